"""Host side of training: chunks, progress, metrics, checkpoints, early stop, resume.

Brax-style split: the compiled ``run_chunk`` does many iterations (all seeds and
markets in one program); between chunks the host appends ``metrics.csv``, moves the progress bar, logs to
the tracker, writes an orbax checkpoint every ``checkpoint_every`` chunks (orbax writes
to a temporary directory and renames it: atomic) and checks the stop conditions.
``resume(run_dir)`` restores the last checkpoint and replays nothing: chunk boundaries
are the same, so on CPU the result is bit-identical to an uninterrupted run.

The seeds x markets are sharded over ``devices`` local devices (``--devices``; default
all, ``jaxmarket.train.devices``), and over every process of a distributed run
(``--distributed``, ``jaxmarket.train.distributed``): then only process 0 writes the run
directory's files, while every process takes part in orbax's checkpoint saves.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import yaml
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from jaxmarket.config.errors import ConfigError, Interrupted
from jaxmarket.config.loader import load_config
from jaxmarket.train import distributed
from jaxmarket.train.config import TrainConfig
from jaxmarket.train.devices import Placement, to_host
from jaxmarket.train.loop import Runner, make_train
from jaxmarket.train.metrics import flatten_metrics, logged, metric_table, seed_rows
from jaxmarket.train.pbt import CSV_COLUMNS as PBT_COLUMNS, PREFIX as PBT_PREFIX
from jaxmarket.train.pbt import event_rows
from jaxmarket.train.plan import RunPlan, resolve
from jaxmarket.train.rundir import (RunDirError, StorageError, check_config_record, check_rows,
                                    describe_os_error, is_empty, lock_dir, read_run_config,
                                    storage_cause, write_config_record)
from jaxmarket.train.summary import final_state, write_summary
from jaxmarket.train.tracking import CsvMetrics, ParquetRows, Tracker, seed_rows_file, with_tracker

RUN_RECORD = "run.json"
# plain progress lines (stdout not a terminal): seconds between lines
PROGRESS_EVERY = 30.0


def _saveable(tree: Any) -> dict:
    """Runner -> flat dict of its non-empty leaves (orbax refuses zero-size arrays)."""
    return {f"leaf{i:05d}": x for i, x in enumerate(jax.tree.leaves(tree)) if x.size > 0}


def _unsaveable(saved: dict, target: Any) -> Any:
    leaves, treedef = jax.tree.flatten(target)
    out = [saved[f"leaf{i:05d}"] if x.size > 0 else jnp.zeros(x.shape, x.dtype)
           for i, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, out)


def _assignment_members(runner: Runner, dynamic: dict, tcfg: TrainConfig
                        ) -> dict[str, np.ndarray]:
    """``{group: [S, E, A]}`` the member driving each market slot under the runner's
    current assignment (a resampled or custom mapping): ``layout[scatter[i] mod E A]``."""
    out = {}
    for g, pop in dynamic.items():
        scatter = to_host(runner.assignment[g][1])
        n = scatter.size // tcfg.num_seeds
        layout = pop.layout(tcfg.num_envs, n // tcfg.num_envs)
        out[g] = layout[scatter % n].reshape(tcfg.num_seeds, tcfg.num_envs, -1)
    return out


def _mapping_rows(members: dict[str, np.ndarray], iteration: int) -> list[dict]:
    """``mapping.csv`` rows: from ``iteration`` on, market ``market`` of seed ``seed`` has
    its agents driven by ``members`` (space-separated, agent order)."""
    return [{"iteration": iteration, "group": g, "seed": s, "market": e,
             "members": " ".join(str(int(k)) for k in m[s, e])}
            for g, m in members.items() for s in range(m.shape[0]) for e in range(m.shape[1])]


def show_bar() -> bool:
    """The rich progress bar on a terminal (or with ``JAXMARKET_PROGRESS=1``); plain
    lines otherwise."""
    return os.isatty(2) or os.environ.get("JAXMARKET_PROGRESS") == "1"


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PlainProgress:
    """Progress as plain lines on stdout, for logs (stdout not a terminal): one when a
    chunk program is compiled, then at most one every ``every`` seconds (and at the
    end): ``iteration 2500/10000 (25%), 1,234 it/s, 5,678 env-steps/s, ETA 0:01:02,
    reward sellers=0.2345``. ``every``: ``--progress-every`` (default 30 s)."""

    def __init__(self, total: int, done: int, every: float, enabled: bool):
        self.total, self.every, self.enabled = total, every, enabled
        self.last = time.monotonic()

    def say(self, line: str) -> None:
        if self.enabled:
            print(line, flush=True)

    def update(self, done: int, its: float, steps: float, reward: str) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.every and done < self.total):
            return
        self.last = now
        eta = (self.total - done) / its if its > 0 else float("inf")
        self.say(f"iteration {done}/{self.total} ({100 * done / self.total:.0f}%), "
                 f"{its:,.0f} it/s, {steps:,.0f} env-steps/s, ETA "
                 f"{_clock(eta) if math.isfinite(eta) else '?'}"
                 + (f", reward {reward}" if reward else ""))


class Trainer:
    """Trains a :class:`~jaxmarket.train.plan.RunPlan` (or a config, resolved here) into
    ``run_dir``. ``devices``: local devices to shard the seeds x markets over (None: all
    that divide them); checked with everything else before anything compiles."""

    def __init__(self, plan: RunPlan | dict, run_dir: Path, devices: int | None = None):
        self.plan = plan if isinstance(plan, RunPlan) else resolve(plan)
        self.config, self.run_dir = dict(self.plan.config), Path(run_dir)
        self.env, self.params, self.tcfg = self.plan.env, self.plan.params, self.plan.train
        self.learners, self.specs = self.plan.learners, self.plan.specs
        init, run_chunk = make_train(self.plan)
        self.placement = Placement(init, self.specs, self.tcfg, devices)
        # in a distributed run only process 0 writes files (orbax: every process saves)
        self.primary = jax.process_index() == 0
        self._init = self.placement.jit_init(init)
        self._chunks: dict[int, Any] = {}
        self._run_chunk = run_chunk
        self.metrics = CsvMetrics(self.run_dir / "metrics.csv")
        self.seed_metrics = seed_rows_file(self.run_dir, self.tcfg.seeds_format)
        self.pbt_events = CsvMetrics(self.run_dir / "pbt.csv")
        self.mapping_log = CsvMetrics(self.run_dir / "mapping.csv")
        self._ckpt = None
        self._compiled: dict[int, Any] = {}
        self.compile_s = 0.0          # compiling the chunk programs, this process's share
        self.run_s = 0.0              # training, compilation excluded
        self.progress_every = PROGRESS_EVERY

    @property
    def ckpt(self) -> ocp.CheckpointManager:
        # created on first use: a Trainer that fails validation leaves no directory behind
        # a distributed run: every process calls save() with its shards, orbax's primary
        # host (process 0) creates the directory, writes the metadata and commits the step
        # (the run directory must be storage every process sees)
        if self._ckpt is None:
            self._ckpt = ocp.CheckpointManager(
                (self.run_dir / "checkpoints").absolute(),
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=2, create=True, enable_async_checkpointing=False,
                    multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=0)))
        return self._ckpt

    def chunk_fn(self, length: int):
        if length not in self._chunks:
            # the runner is donated: XLA updates the learners' buffers in place (without
            # donation it copied a bandit's whole sample buffer on every step); sharded
            # over the placement's devices, metrics replicated
            self._chunks[length] = self.placement.jit_chunk(
                lambda r: self._run_chunk(r, length))
        return self._chunks[length]

    def compiled_chunk(self, length: int, runner: Runner, report: Callable[[str], None]):
        """The chunk program of ``length`` iterations compiled ahead of time (the same
        program ``chunk_fn`` runs), timed into ``compile_s``; ``report`` gets one line
        when it is compiled."""
        if length not in self._compiled:
            t0 = time.perf_counter()
            self._compiled[length] = self.chunk_fn(length).lower(runner).compile()
            dt = time.perf_counter() - t0
            self.compile_s += dt
            report(f"compiled the {length}-iteration chunk in {dt:.1f} s")
        return self._compiled[length]

    def initial_runner(self) -> Runner:
        return self._init(jax.random.key(self.plan.seed))

    def restore(self, report=print) -> tuple[Runner, int]:
        """The newest checkpoint that restores (iteration 0 without any). One that cannot
        be restored (truncated, a file missing, empty) is reported in one line and
        removed, and the next older one is tried; none restorable: RunDirError."""
        target = self.placement.abstract   # shapes with shardings: restored in place
        steps = sorted(self.ckpt.all_steps(), reverse=True)
        if not steps:
            return self.initial_runner(), 0
        bad = []
        for step in steps:
            try:
                saved = self.ckpt.restore(step, args=ocp.args.StandardRestore(_saveable(target)))
            except Exception as err:   # orbax/tensorstore raise many types for damaged files
                why = " ".join(f"{type(err).__name__}: {err}".split())
                bad.append((int(step), why[:120] + ("..." if len(why) > 120 else "")))
                self._ckpt = None   # a failed restore can leave the manager confused
                continue
            if bad:
                self._drop_checkpoints([s for s, _ in bad])
                report(f"checkpoint at iteration {bad[0][0]} cannot be restored ({bad[0][1]})"
                       + "".join(f"; nor the one at {s}" for s, _ in bad[1:])
                       + f"; removed, resuming from the one at iteration {int(step)}")
            return self.placement.put(_unsaveable(saved, target)), int(step)
        raise RunDirError(
            f"run directory error: no checkpoint in {self.run_dir / 'checkpoints'} can be "
            f"restored (iteration {bad[0][0]}: {bad[0][1]}" + "".join(
                f"; iteration {s}: {why}" for s, why in bad[1:]) + "); start the run again: python -m "
            f"jaxmarket.train {self.run_dir / 'config.yaml'} --run-dir NEW_DIR")

    def _drop_checkpoints(self, steps: list[int]) -> None:
        if self.primary:
            for step in steps:
                shutil.rmtree(self.run_dir / "checkpoints" / str(step), ignore_errors=True)
        self._ckpt = None   # a manager that has not seen them

    def _save(self, runner: Runner, iteration: int) -> None:
        if self.ckpt.latest_step() != iteration:
            self.ckpt.save(iteration, args=ocp.args.StandardSave(_saveable(runner)))
            self.ckpt.wait_until_finished()

    def train(self, tracker: Tracker, start_runner: Runner, start: int) -> dict:
        """Chunks from iteration ``start`` to ``num_iterations``. Ctrl-C (SIGINT) lets the
        running chunk finish, checkpoints it and raises :class:`Interrupted`; a second
        Ctrl-C stops at once (the last checkpoint stands)."""
        interrupted = []

        def on_sigint(signum, frame):
            if interrupted:
                raise KeyboardInterrupt
            interrupted.append(signum)

        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
        self.stage = "preparing the run directory's files"
        try:
            return self._train(tracker, start_runner, start, interrupted)
        except KeyboardInterrupt:
            raise Interrupted(self.ckpt.latest_step() or 0, str(self.run_dir)) from None
        except Exception as err:
            cause = storage_cause(err)
            if cause is None:
                raise
            raise self.storage_error(cause) from None
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous)

    def storage_error(self, err: OSError) -> StorageError:
        """One line: what failed, what is kept (the last checkpoint, the rows up to it:
        resume drops the later ones), the command that resumes."""
        try:
            kept = self.ckpt.latest_step()
        except Exception:   # the manager itself may fail on the broken storage
            kept = None
        what = (f"the checkpoint at iteration {kept} and the metrics.csv/seeds.csv rows up to "
                "it" if kept is not None else "no checkpoint yet (resume starts at iteration 0)")
        return StorageError(f"storage error while {self.stage}: {describe_os_error(err)}; kept: "
                            f"{what}; free space or fix the permissions, then resume with "
                            f"python -m jaxmarket.train --resume {self.run_dir}")

    def _train(self, tracker: Tracker, start_runner: Runner, start: int,
               interrupted: list) -> dict:
        tcfg = self.tcfg
        writes = self.primary   # only process 0 writes files
        if writes:
            self.metrics.truncate_after(start)
            self.seed_metrics.truncate_after(start)
        if self.plan.pbt and writes:
            self.pbt_events.truncate_after(start)
            if not self.pbt_events.path.exists():   # the header, even before any event
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.pbt_events.path.write_text(",".join(PBT_COLUMNS) + "\n")
        runner, done_iters = start_runner, start
        self.done_iters = start
        dynamic = {g: p for g, p in self.plan.populations.items() if p is not None and p.dynamic}
        if dynamic:
            logged_members = _assignment_members(runner, dynamic, tcfg)
            if writes:
                self.mapping_log.truncate_after(start)
            if start == 0 and writes:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.mapping_log.append(_mapping_rows(logged_members, 0))
        total = tcfg.num_iterations
        chunk_index = start // tcfg.chunk_size
        stopped = None
        t_start, compile_before = time.perf_counter(), self.compile_s
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} it"),
                      TextColumn("{task.fields[speed]}"), TextColumn("{task.fields[reward]}"),
                      TimeElapsedColumn(), TimeRemainingColumn(),
                      disable=not show_bar()) as bar:
            task = bar.add_task("training", total=total, completed=done_iters, speed="", reward="")
            lines = PlainProgress(total, done_iters, self.progress_every,
                                  enabled=writes and not show_bar())
            while done_iters < total:
                length = min(tcfg.chunk_size, total - done_iters)
                chunk = self.compiled_chunk(length, runner, lines.say)
                t0 = time.perf_counter()
                runner, metrics = chunk(runner)
                metrics = jax.tree.map(to_host, metrics)   # replicated: every process
                dt = time.perf_counter() - t0
                self.stage = f"appending the rows of iterations {done_iters + 1}-" \
                             f"{done_iters + length}"
                events = {k: metrics.pop(k) for k in list(metrics) if k.startswith(PBT_PREFIX)}
                if events and writes:
                    self.pbt_events.append(event_rows(events, done_iters))
                if dynamic:   # the assignment in force after this chunk, when it changed
                    now = _assignment_members(runner, dynamic, tcfg)
                    changed = {g: m for g, m in now.items()
                               if not np.array_equal(m, logged_members[g])}
                    if writes:
                        self.mapping_log.append(_mapping_rows(changed, done_iters + length))
                    logged_members = now
                stopped = self._stop_reason(self._stop_rows(metrics, done_iters))
                keep = logged(done_iters, length, tcfg.log_every,
                              last=stopped is not None or done_iters + length >= total)
                last_row = flatten_metrics(metrics, done_iters, [length - 1])[0]
                if writes:
                    self.metrics.append(flatten_metrics(metrics, done_iters, keep))
                    self.seed_metrics.append(seed_rows(metrics, done_iters, keep))
                    tracker.log(last_row["iteration"],
                                {k: v for k, v in last_row.items() if k != "iteration"})
                done_iters += length
                self.done_iters = done_iters
                chunk_index += 1
                steps = length * tcfg.rollout_length * tcfg.num_envs * tcfg.num_seeds
                rewards = {k: v for k, v in last_row.items() if k.startswith("reward/")}
                reward_text = " ".join(f"{k[7:]}={v:.4g}" for k, v in rewards.items())
                bar.update(task, completed=done_iters, speed=f"{steps / dt:,.0f} env-steps/s",
                           reward=reward_text)
                lines.update(done_iters, length / dt, steps / dt, reward_text)
                self.stage = f"saving the checkpoint at iteration {done_iters}"
                if chunk_index % tcfg.checkpoint_every == 0 or done_iters >= total:
                    self._save(runner, done_iters)
                if stopped:
                    self._save(runner, done_iters)
                    break
                if interrupted:
                    self._save(runner, done_iters)
                    self.run_s += time.perf_counter() - t_start - (self.compile_s - compile_before)
                    raise Interrupted(done_iters, str(self.run_dir))
        self.run_s += time.perf_counter() - t_start - (self.compile_s - compile_before)
        self.stopped = stopped
        final = final_state(self.plan, runner)   # gathered on every process
        if not writes:   # process 0 writes the summary; the others read it
            distributed.wait_for_primary("summary")
            return json.loads((self.run_dir / "summary.json").read_text())
        self.stage = "writing summary.json"
        summary = write_summary(self.run_dir, self.env, stopped=stopped, iterations=done_iters,
                                final=final, log_every=tcfg.log_every,
                                seeds_format=tcfg.seeds_format, plan=self.plan)
        tracker.artifact(self.run_dir / "summary.json")
        tracker.artifact(self.run_dir / "metrics.csv")
        if jax.process_count() > 1:
            distributed.wait_for_primary("summary")
        return summary

    def _stop_rows(self, metrics: dict, start: int) -> list[dict[str, float]]:
        """The rows of a chunk the stop rules need: its first row with a non-finite
        market or model metric (``stop_on_nan``) and its last row (``early_stop``)."""
        columns = metric_table(metrics)
        n = len(next(iter(columns.values())))
        keep = {n - 1}
        checked = [c for k, c in columns.items()
                   if k.split("/")[0] in ("reward", "price", "traffic", "model")]
        if self.tcfg.stop_on_nan and checked:
            bad = ~np.isfinite(np.stack(checked, axis=1)).all(axis=1)
            if bad.any():
                keep.add(int(np.argmax(bad)))
        return flatten_metrics(metrics, start, sorted(keep))

    def _stop_reason(self, rows: list[dict[str, float]]) -> str | None:
        if self.tcfg.stop_on_nan:
            for row in rows:
                # market metrics and external models' (model/...) only: a learner reports
                # NaN for "no update this iteration", while NaN parameters show up in
                # prices and rewards at once
                bad = [k for k, v in row.items()
                       if k.split("/")[0] in ("reward", "price", "traffic", "model")
                       and not math.isfinite(v)]
                if bad:
                    return f"non-finite metric {bad[0]} at iteration {int(row['iteration'])}"
        rule = self.tcfg.early_stop
        if rule:
            name = rule["metric"]   # a known column: checked by resolve()
            value = rows[-1][name]
            if ("above" in rule and value > rule["above"]) or ("below" in rule and value < rule["below"]):
                return f"early stop: {name}={value:.6g} at iteration {int(rows[-1]['iteration'])}"
        return None


# ------------------------------------------------------------------ run.json

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


def run_record(trainer: Trainer, command: str | None, start: int) -> dict:
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


def _write_record(run_dir: Path, segments: list[dict]) -> dict:
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


def _finish_record(trainer: Trainer, segments: list[dict], status: str) -> None:
    """The latest segment's times, last iteration and status (best effort: a run that
    failed on full storage keeps the record it has)."""
    segments[-1].update(compile_s=round(trainer.compile_s, 3), run_s=round(trainer.run_s, 3),
                        end_iteration=getattr(trainer, "done_iters", None), status=status)
    try:
        _write_record(trainer.run_dir, segments)
    except OSError:
        pass


def _status(trainer: Trainer, err: BaseException | None) -> str:
    if isinstance(err, Interrupted):
        return "interrupted"
    if err is not None:
        return "failed"
    return "stopped" if getattr(trainer, "stopped", None) else "finished"


def _train_recorded(trainer: Trainer, tracker: str, mongo_url: str | None, config: dict,
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


def _write_config(run_dir: Path, config: dict) -> None:
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(run_dir / "config.yaml")


def require_new_dir(run_dir: str | Path, resume: str) -> Path:
    """``run_dir`` as a Path if it is new or empty, else a ``--run-dir`` config error
    saying how to continue it (``resume`` + the directory)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and (not run_dir.is_dir() or not is_empty(run_dir)):
        raise ConfigError("--run-dir", str(run_dir),
                          f"a new or empty directory (to continue {resume} {run_dir})")
    return run_dir


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
    run_dir = require_new_dir(run_dir, "that run: python -m jaxmarket.train --resume")
    trainer = Trainer(plan, run_dir, devices)
    if progress_every is not None:
        trainer.progress_every = progress_every
    _synchronised("validated")   # every process checked the directory before it exists
    lock = lock_dir(run_dir) if trainer.primary else None
    segments = [run_record(trainer, command, 0)] if trainer.primary else []
    try:
        if lock is not None:
            lock.acquire()   # creates the directory
            require_new_dir(run_dir, "that run: python -m jaxmarket.train --resume")   # a race
            try:
                _write_config(run_dir, config)
                write_config_record(run_dir, config)
                _write_record(run_dir, segments)
            except OSError as err:
                if storage_cause(err) is None:
                    raise
                raise StorageError(f"storage error while writing {run_dir}/config.yaml: "
                                   f"{describe_os_error(err)}; nothing was trained") from None
            print(f"run directory: {run_dir}" + _placement_note(trainer))
        _synchronised("run-dir")
        summary = _train_recorded(trainer, tracker, mongo_url, config,
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
               command: str | None = None, progress_every: float | None = None) -> dict:
    """Continue ``run_dir`` from its last checkpoint (from iteration 0 if it has none).
    ``overrides`` may extend or shorten the run (``train.num_iterations=N``, at least the
    checkpointed iteration) and change its stop rules; they are saved to its config.yaml.
    ``devices`` may differ from the interrupted run's (a checkpoint holds whole arrays).
    ``run.json`` keeps the first invocation's record and gains this one as a segment."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError("--resume", str(run_dir), "an existing run directory")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("--resume", str(run_dir), "a run directory holding config.yaml "
                          "(this one has none: the run never started; start it with python -m "
                          f"jaxmarket.train CONFIG --run-dir {run_dir})")
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key not in RESUME_OVERRIDES:
            raise ConfigError("--resume overrides", item, "only " + ", ".join(RESUME_OVERRIDES)
                              + " (everything else is fixed by the run's config.yaml)")
    lock = lock_dir(run_dir) if jax.process_index() == 0 else None
    try:
        if lock is not None:
            lock.acquire()
        return _resume_locked(run_dir, tracker, mongo_url, list(overrides), devices,
                              command, progress_every)
    finally:
        if lock is not None:
            lock.release()


def _resume_locked(run_dir: Path, tracker: str, mongo_url: str | None, overrides: list[str],
                   devices: int | None, command: str | None = None,
                   progress_every: float | None = None) -> dict:
    extended = check_config_record(run_dir, read_run_config(run_dir), RESUME_OVERRIDES)
    if extended and jax.process_index() == 0:
        print(f"note: config.yaml changed {', '.join(extended)} since the run started "
              "(settings --resume may change)")
    config = load_config(run_dir / "config.yaml", overrides)
    _agree(config, str(run_dir), devices=devices, resume=True)
    trainer = Trainer(config, run_dir, devices)
    runner, start = trainer.restore(print if trainer.primary else lambda line: None)
    if trainer.tcfg.num_iterations < start:
        raise ConfigError("train.num_iterations", trainer.tcfg.num_iterations,
                          f"an integer >= {start} (the run's last checkpoint)")
    if progress_every is not None:
        trainer.progress_every = progress_every
    previous = read_run_record(run_dir) if trainer.primary else None
    if trainer.primary:   # every row up to the checkpoint, or the summary would be wrong
        # the largest row interval any invocation used (auto grows with num_iterations, by
        # powers of ten: they nest)
        every = max([trainer.tcfg.log_every] + [int(s.get("log_every", 1)) for s in
                                                (previous or {}).get("segments", [])])
        check_rows(run_dir / "metrics.csv", start, 1, run_dir, every)
        if isinstance(trainer.seed_metrics, ParquetRows):
            _check_parquet_rows(trainer.seed_metrics, start, trainer.tcfg.num_seeds, run_dir,
                                every)
        else:
            check_rows(run_dir / "seeds.csv", start, trainer.tcfg.num_seeds, run_dir, every)
    _synchronised("restored")
    if trainer.primary:
        try:
            if overrides:
                _write_config(run_dir, config)
            write_config_record(run_dir, config)   # the config it continues with
        except OSError as err:
            if storage_cause(err) is None:
                raise
            raise StorageError(f"storage error while writing {run_dir}/config.yaml: "
                               f"{describe_os_error(err)}; the run is as it was; resume with "
                               f"python -m jaxmarket.train --resume {run_dir}") from None
        print((f"resuming {run_dir} from iteration {start}" if start else
               f"no checkpoint in {run_dir}: starting it from iteration 0")
              + _placement_note(trainer))
    segments = []
    if trainer.primary:
        segments = (previous or {}).get("segments", []) + [run_record(trainer, command, start)]
        try:
            _write_record(run_dir, segments)
        except OSError:
            pass   # the trainer's first write names a storage fault
    summary = _train_recorded(trainer, tracker, mongo_url, config, runner, start, segments)
    return {**summary, "run_dir": str(run_dir)}


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
    trainer = Trainer(config, Path(run_dir))
    runner, _ = trainer.restore()
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
        "  checkpoints/   the last two; continue or extend with: python -m jaxmarket.train "
        f"--resume {d} train.num_iterations=N",
        f"next: python -m jaxmarket.plot {d}",
    ])


__all__ = ["start_run", "resume_run", "final_learner_state", "finish_message", "Trainer",
           "TrainConfig", "RunPlan", "resolve", "read_run_record", "git_commit"]
