"""Start and resume a training run in a run directory.

``start_run`` resolves the config (every check, nothing written), takes the directory's
lock, writes ``config.yaml``, its record and ``run.json``, then trains
(:class:`~jaxmarket.train.trainer.Trainer`). ``resume_run`` restores the last checkpoint
(:mod:`jaxmarket.train.checkpoints`), checks the row files against it and continues;
chunk boundaries are the same, so on CPU the result is bit-identical to an
uninterrupted run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.train import distributed
from jaxmarket.train.loop import Traced
from jaxmarket.train.metrics import PER_SEED, seed_rows
from jaxmarket.train.plan import RunPlan, resolve
from jaxmarket.train.provenance import read_run_record, run_record, train_recorded, write_record
from jaxmarket.train.rundir import (
    RowScan,
    RunDirError,
    check_config_record,
    clear_failed_start,
    config_changes,
    config_text,
    cut_rows,
    failed_start,
    has_checkpoint,
    is_empty,
    lock_dir,
    read_run_config,
    resume_storage_error,
    scan_rows,
    start_storage_error,
    started_config,
    storage_cause,
    unhonoured,
    write_config_record,
)
from jaxmarket.train.tracking import CsvMetrics, ParquetRows
from jaxmarket.train.trainer import Trainer


def _write_config(run_dir: Path, config: dict, changes: list[dict] = ()) -> None:
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(config_text(config, list(changes)))
    tmp.replace(run_dir / "config.yaml")


def changes_note(changes: list[dict], finished: bool) -> str:
    """The resume's note on the settings ``--allow-config-change`` let it change."""
    return "note: " + "; ".join(
        f"{c['key']} is {c['to']!r} from period {c['from_period']} on ({c['from']!r} before)"
        for c in changes) + (" (the run had finished: no period is played under it)"
                             if finished else "") + "; recorded in config.yaml and run.json"


def earlier_changes(segments: list[dict]) -> list[dict]:
    """The config changes recorded by earlier segments of ``run.json``, oldest first."""
    return [c for seg in segments if isinstance(seg, dict)
            for c in seg.get("config_changes") or []]


