"""A session-engine run as a run directory: what ``python -m jaxmarket.train`` does
when ``train.engine`` resolves to ``sessions``.

The train settings map onto the engine: ``train.num_seeds`` sessions (each one
independent run of the design, as the papers' sessions), at most ``train.num_iterations``
periods each (``train.rollout_length`` must be 1: one period per update),
``train.chunk_size`` periods per compiled chunk, a checkpoint every
``train.checkpoint_every`` chunks, ``train.session_stop`` (``converged``: every session
stops at its learner's convergence rule, as in Calvano et al.; ``periods``: every
session plays all periods), ``train.session_window`` (the played-profit window at the
end of a ``periods`` run), ``train.session_backend`` (``auto | xla | kernel``,
:mod:`jaxmarket.sessions.engine`) and ``train.session_outcome_benchmarks`` (with random
period outcomes, also Delta against each outcome's own benchmarks). The sessions' key is
``jax.random.key(seed)``.

The run directory::

    config.yaml     the resolved config (what --resume continues)
    run.json        versions, commit, command, host, backend, times
    summary.json    engine, backend, profit_gain[group] (Delta of the converged greedy
                    cycle, its 95% CI), benchmarks[group] (pi_N, pi_M and how),
                    convergence (share, periods), per-session distributions
    sessions.csv    one row per session: converged, convergence period, cycle length,
                    cycle prices and profits per seller, greedy prices and fees at the
                    final profile, Delta, and (where every session played the last
                    train.session_window periods) the played profits and their Delta,
                    and with train.session_outcome_benchmarks (random outcomes)
                    profit_gain_outcomes, Delta against the expected informed
                    benchmarks (summary.json outcome_benchmarks)
    strategies.npz  every session's final Q tables and greedy strategies
                    (python -m jaxmarket.impulse RUN)
    checkpoints/    the sessions after a chunk (orbax), resumed bit for bit
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import platform
import shlex
import socket
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jaxmarket.config.errors import ConfigError, Interrupted
from jaxmarket.learners.equilibrium import benchmarks, equilibrium, outcome_benchmarks
from jaxmarket.sessions import engine as eng
from jaxmarket.learners.qlearning import obs_grid_of
from jaxmarket.sessions.diagnostics import Diagnostics, diagnose
from jaxmarket.sessions.game import SessionGame, check_game, make_game
from jaxmarket.sessions.memory import estimate as estimate_memory
from jaxmarket.sessions.warmup import kernel_candidate, learner_kinds, wait_children
from jaxmarket.train.checkpoints import Checkpoints
from jaxmarket.train.config import resolve_train
from jaxmarket.train.memory import MemoryEstimate, check_memory
from jaxmarket.train.plan import RunPlan, check_work_budget, resolve
from jaxmarket.train.provenance import RUN_RECORD, git_commit
from jaxmarket.train.publish import Publication, staged_name
from jaxmarket.train.run import check_resume_overrides as _check_overrides
from jaxmarket.train.run import changes_note, earlier_changes, require_new_dir, restart_in_place
from jaxmarket.train.rundir import (
    SESSIONS_FILE,
    STRATEGIES_FILE,
    StorageError,
    check_config_record,
    config_changes,
    config_text,
    describe_os_error,
    has_checkpoint,
    lock_dir,
    read_run_config,
    resume_storage_error,
    start_storage_error,
    started_config,
    storage_cause,
    unhonoured,
    write_config_record,
)

#: what ``--resume DIR key=value`` may change in a sessions run
RESUME_OVERRIDES = ("train.num_iterations", "train.checkpoint_every")


# ------------------------------------------------------------------ which engine

def session_plan(config: dict) -> RunPlan:
    """The plan of one session (``train.num_seeds: 1``): the market and the learner's
    settings the tables are made from; the run's own size is never built, nor the
    training loop traced. Its ``train`` is the run's own settings; its ``memory`` is None
    (the sessions estimate needs the game: :func:`memory`)."""
    small = {**config, "train": {**(config.get("train") or {}), "num_seeds": 1,
                                 "num_envs": 1, "chunk_size": 1}}
    plan = resolve(small, validate_only=True, estimate_memory=False)
    tcfg = resolve_train(config.get("train"))
    check_work_budget(plan.env, plan.learner_config, tcfg)   # the run's own sizes
    return dataclasses.replace(plan, train=tcfg, memory=None, traced=None)


def memory(game: SessionGame, tcfg) -> MemoryEstimate:
    """The sessions run's memory estimate (:mod:`jaxmarket.sessions.memory`), refused
    with a ConfigError when it cannot fit."""
    est = estimate_memory(game, tcfg.num_seeds)
    check_memory(est)
    return est


def warm_kernel(config: dict) -> None:
    """Where a loaded config may run on the session engine's kernel
    (:func:`jaxmarket.sessions.warmup.kernel_candidate`) and JAX is on a CPU, start
    compiling the kernel's loop of Calvano et al.'s learner on a thread
    (:func:`jaxmarket.sessions.kernel.precompile`), so that it overlaps what the run
    does before its first chunk. Only the commands that train call it."""
    if not kernel_candidate(config) or jax.default_backend() != "cpu":
        return
    from jaxmarket.sessions.kernel import precompile
    precompile(after=wait_children)


def choose_engine(config: dict) -> tuple[str, str | None, RunPlan | None]:
    """``(engine, reason, plan)`` for a loaded config: ``train.engine`` (``auto``:
    sessions wherever :func:`~jaxmarket.sessions.game.check_game` accepts the design,
    with ``reason`` saying why not otherwise); ``plan`` the one-session plan when the
    engine is sessions. ``sessions`` on a design it cannot play is a ConfigError."""
    tcfg = resolve_train(config.get("train"))
    if tcfg.engine == "loop":
        return "loop", None, None
    reason, plan = None, None
    kinds = learner_kinds(config)
    if any(k != "q_learning" for k in kinds.values()) or not kinds:
        reason = ("the session engine plays q_learning sellers; learners: " +
                  ", ".join(f"{g} {k}" for g, k in kinds.items()))
    elif tcfg.rollout_length != 1 or tcfg.num_envs != 1:
        reason = "the session engine steps one period per update of one market (train." \
                 "rollout_length: 1, train.num_envs: 1)"
    elif tcfg.schedule is not None or tcfg.early_stop is not None:
        reason = "train.schedule and train.early_stop run in the loop"
    else:
        plan = session_plan(config)
        try:
            check_game(plan)
        except ValueError as err:
            reason = str(err).removeprefix("session engine: ")
    if reason is None:
        return "sessions", None, plan
    if tcfg.engine == "sessions":
        raise ConfigError("train.engine", "sessions", f"auto or loop for this design "
                          f"({reason})")
    return "loop", reason, None


# ------------------------------------------------------------------ the run

def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _plain(sessions: eng.Sessions) -> eng.Sessions:
    """The sessions as checkpoints hold them: the keys as their data."""
    return sessions._replace(key=jax.random.key_data(sessions.key))


class SessionRun:
    """One sessions run directory (module docstring)."""

    def __init__(self, config: dict, plan: RunPlan, run_dir: Path):
        self.config, self.plan, self.run_dir = config, plan, Path(run_dir)
        self.tcfg = resolve_train(config.get("train"))
        self.seed = int(config.get("seed", 0))
        self.game: SessionGame = make_game(plan)
        self.memory = memory(self.game, self.tcfg)
        self.settings = eng.Settings(
            sessions=self.tcfg.num_seeds, periods=self.tcfg.num_iterations,
            chunk=self.tcfg.chunk_size, stop=self.tcfg.session_stop,
            window=self.tcfg.session_window, backend=self.tcfg.session_backend)
        self.runner = eng.Runner(self.game, self.settings)
        self.checkpoints = Checkpoints(self.run_dir)
        self.progress_every = 30.0

    def initial(self) -> tuple[eng.Sessions, int]:
        return eng.init_sessions(self.game, self.settings.sessions,
                                 jax.random.key(self.seed)), 0

    def restore(self) -> tuple[eng.Sessions, int]:
        like, _ = self.initial()
        found = self.checkpoints.restore(_plain(like))
        if found is None:
            return like, 0
        saved, step = found
        return saved._replace(key=jax.random.wrap_key_data(saved.key)), step

    def save(self, sessions: eng.Sessions, done: int) -> None:
        self.checkpoints.save(_plain(sessions), done)

    def record(self, command: str | None, start: int) -> dict:
        commit, dirty = git_commit()
        device = jax.local_devices()[0]
        return {"engine": "sessions", "backend": self.runner.backend,
                "jaxmarket_version": _version("jaxmarket"), "jax_version": jax.__version__,
                "python_version": platform.python_version(), "git_commit": commit,
                "git_dirty": dirty,
                "command": command if command is not None else shlex.join(sys.argv),
                "host": socket.gethostname(),
                "devices": {"platform": device.platform, "kind": device.device_kind},
                "seed": self.seed, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "start_period": start, "end_period": None, "wall_s": None,
                "status": "running"}

    def write_record(self, segments: list[dict]) -> None:
        record = {**segments[0], "status": segments[-1]["status"],
                  "end_period": segments[-1]["end_period"],
                  "wall_s": round(sum(s["wall_s"] or 0.0 for s in segments), 3),
                  "segments": segments}
        _atomic_text(self.run_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")

    def train(self, sessions: eng.Sessions, done: int, segments: list[dict],
              play: Any = None) -> dict:
        """Chunks from period ``done`` until the engine stops; the run's files.
        ``play(sessions, done) -> (sessions, done)``: the sessions played elsewhere to
        where the engine stops (blocks on a Ray cluster, :mod:`jaxmarket.cluster.blocks`),
        checkpointed once at the end."""
        started = last = time.perf_counter()
        first, chunks, every = done, 0, self.tcfg.checkpoint_every
        status = "failed"
        self.stage = "training"
        last_save = None   # the last checkpoint: saved while strategies.npz is written
        try:
            if play is not None:
                sessions, done = play(sessions, done)
                self.stage = f"saving the checkpoint at period {done}"
                self.save(sessions, done)
            while not self.runner.finished(sessions, done):
                sessions, done = self.runner.advance(sessions, done)
                chunks += 1
                if self.runner.finished(sessions, done):
                    last_save = (sessions, done)
                elif chunks % every == 0:
                    self.stage = f"saving the checkpoint at period {done}"
                    self.save(sessions, done)
                    self.stage = "training"
                now = time.perf_counter()
                if now - last >= self.progress_every or self.runner.finished(sessions, done):
                    last = now
                    converged = float(np.mean(np.asarray(sessions.learner.converged)))
                    elapsed = max(now - started, 1e-9)
                    print(f"period {done:>11,d}  sessions converged {converged:6.1%}  "
                          f"{(done - first) / elapsed:,.0f} periods/s  "
                          f"{self.runner.session_periods / elapsed:,.0f} session-periods/s  "
                          f"{now - started:7.1f} s", flush=True)
            wall = time.perf_counter() - started
            self.stage = "writing sessions.csv, strategies.npz and summary.json"
            summary = self.write_outputs(lambda: self.runner.result(sessions, done, wall),
                                         last_save)
            status = "finished"
            return summary
        except KeyboardInterrupt:
            status = "interrupted"
            raise Interrupted(f"interrupted; continue with: python -m jaxmarket.train "
                              f"--resume {self.run_dir}") from None
        except Exception as err:
            cause = storage_cause(err)
            if cause is None:
                raise
            raise self.storage_error(cause) from None
        finally:
            self.checkpoints.close()   # orbax's threads stop on every way out
            segments[-1].update(end_period=done, status=status,
                                wall_s=round(time.perf_counter() - started, 3))
            try:
                self.write_record(segments)
            except OSError:
                pass

    def storage_error(self, err: OSError) -> StorageError:
        """One line: what failed, what is kept, the command that resumes."""
        try:
            kept = self.checkpoints.latest()
        except Exception:   # the manager itself may fail on the broken storage
            kept = None
        what = (f"the checkpoint at period {kept}" if kept is not None else
                "no checkpoint yet (resume starts at period 0)")
        return StorageError(f"storage error while {self.stage}: {describe_os_error(err)}; "
                            f"kept: {what}; free space or fix the permissions, then resume "
                            f"with python -m jaxmarket.train --resume {self.run_dir}")

    # -------------------------------------------------------------- outputs

    def benchmarks(self) -> dict:
        """pi_N, pi_M of the group and how they were computed
        (:func:`jaxmarket.learners.equilibrium.benchmarks`)."""
        eq = equilibrium(self.plan).get(self.game.group)
        return {} if eq is None else benchmarks(eq)

    def write_outputs(self, make_result: Callable[[], eng.SessionResult],
                      last_save: tuple | None = None) -> dict:
        """The run's files from ``make_result()`` (the sessions' greedy play:
        :meth:`~jaxmarket.sessions.engine.Runner.result`). ``last_save``:
        ``(sessions, period)`` of the last checkpoint, saved meanwhile, before the files
        are published."""
        bench = self.benchmarks()
        # on threads while the checkpoint is saved (XLA, numba, zlib and numpy release
        # the GIL): the greedy play, then strategies.npz (staged, then published with the
        # others) and the equilibrium check
        with ThreadPoolExecutor(2) as pool:
            made = pool.submit(make_result)
            written = pool.submit(lambda: write_strategies(
                self.run_dir / staged_name(STRATEGIES_FILE), made.result(), bench))
            checked = pool.submit(lambda: self.equilibrium_check(made.result()))
            if last_save is not None:   # orbax on this thread (its lazy imports)
                self.stage = f"saving the checkpoint at period {last_save[1]}"
                self.save(*last_save)
                self.stage = "writing sessions.csv, strategies.npz and summary.json"
            return self._write_outputs(made.result(), bench, written, checked)

    def equilibrium_check(self, result: eng.SessionResult) -> Diagnostics | str:
        """The equilibrium check and Q-gap of the learned strategies (:func:`diagnostics`)."""
        rows = np.asarray(result.sessions.learner.rows)   # float32: the check reads it
        m = self.game.grid.size                            # exactly, entry by entry
        return diagnostics(self.game, rows[..., m], rows[..., :m],
                           np.asarray(result.sessions.index), last_history(result))

    def _write_outputs(self, result: eng.SessionResult, bench: dict, written: Future,
                       checked: Future) -> dict:
        group = self.game.group
        nash, joint = bench.get("nash_profit"), bench.get("joint_profit")
        defined = (nash is not None and joint is not None
                   and abs(joint - nash) > 1e-6 * max(1.0, abs(nash), abs(joint)))
        delta = eng.profit_gain(result.cycle_reward, nash, joint) if defined else None
        played = (eng.profit_gain(result.tail_reward, nash, joint)
                  if defined and result.tail_complete else None)
        steps = result.step.astype(np.float64)
        conv = result.converged
        summary: dict[str, Any] = {
            "engine": "sessions", "backend": result.backend, "group": group,
            "sessions": int(conv.size), "periods": int(result.periods),
            "stop": self.settings.stop,
            "final": {group: {"mean_reward": float(result.cycle_reward.mean()),
                              "mean_price": float(result.cycle_price.mean()),
                              "measured_on": "the greedy limit cycle of each session"}},
            "benchmarks": {group: bench},
            "convergence": {
                "share": float(conv.mean()),
                "mean_period": float(steps[conv].mean()) if conv.any() else None,
                "median_period": float(np.median(steps[conv])) if conv.any() else None,
                "max_period": float(steps[conv].max()) if conv.any() else None},
            "per_seed": {group: {   # one entry per session, as the loop's per seed
                "mean_price": [[float(p)] for p in result.cycle_price.mean(axis=1)],
                "mean_reward": [float(r) for r in result.cycle_reward.mean(axis=1)]}},
            "per_session": {"cycle_reward": _dist(result.cycle_reward.mean(axis=1)),
                            "cycle_price": _dist(result.cycle_price.mean(axis=1)),
                            "cycle_length": _dist(result.cycle_length)},
        }
        if delta is not None:
            summary["profit_gain"] = {group: float(delta.mean())}
            summary["profit_gain_ci95"] = {group: eng.bootstrap_ci(delta)}
            summary["per_session"]["profit_gain"] = _dist(delta)
            summary["per_seed"][group]["profit_gain"] = [float(d) for d in delta]
            summary.update(firm_gains(result.cycle_reward, bench, group))
        else:
            summary["profit_gain_skipped"] = bench.get(
                "undefined", "pi_M equals pi_N (or no static benchmark)")
        if played is not None:
            summary["played_profit_gain"] = {group: float(played.mean())}
            summary["played_profit_gain_ci95"] = {group: eng.bootstrap_ci(played)}
        elif delta is not None:
            summary["played_profit_gain_skipped"] = (
                "sessions stopped at convergence before train.num_iterations (set "
                "train.session_stop: periods for the played profits of the last "
                "train.session_window periods)")
        informed = None
        if self.game.num_outcomes > 1 and self.tcfg.session_outcome_benchmarks:
            # a demand shock: the outcomes' own benchmarks too
            inf = (outcome_benchmarks(self.plan) or {}).get(group)
            if inf is not None and inf["nash_profit"] is not None and \
                    inf["joint_profit"] is not None and \
                    abs(inf["joint_profit"] - inf["nash_profit"]) > 1e-6:
                informed = eng.profit_gain(result.cycle_reward, inf["nash_profit"],
                                           inf["joint_profit"])
                summary["outcome_benchmarks"] = {group: inf}
                summary["profit_gain_outcomes"] = {group: float(informed.mean())}
                summary["profit_gain_outcomes_ci95"] = {group: eng.bootstrap_ci(informed)}
        diag = checked.result()
        if isinstance(diag, str):
            summary["equilibrium_check_skipped"] = diag
            diag = None
        else:
            summary["equilibrium_check"] = check_summary(diag, self.game.memory)
        pub = Publication(self.run_dir, "sessions", result.periods)
        pub.text(SESSIONS_FILE, sessions_csv(result, delta, played, informed, diag))
        written.result()
        pub.path(STRATEGIES_FILE)   # staged by write_outputs' writer
        pub.text("summary.json", json.dumps(summary, indent=2) + "\n")
        pub.publish()
        return summary


def last_history(result: eng.SessionResult) -> np.ndarray:
    """``[S, k n]`` every session's last ``k`` profiles, most recent first (the
    ``history`` observation's order): ``index``, then ``past``."""
    index = np.asarray(result.sessions.index, np.int32)
    if result.sessions.past is None:
        return index
    past = np.asarray(result.sessions.past, np.int32)
    return np.concatenate([index, past.reshape(past.shape[0], -1)], axis=1)


