"""``run.json``: how a run was made (versions, git commit, command, host, devices,
times), one segment per invocation (a resume adds one)."""

from __future__ import annotations

import json
import platform
import shlex
import socket
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax

from jaxmarket.config.errors import Interrupted
from jaxmarket.train.tracking import with_tracker

RUN_RECORD = "run.json"

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def git_commit(package: Path = PACKAGE_DIR) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout whose ``jaxmarket/`` is ``package`` (this
    jaxmarket's, by default); ``(None, None)`` outside one (an installed wheel, no git)."""
    package = Path(package).resolve()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(package), *args], check=False,
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() / "jaxmarket" != package:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD"), None if status is None else bool(status)


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def run_record(trainer: Any, command: str | None, start: int) -> dict:
    """This invocation's record (one segment of ``run.json``)."""
    commit, dirty = git_commit()
    devices = jax.local_devices()
    return {
        "jaxmarket_version": _version("jaxmarket"), "jax_version": jax.__version__,
        "jaxlib_version": _version("jaxlib"), "python_version": platform.python_version(),
        "git_commit": commit, "git_dirty": dirty,
        "command": command if command is not None else shlex.join(sys.argv),
        "host": socket.gethostname(),
        "devices": {"platform": devices[0].platform, "kind": devices[0].device_kind,
                    "used": trainer.placement.num_devices, "local": len(devices),
                    "processes": jax.process_count()},
        "seed": trainer.plan.seed, "log_every": trainer.tcfg.log_every,
        "seeds_format": trainer.tcfg.seeds_format,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "start_iteration": start,
        "end_iteration": None, "compile_s": None, "run_s": None, "status": "running"}


def read_run_record(run_dir: Path) -> dict | None:
    """``run_dir/run.json`` (None when absent or unreadable)."""
    try:
        record = json.loads((Path(run_dir) / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("segments"), list) \
        else None


def write_record(run_dir: Path, segments: list[dict]) -> dict:
    """``run.json``: the first invocation's record, with ``compile_s``, ``run_s`` summed
    over every invocation (a resume adds one), ``iterations``, ``status`` and
    ``end_iteration`` of the latest, and ``segments``: each invocation's own record."""
    done = [s for s in segments if s["compile_s"] is not None]
    record = {**segments[0],
              "compile_s": round(sum(s["compile_s"] for s in done), 3) if done else None,
              "run_s": round(sum(s["run_s"] for s in done), 3) if done else None,
              "iterations": segments[-1]["end_iteration"], "status": segments[-1]["status"],
              "end_iteration": segments[-1]["end_iteration"], "segments": segments}
    tmp = run_dir / (RUN_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(run_dir / RUN_RECORD)
    return record


def _finish_record(trainer: Any, segments: list[dict], status: str) -> None:
    """The latest segment's times, last iteration and status (best effort: a run that
    failed on full storage keeps the record it has)."""
    segments[-1].update(compile_s=round(trainer.compile_s, 3), run_s=round(trainer.run_s, 3),
                        end_iteration=getattr(trainer, "done_iters", None), status=status)
    try:
        write_record(trainer.run_dir, segments)
    except OSError:
        pass


def _status(trainer: Any, err: BaseException | None) -> str:
    if isinstance(err, Interrupted):
        return "interrupted"
    if err is not None:
        return "failed"
    return "stopped" if getattr(trainer, "stopped", None) else "finished"


def train_recorded(trainer: Any, tracker: str, mongo_url: str | None, config: dict,
                    runner: Any, start: int, segments: list[dict]) -> dict:
    """``trainer.train`` inside the tracker, ``run.json`` updated however it ends."""
    err = None
    try:
        return with_tracker(tracker if trainer.primary else "files", trainer.run_dir, config,
                            lambda t: trainer.train(t, runner, start), mongo_url)
    except BaseException as e:
        err = e
        raise
    finally:
        if trainer.primary:
            _finish_record(trainer, segments, _status(trainer, err))


__all__ = ["RUN_RECORD", "git_commit", "read_run_record", "run_record", "train_recorded",
           "write_record"]
