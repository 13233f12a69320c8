"""The run directory's guarantees (docs/reliability.md): one writer at a time (an
exclusive ``fcntl.flock`` on ``DIR/.lock``, released by the OS when the process dies),
storage faults as one line, and the integrity checks ``--resume`` makes before it
trusts what is on disk (the rows of ``metrics.csv``/``seeds.csv`` up to the restored
checkpoint, and ``config.yaml`` against the copy stored when the run started).

Every failure here is a :class:`RunDirError`: one line, exit code 1 from the command
line (configuration errors stay ``ConfigError``, exit code 2)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator

import yaml

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import check_sections, safe_load

LOCK_NAME = ".lock"                 # inside a run, sweep or offline run directory
CONFIG_RECORD = ".config.started.yaml"   # the resolved config the run is bound to
SESSIONS_FILE = "sessions.csv"     # a session-engine run's rows (jaxmarket.sessions.run)
STRATEGIES_FILE = "strategies.npz"   # a session-engine run's greedy strategies
# errno values that mean "the storage refused the write" (not a bug of the program)
STORAGE_ERRNOS = frozenset(getattr(errno, n) for n in (
    "ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "EFBIG") if hasattr(errno, n))


class RunDirError(Exception):
    """A run directory cannot be used as it is (busy, damaged, on failing storage):
    the message is one line saying what and what to do; exit code 1."""


class RunDirBusy(RunDirError):
    """Another process holds the directory's lock."""


class StorageError(RunDirError):
    """The storage refused a write (disk full, read-only, permission)."""


