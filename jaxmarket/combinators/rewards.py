"""Reward components, composed like ``optax.chain``.

A group's ``reward:`` config is a list applied in order to a running reward ``r``
(starting at 0 per agent). *Terms* add to it, *transforms* rewrite it::

    reward:
      - {kind: profit}                 # r += sum_p (fees - cost * traffic)
      - {kind: team, teams: [0, 0]}    # r_i = mean_{j in team(i)} r_j   (collusion)
      - {kind: scale, factor: 10}      # r *= 10

Each component is ``fn(r [n], view: GroupView) -> r' [n]``; :func:`build_reward` turns
the validated list into one such function.

Every money amount saturates (:mod:`jaxmarket.combinators.saturate`), so extreme inputs
give a saturated finite reward, never ``inf`` or ``NaN``: a cost, value or budget ``x
traffic`` is capped at ``MONEY_MAX`` like the fees (on the operand: ``cap``); a sum over
more than 340 products, which could overflow, is its plain formula wherever that lies
within ``+-MONEY_MAX`` (``within``) and else has each per-product amount clipped at
``MONEY_MAX / P``. ``scale`` and the weights of ``sum`` beyond 1 in size cap their
operand at ``MONEY_MAX / |factor|``; a team of more than 21 agents whose sum overflowed
averages ``r / count``. Values inside the bounds are untouched, and no op is placed
where it could change how XLA compiles a shipped formula (docs/reliability.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.saturate import MONEY_MAX, cap, per_term, within
from jaxmarket.combinators.view import GroupView
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping, lookup_kind
from jaxmarket.config.registry import Registry

RewardFn = Callable[[jax.Array, GroupView], jax.Array]


@dataclass(frozen=True)
class RewardDef:
    kind: str
    build: Callable[[Mapping[str, Any], int, str], RewardFn]   # (settings, n_agents, where)
    fields: Mapping[str, Field] = field(default_factory=dict)
    sides: tuple[str, ...] = ("seller", "consumer")
    doc: str = ""
    # a term that draws at random each period from ``view.key``, with mean 0: a period's
    # expected reward is the chain without it (:func:`expected_reward`)
    random: bool = False


REWARDS: Registry[RewardDef] = Registry("reward component")


def _additive(kind: str, fn: Callable[[GroupView], jax.Array],
              sides=("seller", "consumer")) -> RewardDef:
    """The definition of a term ``r += fn(view)``, documented by ``fn``'s docstring."""
    return RewardDef(kind, lambda s, n, w: (lambda r, v: r + fn(v)), {}, sides, fn.__doc__ or "")


def revenue(v: GroupView) -> jax.Array:
    """revenue_i = sum_p fees_ip  (= sum_p price_ip * traffic_ip for posted prices)."""
    plain = jnp.sum(v.fees, axis=-1)
    if _cannot_overflow(v.fees.shape[-1]):   # fees <= MONEY_MAX each: a finite sum
        return plain
    return within(plain, jnp.sum(per_term(v.fees, v.fees.shape[-1]), axis=-1))


def profit(v: GroupView) -> jax.Array:
    """profit_i = sum_p (fees_ip - cost_ip * traffic_ip)."""
    P = v.fees.shape[-1]
    if _cannot_overflow(P):     # fees and the capped costs are within MONEY_MAX each
        return jnp.sum(v.fees - cap(v.cost, v.traffic) * v.traffic, axis=-1)
    plain = jnp.sum(v.fees - v.cost * v.traffic, axis=-1)
    safe = jnp.sum(per_term(v.fees - cap(v.cost, v.traffic) * v.traffic, P), axis=-1)
    return within(plain, safe)


def traffic(v: GroupView) -> jax.Array:
    """traffic_i = sum_p traffic_ip (queries served; for consumers: sent - unserved)."""
    plain = jnp.sum(v.traffic, axis=-1)
    if _cannot_overflow(v.traffic.shape[-1]):   # traffic <= QUERY_MAX each
        return plain
    return within(plain, jnp.sum(per_term(v.traffic, v.traffic.shape[-1]), axis=-1))


def surplus(v: GroupView) -> jax.Array:
    """surplus_i = sum_p (value_ip * traffic_ip - fees_ip): an auction bidder's gain."""
    P = v.fees.shape[-1]
    if _cannot_overflow(P):     # the capped values and the fees are within MONEY_MAX each
        return jnp.sum(cap(v.value, v.traffic) * v.traffic - v.fees, axis=-1)
    plain = jnp.sum(v.value * v.traffic - v.fees, axis=-1)
    safe = jnp.sum(per_term(cap(v.value, v.traffic) * v.traffic - v.fees, P), axis=-1)
    return within(plain, safe)


