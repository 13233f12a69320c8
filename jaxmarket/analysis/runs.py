"""Runs back in Python: :func:`load_run` reads a run directory (its config, summary, run
record, metrics and per-seed rows, and its final learners from the last checkpoint);
:func:`compare` tabulates several runs side by side (docs/runs.md).

``metrics``, ``seeds`` and (a session-engine run) ``sessions`` are pandas DataFrames;
they hold exactly the numbers of the files."""

from __future__ import annotations

import csv
import json
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.train.loop import Runner, chain
from jaxmarket.train.plan import RunPlan, resolve
from jaxmarket.train.provenance import read_run_record
from jaxmarket.train.publish import verify
from jaxmarket.train.trainer import Trainer
from jaxmarket.train.rundir import SESSIONS_FILE, RunDirError, changed_keys
from jaxmarket.train.slots import SlotView
from jaxmarket.train.tracking import ParquetRows, read_metrics




def _read_rows(path: Path) -> tuple[list[str], np.ndarray]:
    """``read_metrics(path)``, or a one-line :class:`RunDirError` naming the file and the
    first line that is not a row of the header's numbers (cut, junk, NUL bytes)."""
    try:
        return read_metrics(path)
    except (ValueError, IndexError, UnicodeDecodeError, csv.Error):
        pass
    with open(path, newline="", errors="replace") as f:
        rows = csv.reader(line.replace("\0", "") for line in f)
        header = next(rows, [])
        for number, row in enumerate(rows, start=2):
            try:
                ok = len(row) == len(header) and bool([float(x) for x in row])
            except ValueError:
                ok = False
            if not ok:
                break
        else:
            number = 1
    raise RunDirError(f"run directory error: {path} line {number} is not a row of "
                      f"{len(header)} numbers (cut or damaged); restore the file, or start "
                      f"the run again: python -m jaxmarket.train {path.parent / 'config.yaml'} "
                      f"--run-dir NEW_DIR")


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("jaxmarket.load_run(...).metrics / .seeds and compare() return "
                          "pandas DataFrames: pip install pandas") from None
    return pandas


def _frame(header: list[str], data: np.ndarray):
    """A DataFrame of a metrics file: ``iteration`` and ``seed`` as integers, the
    metrics as the float64 values the file holds."""
    pd = _pandas()
    frame = pd.DataFrame(data, columns=header)
    for name in ("iteration", "seed"):
        if name in frame:
            frame[name] = frame[name].astype("int64")
    return frame


class Policy:
    """A run's final learners acting on its ``S x E`` markets (all seeds' markets, in
    the training loop's order: market ``s * E + e``), as they act in training.

    ``obs``/``state``: the markets where training left them (``state`` the batched
    :class:`~jaxmarket.market.state.MarketState`), so ``act`` then ``step`` continues
    the run's markets; ``reset(key)`` starts fresh ones. ``act(key, obs)`` returns
    ``{group: [S * E, A, P]}``, what ``step`` takes. Runs whose groups act through a
    component (league opponents, external-model observations) are refused."""

    def __init__(self, plan: RunPlan, runner: Runner):
        comps = chain(plan)
        hooked = [c.name for c in comps if c.in_loop_only]
        if hooked:
            raise ConfigError("load_run(...).policy()", ", ".join(hooked),
                              "a run without components that act or observe inside the "
                              "training loop only (league opponents, external-model "
                              "observations)")
        self.plan, self.runner = plan, runner
        self.assignment = {}
        for c in comps:
            self.assignment.update(c.assignment(runner))
        self.env, self.params = plan.env, runner.params
        self.groups = plan.groups
        self.obs, self.state = runner.obs, runner.env_state
        view, learners, groups = SlotView.of(plan), plan.learners, plan.groups

        def act(learner_states, assignment, obs, key):
            keys = dict(zip(groups, jax.random.split(key, len(groups))))
            out = {}
            for g in groups:   # static loop over groups (config), not agents
                a, _ = learners[g].act(learner_states[g], view.learner_view(obs[g], g, assignment),
                                       keys[g])
                out[g] = view.market_actions(a, g, assignment)
            return out

        self._act = jax.jit(act)
        self._reset = jax.jit(jax.vmap(self.env.reset, in_axes=(0, None)))
        self._step = jax.jit(jax.vmap(self.env.step, in_axes=(0, 0, 0, None)))

    def act(self, key: jax.Array, obs: dict) -> dict:
        """Every group's actions ``{group: [S * E, A, P]}`` for the observations ``obs``
        (``{group: [S * E, A, D]}``), drawn as the learners draw them in training."""
        return self._act(self.runner.learners, self.assignment, obs, key)

    def reset(self, key: jax.Array) -> tuple[dict, Any]:
        """``(obs, state)`` of ``S * E`` fresh markets."""
        return self._reset(jax.random.split(key, self.plan.num_markets), self.params)

    def step(self, key: jax.Array, state: Any, actions: dict) -> tuple:
        """``env.step`` of every market: ``(obs, state, rewards, terminated, truncated,
        info)``, batched over the markets."""
        return self._step(jax.random.split(key, self.plan.num_markets), state, actions,
                          self.params)


