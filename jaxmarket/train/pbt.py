"""Population-based training (Jaderberg et al. 2017), in-graph: every ``period``
iterations the bottom members of each seed's population copy the parameters *and*
optimizer state of a random top member of the same seed, then mutate the
hyperparameters they inherited. Modelled on sample-factory's PBT (replace fraction,
relative and absolute reward gap, mutation rate, a perturbation factor drawn from a
range and applied up or down).

Config (``learners.<group>.pbt``, or a top-level ``pbt:`` for every group with a
population; a group's own keys override the top-level ones)::

    pbt:
      period: 100                 # iterations between PBT steps
      start: 0                    # first iteration (1-based count) a step may act
      objective: reward           # the member's mean reward over the last period
      replace_fraction: 0.3       # bottom/top fraction of each seed's K members
      replace_reward_gap: {relative: 0.1, absolute: 0.0}
      mutation_rate: 0.15         # chance per inherited hyperparameter
      perturb: [1.2, 1.5]         # factor range: value * f or value / f, f ~ U(1.2, 1.5)
      hyperparams: {learning_rate: [1.0e-5, 1.0e-1]}   # name: [low, high] (clip bounds)
      init: {learning_rate: log_spaced}   # optional: log_spaced | log_uniform | [K values]

Hyperparameters live in the learner state as per-policy ``[S * K]`` arrays
(``state.hyper``), so a mutation never recompiles. Everything is deterministic given the
run's seed (keys are ``fold_in``s of the runner key). The runner keeps, per PBT group, the
running sum ``[S, K]`` of each member's per-iteration mean reward since the last period
boundary; the objective is that sum / ``period``.

Events come out of each iteration as fixed-size ``[S, K]`` arrays under ``pbt/<group>/``
(``replaced``, ``source``, ``objective``, ``old/<h>``, ``new/<h>``); the host turns the
replaced entries into rows of ``RUN_DIR/pbt.csv`` (:func:`event_rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping
from jaxmarket.learners.base import LEARNERS

PREFIX = "pbt/"              # chunk outputs that become pbt.csv rows, not metrics
OBJECTIVE = "pbt_objective/"  # per-iteration [S, K] objective signal, internal to the loop
CSV_COLUMNS = ("iteration", "group", "seed", "member", "source", "objective",
               "source_objective", "hyperparameter", "old", "new")

INIT_MODES = ("log_spaced", "log_uniform")

FIELDS = {
    "period": Field("int", 100, low=1, doc="iterations between PBT steps"),
    "start": Field("int", 0, low=0, doc="first iteration a PBT step may act"),
    "objective": Field("choice", "reward", choices=("reward",),
                       doc="the member's mean reward over the last period"),
    "replace_fraction": Field("float", 0.3, low=0.0, low_open=True, high=0.5),
    "replace_reward_gap": Field("any", None, optional=True,
                                doc="{relative: 0.1, absolute: 0.0}"),
    "mutation_rate": Field("float", 0.15, low=0.0, high=1.0),
    "perturb": Field("any", None, optional=True, doc="[low, high] factor range, >= 1"),
    "hyperparams": Field("any", None, optional=True, doc="{name: [low, high]}"),
    "init": Field("any", None, optional=True, doc="{name: log_spaced|log_uniform|[K values]}"),
}


@dataclass(frozen=True)
class PbtConfig:
    kind: str
    size: int                 # K members per seed
    period: int
    start: int
    objective: str
    replace_fraction: float
    gap_relative: float
    gap_absolute: float
    mutation_rate: float
    perturb: tuple[float, float]
    hyperparams: tuple[tuple[str, float, float], ...]
    init: tuple[tuple[str, Any], ...] = ()

    @property
    def num_replace(self) -> int:
        """Members replaced (and sources drawn from) per seed: the bottom and top
        ``max(1, floor(K * replace_fraction))``."""
        return max(1, int(math.floor(self.size * self.replace_fraction + 1e-9)))


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def pbt_kinds() -> list[str]:
    """The learner kinds PBT applies to: those whose :class:`LearnerDef` declares
    ``pbt_hyperparams``."""
    return sorted(k for k, d in LEARNERS.items() if d.pbt_hyperparams)


def split_pbt(raw: Any) -> tuple[Any, Any]:
    """A group's learner config -> (config without ``pbt``, its ``pbt`` block or None)."""
    if not isinstance(raw, Mapping) or "pbt" not in raw:
        return raw, None
    return {k: v for k, v in raw.items() if k != "pbt"}, raw["pbt"]


