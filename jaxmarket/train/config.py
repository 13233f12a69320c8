"""The ``train:`` section and the ``learners:`` section, validated before compiling."""

from __future__ import annotations

import copy
import importlib.util
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import INT32_MAX, Field, check_mapping
from jaxmarket.config.loader import _split_path
from jaxmarket.market.demand import DEFAULT_DEMAND, DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.spec import resolve_market

TRAIN_FIELDS = {
    "num_iterations": Field("int", 1000, low=1, doc="learner updates per seed"),
    "rollout_length": Field("int", 1, low=1, doc="market steps collected per update"),
    "num_envs": Field("int", 1, low=1, doc="markets per seed (their agents share policies)"),
    "num_seeds": Field("int", 1, low=1, doc="independent runs, vmapped"),
    "chunk_size": Field("int", 100, low=1, doc="iterations per compiled chunk"),
    "checkpoint_every": Field("int", 1, low=1, doc="chunks between checkpoints"),
    "stop_on_nan": Field("bool", True, doc="stop when a metric is not finite"),
    "early_stop": Field("any", None, optional=True,
                        doc="{metric: NAME, above: X} or {metric: NAME, below: X}"),
    "schedule": Field("any", None, optional=True,
                      doc="market changes during training: a list of {at: ITERATION, "
                          "set: {dotted.market.key: value}} (docs/poi.md)"),
    "log_every": Field("any", "auto",
                       doc="iterations between rows of metrics.csv and the per-seed file "
                           "(and the run's last iteration): an integer >= 1, or 'auto' "
                           "(1 up to 10,000 iterations, then a power of ten; docs/runs.md)"),
    "seeds_format": Field("choice", "csv", choices=("csv", "parquet"),
                          doc="the per-seed rows: seeds.csv, or seeds.parquet/ (a directory "
                              "of Parquet parts, one per chunk; needs pyarrow)"),
    "profit_gain": Field("choice", "auto", choices=("auto", True, False),
                         doc="summary.json's profit_gain per group from the static Nash and "
                             "joint optimum of the market's own reward (docs/equilibrium.md; "
                             "about a second at the end of a run): auto computes it where the "
                             "period's expectation is exact (deterministic, or a draw of "
                             "finitely many declared outcomes; any other random one averages "
                             "256 keys per profile: minutes for large markets), true always, "
                             "false never"),
    "engine": Field("choice", "auto", choices=("auto", "loop", "sessions"),
                    doc="loop: the general training loop; sessions: the session engine "
                        "(train.num_seeds independent sessions against the market's outcome "
                        "tables, docs/sessions.md); auto: sessions wherever the design is one "
                        "it plays exactly, else loop (the reason is printed)"),
    "session_stop": Field("choice", "converged", choices=("converged", "periods"),
                          doc="sessions engine: converged stops each session at its learner's "
                              "convergence rule (at most num_iterations periods); periods "
                              "plays every session for num_iterations periods"),
    "session_window": Field("int", 1000, low=1,
                            doc="sessions engine: the last periods before num_iterations "
                                "whose played profits give played_profit_gain"),
    "session_backend": Field("choice", "auto", choices=("auto", "xla", "kernel"),
                             doc="sessions engine: xla (any device), kernel (numba, CPU; the "
                                 "same sessions bit for bit), auto (kernel where it can run)"),
    "session_outcome_benchmarks": Field("bool", False,
                                        doc="sessions engine, random period outcomes: also "
                                            "Delta against the expectation of each "
                                            "outcome's own Nash and joint profits "
                                            "(profit_gain_outcomes, Calvano et al.'s "
                                            "stochastic demand)"),
}

# log_every "auto": at most this many rows in metrics.csv, and iterations x seeds rows in
# the per-seed file
AUTO_MAX_ROWS, AUTO_MAX_SEED_ROWS = 10_000, 100_000


@dataclass(frozen=True)
class TrainConfig:
    num_iterations: int
    rollout_length: int
    num_envs: int
    num_seeds: int
    chunk_size: int
    checkpoint_every: int
    stop_on_nan: bool
    early_stop: Any
    # train.schedule as given (its shape validated); resolved against the market by
    # resolve_schedule into the plan's ScheduleEntry tuple (jaxmarket.train.plan)
    schedule: Any = None
    # the row interval, resolved ("auto" -> auto_log_every), and the per-seed format
    log_every: int = 1
    seeds_format: str = "csv"
    profit_gain: Any = "auto"
    engine: str = "auto"
    session_stop: str = "converged"
    session_window: int = 1000
    session_backend: str = "auto"
    session_outcome_benchmarks: bool = False


