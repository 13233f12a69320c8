"""Reproductions of published results: a design file, one sessions run, and its
``reproduction.json``.

    jaxmarket reproduce NAME | DESIGN.yaml [--sessions N] [--periods T] [--seed S]
                        [--run-dir DIR] [--json] [key=value ...]
    jaxmarket reproduce --list [--json]

A design is one YAML file; the shipped ones are ``jaxmarket/designs/NAME.yaml``::

    name: klein2021              the design's name (a shipped file: its file name)
    config: klein2021            a shipped config (jaxmarket/configs/NAME.yaml), or a
                                 YAML path relative to the design file
    overrides:                   dotted key=value settings applied to the config
      - train.num_seeds=100      (the design's sessions, periods, ...)
      - train.num_iterations=500000
    figure: mean profit per firm per period over the last 1,000 periods
    statistic: mean              mean | median over sessions
    measure: mean_played_profit  the per-session value (MEASURES) from sessions.csv, or
                                 for a trainer run (LOOP_MEASURES) from its per-seed rows
    published: 0.108             the paper's number (null: the paper's number could not
                                 be read; the verdict is then "no published number")
    source: Klein (RAND 2021), k = 6 price grid
    root_cause: ...              optional: why a design does not reproduce (copied)

The run is exactly ``python -m jaxmarket.train CONFIG --run-dir DIR OVERRIDES`` with the
design's overrides followed by the command's: on the session engine
(:func:`jaxmarket.sessions.run.start`) where it plays the design, else on the regular
trainer (:func:`jaxmarket.train.run.start_run`; PPO sellers, say), one seed being one
session. The options: ``--sessions N`` is ``train.num_seeds=N``, ``--periods T``
``train.num_iterations=T``, ``--seed S`` ``seed=S``, then any ``key=value``. The run
directory (default ``runs/reproduce-NAME-TIME``) holds the run's files and
``reproduction.json``::

    {"name", "figure", "statistic", "measure", "value", "ci95": [lo, hi], "published",
     "tolerance", "verdict", "source", "root_cause" (where the design has one),
     "sessions", "periods", "max_periods", "design_sessions", "design_max_periods",
     "converged_share", "wall_s", "run_dir", "command", "train_command"}

``value``: the statistic over sessions of the measure's per-session values;
``ci95``: their 95% percentile bootstrap interval
(:func:`jaxmarket.sessions.engine.bootstrap_ci`, 2,000 resamples). ``verdict``:
``reproduced`` when the published number lies in the interval widened on each side by
the tolerance ``0.02 |published|`` (published figures carry two or three significant
digits, and a design whose sessions all end alike has an interval of width 0), else
``not reproduced``. ``periods``: the periods the run played (sessions that stop at
convergence end before ``max_periods``, ``train.num_iterations``); ``design_*``: the
design's own sessions and cap, before the command's options (a reduced run differs).
``converged_share``: the share of sessions that met the learner's convergence rule
(``summary.json`` ``convergence.share``; designs that play a fixed number of periods
set a window no session reaches). ``wall_s``: seconds of the whole run (tables,
compiling, the sessions and the files).

A trainer run (``engine: "loop"`` in its ``reproduction.json``; a session-engine run's
file has no ``engine`` key) takes its measure from ``summary.json``'s ``per_seed``
values (the last 10% of each seed's rows of ``seeds.csv``) or its learners' readouts
per seed and seller (``agents``: a bandit's recent median prices; :data:`LOOP_MEASURES`);
``periods`` and ``max_periods`` are its iterations times ``train.rollout_length`` (the
periods each market played), ``converged_share`` the mean over its groups' convergence
shares (0 for learners without a convergence rule).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import SHIPPED_CONFIGS, load_config, read_yaml
from jaxmarket.sessions import run as session_run
from jaxmarket.sessions.engine import bootstrap_ci
from jaxmarket.train.config import resolve_train
from jaxmarket.train.publish import read_summary, verify
from jaxmarket.train.run import start_run

#: the shipped design files
DESIGNS_DIR = Path(__file__).resolve().parents[1] / "designs"
RESULT_FILE = "reproduction.json"
STATISTICS = ("mean", "median")
#: the verdict's tolerance, relative to the published number
TOLERANCE = 0.02
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# ------------------------------------------------------------------ measures

def _columns(frame: pd.DataFrame, prefix: str) -> np.ndarray:
    """``[S, n]`` the per-seller columns ``PREFIX_0 .. PREFIX_{n-1}`` of sessions.csv."""
    cols = sorted((c for c in frame.columns if re.fullmatch(rf"{prefix}_\d+", c)),
                  key=lambda c: int(c.rsplit("_", 1)[1]))
    if not cols:
        raise ConfigError("measure", prefix, f"a measure whose columns sessions.csv holds (no "
                          f"{prefix}_i columns in this run"
                          + ("; the played profits need every session to play the last "
                             "train.session_window periods)" if prefix == "played_profit"
                             else ")"))
    return frame[cols].to_numpy(np.float64)


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        raise ConfigError("measure", name, "a measure whose column sessions.csv holds")
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(np.float64)


def _action_gain(frame: pd.DataFrame) -> np.ndarray:
    """``(a - a_N) / (a_M - a_N)`` per session: ``a`` the mean over sellers of the action
    over the greedy limit cycle (``cycle_price_i``), ``a_N`` and ``a_M`` the static Nash
    and joint-optimum actions of the run's ``summary.json`` benchmarks (the reproduction
    puts the summary in ``frame.attrs["summary"]``)."""
    benchmarks = (frame.attrs.get("summary") or {}).get("benchmarks") or {}
    found = [(b.get("nash_price"), b.get("joint_price")) for b in benchmarks.values()]
    found = [(float(np.mean(n)), float(np.mean(j))) for n, j in found
             if n is not None and j is not None]
    if len(found) != 1 or found[0][0] == found[0][1]:
        raise ConfigError("measure", "action_gain", "a run whose summary.json holds one group's "
                          "static Nash and joint-optimum actions, and they differ")
    nash, joint = found[0]
    return (_columns(frame, "cycle_price").mean(axis=1) - nash) / (joint - nash)


#: name -> (what it is, per-session values [S] from the sessions.csv DataFrame)
MEASURES: dict[str, tuple[str, Callable[[pd.DataFrame], np.ndarray]]] = {
    "profit_gain": ("Delta of the greedy limit cycle (profit_gain)",
                    lambda f: _column(f, "profit_gain")),
    "profit_gain_outcomes": ("Delta of the greedy limit cycle against the outcomes' own "
                             "benchmarks: the expectation over a random period's outcomes "
                             "of each outcome's static Nash and joint profits "
                             "(profit_gain_outcomes)",
                             lambda f: _column(f, "profit_gain_outcomes")),
    "played_profit_gain": ("Delta of the profits played in the last train.session_window "
                           "periods (played_profit_gain)",
                           lambda f: _column(f, "played_profit_gain")),
    "mean_played_profit": ("mean over sellers of the profit played in the last "
                           "train.session_window periods (played_profit_i)",
                           lambda f: _columns(f, "played_profit").mean(axis=1)),
    "mean_cycle_profit": ("mean over sellers of the profit over the greedy limit cycle "
                          "(cycle_profit_i)", lambda f: _columns(f, "cycle_profit").mean(axis=1)),
    "mean_cycle_price": ("mean over sellers of the price over the greedy limit cycle "
                         "(cycle_price_i)", lambda f: _columns(f, "cycle_price").mean(axis=1)),
    "mean_greedy_price": ("mean over sellers of the greedy price at the final profile "
                          "(greedy_price_i)", lambda f: _columns(f, "greedy_price").mean(axis=1)),
    "min_greedy_price": ("lowest greedy price at the final profile (a homogeneous good's "
                         "market price)", lambda f: _columns(f, "greedy_price").min(axis=1)),
    "action_gain": ("(a - a_N) / (a_M - a_N) of the mean over sellers of the action over the "
                    "greedy limit cycle (cycle_price_i; a Cournot market's quantities), a_N and "
                    "a_M the static Nash and joint-optimum actions of summary.json benchmarks: "
                    "0 at the static Nash equilibrium, 1 at the joint optimum", _action_gain),
    "revenue": ("sum over sellers of the fees at the final greedy profile (an auction's "
                "payments, greedy_fees_i)", lambda f: _columns(f, "greedy_fees").sum(axis=1)),
    "cycle_length": ("periods of the greedy limit cycle (cycle_length)",
                     lambda f: _column(f, "cycle_length")),
    "constant_price": ("1 where the greedy limit cycle is one period (constant prices), "
                       "else 0: its mean over sessions is their share (cycle_length)",
                       lambda f: (_column(f, "cycle_length") == 1).astype(np.float64)),
    "convergence_period": ("period of convergence, or of the run's end "
                           "(convergence_period)", lambda f: _column(f, "convergence_period")),
}


def _group_seeds(summary: dict, key: str) -> np.ndarray:
    """``[S]`` the per-seed ``key`` of the run's one group that has it
    (``summary.json`` ``per_seed[group][key]``; ``mean_price``: the first product's)."""
    groups = {g: v[key] for g, v in (summary.get("per_seed") or {}).items()
              if v.get(key) is not None}
    if key == "profit_gain":   # only the groups with both benchmarks
        groups = {g: v for g, v in groups.items() if g in (summary.get("profit_gain") or {})}
    if len(groups) != 1:
        raise ConfigError("measure", key, "a measure of a run with exactly one group that has "
                          f"per-seed {key} (groups with it: {sorted(groups) or 'none'}"
                          + ("; profit_gain needs pi_M != pi_N, summary.json "
                             "profit_gain_skipped)" if key == "profit_gain" else ")"))
    values = next(iter(groups.values()))
    values = [v[0] if isinstance(v, list) else v for v in values]
    return np.asarray([np.nan if v is None else v for v in values], np.float64)


#: a cent of a price in currency units: Hansen, Misra & Pai's "<1c" (their Figure 2)
CENT = 0.01
#: float32 prices one cent apart may differ by a little less than 0.01: below this
#: they count as within a cent
CENT_BELOW = CENT - 1e-5


def _recent_prices(summary: dict) -> tuple[str, np.ndarray]:
    """``(group, [S, A])`` the median price of each seller's last periods, per seed and
    seller, first product, of the run's one group that reports it (``summary.json``
    ``agents[group].recent_median_price``: a discrete bandit with ``recent_window``)."""
    found = {g: a["recent_median_price"]["per_seed"]
             for g, a in (summary.get("agents") or {}).items() if "recent_median_price" in a}
    if len(found) != 1:
        raise ConfigError("measure", "recent prices", "a run with exactly one group whose "
                          "learner reports its recent median prices (a discrete bandit with "
                          "recent_window > 0; groups with them: "
                          f"{sorted(found) or 'none'})")
    group, values = next(iter(found.items()))
    return group, np.asarray(values, np.float64)[:, :, 0]


def _recent_price_index(summary: dict) -> np.ndarray:
    """``(p - p_N) / (p_M - p_N)`` per seed: ``p`` the mean over sellers of their recent
    median prices, ``p_N``/``p_M`` the static Nash and joint-optimum prices of the
    group's ``summary.json`` benchmarks."""
    group, prices = _recent_prices(summary)
    bench = (summary.get("benchmarks") or {}).get(group) or {}
    nash, joint = bench.get("nash_price"), bench.get("joint_price")
    if nash is None or joint is None or nash == joint:
        raise ConfigError("measure", "recent_price_index", "a run whose summary.json holds "
                          f"{group}'s static Nash and joint-optimum prices, and they differ")
    return (prices.mean(axis=1) - nash) / (joint - nash)


def _recent_gap(summary: dict) -> np.ndarray:
    prices = _recent_prices(summary)[1]
    return prices.max(axis=1) - prices.min(axis=1)


#: name -> (what it is, per-seed values [S] from a trainer run's summary.json)
LOOP_MEASURES: dict[str, tuple[str, Callable[[dict], np.ndarray]]] = {
    "profit_gain": ("Delta of each seed's mean profit per seller over the last 10% of its "
                    "rows (summary.json per_seed[group].profit_gain)",
                    lambda s: _group_seeds(s, "profit_gain")),
    "mean_reward": ("each seed's mean reward per agent over the last 10% of its rows "
                    "(per_seed[group].mean_reward)", lambda s: _group_seeds(s, "mean_reward")),
    "mean_price": ("each seed's mean price over the last 10% of its rows "
                   "(per_seed[group].mean_price, first product)",
                   lambda s: _group_seeds(s, "mean_price")),
    "recent_price_index": ("(p - p_N) / (p_M - p_N) of the mean over sellers of each seed's "
                           "recent median prices (agents[group].recent_median_price: the median "
                           "price of each seller's last recent_window periods, first product), "
                           "p_N and p_M the static Nash and joint-optimum prices of "
                           "summary.json benchmarks: 0 at the static Nash equilibrium, 1 at "
                           "the joint optimum", _recent_price_index),
    "recent_price_gap": ("the highest less the lowest seller's recent median price of each "
                         "seed (|p_1 - p_2| for two sellers)", _recent_gap),
    "recent_prices_within_cent": ("1 where the sellers' recent median prices of a seed differ "
                                  "by less than one cent (0.01; prices one cent apart in "
                                  "float32 do not), else 0: its mean over seeds is their share",
                                  lambda s: (_recent_gap(s) < CENT_BELOW).astype(np.float64)),
}


def _finite(values: np.ndarray, measure: str) -> np.ndarray:
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ConfigError("measure", measure, "a measure defined in every session of this run "
                          "(empty or non-finite values; profit_gain needs pi_M != pi_N, "
                          "summary.json profit_gain_skipped)")
    return values


def per_seed(summary: dict, measure: str) -> np.ndarray:
    """The per-seed values ``[S]`` of ``measure`` (:data:`LOOP_MEASURES`) in a trainer
    run's ``summary.json``; a value that is not finite is a ConfigError."""
    return _finite(LOOP_MEASURES[measure][1](summary), measure)


def per_session(frame: pd.DataFrame, measure: str) -> np.ndarray:
    """The per-session values ``[S]`` of ``measure`` (:data:`MEASURES`) in a
    sessions.csv DataFrame; a value that is not finite (Delta without a benchmark) is a
    ConfigError."""
    values = MEASURES[measure][1](frame)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ConfigError("measure", measure, "a measure defined in every session of this run "
                          "(sessions.csv has empty or non-finite values; profit_gain needs "
                          "pi_M != pi_N, summary.json profit_gain_skipped)")
    return values


def statistic_of(values: np.ndarray, statistic: str) -> float:
    return float(np.median(values) if statistic == "median" else np.mean(values))


NO_PUBLISHED = "no published number"


def verdict(published: float | None, ci95: Sequence[float], tolerance: float) -> str:
    """``reproduced`` when ``published`` lies in ``[lo - tolerance, hi + tolerance]``
    (:data:`NO_PUBLISHED` when there is no published number)."""
    if published is None:
        return NO_PUBLISHED
    lo, hi = ci95
    return "reproduced" if lo - tolerance <= published <= hi + tolerance else "not reproduced"


# ------------------------------------------------------------------ designs

@dataclass(frozen=True)
class Design:
    """One design file, validated (module docstring)."""

    name: str
    config: Path                 # the resolved config file
    config_text: str             # as the train command names it
    overrides: tuple[str, ...]
    figure: str
    statistic: str
    measure: str
    published: float | None
    source: str
    root_cause: str | None
    path: Path

    def listing(self) -> dict:
        return {"name": self.name, "figure": self.figure, "published": self.published,
                "source": self.source}


_REQUIRED = ("name", "config", "overrides", "figure", "statistic", "measure", "published",
             "source")
_OPTIONAL = ("root_cause",)


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, value, "a non-empty string")
    return value.strip()


