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
import os
from pathlib import Path
from typing import Any, Iterator

import yaml

from jaxmarket.config.errors import ConfigError

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


def storage_cause(err: BaseException) -> OSError | None:
    """The storage ``OSError`` behind ``err`` (itself or in its cause/context chain)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


def describe_os_error(err: OSError) -> str:
    where = f": {err.filename}" if err.filename else ""
    return f"{os.strerror(err.errno)} (errno {errno.errorcode.get(err.errno, err.errno)}){where}"


class DirLock:
    """An exclusive, non-blocking ``flock`` on ``path`` (created if missing; the holder's
    process id is written into it). ``beside=True``: the lock file sits next to an
    output that does not exist yet (``OUT.lock``) and is removed on release.

    The lock belongs to the open file: the OS drops it when the process dies, however
    it dies, so a stale lock file never blocks anyone."""

    def __init__(self, path: Path, what: str, target: Path, beside: bool = False):
        self.path, self.what, self.target, self.beside = Path(path), what, Path(target), beside
        self.fd: int | None = None

    def acquire(self) -> "DirLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise RunDirBusy(
                        f"{self.what} {self.target} is in use by process {holder} (one writer "
                        f"per directory; its lock: {self.path}); wait for that process to "
                        "finish or stop it, then run this again") from None
                try:   # the file we locked may have been removed and made anew meanwhile
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            self.fd = fd
        except OSError as err:
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


# ------------------------------------------------------------------ config.yaml

def read_run_config(run_dir: Path) -> dict:
    """``run_dir/config.yaml`` as a mapping; a ConfigError naming the file when it is not
    readable UTF-8 YAML holding one."""
    path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), f"undecodable bytes at offset {err.start}",
                          "the run's config.yaml as UTF-8 YAML text (restore it)") from None
    except yaml.YAMLError as err:
        raise ConfigError(str(path), " ".join(str(err).split())[:160],
                          "the run's config.yaml as valid YAML (restore it)") from None
    if not isinstance(config, dict):
        raise ConfigError(str(path), config, "the run's config.yaml: a YAML mapping "
                          "(restore it)")
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


def write_config_record(run_dir: Path, config: dict) -> None:
    tmp = run_dir / (CONFIG_RECORD + ".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(run_dir / CONFIG_RECORD)


def check_config_record(run_dir: Path, config: dict, extendable: tuple[str, ...]) -> list[str]:
    """Compare ``config`` (config.yaml now) with the copy stored when the run started:
    a ConfigError listing the changed keys unless every change is an ``extendable``
    setting (returned, so the caller can say so). A run started before the copy existed
    has nothing to compare with (``[]``)."""
    path = run_dir / CONFIG_RECORD
    if not path.is_file():
        return []
    try:
        started = yaml.safe_load(path.read_text())
    except (UnicodeDecodeError, yaml.YAMLError):
        raise RunDirError(f"run directory error: {path} (the config the run started with) "
                          "is damaged; delete it to resume without the check") from None
    changed = list(changed_keys(started, config))
    fixed = [k for k in changed if not any(k == e or k.startswith(e + ".") for e in extendable)]
    if fixed:
        raise ConfigError(
            str(run_dir / "config.yaml"), "changed " + ", ".join(fixed),
            "the config the run was started with (only " + ", ".join(extendable)
            + " may change on --resume); put the file back as it was, or start a new run with "
            f"it: python -m jaxmarket.train {run_dir / 'config.yaml'} --run-dir NEW_DIR")
    return changed


# ------------------------------------------------------------------ metrics rows

def check_rows(path: Path, iteration: int, per_iteration: int, run_dir: Path,
               every: int = 1) -> None:
    """``path`` (metrics.csv: one row per iteration; seeds.csv: one per seed) must hold
    every row of iterations 1 .. ``iteration`` (the checkpoint restored) that are
    multiples of ``every`` (``train.log_every``; other rows, a segment's last iteration,
    are allowed), and only rows
    of numbers; an unterminated last line (a crash mid-append, after that checkpoint) is
    allowed: the trainer drops it with the other rows past the checkpoint."""
    restart = f"start the run again: python -m jaxmarket.train {run_dir / 'config.yaml'} " \
              "--run-dir NEW_DIR"
    if iteration == 0:
        return
    if not path.is_file():
        raise RunDirError(f"run directory error: {path} is missing but the checkpoint restored "
                          f"is at iteration {iteration}: its rows are lost (restore the file, or "
                          f"{restart})")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        lines.pop()            # cut last row: past the checkpoint, dropped on resume
    width, seen = None, 0
    for n, raw in enumerate(lines, 1):
        bad = None
        if b"\x00" in raw:
            bad = "NUL bytes"
        else:
            try:
                fields = raw.decode("utf-8").rstrip("\r").split(",")
            except UnicodeDecodeError:
                fields, bad = [], "undecodable bytes"
        if bad is None and n == 1:
            width = len(fields)
            continue
        if bad is None and len(fields) != width:
            bad = f"{len(fields)} fields, the header has {width}"
        if bad is None:
            try:
                values = [float(x) for x in fields]
            except ValueError:
                bad = "not a row of numbers"
        if bad:
            raise RunDirError(f"run directory error: {path} line {n} is damaged ({bad}); "
                              f"restore the file, or {restart}")
        it = int(values[0])
        if it <= iteration and it % every == 0:
            if it != (seen // per_iteration + 1) * every:
                break
            seen += 1
    if seen != iteration // every * per_iteration:
        have = seen // per_iteration * every
        raise RunDirError(f"run directory error: {path} holds rows up to iteration {have} "
                          f"only, but the checkpoint restored is at iteration {iteration}: rows "
                          f"are missing, so the summary would be wrong (restore the file, or "
                          f"{restart})")
