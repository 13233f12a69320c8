"""The chunk loop of a training run (Brax-style): the compiled ``run_chunk`` does many
iterations (all seeds and markets in one program); between chunks the host appends
``metrics.csv`` and the per-seed rows, hands each component its host outputs
(:class:`~jaxmarket.train.components.base.HostOutput`), moves the progress bar, logs to
the tracker, checkpoints every ``checkpoint_every`` chunks
(:mod:`jaxmarket.train.checkpoints`) and checks the stop conditions. Chunk boundaries are
the same on a resume, so on CPU a resumed run is bit-identical to an uninterrupted one.

The seeds x markets are sharded over ``devices`` local devices (``--devices``; default
all, :mod:`jaxmarket.train.devices`), and over every process of a distributed run
(``--distributed``, :mod:`jaxmarket.train.distributed`): then only process 0 writes the
run directory's files, while every process takes part in orbax's checkpoint saves.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxmarket.config.errors import Interrupted
from jaxmarket.train import distributed
from jaxmarket.train.checkpoints import Checkpoints
from jaxmarket.train.devices import Placement, to_host
from jaxmarket.train.loop import Runner, chain, host_outputs, make_train
from jaxmarket.train.metrics import NONFINITE, flatten_metrics, logged, metric_table, seed_rows
from jaxmarket.train.plan import RunPlan
from jaxmarket.train.progress import PROGRESS_EVERY, PlainProgress, progress_bar, show_bar
from jaxmarket.train.rundir import RunDirError, StorageError, describe_os_error, storage_cause
from jaxmarket.train.summary import final_state, write_summary
from jaxmarket.train.tracking import CsvMetrics, Tracker, seed_rows_file

METRICS_FILE = "metrics.csv"
# one row per iteration in which an agent group sent NaN or +-inf actions (created at the
# first such iteration: a run without any has no such file); docs/reliability.md
NONFINITE_FILE = "nonfinite_actions.csv"
# the market's metric families (jaxmarket.train.loop.market_metrics)
MARKET_METRICS = ("reward", "price", "traffic")


class Trainer:
    """Trains a :class:`~jaxmarket.train.plan.RunPlan` into ``run_dir``. ``devices``:
    local devices to shard the seeds x markets over (None: all that divide them); checked
    with everything else before anything compiles."""

    def __init__(self, plan: RunPlan, run_dir: str | Path, devices: int | None = None):
        if not isinstance(plan, RunPlan):
            raise TypeError(f"Trainer takes a RunPlan (jaxmarket.train.plan.resolve(config)), "
                            f"not {type(plan).__name__}")
        self.plan, self.run_dir = plan, Path(run_dir)
        self.config = dict(plan.config)
        self.env, self.params, self.tcfg = plan.env, plan.params, plan.train
        self.learners, self.specs = plan.learners, plan.specs
        self.components = chain(plan)
        # the metric families stop_on_nan watches: the market's and the components'
        self.nan_checked = MARKET_METRICS + tuple(
            m for c in self.components for m in c.nan_checked)
        init, run_chunk = make_train(plan, self.components)
        self.placement = Placement(init, self.specs, self.tcfg, devices)
        # in a distributed run only process 0 writes files (orbax: every process saves)
        self.primary = jax.process_index() == 0
        self._init = self.placement.jit_init(init)
        self._chunks: dict[int, Any] = {}
        self._run_chunk = run_chunk
        self.metrics = CsvMetrics(self.run_dir / METRICS_FILE)
        self.seed_metrics = seed_rows_file(self.run_dir, self.tcfg.seeds_format)
        self.nonfinite = CsvMetrics(self.run_dir / NONFINITE_FILE)
        self.checkpoints = Checkpoints(self.run_dir, self.primary)
        self._compiled: dict[int, Any] = {}
        self.compile_s = 0.0          # compiling the chunk programs, this process's share
        self.run_s = 0.0              # training, compilation excluded
        self.progress_every = PROGRESS_EVERY
        self.done_iters: int | None = None   # the last iteration trained, once training
        self.stopped: str | None = None      # why it stopped early (early stop, NaN)

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
        """The newest checkpoint that restores (iteration 0 without any): see
        :meth:`~jaxmarket.train.checkpoints.Checkpoints.restore`."""
        found = self.checkpoints.restore(self.placement.abstract, report)
        if found is None:
            return self.initial_runner(), 0
        saved, step = found
        return self.placement.put(saved), step

    def save(self, runner: Runner, iteration: int) -> None:
        self.checkpoints.save(runner, iteration)

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
            raise Interrupted(self.checkpoints.latest() or 0, str(self.run_dir)) from None
        except Exception as err:
            cause = storage_cause(err)
            if cause is None:
                raise
            raise self.storage_error(cause) from None
        finally:
            self.checkpoints.close()   # orbax's threads stop on every way out
            if in_main:
                signal.signal(signal.SIGINT, previous)

    def storage_error(self, err: OSError) -> StorageError:
        """One line: what failed, what is kept (the last checkpoint, the rows up to it:
        resume drops the later ones), the command that resumes."""
        try:
            kept = self.checkpoints.latest()
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
            self.nonfinite.truncate_after(start)
        runner, done_iters = start_runner, start
        self.done_iters = start
        # the components' own files (process 0 writes)
        hosts = [(c, h) for c in self.components
                 if (h := c.host(self.plan, self.run_dir)) is not None] if writes else []
        for _, h in hosts:
            h.start(runner, start)
        prefixes = host_outputs(self.components)
        total = tcfg.num_iterations
        chunk_index = start // tcfg.chunk_size
        stopped = None
        t_start, compile_before = time.perf_counter(), self.compile_s
        with progress_bar() as bar:
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
                outputs = {k: metrics.pop(k) for k in list(metrics) if k.startswith(prefixes)} \
                    if prefixes else {}
                for c, h in hosts:
                    h.chunk(runner, {k: v for k, v in outputs.items()
                                     if c.host_prefix and k.startswith(c.host_prefix)},
                            done_iters, length)
                flagged = self._nonfinite_rows(metrics, done_iters)
                stopped = self._stop_reason(self._stop_rows(metrics, done_iters), flagged)
                keep = logged(done_iters, length, tcfg.log_every,
                              last=stopped is not None or done_iters + length >= total)
                last_row = flatten_metrics(metrics, done_iters, [length - 1])[0]
                if writes:
                    self.metrics.append(flatten_metrics(metrics, done_iters, keep))
                    self.seed_metrics.append(seed_rows(metrics, done_iters, keep))
                    self.nonfinite.append(flagged)
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
                    self.save(runner, done_iters)
                if stopped:
                    self.save(runner, done_iters)
                    break
                if interrupted:
                    self.save(runner, done_iters)
                    self.run_s += time.perf_counter() - t_start - (self.compile_s - compile_before)
                    raise Interrupted(done_iters, str(self.run_dir))
        self.run_s += time.perf_counter() - t_start - (self.compile_s - compile_before)
        self.stopped = stopped
        final = final_state(self.plan, runner)   # gathered on every process
        if not writes:   # process 0 writes the summary; the others read it
            distributed.wait_for_primary("summary")
            return json.loads((self.run_dir / "summary.json").read_text())
        self.stage = "writing summary.json"
        try:
            summary = write_summary(self.run_dir, self.env, stopped=stopped,
                                    iterations=done_iters, final=final,
                                    log_every=tcfg.log_every, seeds_format=tcfg.seeds_format,
                                    plan=self.plan)
        except KeyError as err:   # a row file's header edited after --resume checked it
            raise RunDirError(f"run directory error: {self.run_dir / METRICS_FILE} has no "
                              f"column {err} (its header was changed); restore the file, "
                              "then resume with python -m jaxmarket.train --resume "
                              f"{self.run_dir}") from None
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
        checked = [c for k, c in columns.items() if k.split("/")[0] in self.nan_checked]
        if self.tcfg.stop_on_nan and checked:
            bad = ~np.isfinite(np.stack(checked, axis=1)).all(axis=1)
            if bad.any():
                keep.add(int(np.argmax(bad)))
        return flatten_metrics(metrics, start, sorted(keep))

    def _nonfinite_rows(self, metrics: dict, start: int) -> list[dict[str, int]]:
        """``nonfinite_actions.csv`` rows of a chunk: for each iteration in which some
        group sent NaN or +-inf action entries, ``iteration`` and per agent group the
        entries (over the rollout's steps, markets, agents and products)."""
        counts = {k[len(NONFINITE):]: np.asarray(v, np.float64) * self.tcfg.rollout_length
                  for k, v in metrics.items() if k.startswith(NONFINITE)}
        if not counts:
            return []
        table = np.rint(np.stack(list(counts.values()), axis=1)).astype(np.int64)
        return [{"iteration": start + i + 1, **dict(zip(counts, map(int, table[i])))}
                for i in np.flatnonzero(table.any(axis=1))]

    def _stop_reason(self, rows: list[dict[str, float]],
                     flagged: list[dict[str, int]] = ()) -> str | None:
        if self.tcfg.stop_on_nan:
            reasons = []
            for row in rows:
                # market metrics and the components' declared ones only: a learner
                # reports NaN for "no update this iteration", while NaN parameters show
                # up in prices and rewards at once
                bad = [k for k, v in row.items()
                       if k.split("/")[0] in self.nan_checked and not math.isfinite(v)]
                if bad:
                    reasons.append((int(row["iteration"]), f"non-finite metric {bad[0]} at "
                                    f"iteration {int(row['iteration'])}"))
                    break
            if flagged:   # the market kept the actions in force: its metrics stay finite
                it, groups = flagged[0]["iteration"], [(g, n) for g, n in flagged[0].items()
                                                       if g != "iteration" and n]
                reasons.append((it, f"non-finite actions at iteration {it}: " + ", ".join(
                    f"{g} sent {n} NaN/inf action entries" for g, n in groups)
                    + f" (the market kept the actions in force; {NONFINITE_FILE})"))
            if reasons:
                return min(reasons, key=lambda r: r[0])[1]
        rule = self.tcfg.early_stop
        if rule:
            name = rule["metric"]   # a known column: checked by resolve()
            value = rows[-1][name]
            if ("above" in rule and value > rule["above"]) or ("below" in rule and value < rule["below"]):
                return f"early stop: {name}={value:.6g} at iteration {int(rows[-1]['iteration'])}"
        return None


__all__ = ["METRICS_FILE", "Trainer"]