def diagnostics(game: SessionGame, greedy: np.ndarray, q: np.ndarray,
                index: np.ndarray | None, history: np.ndarray | None = None
                ) -> Diagnostics | str:
    """The authors' diagnostics (:mod:`jaxmarket.sessions.diagnostics`: best replies,
    equilibrium on path, subgame perfection, the Q-gaps) of every session's greedy
    strategies ``greedy [S, n, Z]`` and learned tables ``q [S, n, Z, m]``, the limit
    cycle followed from the profile ``index [S, n]`` in force (None or empty: memory 0,
    whose strategies ignore it; memory ``k > 1``: from the history ``[S, k n]``,
    :func:`last_history`), or why they are not computed."""
    if game.memory > 1:
        return _history_diagnostics(game, greedy, q, history)
    if game.turns is not None:
        return "sellers move in turns (the check is of simultaneous moves)"
    if game.probs is not None:
        return "random period outcomes (the check is of a deterministic period)"
    greedy = np.asarray(greedy)
    if greedy.shape[1] != game.sellers:
        return "sellers share a Q table"
    state = np.asarray(obs_grid_of(game.settings).state_index(game.obs), np.int64)
    S = greedy.shape[0]
    start = (np.zeros(S, np.int64) if index is None or np.size(index) == 0 else
             np.asarray(game.row(np.asarray(index, np.int32)), np.int64))
    return diagnose(np.asarray(game.reward, np.float64), state, greedy.astype(np.int64),
                    game.grid.size, game.settings.discount, start, q, lagged=game.lagged)