def require_new_dir(run_dir: str | Path, resume: str, restartable: bool = False) -> Path:
    """``run_dir`` as a Path if it is new or empty (``restartable``: or holds only what a
    start that failed before its first checkpoint wrote, which the new run replaces),
    else a ``--run-dir`` config error saying how to continue it (``resume`` + the
    directory)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and (not run_dir.is_dir() or not (
            is_empty(run_dir) or (restartable and failed_start(run_dir)))):
        raise ConfigError("--run-dir", str(run_dir),
                          f"a new or empty directory (to continue {resume} {run_dir})")
    return run_dir


def restart_in_place(run_dir: Path) -> None:
    """With the lock held: remove what a failed start left (saying so), so the new run
    starts as in an empty directory."""
    if run_dir.is_dir() and not is_empty(run_dir):
        removed = clear_failed_start(run_dir)
        print(f"note: {run_dir} held a start that failed before its first checkpoint "
              f"({', '.join(removed)}); starting it again in place")


def _agree(config: dict, run_dir: str, **flags) -> str:
    """In a distributed run: process 0's run directory, after checking that every process
    resolved the same config and flags (one-line ConfigError otherwise)."""
    if jax.process_count() == 1:
        return run_dir
    run_dir = distributed.broadcast_text(str(run_dir))
    distributed.check_same(distributed.config_hash(config, run_dir=run_dir, **flags))
    return run_dir


def _synchronised(name: str) -> None:
    if jax.process_count() > 1:
        distributed.wait_for_primary(name)


def start_run(config_path: str | Path | dict | RunPlan | None, overrides: list[str],
              run_dir: str | None, tracker: str = "files", mongo_url: str | None = None,
              devices: int | None = None, command: str | None = None,
              progress_every: float | None = None) -> dict:
    """Train a new run: ``config_path`` is a scenario file, a loaded config or a
    resolved :class:`~jaxmarket.train.plan.RunPlan` (then ``overrides`` must be empty:
    the plan is what runs). ``command``: what ``run.json`` records as the command line
    (default: this process's ``sys.argv``); ``progress_every``: seconds between plain
    progress lines (stdout not a terminal; default 30)."""
    if isinstance(config_path, RunPlan):
        if overrides:
            raise ConfigError("overrides", list(overrides), "none with a resolved RunPlan")
        plan = config_path
    else:
        plan = resolve(load_config(config_path, overrides))   # every check, nothing written
    config = dict(plan.config)
    if run_dir is None:
        stem = Path(config_path).stem if isinstance(config_path, (str, Path)) else \
            str(config.get("name", "run"))
        run_dir = f"runs/{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = _agree(config, run_dir, devices=devices, resume=False)
    run_dir = require_new_dir(run_dir, "that run: python -m jaxmarket.train --resume",
                              restartable=True)
    trainer = Trainer(plan, run_dir, devices)
    if progress_every is not None:
        trainer.progress_every = progress_every
    _synchronised("validated")   # every process checked the directory before it exists
    lock = lock_dir(run_dir) if trainer.primary else None
    segments = [run_record(trainer, command, 0)] if trainer.primary else []
    try:
        if lock is not None:
            lock.acquire()   # creates the directory
            require_new_dir(run_dir, "that run: python -m jaxmarket.train --resume",
                            restartable=True)   # a race
            try:
                restart_in_place(run_dir)
                _write_config(run_dir, config)
                write_config_record(run_dir, config)
                write_record(run_dir, segments)
            except OSError as err:
                if storage_cause(err) is None:
                    raise
                raise start_storage_error(run_dir, err) from None
            print(f"run directory: {run_dir}" + _placement_note(trainer))
        _synchronised("run-dir")
        summary = train_recorded(trainer, tracker, mongo_url, config,
                                  trainer.initial_runner(), 0, segments)
    finally:
        if lock is not None:
            lock.release()
    return {**summary, "run_dir": str(run_dir)}


def _placement_note(trainer: Trainer) -> str:
    n, procs = trainer.placement.num_devices, jax.process_count()
    if n == 1 and procs == 1:
        return ""
    where = f"{n} device(s)" + (f" x {procs} processes" if procs > 1 else "")
    return f" (markets sharded over {where})" + "".join(
        f"\nnote: {line}" for line in trainer.placement.notes)


# what ``--resume DIR key=value`` may change: how long and when to stop, not what runs
RESUME_OVERRIDES = ("train.num_iterations", "train.early_stop", "train.stop_on_nan",
                    "train.checkpoint_every")


def resume_run(run_dir: str, tracker: str = "files", mongo_url: str | None = None,
               overrides: list[str] | tuple[str, ...] = (), devices: int | None = None,
               command: str | None = None, progress_every: float | None = None,
               allow_changes: list[str] | tuple[str, ...] = ()) -> dict:
    """Continue ``run_dir`` from its last checkpoint (from iteration 0 if it has none).
    ``overrides`` may extend or shorten the run (``train.num_iterations=N``, at least the
    checkpointed iteration) and change its stop rules; they are saved to its config.yaml.
    ``devices`` may differ from the interrupted run's (a checkpoint holds whole arrays).
    ``run.json`` keeps the first invocation's record and gains this one as a segment.
    ``allow_changes``: fields of config.yaml whose change since the run started is
    accepted (``--allow-config-change``; ``all``: config.yaml as it is), which
    ``overrides`` may set too."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError("--resume", str(run_dir), "an existing run directory")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("--resume", str(run_dir), "a run directory holding config.yaml "
                          "(this one has none: the run never started; start it with python -m "
                          f"jaxmarket.train CONFIG --run-dir {run_dir})")
    check_resume_overrides(overrides, RESUME_OVERRIDES, allow_changes)
    lock = lock_dir(run_dir) if jax.process_index() == 0 else None
    try:
        if lock is not None:
            lock.acquire()
        return _resume_locked(run_dir, tracker, mongo_url, list(overrides), devices,
                              command, progress_every, tuple(allow_changes))
    finally:
        if lock is not None:
            lock.release()


def check_resume_overrides(overrides, resumable: tuple[str, ...],
                           allow_changes=()) -> None:
    """``--resume DIR key=value``: only the ``resumable`` settings, or fields the user
    accepts changing (``--allow-config-change``)."""
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key not in resumable and not any(
                f == "all" or key == f or key.startswith((f + ".", f + "["))
                for f in allow_changes):
            raise ConfigError("--resume overrides", item, "only " + ", ".join(resumable)
                              + " (everything else is fixed by the run's config.yaml; "
                              "--allow-config-change FIELD accepts changing FIELD)")