@dataclass
class Run:
    """A run directory read back: ``config`` (its config.yaml), ``summary``
    (summary.json; None before the run finished), ``record`` (run.json; None for a run
    made before it existed), ``metrics`` and ``seeds`` (DataFrames of metrics.csv and of
    seeds.csv or seeds.parquet/), ``iterations`` (the last checkpointed iteration) and
    :meth:`policy`."""

    path: Path
    config: dict
    summary: dict | None
    record: dict | None
    _runner: Any = field(default=None, repr=False)

    @property
    def engine(self) -> str:
        """``"sessions"`` or ``"loop"``: the engine that ran (summary.json's ``engine``;
        a sessions run holds sessions.csv)."""
        if self.summary is not None and "engine" in self.summary:
            return self.summary["engine"]
        return "sessions" if (self.path / SESSIONS_FILE).is_file() else "loop"

    @cached_property
    def sessions(self):
        """A session-engine run's sessions.csv: one row per session (docs/sessions.md)."""
        path = self.path / SESSIONS_FILE
        if not path.is_file():
            raise ConfigError("run directory", str(self.path), "a finished session-engine run "
                              f"(it holds no {SESSIONS_FILE}: train.engine sessions writes one)")
        return _pandas().read_csv(path)

    @cached_property
    def metrics(self):
        return _frame(*_read_rows(self.path / "metrics.csv"))

    @cached_property
    def seeds(self):
        fmt = (self.config.get("train") or {}).get("seeds_format", "csv")
        if fmt == "parquet":
            got = ParquetRows(self.path / "seeds.parquet").read()
            return _frame(*got) if got is not None else _pandas().DataFrame()
        path = self.path / "seeds.csv"
        if not path.is_file() or path.stat().st_size == 0:
            return _pandas().DataFrame()
        return _frame(*_read_rows(path))

    def _restored(self) -> tuple[RunPlan, Runner, int]:
        if self._runner is None:
            trainer = Trainer(resolve(load_config(self.path / "config.yaml")), self.path)
            runner, step = trainer.restore(report=lambda line: None)
            self._runner = (trainer.plan, runner, step)
        return self._runner

    @property
    def iterations(self) -> int:
        """The iteration of the checkpoint :meth:`policy` restores."""
        return self._restored()[2]

    def runner(self) -> Runner:
        """The whole training state of the last checkpoint (learners, markets, key)."""
        return self._restored()[1]

    def policy(self) -> Policy:
        """The final learners (the last checkpoint) acting on the run's markets."""
        plan, runner, _ = self._restored()
        return Policy(plan, runner)