def _history_diagnostics(game: SessionGame, greedy: np.ndarray, q: np.ndarray,
                         history: np.ndarray | None) -> Diagnostics | str:
    """:func:`diagnostics` under memory ``k > 1``: the states are the ``J^k`` histories
    (:mod:`jaxmarket.sessions.diagnostics`), the cycle followed from each session's
    last history."""
    if game.turns is not None:
        return (f"sellers move in turns (the check is of simultaneous moves; memory "
                f"{game.memory})")
    greedy = np.asarray(greedy)
    if greedy.shape[1] != game.sellers:
        return "sellers share a Q table"
    if history is None:
        return f"memory {game.memory}: no last history of the sessions to follow the cycle from"
    rows = game.history_rows()
    obs = game.history_obs(jnp.asarray(rows))
    state = np.asarray(obs_grid_of(game.settings).state_index(obs), np.int64)   # [Z, n]
    n, J = game.sellers, game.profiles
    radix = np.asarray(game.radix, np.int64)
    digits = np.asarray(history, np.int64).reshape(-1, game.memory, n)
    start = np.zeros(digits.shape[0], np.int64)
    for lag in range(game.memory):   # the k digits of the history number, not a step
        start = start * J + digits[:, lag] @ radix
    return diagnose(np.asarray(game.reward, np.float64), state, greedy.astype(np.int64),
                    game.grid.size, game.settings.discount, start, q, game.memory)