def auto_log_every(num_iterations: int, num_seeds: int) -> int:
    """``train.log_every: auto``: the smallest power of ten ``10^k`` that keeps
    ``metrics.csv`` at most :data:`AUTO_MAX_ROWS` rows and the per-seed file at most
    :data:`AUTO_MAX_SEED_ROWS` rows (iterations / interval x seeds): 1 for every run up
    to 10,000 iterations of up to 10 seeds (every shipped config at the lengths its
    tests run), 1000 for 2.5M iterations of 8 seeds. Powers of ten nest, so a run
    extended on ``--resume`` (a larger interval) still has a row at every multiple of
    the new one."""
    every = 1
    while (math.ceil(num_iterations / every) > AUTO_MAX_ROWS
           or math.ceil(num_iterations / every) * num_seeds > AUTO_MAX_SEED_ROWS):
        every *= 10
    return every


def _log_every(value: Any, tcfg: dict, where: str) -> int:
    if value == "auto":
        return auto_log_every(tcfg["num_iterations"], tcfg["num_seeds"])
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT32_MAX
    if not ok:
        raise ConfigError(f"{where}.log_every", value, "'auto' or an integer >= 1 (iterations "
                          "between rows of metrics.csv and the per-seed file)")
    return value


def resolve_train(raw: Any, where: str = "train") -> TrainConfig:
    vals = check_mapping(TRAIN_FIELDS, raw or {}, where, ignore=())
    stop = vals["early_stop"]
    if stop is not None:
        ok = (isinstance(stop, dict) and isinstance(stop.get("metric"), str)
              and len(set(stop) & {"above", "below"}) == 1 and set(stop) <= {"metric", "above", "below"})
        if not ok:
            raise ConfigError(f"{where}.early_stop", stop,
                              "{metric: NAME, above: NUMBER} or {metric: NAME, below: NUMBER}")
    vals["schedule"] = check_schedule(vals["schedule"], vals["num_iterations"],
                                      f"{where}.schedule")
    vals["log_every"] = _log_every(vals["log_every"], vals, where)
    if vals["seeds_format"] == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError(f"{where}.seeds_format", "parquet", "csv, or parquet with pyarrow "
                          "installed (pip install 'jaxmarket[parquet]')")
    return TrainConfig(**vals)


# ------------------------------------------------------------------ train.schedule

# the market fields a schedule may set: arrays of params that no learner reads at build
# time (action bounds are compiled into the learners: low, high, budget_low, budget_high)
SCHEDULE_SELLER = ("initial", "cost", "quality", "reliability", "latency", "freshness",
                   "stake", "value")
SCHEDULE_CONSUMER = ("budget", "base_price", "queries")


@dataclass(frozen=True)
class ScheduleEntry:
    """One resolved ``train.schedule`` item: from the iteration with 0-based index
    ``at`` on (after ``at`` iterations), ``params`` leaf ``path`` holds ``value``.
    ``path``: ``("sellers", group, field)``, ``("consumers", group, field)``,
    ``("consumers", group, "demand", name)`` or ``("distributor", name)``; ``value``:
    nested tuples of floats (hashable), the leaf's exact shape."""

    at: int
    path: tuple
    value: tuple


def check_schedule(raw: Any, num_iterations: int, where: str) -> Any:
    """The shape of ``train.schedule`` (values are resolved against the market later);
    returns it with every ``at`` an iteration (``"50%"``: that share of
    ``num_iterations``, rounded down)."""
    if raw is None:
        return None
    out = []
    item_text = "{at: ITERATION, set: {dotted.market.key: value, ...}}"
    if not isinstance(raw, list):
        raise ConfigError(where, raw, "a list of " + item_text)
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or set(item) != {"at", "set"}:
            raise ConfigError(at, item, item_text)
        it = item["at"]
        if isinstance(it, str) and it.endswith("%"):
            try:
                share = float(it[:-1])
            except ValueError:
                share = -1.0
            it = int(share / 100 * num_iterations) if 0 <= share <= 100 else item["at"]
        if not isinstance(it, int) or isinstance(it, bool) or not 0 <= it <= num_iterations:
            raise ConfigError(f"{at}.at", item["at"], f"an integer in [0, {num_iterations}] "
                              "(train.num_iterations: the iterations done before the change) "
                              "or a share like '50%'")
        changes = item["set"]
        if not isinstance(changes, dict) or not changes:
            raise ConfigError(f"{at}.set", changes,
                              "a non-empty mapping {dotted.market.key: value}")
        for key in changes:
            if not isinstance(key, str) or not key.startswith("market."):
                raise ConfigError(f"{at}.set", key, "keys that are dotted market fields, e.g. "
                                  "market.sellers[1].cost or market.distributor.temperature")
        out.append({"at": it, "set": changes})
    return out