def _resume_locked(run_dir: Path, tracker: str, mongo_url: str | None, overrides: list[str],
                   devices: int | None, command: str | None = None,
                   progress_every: float | None = None,
                   allow_changes: tuple[str, ...] = ()) -> dict:
    changed = check_config_record(run_dir, read_run_config(run_dir), RESUME_OVERRIDES,
                                  allow_changes, required=has_checkpoint(run_dir))
    if changed and jax.process_index() == 0:
        print(f"note: config.yaml changed {', '.join(changed)} since the run started "
              "(settings --resume may change, or accepted by --allow-config-change)")
    config = load_config(run_dir / "config.yaml", overrides)
    changes = config_changes(started_config(run_dir), config, RESUME_OVERRIDES, 0)
    _agree(config, str(run_dir), devices=devices, resume=True)
    trainer = Trainer(resolve(config), run_dir, devices)
    previous = read_run_record(run_dir) if trainer.primary else None
    # the largest row interval any invocation used (auto grows with num_iterations, by
    # powers of ten: they nest)
    every = max([trainer.tcfg.log_every] + [int(s.get("log_every", 1)) for s in
                                            (previous or {}).get("segments", [])])
    if trainer.primary:
        trainer.checkpoints.clear_unfinished()
    if changes and not trainer.checkpoints.fits(trainer.placement.abstract):
        raise unhonoured(changes, run_dir)   # named before the rows are blamed
    scans = _check_row_files(trainer, every) if trainer.primary else []
    _synchronised("rows-checked")
    runner, start = trainer.restore(print if trainer.primary else lambda line: None)
    for c in changes:
        c["from_period"] = start
    if trainer.tcfg.num_iterations < start:
        raise ConfigError("train.num_iterations", trainer.tcfg.num_iterations,
                          f"an integer >= {start} (the run's last checkpoint)")
    if progress_every is not None:
        trainer.progress_every = progress_every
    if trainer.primary:   # every row up to the checkpoint, nothing after it
        for scan in scans:
            cut_rows(scan.path, scan.offset(start) if start else 0)
        if isinstance(trainer.seed_metrics, ParquetRows) and start:
            _check_parquet_rows(trainer.seed_metrics, start, trainer.tcfg.num_seeds, run_dir,
                                every)
    _synchronised("restored")
    earlier = earlier_changes((previous or {}).get("segments", []))
    if trainer.primary:
        try:
            if overrides or changes:
                _write_config(run_dir, config, earlier + changes)
            write_config_record(run_dir, config)   # the config it continues with
        except OSError as err:
            if storage_cause(err) is None:
                raise
            raise resume_storage_error(run_dir, err) from None
        print((f"resuming {run_dir} from iteration {start}" if start else
               f"no checkpoint in {run_dir}: starting it from iteration 0")
              + _placement_note(trainer))
    segments = []
    if changes and trainer.primary:
        print(changes_note(changes, start >= trainer.tcfg.num_iterations))
    if trainer.primary:
        segments = (previous or {}).get("segments", []) + [
            {**run_record(trainer, command, start),
             **({"config_changes": changes} if changes else {})}]
        try:
            write_record(run_dir, segments)
        except OSError:
            pass   # the trainer's first write names a storage fault
    summary = train_recorded(trainer, tracker, mongo_url, config, runner, start, segments)
    return {**summary, "run_dir": str(run_dir)}


def _seed_columns(traced: Traced) -> list[str] | None:
    """The ``seeds.csv`` header of a plan, from its traced iteration."""
    metrics = traced.iteration[1][1]
    rows = seed_rows({k: np.zeros(v.shape, np.float32) for k, v in metrics.items()
                      if k.startswith(PER_SEED)}, 0)
    return list(rows[0]) if rows else None