def check_summary(d: Diagnostics, memory: int = 1) -> dict:
    """summary.json's ``equilibrium_check``: the shares of sessions whose profile is a
    Nash equilibrium on path and subgame perfect, per firm the mean share of states where
    it best-replies (on path, all), its Q-gap to the maximum (on path, all) and its
    learned-Q error, each with its 95% bootstrap CI over sessions."""
    def stat(values: np.ndarray) -> dict:
        v = np.asarray(values, np.float64)
        if v.ndim == 1:
            return {"mean": float(v.mean()), "ci95": eng.bootstrap_ci(v)}
        return {"mean": [float(x) for x in v.mean(0)],
                "ci95": [eng.bootstrap_ci(v[:, i]) for i in range(v.shape[1])]}

    return {"nash_on_path": stat(d.nash_on_path), "subgame_perfect": stat(d.spe),
            "best_reply_on_path": stat(d.br_path), "best_reply_all_states": stat(d.br_all),
            "q_gap_on_path": stat(d.gap_path), "q_gap_all_states": stat(d.gap_all),
            "q_error": stat(d.q_error),
            "method": "one-shot deviations against the true Q of each session's greedy "
                      "profile, states = " + ("the last price profile" if memory == 1 else
                                             f"the last {memory} price profiles") +
                      " (jaxmarket.sessions.diagnostics)"}