def strip_pbt(config: dict) -> dict:
    """The config as the market and learner builders expect it: no top-level ``pbt`` and
    no ``learners.<group>.pbt``."""
    out = {k: v for k, v in config.items() if k != "pbt"}
    if isinstance(out.get("learners"), Mapping):
        out["learners"] = {g: split_pbt(c)[0] for g, c in out["learners"].items()}
    return out


def resolve_pbt(config: dict, populations: Mapping[str, Any]) -> dict[str, PbtConfig]:
    """Validate the ``pbt`` blocks against the groups' populations and learner kinds;
    ``{group: PbtConfig}`` for every group PBT applies to."""
    top = config.get("pbt")
    learners = config.get("learners") if isinstance(config.get("learners"), Mapping) else {}
    if top is not None:
        check_mapping(FIELDS, top, "pbt", ignore=())
        if not any(p is not None for p in populations.values()):
            raise ConfigError("pbt", top, "a learners.<group> with population: K >= 2 "
                              "(PBT acts within a population)")
    out = {}
    for g, raw in learners.items():
        _, own = split_pbt(raw)
        if own is None and top is None:
            continue
        where = f"learners.{g}.pbt" if own is not None else "pbt"
        pop = populations.get(g)
        if pop is None:
            if own is None:
                continue          # a top-level pbt: applies to the groups with a population
            raise ConfigError(where, own, f"a group with population: K >= 2 (learners.{g} "
                              "has no population)")
        if own is not None and not isinstance(own, Mapping):
            raise ConfigError(where, own, "a mapping of PBT settings")
        merged = {**(top or {}), **(own or {})}
        out[g] = _resolve_one(merged, where, g, raw, pop.size)
    return out


def _resolve_one(raw: Mapping, where: str, group: str, learner: Any, size: int) -> PbtConfig:
    h = check_mapping(FIELDS, raw, where, ignore=())
    kind = learner.get("kind") if isinstance(learner, Mapping) else None
    if kind not in LEARNERS or not LEARNERS[kind].pbt_hyperparams:
        raise ConfigError(f"learners.{group}.kind", kind, "one of " + ", ".join(pbt_kinds())
                          + f" (the learners whose definition declares PBT hyperparameters, "
                          f"which {where} mutates)")
    names = LEARNERS[kind].pbt_hyperparams
    if size < 2:
        raise ConfigError(f"learners.{group}.population", size,
                          f"an integer >= 2 ({where} needs members to compare)")
    gap = h["replace_reward_gap"] if h["replace_reward_gap"] is not None else {}
    if not isinstance(gap, Mapping) or set(gap) - {"relative", "absolute"} or not all(
            _number(v) and v >= 0 for v in gap.values()):
        raise ConfigError(f"{where}.replace_reward_gap", gap,
                          "{relative: R, absolute: A} with numbers >= 0")
    perturb = h["perturb"] if h["perturb"] is not None else [1.2, 1.5]
    if not (isinstance(perturb, (list, tuple)) and len(perturb) == 2 and all(map(_number, perturb))
            and 1.0 <= perturb[0] <= perturb[1]):
        raise ConfigError(f"{where}.perturb", perturb, "[low, high] with 1 <= low <= high "
                          "(a factor drawn from that range multiplies or divides the value)")
    hp = h["hyperparams"]
    if not isinstance(hp, Mapping) or not hp:
        raise ConfigError(f"{where}.hyperparams", hp if hp is not None else "<missing>",
                          "a mapping {name: [low, high]} of the hyperparameters to mutate, "
                          "names among " + ", ".join(names))
    bounds = []
    for name, b in hp.items():
        if name not in names:
            raise ConfigError(f"{where}.hyperparams.{name}", b, f"a hyperparameter of {kind}: "
                              + ", ".join(names))
        if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(map(_number, b))
                and 0 < b[0] <= b[1]):
            raise ConfigError(f"{where}.hyperparams.{name}", b,
                              "[low, high] with 0 < low <= high")
        bounds.append((str(name), float(b[0]), float(b[1])))
    init = h["init"] if h["init"] is not None else {}
    if not isinstance(init, Mapping):
        raise ConfigError(f"{where}.init", init, "a mapping {name: mode}")
    inits = []
    for name, mode in init.items():
        if name not in hp:
            raise ConfigError(f"{where}.init.{name}", mode,
                              "a hyperparameter listed in hyperparams (its bounds set the range)")
        if isinstance(mode, (list, tuple)):
            if len(mode) != size or not all(_number(v) and v > 0 for v in mode):
                raise ConfigError(f"{where}.init.{name}", mode,
                                  f"{size} positive numbers (one per member)")
            mode = tuple(float(v) for v in mode)
        elif mode not in INIT_MODES:
            raise ConfigError(f"{where}.init.{name}", mode, "one of " + ", ".join(INIT_MODES)
                              + f" or a list of {size} values")
        inits.append((str(name), mode))
    return PbtConfig(kind=kind, size=size, period=h["period"], start=h["start"],
                     objective=h["objective"], replace_fraction=h["replace_fraction"],
                     gap_relative=float(gap.get("relative", 0.1)),
                     gap_absolute=float(gap.get("absolute", 0.0)),
                     mutation_rate=h["mutation_rate"],
                     perturb=(float(perturb[0]), float(perturb[1])),
                     hyperparams=tuple(bounds), init=tuple(inits))


