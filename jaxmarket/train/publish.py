"""A run directory's result, published as one: ``published.json``.

A finished segment of a run (the first start, or a ``--resume`` that plays more periods or
only rewrites the result) writes its result files under staging names
(``summary.staged.json``, ...), then *publishes* them: it writes the manifest
``published.json`` (atomically: a synced temporary file renamed over the old one), and
only then renames each staged file over its published name. The manifest is the
segment's identity:

* ``engine`` and ``period``: the engine and the period (loop: iteration) the result is
  of;
* ``config``, ``config_sha256``: the resolved config the result was made under (what
  ``config.yaml`` holds while nothing else runs);
* ``files[name]``: ``bytes`` and ``sha256`` of every result file (session engine:
  ``summary.json``, ``sessions.csv``, ``strategies.npz``; loop: ``summary.json``);
* ``logs[name]``: the same of every append-only row file (``metrics.csv``,
  ``seeds.csv`` and the components' ``*.csv``; ``seeds.parquet/`` parts) as it stood at
  publication: the result was computed from these bytes.

Every reader checks a file against the manifest (:func:`verify`) before it trusts it. A
run stopped at any point of a publication is either the previous result whole (stopped
before the manifest was replaced: then ``config.yaml`` still names the resume that was
running, and readers refuse it naming the changed keys) or a manifest whose files are not
all in place (readers refuse it naming the file); ``python -m jaxmarket.train --resume
RUN`` repairs both (it recomputes the result from the last checkpoint and publishes it
again). A file changed after publication (edited, damaged, flipped bytes) fails its
checksum the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from jaxmarket.train.rundir import RunDirError, changed_keys, config_hash
from jaxmarket.train.tracking import sync_dir

MANIFEST = "published.json"
FORMAT = 1


def digest(path: Path, size: int | None = None) -> str:
    """SHA-256 of the first ``size`` bytes of ``path`` (all of it: None)."""
    h = hashlib.sha256()
    left = size
    with Path(path).open("rb") as f:
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def _entry(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": digest(path)}


def staged_name(name: str) -> str:
    """``summary.json`` -> ``summary.staged.json`` (the suffix kept: numpy adds ``.npz``
    to a name without it)."""
    p = Path(name)
    return str(p.with_name(f"{p.stem}.staged{p.suffix}"))


def _sync_write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class Publication:
    """One segment's result, staged file by file, then published as one
    (module docstring). ``engine``, ``period``: the segment's identity, with the
    ``config.yaml`` it ran under (read at publication: the run holds the directory's
    lock, and ``--resume`` wrote the file before the segment started)."""

    def __init__(self, run_dir: Path, engine: str, period: int):
        self.run_dir, self.engine, self.period = Path(run_dir), engine, int(period)
        self.staged: dict[str, Path] = {}
        self.logs: list[str] = []

    def path(self, name: str) -> Path:
        """Where a writer puts result file ``name`` before publication."""
        path = self.run_dir / staged_name(name)
        self.staged[name] = path
        return path

    def text(self, name: str, text: str) -> None:
        """Result file ``name`` with ``text`` (staged, synced)."""
        _sync_write(self.path(name), text.encode())

    def log(self, *names: str) -> None:
        """Append-only row files (relative paths) the result was computed from."""
        self.logs += [n for n in names if (self.run_dir / n).is_file()]

    def manifest(self) -> dict:
        config = _config_now(self.run_dir)
        return {"format": FORMAT, "engine": self.engine, "period": self.period,
                "config_sha256": config_hash(config), "config": config,
                "files": {n: _entry(p) for n, p in self.staged.items()},
                "logs": {n: _entry(self.run_dir / n) for n in self.logs}}

    def publish(self, hook=None) -> dict:
        """The manifest, then each staged file renamed to its name (``hook(name)`` before
        each step: the fault-injection tests' crash point). Returns the manifest."""
        manifest = self.manifest()
        hook = hook or _HOOK
        hook(MANIFEST)
        tmp = self.run_dir / (MANIFEST + ".tmp")
        _sync_write(tmp, (json.dumps(manifest, indent=2) + "\n").encode())
        tmp.replace(self.run_dir / MANIFEST)
        for name, path in self.staged.items():
            hook(name)
            path.replace(self.run_dir / name)
        sync_dir(self.run_dir)
        return manifest


def _no_hook(name: str) -> None:
    return None


_HOOK = _no_hook   # tests replace it to stop the writer between two steps


def read_manifest(run_dir: Path) -> dict | None:
    """``published.json`` (None when the run has published nothing); a RunDirError when
    it cannot be read."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise RunDirError(f"run directory error: {path} cannot be read ({type(err).__name__}); "
                          f"publish the result again: {repair(run_dir)}") from None
    if not (isinstance(manifest, dict) and isinstance(manifest.get("files"), dict)
            and isinstance(manifest.get("logs"), dict) and "period" in manifest):
        raise RunDirError(f"run directory error: {path} is not a manifest of jaxmarket "
                          f"(format {FORMAT}); publish the result again: {repair(run_dir)}")
    return manifest


def repair(run_dir: Path) -> str:
    return f"python -m jaxmarket.train --resume {run_dir}"


def _config_now(run_dir: Path) -> Any:
    try:
        return yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None


def verify(run_dir: str | Path, names: tuple[str, ...] | list[str] | None = None,
           growing: bool = False, result_file: str = "summary.json") -> dict | None:
    """The manifest of ``run_dir`` once ``names`` (default: every file it lists, and its
    logs) are checked against it, and ``config.yaml`` against the config it was made
    under. None when the run has published nothing yet (no manifest and no
    ``result_file``: a run still in its first segment). ``growing`` (``plot`` watching a
    live run): a log may have rows appended past the published ones, whose bytes must
    still match, and ``config.yaml`` may have moved on (a resume that extends the run).
    Any disagreement is a RunDirError naming the file and the command that repairs it."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if manifest is None:
        if (run_dir / result_file).exists():
            raise RunDirError(
                f"run directory error: {run_dir / result_file} is not part of a published "
                f"result ({run_dir} has no {MANIFEST}: the run was stopped while publishing "
                f"its result, or written by a jaxmarket without it); publish it again: "
                f"{repair(run_dir)}")
        return None
    period = manifest.get("period")
    now = _config_now(run_dir)
    if not growing and now is not None and config_hash(now) != manifest.get("config_sha256"):
        keys = list(changed_keys(manifest.get("config"), now)) or ["(the whole file)"]
        raise RunDirError(
            f"run directory error: {run_dir / 'config.yaml'} differs from the config of the "
            f"result published at period {period} ({', '.join(keys[:4])}"
            + (", ..." if len(keys) > 4 else "") + "): a resume that changed it has not "
            f"finished, so the files are not one result; finish it: {repair(run_dir)}")
    files, logs = manifest["files"], manifest["logs"]
    wanted = list(files) + list(logs) if names is None else list(names)
    for name in wanted:
        if name in files:
            _check(run_dir, name, files[name], period, growing=False)
        elif name in logs:
            _check(run_dir, name, logs[name], period, growing=growing)
    return manifest


def _check(run_dir: Path, name: str, entry: dict, period: Any, growing: bool) -> None:
    path = run_dir / name
    where = f"the result published at period {period} ({MANIFEST})"
    if not path.is_file():
        why = "is missing"
    else:
        size = path.stat().st_size
        want = int(entry.get("bytes", -1))
        if size < want or (size > want and not growing):
            why = f"has {size} bytes, not the {want} of {where}"
        elif digest(path, want if growing else None) != entry.get("sha256"):
            why = f"does not match the checksum of {where}"
        else:
            return
    raise RunDirError(f"run directory error: {path} {why}: written by a run stopped before "
                      f"it finished publishing, or changed since; publish the result again: "
                      f"{repair(run_dir)}")


def read_summary(run_dir: str | Path) -> dict:
    """``summary.json`` of a published result, checked first (:func:`verify`); a
    RunDirError when the run has published nothing."""
    run_dir = Path(run_dir)
    if verify(run_dir) is None:
        raise RunDirError(f"run directory error: {run_dir} holds no result yet (no "
                          f"summary.json): finish the run: {repair(run_dir)}")
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise RunDirError(f"run directory error: {run_dir / 'summary.json'} cannot be read "
                          f"({type(err).__name__}); publish it again: "
                          f"{repair(run_dir)}") from None


def published(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a published result that verifies (for sweeps deciding
    whether a cell is done)."""
    try:
        return verify(run_dir) is not None
    except RunDirError:
        return False


__all__ = ["MANIFEST", "Publication", "digest", "published", "read_manifest", "read_summary",
           "repair", "staged_name", "verify"]