def firm_gains(reward: np.ndarray, bench: dict, group: str) -> dict:
    """The profit gain per firm beside the industry's ``profit_gain`` (the authors' code's
    headline: means over firms first): ``profit_gain_firms[group]`` (each firm's
    ``Delta_i``, the mean over sessions; None where undefined), its ``_ci95``, and
    ``profit_gain_firm_mean[group]`` (the mean over firms of the ``Delta_i`` per
    session, then over sessions) with its ``_ci95``; ``profit_gain_firms_undefined``
    says why for a firm without one."""
    gains, why = eng.firm_profit_gains(reward, bench["nash_profits"], bench["joint_profits"])
    defined = [w is None for w in why]
    out: dict[str, Any] = {
        "profit_gain_firms": {group: [float(gains[:, i].mean()) if ok else None
                                      for i, ok in enumerate(defined)]},
        "profit_gain_firms_ci95": {group: [eng.bootstrap_ci(gains[:, i]) if ok else None
                                           for i, ok in enumerate(defined)]}}
    if all(defined):
        per_session = gains.mean(axis=1)
        out["profit_gain_firm_mean"] = {group: float(per_session.mean())}
        out["profit_gain_firm_mean_ci95"] = {group: eng.bootstrap_ci(per_session)}
    else:
        out["profit_gain_firms_undefined"] = {group: [w for w in why if w is not None]}
    return out