# ---- in-graph ------------------------------------------------------------------------

def members(state: Any, kind: str) -> dict:
    """The per-member part of a learner state of ``kind``: what a replaced member copies
    (its definition's ``member_fields``: parameters and optimizer state, or Q tables) and
    what it mutates (``hyper``)."""
    return LEARNERS[kind].members(state)


def with_members(state: Any, tree: dict) -> Any:
    return state.replace(**tree)


def initial_hyper(key: jax.Array, cfg: PbtConfig, state: Any, num_seeds: int) -> Any:
    """``state`` with the per-member initial hyperparameters of ``cfg.init``."""
    if not cfg.init:
        return state
    S, K = num_seeds, cfg.size
    bounds = {n: (lo, hi) for n, lo, hi in cfg.hyperparams}
    hyper = dict(state.hyper)
    for i, (name, mode) in enumerate(cfg.init):
        lo, hi = bounds[name]
        if mode == "log_spaced":
            row = np.exp(np.linspace(math.log(lo), math.log(hi), K)).astype(np.float32)
            values = jnp.tile(jnp.asarray(row), S)
        elif mode == "log_uniform":
            u = jax.random.uniform(jax.random.fold_in(key, i), (S * K,), jnp.float32,
                                   math.log(lo), math.log(hi))
            values = jnp.exp(u)
        else:
            values = jnp.tile(jnp.asarray(mode, jnp.float32), S)
        hyper[name] = values.astype(hyper[name].dtype)
    return state.replace(hyper=hyper)