def load_run(run_dir: str | Path) -> Run:
    """Read the run in ``run_dir`` (config.yaml is required; the rest is read when
    asked for). A ConfigError names the directory when it holds no run; a RunDirError
    names the file that is not part of the run's published result
    (:func:`jaxmarket.train.publish.verify`)."""
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise ConfigError("run directory", str(path), "a directory holding a run's config.yaml "
                          "(python -m jaxmarket.train CONFIG --run-dir DIR writes one)")
    config = load_config(path / "config.yaml")
    verify(path)   # the files are one published result, or the run has none yet
    summary_path = path / "summary.json"
    summary = None
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            where = f" line {err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
            raise RunDirError(f"run directory error: {summary_path}{where} cannot be read "
                              f"({type(err).__name__}); restore it, or delete it and "
                              f"finish the run again: python -m jaxmarket.train --resume "
                              f"{path}") from None
    return Run(path, config, summary, read_run_record(path))


def _flat(prefix: str, value: Any, out: dict, suffix: str = "") -> None:
    if isinstance(value, list):
        for j, v in enumerate(value):
            _flat(f"{prefix}/p{j}", v, out, suffix)
    else:
        out[prefix + suffix] = value


def compare_rows(run_dirs: list[str | Path]) -> list[dict]:
    """One row per run: ``run``, ``iterations``, ``num_seeds``, and per group each
    figure of ``over_seeds`` as ``<name>/<group>[/p<j>]`` (the mean over seeds: price,
    reward, traffic) with its ``.../ci95_low``, ``.../ci95_high`` (and
    ``profit_gain/<group>`` where the summary has one), and the ``engine``; a session-engine
    run's row: :func:`_session_row`."""
    rows = []
    for d in run_dirs:
        run = load_run(d)
        s = run.summary
        if s is None:
            raise ConfigError("run directory", str(d), "a finished run (no summary.json yet: "
                              f"python -m jaxmarket.train --resume {d})")
        row: dict = {"run": str(d), "iterations": s.get("iterations", s.get("periods"))}
        if run.engine == "sessions":
            rows.append(_session_row(row, run, load_run(run_dirs[0]) if rows else None))
            continue
        for g, stats in s.get("over_seeds", {}).items():
            row.setdefault("num_seeds", stats["num_seeds"])
            for name, st in stats.items():
                if name == "num_seeds":
                    continue
                short = name.removeprefix("mean_")
                _flat(f"{short}/{g}", st["mean"], row)
                _flat(f"{short}/{g}", st["ci95_low"], row, "/ci95_low")
                _flat(f"{short}/{g}", st["ci95_high"], row, "/ci95_high")
        for g, value in (s.get("profit_gain") or {}).items():
            if not isinstance(value, dict):
                row[f"profit_gain/{g}"] = value
        row["engine"] = run.engine
        rows.append(row)
    return rows


def _session_row(row: dict, run: Run, first: Run | None) -> dict:
    """A sessions run's row: sessions, Delta with its 95% CI and convergence; against the
    first run (a sessions run too): the Welch two-sample t-test of the sessions' Delta
    (``p_value/<group>``) and the settings that differ (``differs``)."""
    s = run.summary
    row["num_seeds"] = s["sessions"]
    for g, value in (s.get("profit_gain") or {}).items():
        low, high = s["profit_gain_ci95"][g]
        row.update({f"profit_gain/{g}": value, f"profit_gain/{g}/ci95_low": low,
                    f"profit_gain/{g}/ci95_high": high})
        if first is not None and first.engine == "sessions" and "profit_gain" in first.sessions:
            from scipy.stats import ttest_ind
            with warnings.catch_warnings():   # identical sessions: a degenerate test
                warnings.simplefilter("ignore", RuntimeWarning)
                test = ttest_ind(run.sessions["profit_gain"], first.sessions["profit_gain"],
                                 equal_var=False)
            row[f"p_value/{g}"] = float(test.pvalue)
    row["converged_share"] = s["convergence"]["share"]
    if first is not None:
        row["differs"] = ", ".join(changed_keys(first.config, run.config)) or "nothing"
    row["engine"] = run.engine
    return row


def compare(run_dirs: list[str | Path]):
    """A pandas DataFrame with one row per run (:func:`compare_rows`), indexed by run."""
    return _pandas().DataFrame(compare_rows(list(run_dirs))).set_index("run")


__all__ = ["Policy", "Run", "compare", "compare_rows", "load_run"]