def _dist(values: np.ndarray) -> dict:
    v = np.asarray(values, np.float64)
    q = np.percentile(v, [5, 25, 50, 75, 95])
    return {"mean": float(v.mean()), "sd": float(v.std()), "min": float(v.min()),
            "p5": float(q[0]), "p25": float(q[1]), "median": float(q[2]),
            "p75": float(q[3]), "p95": float(q[4]), "max": float(v.max())}


def sessions_csv(result: eng.SessionResult, delta, played, informed=None,
                 diag: Diagnostics | None = None) -> str:
    """One row per session (module docstring); ``informed``: Delta against the outcomes'
    own benchmarks (a random period's ``profit_gain_outcomes`` column); ``diag``: the
    equilibrium check's columns (``nash_on_path``, ``subgame_perfect``, per firm
    ``best_reply_on_path_i``, ``best_reply_all_i``, ``q_gap_on_path_i``, ``q_gap_all_i``,
    ``q_error_i``)."""
    n = result.game.sellers
    header = (["session", "converged", "convergence_period", "cycle_length"]
              + [f"cycle_price_{i}" for i in range(n)] + [f"cycle_profit_{i}" for i in range(n)]
              + [f"greedy_price_{i}" for i in range(n)] + [f"greedy_fees_{i}" for i in range(n)]
              + ["profit_gain"]
              + ([f"played_profit_{i}" for i in range(n)] if result.tail_complete else [])
              + (["played_profit_gain"] if played is not None else [])
              + (["profit_gain_outcomes"] if informed is not None else [])
              + (["nash_on_path", "subgame_perfect"] + [
                  f"{name}_{i}" for name in DIAG_COLUMNS for i in range(n)]
                 if diag is not None else []))
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    for s in range(result.converged.size):
        row = [s, int(result.converged[s]), int(result.step[s]), int(result.cycle_length[s])]
        row += [repr(float(x)) for x in result.cycle_price[s]]
        row += [repr(float(x)) for x in result.cycle_reward[s]]
        row += [repr(float(x)) for x in result.greedy_price[s]]
        row += [repr(float(x)) for x in result.greedy_fees[s]]
        row += [repr(float(delta[s])) if delta is not None else ""]
        if result.tail_complete:
            row += [repr(float(x)) for x in result.tail_reward[s]]
        if played is not None:
            row += [repr(float(played[s]))]
        if informed is not None:
            row += [repr(float(informed[s]))]
        if diag is not None:
            row += [int(diag.nash_on_path[s]), int(diag.spe[s])]
            row += [repr(float(x)) for f in DIAG_COLUMNS.values() for x in getattr(diag, f)[s]]
        w.writerow(row)
    return out.getvalue()


#: sessions.csv's per-firm columns of the equilibrium check -> the Diagnostics field
DIAG_COLUMNS = {"best_reply_on_path": "br_path", "best_reply_all": "br_all",
                "q_gap_on_path": "gap_path", "q_gap_all": "gap_all", "q_error": "q_error"}