def pbt_step(key: jax.Array, tree: dict, objective: jax.Array, cfg: PbtConfig
             ) -> tuple[dict, dict]:
    """One PBT step on the member tree of ``S`` seeds (every policy-stacked leaf
    ``[S * K, ...]``), with ``objective [S, K]``. Returns the new tree and the events
    ``{replaced, source, objective, source_objective, old/<h>, new/<h>}`` (each ``[S, K]``).

    Per seed: rank the members by objective (ties: lower index first); each of the bottom
    ``n`` draws a source uniformly among the top ``n`` and is replaced when the source
    beats it by more than ``absolute`` and by more than ``relative * |source objective|``.
    A replaced member gets the source's leaves bit for bit; each of its hyperparameters
    is then, with probability ``mutation_rate``, multiplied or divided (even odds) by
    ``f ~ U(perturb)`` and clipped to its bounds."""
    S, K = objective.shape
    n = cfg.num_replace
    k_src, k_mut, k_amt, k_dir = jax.random.split(key, 4)
    order = jnp.argsort(-objective, axis=1, stable=True)                 # best first
    bottom = order[:, K - n:]                                            # [S, n]
    pick = jax.random.randint(k_src, (S, n), 0, n)
    source = jnp.take_along_axis(order[:, :n], pick, axis=1)             # [S, n]
    obj_b = jnp.take_along_axis(objective, bottom, axis=1)
    obj_s = jnp.take_along_axis(objective, source, axis=1)
    gap = obj_s - obj_b
    replace = (gap > cfg.gap_absolute) & (gap > cfg.gap_relative * jnp.abs(obj_s))
    rows = jnp.arange(S)[:, None]
    own = jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32), (S, K))
    src = own.at[rows, bottom].set(jnp.where(replace, source, bottom).astype(jnp.int32))
    replaced = jnp.zeros((S, K), bool).at[rows, bottom].set(replace)
    flat = (jnp.arange(S, dtype=jnp.int32)[:, None] * K + src).reshape(-1)
    N = S * K

    def copy(x):
        x = jnp.asarray(x)
        return x[flat] if x.ndim >= 1 and x.shape[0] == N else x

    new = jax.tree.map(copy, tree)
    events = {"replaced": replaced, "source": src, "objective": objective,
              "source_objective": jnp.take_along_axis(objective, src, axis=1)}
    hyper = dict(new["hyper"])
    for i, (name, lo, hi) in enumerate(cfg.hyperparams):
        inherited = hyper[name].reshape(S, K)
        mutate = replaced & (jax.random.uniform(jax.random.fold_in(k_mut, i), (S, K))
                             < cfg.mutation_rate)
        amount = jax.random.uniform(jax.random.fold_in(k_amt, i), (S, K), jnp.float32,
                                    cfg.perturb[0], cfg.perturb[1])
        up = jax.random.bernoulli(jax.random.fold_in(k_dir, i), 0.5, (S, K))
        factor = jnp.where(up, amount, 1.0 / amount)
        value = jnp.where(mutate, jnp.clip(inherited * factor, lo, hi), inherited)
        events[f"old/{name}"] = tree["hyper"][name].reshape(S, K)
        events[f"new/{name}"] = value
        hyper[name] = value.reshape(-1).astype(hyper[name].dtype)
    new["hyper"] = hyper
    return new, events


def no_events(tree: dict, objective: jax.Array, cfg: PbtConfig) -> dict:
    """The events of an iteration without a PBT step (nothing replaced)."""
    S, K = objective.shape
    events = {"replaced": jnp.zeros((S, K), bool),
              "source": jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32), (S, K)),
              "objective": objective, "source_objective": objective}
    for name, _, _ in cfg.hyperparams:
        v = tree["hyper"][name].reshape(S, K)
        events[f"old/{name}"] = v
        events[f"new/{name}"] = v
    return events


# ---- host ------------------------------------------------------------------------------

def event_rows(outputs: Mapping[str, np.ndarray], start: int) -> list[dict]:
    """The ``pbt/<group>/...`` chunk outputs (``[chunk, S, K]`` each) -> ``pbt.csv`` rows,
    one per replaced member and hyperparameter, ordered by iteration, group, seed,
    member."""
    groups = sorted({k[len(PREFIX):].split("/")[0] for k in outputs if k.startswith(PREFIX)})
    rows = []
    if not groups:
        return rows
    length = np.asarray(outputs[f"{PREFIX}{groups[0]}/replaced"]).shape[0]
    for t in range(length):
        for g in groups:
            base = f"{PREFIX}{g}/"
            names = sorted(k[len(base) + 4:] for k in outputs if k.startswith(base + "old/"))
            replaced = np.asarray(outputs[base + "replaced"][t])
            for s, k in zip(*np.nonzero(replaced)):
                common = {"iteration": start + t + 1, "group": g, "seed": int(s),
                          "member": int(k),
                          "source": int(outputs[base + "source"][t][s, k]),
                          "objective": float(outputs[base + "objective"][t][s, k]),
                          "source_objective": float(outputs[base + "source_objective"][t][s, k])}
                for name in names:
                    rows.append({**common, "hyperparameter": name,
                                 "old": float(outputs[base + "old/" + name][t][s, k]),
                                 "new": float(outputs[base + "new/" + name][t][s, k])})
    return rows


__all__ = ["PbtConfig", "resolve_pbt", "strip_pbt", "split_pbt", "pbt_step", "initial_hyper",
           "event_rows", "pbt_kinds", "PREFIX", "CSV_COLUMNS"]