def regret_ratio(v: GroupView) -> jax.Array:
    """regret_i = sum_p spend_ip / sum_p budget_ip * sent_ip (0 when nothing was sent):
    the share of its budget a paying consumer actually spent."""
    # saturating on the operands only (an op after the division moved shipped results):
    # budget x sent capped like the spend it bounds, each spend at MONEY_MAX / P, and the
    # denominator at least spend / MONEY_MAX (auctions charge bids above the budget), so
    # the ratio stays within MONEY_MAX
    P = v.fees.shape[-1]
    denom = jnp.sum(cap(v.budget, v.sent, MONEY_MAX / P) * v.sent, axis=-1)
    spent = jnp.sum(per_term(v.fees, P), axis=-1)
    return jnp.where(denom > 0, spent / jnp.maximum(jnp.where(denom > 0, denom, 1.0),
                                                    spent / MONEY_MAX), 0.0)


REWARDS.register(_additive("revenue", revenue, ("seller",)))
REWARDS.register(_additive("profit", profit, ("seller",)))
REWARDS.register(_additive("traffic", traffic))
REWARDS.register(_additive("surplus", surplus, ("seller",)))
REWARDS.register(_additive("regret_ratio", regret_ratio, ("consumer",)))


F32_MAX = float(np.finfo(np.float32).max)
TEAM_PLAIN_MAX = int(F32_MAX // (16 * MONEY_MAX))   # 21 agents


def _cannot_overflow(n: int) -> bool:
    """A sum of ``n`` terms each within MONEY_MAX stays finite in float32 (n <= 340):
    the plain sum needs no guard, and none is added (an extra op after a reduction can
    change how XLA fuses it, and shipped results with it)."""
    return n * MONEY_MAX <= F32_MAX


def _bound(w: float) -> float:
    """MONEY_MAX / |w|: what ``x`` may be for ``w * x`` to stay within MONEY_MAX (inf
    where that is beyond float32's range, or w = 0)."""
    bound = MONEY_MAX / abs(w) if w else math.inf
    return bound if bound <= F32_MAX else math.inf


def _within(x, w: float):
    """``x`` capped at MONEY_MAX / |w| where ``|w| > 1``, so that ``w * x`` stays within
    MONEY_MAX (``|w| <= 1`` cannot overflow: ``x`` as it is)."""
    if abs(w) <= 1.0:
        return x
    bound = _bound(w)
    return jnp.clip(x, -bound, bound)


def _build_team(s: Mapping[str, Any], n: int, where: str) -> RewardFn:
    """r_i = mean_{j: team_j = team_i} r_j over the group's team assignment."""
    teams = s["teams"]
    if teams is None:
        teams = (0,) * n
    if len(teams) != n:
        raise ConfigError(f"{where}.teams", list(teams), f"a list of {n} team ids (one per agent)")
    ids = jnp.asarray(np.unique(np.asarray(teams), return_inverse=True)[1], jnp.int32)
    k = int(ids.max()) + 1

    def team(r, v):
        totals = jax.ops.segment_sum(r, ids, num_segments=k)
        counts = jax.ops.segment_sum(jnp.ones_like(r), ids, num_segments=k)
        mean = totals / counts
        if n <= TEAM_PLAIN_MAX:     # |r| <~ 16 MONEY_MAX: a sum of n cannot overflow
            return mean[ids]
        # a team sum that overflowed (> ~340 members near MONEY_MAX): mean of r / count
        safe = jax.ops.segment_sum(r / counts[ids], ids, num_segments=k)
        return jnp.where(jnp.isfinite(mean), mean, safe)[ids]

    return team


def _build_scale(s, n, where) -> RewardFn:
    """r <- factor * r (for |factor| > 1, r capped at MONEY_MAX / |factor| first: the
    product saturates; a smaller factor cannot overflow and multiplies r as it is)."""
    factor = s["factor"]
    if abs(factor) <= 1.0:
        return lambda r, v: factor * r
    bound = _bound(factor)
    return lambda r, v: factor * jnp.clip(r, -bound, bound)


def _build_clip(s, n, where) -> RewardFn:
    """r <- clip(r, low, high)."""
    if s["low"] > s["high"]:
        raise ConfigError(f"{where}.low", s["low"], f"a number <= high ({s['high']})")
    return lambda r, v: jnp.clip(r, s["low"], s["high"])


def _build_sum(s, n, where) -> RewardFn:
    """r <- r + sum_k weight_k * chain_k(0): a weighted sum of sub-chains."""
    terms = s["terms"]
    if not isinstance(terms, list) or not terms:
        raise ConfigError(f"{where}.terms", terms, "a non-empty list of reward components")
    weights = s["weights"] or (1.0,) * len(terms)
    if len(weights) != len(terms):
        raise ConfigError(f"{where}.weights", list(weights), f"a list of {len(terms)} numbers")
    fns = [_term(t, n, f"{where}.terms[{i}]", s["_side"]) for i, t in enumerate(terms)]

    def total(r, v):
        return r + sum(w * _within(f(v), w) for w, f in zip(weights, fns))

    return total


REWARDS.register(RewardDef("team", _build_team, {"teams": Field("ints", None, optional=True)},
                           doc=_build_team.__doc__))
REWARDS.register(RewardDef("scale", _build_scale, {"factor": Field("float")},
                           doc=_build_scale.__doc__))
REWARDS.register(RewardDef("clip", _build_clip, {"low": Field("float"), "high": Field("float")},
                           doc=_build_clip.__doc__))


def _build_noise(s, n, where) -> RewardFn:
    """r_i += eps_i, one independent draw per agent and period from the step's key:
    ``dist: uniform``, eps ~ U[-scale, scale]; ``dist: normal``, eps ~ N(0, scale^2).
    Mean 0, so the static benchmarks (the expected reward) leave it out."""
    scale, normal = float(s["scale"]), s["dist"] == "normal"

    def noise(r, v):
        if v.key is None:
            raise ValueError(f"{where}: a noise term needs the step's key (GroupView.key); "
                             "views built by hand have none")
        if normal:
            eps = scale * jax.random.normal(v.key, r.shape, jnp.float32)
        else:
            eps = jax.random.uniform(v.key, r.shape, jnp.float32, -scale, scale)
        return r + eps

    return noise


REWARDS.register(RewardDef(
    "noise", _build_noise,
    {"dist": Field("choice", "uniform", choices=("uniform", "normal"),
                   doc="uniform on [-scale, scale], or normal with standard deviation scale"),
     "scale": Field("float", low=0.0, doc="the half-width (uniform) or standard deviation "
                                          "(normal)")},
    doc=_build_noise.__doc__, random=True))


def _draws(item: Any) -> bool:
    """Whether one reward component is itself a random term (its definition's
    ``random``)."""
    kind = item.get("kind") if isinstance(item, Mapping) else item
    d = REWARDS.get(kind) if isinstance(kind, str) else None
    return d is not None and d.random


def _random_sum(item: Any) -> bool:
    """Whether one reward component is a ``sum`` holding a random term."""
    return isinstance(item, Mapping) and item.get("kind") == "sum" and is_random(
        item.get("terms"))


def is_random(config: Any) -> bool:
    """Whether a reward list (validated or not) holds a random term, at any depth of
    ``sum`` terms."""
    return any(_draws(item) or _random_sum(item) for item in config or ())


def expected_reward(config: Any) -> Any:
    """The reward list with every random term (mean 0) left out, at any depth (with its
    weight in a ``sum``; a ``sum`` of random terms only goes): a period's expected
    reward where nothing after the term bends it (``clip`` after ``noise`` gives the
    clipped noiseless reward instead)."""
    if not is_random(config):
        return config
    out = []
    for item in config:
        if _draws(item):
            continue
        if _random_sum(item):
            weights = item.get("weights") or [1.0] * len(item["terms"])
            kept = [(expected_reward([t]), w) for t, w in zip(item["terms"], weights)]
            kept = [(t[0], w) for t, w in kept if t]
            if not kept:
                continue
            item = {**item, "terms": [t for t, _ in kept]}
            if item.get("weights") is not None:
                item["weights"] = [w for _, w in kept]
        out.append(item)
    return out


def _term(term: Any, n: int, where: str, side: str):
    """One ``sum`` term, built as a one-item reward list; its errors name
    ``...terms[i].<field>``, not the list's own ``...terms[i][0].<field>``."""
    try:
        return build_reward([term], n, where, side)
    except ConfigError as err:
        field = err.field.replace(f"{where}[0]", where, 1)
        raise ConfigError(field, err.value, err.allowed) from None


REWARDS.register(RewardDef("sum", _build_sum, {"terms": Field("any"),
                                              "weights": Field("floats", None, optional=True)},
                           doc=_build_sum.__doc__))


def build_reward(config: Sequence[Mapping[str, Any]], n_agents: int, where: str,
                 side: str) -> Callable[[GroupView], jax.Array]:
    """Validate a reward list and return ``reward(view) -> [n]``."""
    if not isinstance(config, (list, tuple)):
        raise ConfigError(where, config, "a list of reward components like [{kind: profit}]")
    fns: list[RewardFn] = []
    for i, item in enumerate(config):
        at = f"{where}[{i}]"
        kind, d = lookup_kind(item, REWARDS, at)
        if side not in d.sides:
            allowed = sorted(k for k, x in REWARDS.items() if side in x.sides)
            raise ConfigError(f"{at}.kind", kind, f"for a {side} group one of " + ", ".join(allowed))
        settings = check_mapping(d.fields, item, at)
        settings["_side"] = side
        fns.append(d.build(settings, n_agents, at))

    def reward(view: GroupView) -> jax.Array:
        r = jnp.zeros(view.action.shape[0], jnp.float32)
        for fn in fns:  # static chain over config entries, not over agents
            r = fn(r, view)
        return r

    return reward