def write_strategies(path: Path, result: eng.SessionResult, bench: dict) -> None:
    """The ``strategies.npz`` :func:`jaxmarket.analysis.impulse_response` reads: Q
    tables, greedy strategies, the last profile, the grid and the profit table (a lagged
    game's: one row per pair of profiles, ``lagged`` True)."""
    game, state = result.game, result.sessions.learner
    memory = game.settings.num_digits // game.sellers if game.sellers else 0
    rows = np.asarray(state.rows, np.float32)
    m = game.grid.size
    last = last_history(result) if memory else np.zeros((rows.shape[0], 0), np.int32)
    arrays = dict(
        q=rows[..., :m], greedy=rows[..., m].astype(np.int32), last=last,
        converged=np.asarray(state.converged, bool),
        grid=np.asarray(game.grid.prices, np.float64),
        profit_table=np.asarray(game.reward, np.float64), memory=memory,
        lagged=bool(game.lagged),
        p_nash=_nan(bench.get("nash_price")), p_monopoly=_nan(bench.get("joint_price")),
        pi_nash=_nan(bench.get("nash_profit")), pi_monopoly=_nan(bench.get("joint_profit")))
    with path.open("wb") as f:
        save_npz(f, arrays)
        f.flush()
        os.fsync(f.fileno())


#: zlib's level for ``strategies.npz``: its fastest, 3x level 6's speed on learned Q
#: tables for a file about 7% larger
NPZ_LEVEL = 1
#: arrays larger than this are stored as they are: deflating learned Q tables saves
#: under half their size at about 60 MB/s on one core (three firms' 608 MB: 10 s)
NPZ_STORE_BYTES = 64 << 20