def _check_row_files(trainer: Trainer, every: int) -> list:
    """``metrics.csv`` and ``seeds.csv`` against the checkpoints: their headers must be
    the run's columns, and they must hold every row up to a checkpoint (clean: no line
    damaged, repeated, out of order or missing). Checkpoints past the rows are removed
    (saying so), so the resume starts from the newest one the rows cover; none covered
    is a RunDirError. The scans, to cut the files at the checkpoint restored."""
    run_dir = trainer.run_dir
    steps = trainer.checkpoints.steps()
    if not steps:   # it starts from iteration 0: the files are removed
        return [RowScan(f.path) for f in (trainer.metrics, trainer.seed_metrics)
                if isinstance(f, CsvMetrics)]
    traced = trainer.plan.traced or Traced(trainer.plan)
    scans = [scan_rows(trainer.metrics.path, 1, every,
                       ["iteration", *traced.metric_columns], run_dir)]
    if isinstance(trainer.seed_metrics, CsvMetrics):
        scans.append(scan_rows(trainer.seed_metrics.path, trainer.tcfg.num_seeds, every,
                               _seed_columns(traced), run_dir))
    worst = min(scans, key=lambda scan: scan.covered)
    usable = [s for s in steps if s <= worst.covered]
    if not usable:
        raise RunDirError(worst.short(steps[0], run_dir))
    newer = [s for s in steps if s > worst.covered]
    if newer:
        why = worst.problem or (f"{worst.path} holds rows up to iteration "
                                f"{worst.ends[-1][0] if worst.ends else 0} only")
        print(f"{why}: resuming from the checkpoint at iteration {usable[-1]} (rows from there "
              f"are recomputed); removed the one at iteration "
              f"{', '.join(map(str, newer))}")
        trainer.checkpoints.drop(newer)
    return scans


def _check_parquet_rows(rows: ParquetRows, start: int, num_seeds: int, run_dir: Path,
                        every: int) -> None:
    """As :func:`~jaxmarket.train.rundir.check_rows`, for ``seeds.parquet/``."""
    got = rows.read()
    it = got[1][:, 0] if got is not None else np.empty(0)
    have = it[(it <= start) & (it % every == 0)]
    expected = np.repeat(np.arange(every, start + 1, every), num_seeds)
    if not np.array_equal(have, expected):
        raise RunDirError(f"run directory error: {rows.path} does not hold every row up to "
                          f"iteration {start} (the checkpoint restored): rows are missing, so "
                          "the summary would be wrong (restore it, or start the run again: "
                          f"python -m jaxmarket.train {run_dir / 'config.yaml'} --run-dir "
                          "NEW_DIR)")


def final_learner_state(run_dir: str | Path) -> Any:
    """The last checkpointed Runner of a run (for analysis and tests)."""
    config = load_config(Path(run_dir) / "config.yaml")
    trainer = Trainer(resolve(config), Path(run_dir))
    try:
        runner, _ = trainer.restore()
    finally:
        trainer.checkpoints.close()
    return runner


def finish_message(summary: dict) -> str:
    """What a finished run says: where its files are, what the summary averages, and the
    commands to run next."""
    d = summary["run_dir"]
    n, tail = summary["iterations"], summary["averaged_over_last_iterations"]
    head = (f"stopped at iteration {n}: {summary['stopped']}" if summary.get("stopped")
            else f"finished {n} iterations")
    every = summary.get("log_every", 1)
    rows = "one row per iteration" if every == 1 else f"one row every {every} iterations"
    seeds = "seeds.csv" if (Path(d) / "seeds.csv").exists() or not \
        (Path(d) / "seeds.parquet").exists() else "seeds.parquet/"
    return "\n".join([
        f"{head}; files in {d}/",
        f"  summary.json   final price, reward, traffic per group: the mean over the last {tail}"
        " iterations (10%) and over seeds (the progress bar showed only the last iteration)",
        f"  metrics.csv    {rows}, means over seeds; {seeds}: each seed",
        "  run.json       how the run was made: versions, commit, command, host, devices, times",
        "  published.json the result's identity (iteration, config, checksums): readers check it",
        "  checkpoints/   the last two; continue or extend with: python -m jaxmarket.train "
        f"--resume {d} train.num_iterations=N",
        f"next: python -m jaxmarket.plot {d}",
    ])


__all__ = ["start_run", "resume_run", "final_learner_state", "finish_message",
           "require_new_dir", "restart_in_place", "check_resume_overrides", "RESUME_OVERRIDES"]