def _schedule_path(config: dict, key: str, where: str) -> tuple:
    """A dotted market key -> the path of its leaf in ``MarketParams``, or a
    ConfigError naming it when it is not an array-valued market field."""
    allowed = ("an array-valued market field: market.sellers[i].{" + ",".join(SCHEDULE_SELLER)
               + "}, market.consumers[i].{" + ",".join(SCHEDULE_CONSUMER)
               + "}, market.consumers[i].demand.<param>, market.distributor.<param> "
               "(not structure, options or action bounds)")
    try:
        parts = _split_path(key)
    except ConfigError:
        raise ConfigError(where, key, allowed) from None
    market = config.get("market") if isinstance(config.get("market"), dict) else {}
    if len(parts) == 4 and parts[1] in ("sellers", "consumers") and isinstance(parts[2], int):
        side, i, name = parts[1], parts[2], parts[3]
        groups = market.get(side) if isinstance(market.get(side), list) else []
        fields = SCHEDULE_SELLER if side == "sellers" else SCHEDULE_CONSUMER
        if 0 <= i < len(groups) and isinstance(groups[i], dict) and name in fields:
            return (side, groups[i].get("name"), name)
    if len(parts) == 5 and parts[1] == "consumers" and isinstance(parts[2], int) \
            and parts[3] == "demand":
        groups = market.get("consumers") if isinstance(market.get("consumers"), list) else []
        if 0 <= parts[2] < len(groups) and isinstance(groups[parts[2]], dict):
            demand = groups[parts[2]].get("demand") or {"kind": DEFAULT_DEMAND}
            kind = demand.get("kind") if isinstance(demand, dict) else None
            if kind in DEMANDS and parts[4] in DEMANDS[kind].params:
                return ("consumers", groups[parts[2]].get("name"), "demand", parts[4])
    if len(parts) == 3 and parts[1] == "distributor":
        dist = market.get("distributor")
        kind = dist.get("kind") if isinstance(dist, dict) else None
        if kind in DISTRIBUTORS and parts[2] in DISTRIBUTORS[kind].params:
            return ("distributor", parts[2])
    raise ConfigError(where, key, allowed)


def schedule_leaf(params: Any, path: tuple) -> Any:
    """The leaf of ``MarketParams`` at a schedule path."""
    if path[0] == "distributor":
        return params.distributor[path[1]]
    group = getattr(params, path[0])[path[1]]
    return group.demand[path[3]] if len(path) == 4 else getattr(group, path[2])


def with_schedule_leaf(params: Any, path: tuple, value: Any) -> Any:
    """``params`` with the leaf at ``path`` replaced by ``value`` (a new pytree)."""
    if path[0] == "distributor":
        return params.replace(distributor={**params.distributor, path[1]: value})
    side = getattr(params, path[0])
    group = side[path[1]]
    if len(path) == 4:
        group = group.replace(demand={**group.demand, path[3]: value})
    else:
        group = group.replace(**{path[2]: value})
    return params.replace(**{path[0]: {**side, path[1]: group}})


def resolve_schedule(config: dict, tcfg: TrainConfig, base: tuple | None = None) -> tuple:
    """``train.schedule`` -> a tuple of :class:`ScheduleEntry`, every value resolved by
    the market's own resolver (``resolve_market`` on the config with the change applied),
    so a scalar, a per-product list or a ``[count, P]`` array is broadcast and checked as
    it would be in ``market:``; a change that alters the market's structure is refused.
    ``base``: the market's ``(spec, params)`` as resolved already."""
    raw = tcfg.schedule
    if not raw:
        return ()
    base_spec, base_params = base if base is not None else resolve_market(config.get("market"))
    entries = []
    for i, item in enumerate(raw):
        for key, value in item["set"].items():
            where = f"train.schedule[{i}].set.{key}"
            path = _schedule_path(config, key, where)
            changed = copy.deepcopy(config)
            node = changed
            parts = _split_path(key)
            for part in parts[:-1]:
                node = node[part] if isinstance(part, int) else node.setdefault(part, {})
            node[parts[-1]] = value
            try:
                spec, params = resolve_market(changed["market"])
            except ConfigError as err:
                raise ConfigError(where, value, err.allowed) from None
            if spec != base_spec:
                raise ConfigError(where, value, "a value that leaves the market's structure "
                                  "unchanged")
            leaf = np.asarray(schedule_leaf(params, path), np.float32)
            if leaf.shape != np.shape(schedule_leaf(base_params, path)):
                raise ConfigError(where, value, "a value of the field's shape "
                                  f"{list(np.shape(schedule_leaf(base_params, path)))}")
            entries.append(ScheduleEntry(item["at"], path, _to_tuple(leaf)))
    return tuple(entries)


def _to_tuple(x: Any) -> Any:
    x = np.asarray(x)
    return float(x) if x.ndim == 0 else tuple(_to_tuple(v) for v in x)