def save_npz(f, arrays: dict[str, Any], level: int = NPZ_LEVEL,
             store_bytes: int = NPZ_STORE_BYTES) -> None:
    """``np.savez_compressed(f, **arrays)`` at zlib level ``level``, an array of more
    than ``store_bytes`` stored undeflated (numpy's own format: one ``NAME.npy`` member
    per array in a zip, what ``np.load`` reads)."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED, compresslevel=level,
                         allowZip64=True) as z:
        for name, value in arrays.items():
            value = np.asanyarray(value)
            member = f"{name}.npy"
            if value.nbytes <= store_bytes:
                with z.open(member, "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, value, allow_pickle=False)
                continue
            member = zipfile.ZipInfo(member)   # dated 1980 as numpy's: the same bytes
            member.compress_type = zipfile.ZIP_STORED   # whenever written
            with z.open(member, "w", force_zip64=True) as out:
                _write_npy_blocks(out, value)


#: the bytes of a stored array written at once (one block of its leading axis)
NPZ_BLOCK_BYTES = 16 << 20


def _write_npy_blocks(out, value: np.ndarray, block_bytes: int = NPZ_BLOCK_BYTES) -> None:
    """The bytes ``np.lib.format.write_array(out, value)`` writes (format 1.0, C order),
    in blocks of the leading axis; a block that is not contiguous in memory (a slice such
    as the Q part of the learners' rows) is copied into one buffer reused for every
    block, not into fresh memory per block."""
    if value.ndim == 0 or value.dtype.hasobject or value.size == 0:
        np.lib.format.write_array(out, value, allow_pickle=False)
        return
    header = np.lib.format.header_data_from_array_1_0(value)
    if header["fortran_order"]:   # numpy writes a Fortran-ordered array as it lies
        np.lib.format.write_array(out, value, allow_pickle=False)
        return
    np.lib.format.write_array_header_1_0(out, header)
    rows = max(1, block_bytes // max(1, value[0].nbytes))
    buffer = None
    for b in range(0, value.shape[0], rows):
        part = value[b:b + rows]
        if not part.flags.c_contiguous:
            if buffer is None:
                buffer = np.empty((rows,) + value.shape[1:], value.dtype)
            np.copyto(buffer[:len(part)], part)
            part = buffer[:len(part)]
        out.write(memoryview(part.reshape(-1).view(np.uint8)))


def _nan(x) -> float:
    return math.nan if x is None else float(x)


# ------------------------------------------------------------------ commands

def _train(run: SessionRun, sessions: eng.Sessions, done: int, segments: list[dict],
           cluster: Any) -> dict:
    if cluster is None:
        return run.train(sessions, done, segments)
    return cluster.train(run, sessions, done, segments)


def start(config: dict, plan: RunPlan, run_dir: str | Path, command: str | None = None,
          progress_every: float | None = None, cluster: Any = None) -> dict:
    """A new sessions run in ``run_dir`` (new or empty); ``cluster``: where its sessions
    are played instead of this process (``check(run)`` before anything is written,
    ``train(run, sessions, done, segments)``: :class:`jaxmarket.cluster.blocks.OnCluster`)."""
    run_dir = require_new_dir(run_dir, "that run: python -m jaxmarket.train --resume",
                              restartable=True)
    run = SessionRun(config, plan, run_dir)
    if cluster is not None:
        cluster.check(run)
    if progress_every is not None:
        run.progress_every = progress_every
    lock = lock_dir(run_dir)
    lock.acquire()
    try:
        require_new_dir(run_dir, "that run: python -m jaxmarket.train --resume",
                        restartable=True)   # a race
        try:
            restart_in_place(run_dir)
            _atomic_text(run_dir / "config.yaml", yaml.safe_dump(config, sort_keys=False))
            write_config_record(run_dir, config)
        except OSError as err:
            if storage_cause(err) is None:
                raise
            raise start_storage_error(run_dir, err) from None
        print(f"run directory: {run_dir}")
        print(_engine_line(run))
        segments = [run.record(command, 0)]
        sessions, done = run.initial()
        summary = _train(run, sessions, done, segments, cluster)
    finally:
        lock.release()
    return {**summary, "run_dir": str(run_dir)}


def _engine_line(run: SessionRun) -> str:
    line = (f"engine: sessions ({run.settings.sessions} sessions of at most "
            f"{run.settings.periods:,d} periods, backend {run.runner.backend})")
    return line + (f"\nnote: {run.runner.note}" if run.runner.note else "")


def check_resume_overrides(overrides: list[str], allow_changes=()) -> None:
    _check_overrides(overrides, RESUME_OVERRIDES, allow_changes)


def resume(run_dir: str | Path, config: dict, plan: RunPlan, overrides: list[str],
           command: str | None = None, progress_every: float | None = None,
           allow_changes: tuple[str, ...] = (), cluster: Any = None) -> dict:
    """Continue a sessions run from its last checkpoint (bit for bit the sessions of an
    uninterrupted run); ``cluster`` as :func:`start` (the blocks kept by a run on a
    cluster are not played again)."""
    run_dir = Path(run_dir)
    lock = lock_dir(run_dir)
    lock.acquire()
    try:
        check_config_record(run_dir, read_run_config(run_dir), RESUME_OVERRIDES, allow_changes,
                            required=has_checkpoint(run_dir))
        changes = config_changes(started_config(run_dir), config, RESUME_OVERRIDES, 0)
        run = SessionRun(config, plan, run_dir)
        if cluster is not None:
            cluster.check(run)
        if progress_every is not None:
            run.progress_every = progress_every
        if changes and not run.checkpoints.fits(_plain(run.initial()[0])):
            raise unhonoured(changes, run_dir)
        sessions, done = run.restore()
        for c in changes:
            c["from_period"] = done
        if run.settings.periods < done:
            raise ConfigError("train.num_iterations", run.settings.periods,
                              f"an integer >= {done} (the run's last checkpoint)")
        try:
            previous = json.loads((run_dir / RUN_RECORD).read_text()).get("segments", [])
        except (OSError, ValueError, AttributeError):
            previous = []
        try:
            if overrides or changes:
                _atomic_text(run_dir / "config.yaml",
                             config_text(config, earlier_changes(previous) + changes))
            write_config_record(run_dir, config)
        except OSError as err:
            if storage_cause(err) is None:
                raise
            raise resume_storage_error(run_dir, err) from None
        print(f"resuming {run_dir} from period {done}" if done else
              f"no checkpoint in {run_dir}: starting it from period 0")
        print(_engine_line(run))
        if changes:
            print(changes_note(changes, run.runner.finished(sessions, done)))
        segments = list(previous) + [{**run.record(command, done),
                                      **({"config_changes": changes} if changes else {})}]
        summary = _train(run, sessions, done, segments, cluster)
    finally:
        lock.release()
    return {**summary, "run_dir": str(run_dir)}


def finish_message(summary: dict) -> str:
    """The last lines of a sessions run: Delta with its CI, convergence, the files."""
    d, group = summary["run_dir"], summary["group"]
    conv = summary["convergence"]
    lines = []
    if "profit_gain" in summary:
        lo, hi = summary["profit_gain_ci95"][group]
        lines.append(f"profit gain Delta ({group}, converged greedy cycle): "
                     f"{summary['profit_gain'][group]:.4f}  95% CI [{lo:.4f}, {hi:.4f}]")
    period = conv["mean_period"]
    lines.append(f"{summary['sessions']} sessions, {conv['share']:.1%} converged"
                 + (f" (mean period {period:,.0f})" if period is not None else "")
                 + f"; {summary['periods']:,d} periods")
    lines += [f"files in {d}/: summary.json, sessions.csv (one row per session), "
              "strategies.npz, published.json, run.json, checkpoints/",
              f"next: python -m jaxmarket.impulse {d}"]
    return "\n".join(lines)


__all__ = ["RESUME_OVERRIDES", "SessionRun", "check_summary", "choose_engine", "diagnostics",
           "finish_message", "resume", "session_plan", "sessions_csv", "start"]