def _config_path(where: str, value: str, design_dir: Path) -> tuple[Path, str]:
    """``(file, text)``: a shipped config name, or a path relative to the design file."""
    if "/" not in value and "\\" not in value and not value.endswith((".yaml", ".yml")):
        path = SHIPPED_CONFIGS / f"{value}.yaml"
        if path.is_file():
            return path, f"configs/{value}.yaml"
    else:
        path = Path(value) if Path(value).is_absolute() else design_dir / value
        if path.is_file():
            return path, str(path)
    shipped = ", ".join(sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml")))
    raise ConfigError(where, value, f"a shipped config ({shipped}) or a YAML file relative "
                      f"to the design file ({design_dir})")


def load_design(path: str | Path) -> Design:
    """A design file, validated: a bad field is a ConfigError naming the file and field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("design", str(path), "an existing design YAML file")
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(str(path), raw, "a YAML mapping with the keys "
                          + ", ".join(_REQUIRED))
    at = lambda key: f"{path}: {key}"  # noqa: E731
    for key in raw:
        if key not in _REQUIRED + _OPTIONAL:
            raise ConfigError(at(key), raw[key], "the keys " + ", ".join(_REQUIRED + _OPTIONAL))
    for key in _REQUIRED:
        if key not in raw:
            raise ConfigError(at(key), "<missing>", "this field is required")
    name = _text(at("name"), raw["name"])
    if not _NAME.fullmatch(name):
        raise ConfigError(at("name"), name, "letters, digits, '_', '.' and '-'")
    config, config_text = _config_path(at("config"), _text(at("config"), raw["config"]),
                                       path.parent)
    overrides = raw["overrides"] if raw["overrides"] is not None else []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o
                                                  for o in overrides):
        raise ConfigError(at("overrides"), overrides, "a list of dotted key=value strings")
    if raw["statistic"] not in STATISTICS:
        raise ConfigError(at("statistic"), raw["statistic"], " or ".join(STATISTICS))
    if raw["measure"] not in MEASURES and raw["measure"] not in LOOP_MEASURES:
        raise ConfigError(at("measure"), raw["measure"], "one of " + ", ".join(
            dict.fromkeys([*MEASURES, *LOOP_MEASURES])))
    published = raw["published"]
    if published is not None and (not isinstance(published, (int, float))
                                  or isinstance(published, bool)
                                  or not math.isfinite(published)):
        raise ConfigError(at("published"), published, "a finite number, or null where the "
                          "paper's number could not be read")
    root = raw.get("root_cause")
    return Design(name=name, config=config, config_text=config_text,
                  overrides=tuple(o.strip() for o in overrides),
                  figure=_text(at("figure"), raw["figure"]), statistic=raw["statistic"],
                  measure=raw["measure"],
                  published=None if published is None else float(published),
                  source=_text(at("source"), raw["source"]),
                  root_cause=None if root is None else _text(at("root_cause"), root),
                  path=path)


def design_paths() -> list[Path]:
    """The shipped design files, by name."""
    return sorted(DESIGNS_DIR.glob("*.yaml"))


def list_designs() -> list[Design]:
    return [load_design(p) for p in design_paths()]


def find_design(name_or_path: str) -> Design:
    """A shipped design by name, or a design file (a path: it names a file, contains a
    ``/`` or ends in ``.yaml``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path or path.is_file():
        return load_design(path)
    shipped = DESIGNS_DIR / f"{name_or_path}.yaml"
    if not shipped.is_file():
        raise ConfigError("design", name_or_path, "one of " + ", ".join(
            p.stem for p in design_paths()) + ", or a design YAML file")
    return load_design(shipped)


# ------------------------------------------------------------------ the run

def _sizes(config: dict) -> tuple[int, int]:
    tcfg = resolve_train(config.get("train"))
    return tcfg.num_seeds, tcfg.num_iterations


def command_overrides(sessions: int | None = None, periods: int | None = None,
                      seed: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command's options as overrides, after the design's (module docstring)."""
    out = [] if sessions is None else [f"train.num_seeds={sessions}"]
    out += [] if periods is None else [f"train.num_iterations={periods}"]
    out += [] if seed is None else [f"seed={seed}"]
    return out + list(extra)


def default_run_dir(design: Design) -> str:
    return f"runs/reproduce-{design.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def reproduce(design: Design, run_dir: str | Path | None = None,
              overrides: Sequence[str] = (), command: str | None = None,
              progress_every: float | None = None, cluster: Any = None) -> dict:
    """Run ``design`` (with the command's ``overrides`` after its own) into ``run_dir``
    and write its ``reproduction.json`` there; returns that dict. ``cluster``: where a
    session-engine design's sessions play (:class:`jaxmarket.cluster.blocks.OnCluster`;
    None: this process); a loop design with one is a ConfigError naming ``--ray``."""
    all_overrides = list(design.overrides) + list(overrides)
    design_sessions, design_periods = _sizes(load_config(design.config, design.overrides))
    config = load_config(design.config, all_overrides)
    session_run.warm_kernel(config)
    engine, reason, plan = session_run.choose_engine(config)
    run_dir = str(run_dir) if run_dir is not None else default_run_dir(design)
    train_command = shlex.join(["python", "-m", "jaxmarket.train", design.config_text,
                                "--run-dir", run_dir, *all_overrides])
    if engine != "sessions":
        if cluster is not None:
            raise ConfigError("--ray", cluster.address or "local", f"a session-engine design "
                              f"({design.name} runs on the loop engine: {reason}; the loop "
                              "runs across hosts with --distributed, docs/cluster.md)")
        return _reproduce_loop(design, config, run_dir, command or train_command,
                               train_command, design_sessions, design_periods, progress_every)
    if design.measure not in MEASURES:
        raise ConfigError(f"{design.path}: measure", design.measure, "a measure of a "
                          "session-engine run: one of " + ", ".join(MEASURES))
    started = time.perf_counter()
    summary = session_run.start(config, plan, run_dir, command=command or train_command,
                                progress_every=progress_every, cluster=cluster)
    wall = time.perf_counter() - started
    verify(run_dir)
    frame = pd.read_csv(Path(run_dir) / session_run.SESSIONS_FILE)
    frame.attrs["summary"] = summary   # the benchmarks of action_gain
    values = per_session(frame, design.measure)
    _, max_periods = _sizes(config)
    result = _result(design, values, {
        "sessions": int(values.size), "periods": int(summary["periods"]),
        "max_periods": int(max_periods), "design_sessions": int(design_sessions),
        "design_max_periods": int(design_periods),
        "converged_share": float(summary["convergence"]["share"]),
        "wall_s": round(wall, 1), "run_dir": run_dir,
        "command": command or train_command, "train_command": train_command,
    })
    _write_result(run_dir, result)
    return result


def _result(design: Design, values: np.ndarray, run: dict) -> dict:
    """``reproduction.json``: the design's figure, ``values``' statistic with its 95%
    interval and the verdict, then ``run`` (the run's sizes, time and commands)."""
    ci = bootstrap_ci(values, design.statistic)
    tolerance = TOLERANCE * abs(design.published or 0.0)
    return {
        "name": design.name, "figure": design.figure, "statistic": design.statistic,
        "measure": design.measure, "value": statistic_of(values, design.statistic),
        "ci95": ci, "published": design.published, "tolerance": tolerance,
        "verdict": verdict(design.published, ci, tolerance), "source": design.source,
        **({"root_cause": design.root_cause} if design.root_cause else {}),
        **run,
    }


def _write_result(run_dir: str, result: dict) -> None:
    tmp = Path(run_dir) / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(Path(run_dir) / RESULT_FILE)


def _reproduce_loop(design: Design, config: dict, run_dir: str, command: str,
                    train_command: str, design_sessions: int, design_periods: int,
                    progress_every: float | None) -> dict:
    """A design the session engine does not play, on the regular trainer (one seed = one
    session); its measure from the run's ``summary.json`` per-seed values."""
    if design.measure not in LOOP_MEASURES:
        raise ConfigError(f"{design.path}: measure", design.measure, "a measure of a trainer "
                          "run (the session engine does not play this design): one of "
                          + ", ".join(LOOP_MEASURES))
    tcfg = resolve_train(config.get("train"))
    started = time.perf_counter()
    start_run(config, [], run_dir, command=command, progress_every=progress_every)
    wall = time.perf_counter() - started
    summary = read_summary(run_dir)
    values = per_seed(summary, design.measure)
    shares = [c["share_converged"] for c in (summary.get("convergence") or {}).values()]
    T = tcfg.rollout_length
    result = _result(design, values, {
        "engine": "loop", "sessions": int(values.size),
        "periods": int(summary["iterations"]) * T, "max_periods": tcfg.num_iterations * T,
        "design_sessions": int(design_sessions), "design_max_periods": int(design_periods) * T,
        "converged_share": float(np.mean(shares)) if shares else 0.0,
        "wall_s": round(wall, 1), "run_dir": run_dir,
        "command": command, "train_command": train_command,
    })
    _write_result(run_dir, result)
    return result


def published_text(published: float | None) -> str:
    """A published number as the listing and the table print it."""
    return "not found" if published is None else f"{published:g}"


def result_lines(result: dict) -> str:
    """The lines a reproduction ends with: the figure, ours beside the published one."""
    lo, hi = result["ci95"]
    return "\n".join([
        f"{result['name']}: {result['figure']}",
        f"  ours {result['value']:.4f}  95% CI [{lo:.4f}, {hi:.4f}]  published "
        f"{published_text(result['published'])}: {result['verdict']} "
        f"({result['sessions']} sessions, "
        f"{result['periods']:,d} periods, converged {result['converged_share']:.0%}, "
        f"{result['wall_s']:.1f} s)",
        f"  {result['run_dir']}/{RESULT_FILE}"])


__all__ = [
    "DESIGNS_DIR",
    "LOOP_MEASURES",
    "MEASURES",
    "NO_PUBLISHED",
    "RESULT_FILE",
    "STATISTICS",
    "TOLERANCE",
    "Design",
    "command_overrides",
    "design_paths",
    "find_design",
    "list_designs",
    "load_design",
    "per_seed",
    "per_session",
    "published_text",
    "reproduce",
    "result_lines",
    "statistic_of",
    "verdict",
]