# how tensorstore (under orbax) reports a storage error: a ValueError whose text holds
# the OS's error code, or a status code with the file named in quotes
_OS_ERROR_CODE = re.compile(r"os_error_code='(\d+)'")
_STATUS = {"PERMISSION_DENIED": errno.EACCES, "Read-only file system": errno.EROFS,
           "No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT}
_QUOTED_PATH = re.compile(r'local file "([^"]+)"')


def _from_message(err: BaseException) -> OSError | None:
    text = str(err)
    code = None
    if (m := _OS_ERROR_CODE.search(text)) and int(m.group(1)) in STORAGE_ERRNOS:
        code = int(m.group(1))
    else:
        code = next((c for k, c in _STATUS.items() if k in text), None)
    if code is None:
        return None
    paths = _QUOTED_PATH.findall(text)
    return OSError(code, os.strerror(code), paths[-1] if paths else None)


def storage_cause(err: BaseException) -> OSError | None:
    """The storage ``OSError`` behind ``err`` (itself or in its cause/context chain; an
    orbax/tensorstore error whose text names a storage error counts as one)."""
    seen, chain = set(), []
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
            return err
        chain.append(err)
        err = err.__cause__ or err.__context__
    for e in chain:
        if not isinstance(e, (KeyboardInterrupt, SystemExit)) and (found := _from_message(e)):
            return found
    return None


def describe_os_error(err: OSError) -> str:
    where = f": {err.filename}" if err.filename else ""
    return f"{os.strerror(err.errno)} (errno {errno.errorcode.get(err.errno, err.errno)}){where}"


def start_storage_error(run_dir: Path, err: OSError) -> StorageError:
    """A start's storage fault (both engines): nothing was trained, the same command
    replaces what the start left."""
    return StorageError(f"storage error while starting the run in {run_dir}: "
                        f"{describe_os_error(err)}; nothing was trained; free space or fix "
                        "the permissions, then run the same command again (it replaces what "
                        "this start left)")


def resume_storage_error(run_dir: Path, err: OSError) -> StorageError:
    """A resume's fault writing the config it continues with (both engines)."""
    return StorageError(f"storage error while writing {run_dir}/config.yaml: "
                        f"{describe_os_error(err)}; the run is as it was; resume with "
                        f"python -m jaxmarket.train --resume {run_dir}")


class DirLock:
    """An exclusive, non-blocking ``flock`` on ``path`` (created if missing; the holder's
    process id is written into it) and, for a directory's own lock (``beside=False``), on
    the directory itself: a lock file removed by hand while its run is live does not let
    a second writer in (the kernel holds the lock on the directory's inode, which no
    ``rm`` removes). ``beside=True``: the lock file sits next to an output that does not
    exist yet (``OUT.lock``) and is removed on release.

    The locks belong to the open files: the OS drops them when the process dies, however
    it dies, so a stale lock file never blocks anyone."""

    def __init__(self, path: Path, what: str, target: Path, beside: bool = False):
        self.path, self.what, self.target, self.beside = Path(path), what, Path(target), beside
        self.fd: int | None = None
        self.dir_fd: int | None = None

    def _busy(self, holder: str) -> RunDirBusy:
        return RunDirBusy(
            f"{self.what} {self.target} is in use by process {holder} (one writer per "
            f"directory; its lock: {self.path}); wait for that process to finish or stop "
            "it, then run this again")

    def _holder(self) -> str:
        try:
            return self.path.read_bytes()[:64].decode(errors="replace").strip() or "unknown"
        except OSError:
            return "unknown (its lock file was removed)"

    def _lock_directory(self) -> None:
        """The kernel's lock on the directory itself (what a removed lock file cannot
        defeat); a file system without ``flock`` on directories keeps the file lock."""
        try:
            fd = os.open(self.target, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            if err.errno in STORAGE_ERRNOS:
                raise
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._busy(self._holder()) from None
        except OSError:   # no flock on directories here (some network file systems)
            os.close(fd)
            return
        self.dir_fd = fd

    def acquire(self) -> "DirLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.beside:
                self._lock_directory()
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    self._release_directory()
                    raise self._busy(holder) from None
                try:   # the file we locked may have been removed and made anew meanwhile
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            self.fd = fd
        except OSError as err:
            self._release_directory()
            if err.errno not in STORAGE_ERRNOS:
                raise
            raise StorageError(f"storage error: cannot create {self.path} "
                               f"({describe_os_error(err)}); nothing was written") from None
        try:   # who holds it (best effort: a full disk still gets the lock)
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        return self

    def _release_directory(self) -> None:
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None

    def release(self) -> None:
        if self.fd is None:
            return
        if self.beside:
            try:
                self.path.unlink()
            except OSError:
                pass
        os.close(self.fd)
        self.fd = None
        self._release_directory()

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_dir(run_dir: str | Path, what: str = "run directory") -> DirLock:
    """The lock of a directory the process writes into (``DIR/.lock``), not yet taken."""
    run_dir = Path(run_dir)
    return DirLock(run_dir / LOCK_NAME, what, run_dir)


def lock_beside(out: str | Path, what: str = "output") -> DirLock:
    """The lock of an output written under a temporary name and renamed (``OUT.lock``)."""
    out = Path(out)
    return DirLock(out.with_name(out.name + ".lock"), what, out, beside=True)


def is_empty(run_dir: Path) -> bool:
    """No entry but the lock file (a run killed before it wrote anything)."""
    return all(p.name == LOCK_NAME for p in run_dir.iterdir())


# what a start writes before its first checkpoint (each also under NAME.tmp): a run
# directory holding only these and no checkpoint is a start that failed (full disk,
# killed), restarted in place by a new run into it
START_FILES = frozenset({"config.yaml", CONFIG_RECORD, "run.json", "metrics.csv",
                         "seeds.csv", "seeds.parquet", "pbt.csv", "mapping.csv",
                         "nonfinite_actions.csv",
                         "checkpoints", "sacred", "tensorboard", "wandb"})


def has_checkpoint(run_dir: Path) -> bool:
    """A committed checkpoint in ``run_dir/checkpoints`` (orbax names it by its step;
    an unfinished one ends in ``.orbax-checkpoint-tmp``)."""
    ckpt = Path(run_dir) / "checkpoints"
    return ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())


def failed_start(run_dir: Path) -> bool:
    """``run_dir`` holds only what a start writes before its first checkpoint (no
    checkpoint, no summary): nothing of it is worth keeping."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return False
    names = [p.name for p in run_dir.iterdir() if p.name != LOCK_NAME]
    return all(n.removesuffix(".tmp") in START_FILES for n in names) \
        and not has_checkpoint(run_dir)


def clear_failed_start(run_dir: Path) -> list[str]:
    """Remove what a failed start left in ``run_dir`` (its lock stays); the names."""
    removed = []
    for p in sorted(Path(run_dir).iterdir()):
        if p.name == LOCK_NAME:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        removed.append(p.name)
    return removed


# ------------------------------------------------------------------ config.yaml

def read_run_config(run_dir: Path) -> dict:
    """``run_dir/config.yaml`` as a mapping; a ConfigError naming the file when it is not
    readable UTF-8 YAML holding one."""
    path = run_dir / "config.yaml"
    try:
        config = safe_load(path.read_bytes().decode("utf-8"), str(path))
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), f"undecodable bytes at offset {err.start}",
                          "the run's config.yaml as UTF-8 YAML text (restore it)") from None
    except yaml.YAMLError as err:
        raise ConfigError(str(path), " ".join(str(err).split())[:160],
                          "the run's config.yaml as valid YAML (restore it)") from None
    if not isinstance(config, dict):
        raise ConfigError(str(path), config, "the run's config.yaml: a YAML mapping "
                          "(restore it)")
    check_sections(config)   # before the engine choice reads a section
    return config


def changed_keys(a: Any, b: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths (``market.sellers[0].count``) where ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in a or k not in b:
                yield path
            else:
                yield from changed_keys(a[k], b[k], path)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from changed_keys(x, y, f"{prefix}[{i}]")
    elif a != b or type(a) is not type(b):
        yield prefix or "(the whole file)"


ALL_FIELDS = "all"   # --allow-config-change all: accept config.yaml as it is


def package_version() -> str:
    try:
        return version("jaxmarket")
    except PackageNotFoundError:
        return "unknown"


def config_hash(config: dict) -> str:
    """SHA-256 of a config as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def identity(config: dict) -> dict:
    """What a run is: the hash of its resolved config, the package version, its seeds."""
    train = config.get("train") or {}
    return {"config_sha256": config_hash(config), "jaxmarket_version": package_version(),
            "seed": config.get("seed", 0), "num_seeds": train.get("num_seeds")}


def write_config_record(run_dir: Path, config: dict) -> None:
    """``run_dir/.config.started.yaml``: the run's identity and its resolved config (what
    ``--resume`` checks config.yaml against), written atomically and synced."""
    config = yaml.safe_load(yaml.safe_dump(config, sort_keys=False))   # as read back
    text = yaml.safe_dump({"identity": identity(config), "config": config}, sort_keys=False)
    tmp = run_dir / (CONFIG_RECORD + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(run_dir / CONFIG_RECORD)


def _matches(key: str, fields) -> bool:
    return any(f == ALL_FIELDS or key == f or key.startswith((f + ".", f + "["))
               for f in fields)


def check_config_record(run_dir: Path, config: dict, extendable: tuple[str, ...],
                        allowed: tuple[str, ...] | list[str] = (),
                        required: bool = True) -> list[str]:
    """Compare ``config`` (config.yaml now) with the identity recorded when the run
    started: a ConfigError listing the changed keys unless every change is an
    ``extendable`` setting or one the user ``allowed`` (``--allow-config-change``; the
    changed keys are returned, so the caller can say so). A missing or damaged record is
    a RunDirError when ``required`` (the run has a checkpoint its config must match)
    unless ``allowed`` holds ``all``."""
    path = run_dir / CONFIG_RECORD
    resume = f"python -m jaxmarket.train --resume {run_dir}"
    accept_all = ALL_FIELDS in allowed
    if not path.is_file():
        if not required or accept_all:
            return []
        raise RunDirError(
            f"run directory error: {path} (the run's identity: the config it started with) "
            "is missing, so config.yaml cannot be checked against the config its checkpoints "
            f"were trained with; restore it, or accept config.yaml as it is: {resume} "
            f"--allow-config-change {ALL_FIELDS}")
    try:
        record = yaml.safe_load(path.read_text())
    except (UnicodeDecodeError, yaml.YAMLError):
        record = None
    started, why = record, None
    if isinstance(record, dict) and set(record) == {"identity", "config"}:
        started = record["config"]
        ident = record["identity"] if isinstance(record["identity"], dict) else {}
        if not isinstance(started, dict) or ident.get("config_sha256") != config_hash(started):
            why = "its config does not match its hash: edited or damaged"
        elif ident.get("jaxmarket_version") != package_version() and not _matches(
                "jaxmarket_version", allowed):
            raise ConfigError(
                "jaxmarket_version", package_version(),
                f"{ident.get('jaxmarket_version')}, the version the run started with (a "
                f"resumed run is identical only under it); install that version, or accept "
                f"this one: {resume} --allow-config-change jaxmarket_version")
    elif not isinstance(record, dict):
        why = "not a YAML mapping"
    if why is not None:
        if accept_all:
            return []
        raise RunDirError(f"run directory error: {path} (the run's identity: the config it "
                          f"started with) is damaged ({why}); restore it, or accept "
                          f"config.yaml as it is: {resume} --allow-config-change {ALL_FIELDS}")
    changed = list(changed_keys(started, config))
    fixed = [k for k in changed if not _matches(k, extendable) and not _matches(k, allowed)]
    if fixed:
        raise ConfigError(
            str(run_dir / "config.yaml"), "changed " + ", ".join(fixed),
            "the config the run was started with (only " + ", ".join(extendable)
            + " may change on --resume); put the file back as it was, accept the change: "
            f"{resume} --allow-config-change {' '.join(fixed)}, or start a new run with it: "
            f"python -m jaxmarket.train {run_dir / 'config.yaml'} --run-dir NEW_DIR")
    return changed


def started_config(run_dir: Path) -> dict | None:
    """The config the run's last segment started with (``.config.started.yaml``; None
    when missing or damaged: :func:`check_config_record` has judged that already)."""
    try:
        record = yaml.safe_load((Path(run_dir) / CONFIG_RECORD).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    config = record.get("config") if isinstance(record, dict) else None
    return config if isinstance(config, dict) else None


_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def value_at(config: Any, key: str) -> Any:
    """The value at a dotted path of :func:`changed_keys` (``market.sellers[0].count``);
    None where the path does not exist."""
    node = config
    for name, index in _STEP.findall(key):
        try:
            node = node[int(index)] if index else node[name]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def config_changes(before: dict | None, after: dict, extendable: tuple[str, ...],
                   period: int) -> list[dict]:
    """The settings a resume changes that are not ``extendable`` (accepted by
    ``--allow-config-change``): ``key``, ``from``, ``to`` and ``from_period`` (the first
    period played under the new value: the checkpoint's)."""
    if before is None:
        return []
    after = yaml.safe_load(yaml.safe_dump(after, sort_keys=False))   # as read back
    return [{"key": k, "from": value_at(before, k), "to": value_at(after, k),
             "from_period": int(period)}
            for k in changed_keys(before, after) if not _matches(k, extendable)]


def config_text(config: dict, changes: list[dict]) -> str:
    """``config.yaml``: the config, headed by one comment line per setting a resume
    changed (``changes``: every segment's :func:`config_changes`, oldest first), saying
    from which period on it was in force (run.json ``segments[i].config_changes``)."""
    head = "".join(
        f"# {c['key']}: {json.dumps(c['to'])} from period {c['from_period']} on "
        f"({json.dumps(c['from'])} before; --allow-config-change, run.json "
        "segments[].config_changes)\n" for c in changes)
    return head + yaml.safe_dump(config, sort_keys=False)


def unhonoured(changes: list[dict], run_dir: Path) -> ConfigError:
    """The checkpoints do not restore under the changed settings: a change a resume
    cannot honour (it changes the shape of what was trained: the session or seed count,
    the markets, the grid), refused naming the keys, not blamed on the checkpoints
    (which are kept and restore under the run's own config)."""
    keys = ", ".join(c["key"] for c in changes)
    one = len(changes) == 1
    got = changes[0]["to"] if one else [c["to"] for c in changes]
    was = changes[0]["from"] if one else [c["from"] for c in changes]
    return ConfigError(keys, got,
                       f"{json.dumps(was)}, as the run has it: a resume cannot honour this "
                       "change (it changes the shape of what the run's checkpoints hold, so "
                       "none restores under it; they are kept); put config.yaml back as it "
                       "was, or start a new run with it: python -m jaxmarket.train "
                       f"{run_dir / 'config.yaml'} --run-dir NEW_DIR")


# ------------------------------------------------------------------ metrics rows

class RowScan:
    """What :func:`scan_rows` found in a row file (``metrics.csv``, ``seeds.csv``): its
    clean prefix (the header, then whole iterations in order: no line damaged, repeated,
    out of order or missing) and why it ends there."""

    def __init__(self, path: Path):
        self.path = path
        self.exists = path.is_file()
        self.ends: list[tuple[int, int]] = []   # (iteration, byte offset after its rows)
        self.header_end = 0
        self.covered = 0          # every row due up to this iteration is in the prefix
        self.problem: str | None = None   # why the prefix ends before the file does
        self.problem_kind: str | None = None   # "damaged", "order", "gap"

    def offset(self, iteration: int) -> int:
        """The byte length of the prefix up to the rows of ``iteration``."""
        end = self.header_end
        for it, off in self.ends:
            if it > iteration:
                break
            end = off
        return end

    def short(self, iteration: int, run_dir: Path) -> str:
        """One line: these rows do not reach ``iteration`` (the oldest checkpoint)."""
        restart = f"start the run again: python -m jaxmarket.train " \
                  f"{run_dir / 'config.yaml'} --run-dir NEW_DIR"
        if not self.exists:
            return (f"run directory error: {self.path} is missing but the oldest checkpoint "
                    f"is at iteration {iteration}: its rows are lost (restore the file, or "
                    f"{restart})")
        if self.problem_kind == "damaged":
            return f"run directory error: {self.problem}; restore the file, or {restart}"
        if self.problem_kind in ("order", "gap"):
            return (f"run directory error: {self.problem} before the oldest checkpoint "
                    f"(iteration {iteration}), so the summary would be wrong (restore the "
                    f"file, or {restart})")
        return (f"run directory error: {self.path} holds rows up to iteration "
                f"{self.ends[-1][0] if self.ends else 0} only, but the oldest checkpoint is "
                f"at iteration {iteration}: rows are missing, so the summary would be wrong "
                f"(restore the file, or {restart})")


def scan_rows(path: Path, per_iteration: int, every: int = 1,
              columns: list[str] | None = None, run_dir: Path | None = None) -> RowScan:
    """Read ``path`` (metrics.csv: one row per iteration; seeds.csv: ``per_iteration``
    rows, seeds ``0 .. per_iteration - 1``, per iteration) and find its clean prefix.
    Every multiple of ``every`` (``train.log_every``) is due; other iterations (a
    segment's last) may have rows too. A header other than ``columns`` (the run's) is a
    RunDirError; an unterminated last line (a crash mid-append) ends the prefix."""
    scan = RowScan(path)
    if not scan.exists:
        return scan
    data = path.read_bytes()
    restart = "start the run again: python -m jaxmarket.train " \
              f"{(run_dir or path.parent) / 'config.yaml'} --run-dir NEW_DIR"
    pos, n, width = 0, 0, None
    due, last_it, group, group_it = every, 0, 0, None
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break   # a cut last line
        raw, pos = data[pos:nl], nl + 1
        n += 1
        bad, fields = None, []
        if b"\x00" in raw:
            bad = "NUL bytes"
        else:
            try:
                fields = raw.decode("utf-8").rstrip("\r").split(",")
            except UnicodeDecodeError:
                bad = "undecodable bytes"
        if n == 1:
            if bad is None and columns is not None and fields != list(columns):
                extra = [c for c in fields if c not in columns][:3]
                lost = [c for c in columns if c not in fields][:3]
                diff = (f"unknown {', '.join(extra)}" if extra else "") + \
                    ("; " if extra and lost else "") + \
                    (f"missing {', '.join(lost)}" if lost else "") or "the columns reordered"
                raise RunDirError(f"run directory error: {path} line 1 (the header) does not "
                                  f"match the run's columns ({diff}); restore the file, or "
                                  f"{restart}")
            if bad:
                raise RunDirError(f"run directory error: {path} line 1 (the header) is "
                                  f"damaged ({bad}); restore the file, or {restart}")
            width, scan.header_end = len(fields), pos
            continue
        if bad is None and len(fields) != width:
            bad = f"{len(fields)} fields, the header has {width}"
        if bad is None:
            try:
                values = [float(x) for x in fields]
                it = int(values[0])
                seed = int(values[1]) if per_iteration > 1 else 0
                if it != values[0] or (per_iteration > 1 and seed != values[1]):
                    raise ValueError
            except (ValueError, IndexError, OverflowError):
                bad = "not a row of numbers"
        if bad:
            scan.problem, scan.problem_kind = f"{path} line {n} is damaged ({bad})", "damaged"
            break
        if group_it is not None:   # inside an iteration's seeds
            if it != group_it or seed != group:
                scan.problem = (f"{path} line {n} (iteration {it}, seed {seed}) comes where "
                                f"seed {group} of iteration {group_it} belongs: rows repeated "
                                "or out of order")
                scan.problem_kind = "order"
                break
        else:
            if it <= last_it or seed != 0:
                scan.problem = (f"{path} line {n} (iteration {it}) follows iteration "
                                f"{last_it}: rows repeated or out of order")
                scan.problem_kind = "order"
                break
            if it > due:
                scan.problem = (f"{path} holds rows up to iteration {last_it} only: line "
                                f"{n} jumps to iteration {it} (the rows of iteration {due} "
                                "are missing or out of order)")
                scan.problem_kind = "gap"
                break
            group_it = it
        group += 1
        if group == per_iteration:
            scan.ends.append((it, pos))
            last_it, group, group_it = it, 0, None
            if it == due:
                due += every
    if width is None:   # no header: an empty file or a cut first line
        scan.header_end = 0
    scan.covered = due - 1
    return scan


def cut_rows(path: Path, length: int) -> None:
    """Cut ``path`` to its first ``length`` bytes (the rows up to a checkpoint), synced;
    a file left without any row is removed (the next append writes the header)."""
    if not path.is_file():
        return
    if length == 0:
        path.unlink()
        return
    if path.stat().st_size != length:
        with path.open("r+b") as f:
            f.truncate(length)
            f.flush()
            os.fsync(f.fileno())
