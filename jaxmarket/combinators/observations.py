"""Observation components, concatenated in config order.

Each component is ``fn(view: GroupView) -> [n, d]``; a group's ``observation:`` list
becomes one function returning ``[n, sum d]`` (``[n, 0]`` for an empty list: a bandit)::

    observation:
      - {kind: own_price}
      - {kind: competitor_prices, summary: [min, mean]}
      - {kind: history, k: 1}

Every component is finite for finite inputs: quoted prices saturate (the env caps them
at ``PRICE_MAX / S``, so sums over the sellers stay finite), the mean budget falls back
to a mean of scaled values where the plain sum overflowed (budgets near float32's
largest), and the time phase to ``t mod period`` where ``t / period`` overflowed --
bit for bit the plain formula elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.saturate import finite_mean
from jaxmarket.combinators.view import GroupView
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping, lookup_kind
from jaxmarket.config.precheck import check_summary
from jaxmarket.config.registry import Registry

ObsFn = Callable[[GroupView], jax.Array]


@dataclass(frozen=True)
class BoundsContext:
    """What a component's ``bounds`` may read (numpy, float32, fixed by the params).

    ``own_low`` / ``own_high`` [n, P]: the group's action bounds (prices, multipliers,
    quantities or budgets: what ``own_price`` holds); ``quote_low`` / ``quote_high``
    [S, P]: the range of every seller's quoted price (``-inf`` / ``inf`` where it is not
    bounded, e.g. a multiplier seller's); ``self_index`` [n]: this group's sellers in
    it; ``side``: "seller" or "consumer"; ``episode_length``: the market's."""
    own_low: np.ndarray
    own_high: np.ndarray
    quote_low: np.ndarray
    quote_high: np.ndarray
    self_index: np.ndarray
    side: str
    episode_length: int


Bounds = Callable[[Mapping[str, Any], BoundsContext], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ObservationDef:
    kind: str
    build: Callable[[Mapping[str, Any]], ObsFn]
    fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""
    # the action kinds whose scale the features are on (a tabular learner may snap them
    # to its action grid): "all" (the sellers' own action values), a tuple of action
    # kinds, or () (another quantity: traffic, rewards, budgets, time)
    action_scale: str | tuple[str, ...] = ()
    # (settings, BoundsContext) -> (low, high), each [n, d] like the component's output
    # (or broadcastable to it); None: unbounded (-inf, inf). Read by the adapters for
    # their observation spaces (observation_bounds), never by the market step.
    bounds: Bounds | None = None

    def on_action_scale(self, action: str) -> bool:
        return self.action_scale == "all" or action in self.action_scale


OBSERVATIONS: Registry[ObservationDef] = Registry("observation component")


def _component(kind: str, build: Callable[[Mapping[str, Any]], ObsFn],
               fields: Mapping[str, Field] | None = None,
               action_scale: str | tuple[str, ...] = (),
               bounds: Bounds | None = None) -> ObservationDef:
    """The definition of a component documented by its builder's docstring."""
    return ObservationDef(kind, build, fields or {}, build.__doc__ or "", action_scale, bounds)


def off_action_scale(config: Sequence[Any], action: str) -> str | None:
    """The observation components of ``config`` that are not on the scale of ``action``
    (named, for an error message), or None when all are."""
    off = []
    for item in config or ():
        kind = item.get("kind") if isinstance(item, Mapping) else item
        if kind in OBSERVATIONS and not OBSERVATIONS[kind].on_action_scale(action):
            off.append(str(kind))
    return None if not off else (", ".join(off) + f" (the action is {action})")


def _empty(s) -> ObsFn:
    """[n, 0]: no observation (bandits)."""
    return lambda v: jnp.zeros((v.action.shape[0], 0), jnp.float32)


def _own_price(s) -> ObsFn:
    """[n, P]: the agent's own current action value (price, multiplier or budget)."""
    return lambda v: v.action


def _own_traffic(s) -> ObsFn:
    """[n, P]: queries the agent served (sellers) or got served (consumers) last step."""
    return lambda v: v.traffic


def _own_reward(s) -> ObsFn:
    """[n, 1]: the agent's reward last step."""
    return lambda v: v.last_reward[:, None]


def _competitor_prices(s) -> ObsFn:
    """Quoted prices of all *other* sellers (every seller group).

    ``summary: all`` -> [n, (S - 1) * P], others in market order;
    ``summary: [min, mean, max]`` -> [n, len * P] statistics over the others, computed
    without an n x S array: min/max from the top-2 per product, mean from
    (sum - own) / (S - 1). A consumer group is no seller: its "others" are all S
    sellers (``all`` -> [n, S * P], statistics over every seller).
    """
    summary = s["summary"]
    of_consumer = s.get("of_consumer", False)

    def obs(v: GroupView):
        prices, me = v.all_prices, v.self_index
        S = prices.shape[0]
        if of_consumer:
            stats = {"min": prices.min(0), "mean": prices.mean(0), "max": prices.max(0)}
            row = (prices.reshape(-1) if summary == "all"
                   else jnp.concatenate([stats[x] for x in summary]))
            return jnp.broadcast_to(row, (me.shape[0],) + row.shape)
        if S < 2:
            raise ConfigError("observation.competitor_prices", S, "a market with >= 2 sellers")
        own = prices[me]  # [n, P]
        if summary == "all":
            # row j of others: indices 0..S-1 without me (static shape S - 1)
            idx = jnp.arange(S - 1)[None, :]
            idx = idx + (idx >= me[:, None])
            return prices[idx].reshape(me.shape[0], -1)
        parts = []
        for stat in summary:
            if stat == "mean":
                parts.append((prices.sum(0)[None] - own) / (S - 1))
            else:
                sign = 1.0 if stat == "max" else -1.0
                top2, arg = jax.lax.top_k((sign * prices).T, 2)  # [P, 2]
                first_is_me = arg[:, 0][None, :] == me[:, None]
                best = jnp.where(first_is_me, top2[:, 1][None], top2[:, 0][None])
                parts.append(sign * best)
        return jnp.concatenate(parts, axis=-1)

    return obs


def _budgets(s) -> ObsFn:
    """Consumers' budgets: ``summary: all`` -> [n, C * P]; ``mean`` -> [n, P]."""

    def obs(v: GroupView):
        n = v.action.shape[0]
        b = v.budgets.reshape(-1) if s["summary"] == "all" else finite_mean(v.budgets, 0)
        return jnp.broadcast_to(b, (n,) + b.shape)

    return obs


def _time(s) -> ObsFn:
    """[n, 1 (+2)]: t / episode_length, and with ``period`` the phase
    (sin 2 pi t / period, cos 2 pi t / period)."""

    def obs(v: GroupView):
        n = v.action.shape[0]
        t = v.time.astype(jnp.float32)
        feats = [t / jnp.maximum(v.episode_length.astype(jnp.float32), 1.0)]
        if s["period"] is not None:
            angle = 2 * jnp.pi * t / s["period"]
            # t / period overflowed (a tiny period): the same phase from t mod period
            safe = 2 * jnp.pi * (jnp.mod(t, s["period"]) / s["period"])
            angle = jnp.where(jnp.isfinite(angle), angle, safe)
            feats += [jnp.sin(angle), jnp.cos(angle)]
        return jnp.broadcast_to(jnp.stack(feats), (n, len(feats)))

    return obs


def _market_price(s) -> ObsFn:
    """[n, P]: the clearing price of the last period, the same for every agent: the sum
    over consumers of spend / the sum of served queries (0 where nothing was served; at
    reset 0) -- what a seller sees under imperfect monitoring (not its rivals' actions)."""

    def obs(v: GroupView):
        return jnp.broadcast_to(v.market_price, (v.action.shape[0],) + v.market_price.shape)

    return obs


def _history(s) -> ObsFn:
    """[n, k * S * P]: the last k price profiles of all sellers (most recent first) —
    the state of the Calvano et al. Q-learners."""
    k = s["k"]

    def obs(v: GroupView):
        h = v.price_history[:k].reshape(-1)
        return jnp.broadcast_to(h, (v.action.shape[0],) + h.shape)

    return obs


def _own_price_bounds(s, ctx: BoundsContext):
    """The group's own action bounds: the market clips every action to them."""
    return ctx.own_low, ctx.own_high


def _competitor_prices_bounds(s, ctx: BoundsContext):
    """Each other seller's quoted-price range (``all``), or the range over every seller
    for a statistic of them (min, mean and max of values in it stay in it)."""
    n, summary = ctx.self_index.shape[0], s["summary"]
    if summary != "all":
        low, high = ctx.quote_low.min(0), ctx.quote_high.max(0)            # [P]
        return np.tile(low, len(summary)), np.tile(high, len(summary))
    if ctx.side == "consumer":
        return ctx.quote_low.reshape(-1), ctx.quote_high.reshape(-1)
    S = ctx.quote_low.shape[0]
    idx = np.arange(S - 1)[None, :]
    idx = idx + (idx >= ctx.self_index[:, None])                            # [n, S - 1]
    return ctx.quote_low[idx].reshape(n, -1), ctx.quote_high[idx].reshape(n, -1)


def _history_bounds(s, ctx: BoundsContext):
    """k copies of every seller's quoted-price range (the history starts at the reset
    quotes)."""
    return np.tile(ctx.quote_low.reshape(-1), s["k"]), np.tile(ctx.quote_high.reshape(-1), s["k"])


def _time_bounds(s, ctx: BoundsContext):
    """t / episode_length in [0, 1] (an episode ends at t = episode_length), the phase's
    sine and cosine in [-1, 1]."""
    extra = 0 if s["period"] is None else 2
    return np.array([0.0] + [-1.0] * extra), np.array([1.0] + [1.0] * extra)


OBSERVATIONS.register(_component("empty", _empty, action_scale="all"))
OBSERVATIONS.register(_component("own_price", _own_price, action_scale="all",
                                 bounds=_own_price_bounds))
OBSERVATIONS.register(_component("own_traffic", _own_traffic))
OBSERVATIONS.register(_component("own_reward", _own_reward))
OBSERVATIONS.register(_component(
    "competitor_prices", _competitor_prices,
    {"summary": Field("any", "all", doc="'all' or a list from min, mean, max")},
    action_scale="all", bounds=_competitor_prices_bounds))
OBSERVATIONS.register(_component(
    "budgets", _budgets, {"summary": Field("choice", "mean", choices=("mean", "all"))}))
OBSERVATIONS.register(_component(
    "time", _time, {"period": Field("float", None, low=0.0, low_open=True, optional=True)},
    bounds=_time_bounds))
OBSERVATIONS.register(_component("history", _history, {"k": Field("int", 1, low=1)},
                                 action_scale="all", bounds=_history_bounds))
OBSERVATIONS.register(_component("market_price", _market_price, action_scale=("price",)))


def history_length(config: Sequence[Mapping[str, Any]]) -> int:
    """Largest ``k`` of the ``history`` components (0 if none)."""
    return max([int(c.get("k", 1)) for c in config if c.get("kind") == "history"], default=0)


def _components(config: Sequence[Mapping[str, Any]], where: str, side: str
                ) -> list[tuple[ObservationDef, Mapping[str, Any]]]:
    """Each component's definition and checked settings."""
    if not isinstance(config, (list, tuple)):
        raise ConfigError(where, config, "a list of observation components like [{kind: own_price}]")
    out = []
    for i, item in enumerate(config):
        at = f"{where}[{i}]"
        _, d = lookup_kind(item, OBSERVATIONS, at)
        settings = check_mapping(d.fields, item, at)
        if item["kind"] == "competitor_prices":
            check_summary(settings["summary"], f"{at}.summary")
            settings = {**settings, "of_consumer": side == "consumer"}
        out.append((d, settings))
    return out


def build_observation(config: Sequence[Mapping[str, Any]], where: str,
                      side: str = "seller") -> ObsFn:
    """Validate an observation list and return ``obs(view) -> [n, D]`` for a group of
    ``side`` ("seller" or "consumer")."""
    fns: list[ObsFn] = [d.build(settings) for d, settings in _components(config, where, side)]

    def observe(view: GroupView) -> jax.Array:
        n = view.action.shape[0]
        parts = [f(view).astype(jnp.float32).reshape(n, -1) for f in fns]
        return jnp.concatenate(parts, axis=-1) if parts else jnp.zeros((n, 0), jnp.float32)

    return observe


def observation_bounds(config: Sequence[Mapping[str, Any]], view: GroupView,
                       ctx: BoundsContext, where: str = "observation"
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)``, each ``[n, D]`` float32, of the observation that
    :func:`build_observation` builds from ``config``: each component's declared
    ``bounds``, ``-inf`` / ``inf`` for a component without them. ``view`` is the group's
    :class:`GroupView` (arrays or ``jax.ShapeDtypeStruct``: only shapes are read)."""
    n = ctx.self_index.shape[0]
    lows, highs = [], []
    for d, settings in _components(config, where, ctx.side):
        shape = jax.eval_shape(d.build(settings), view).shape
        dim = int(np.prod(shape[1:], dtype=np.int64))
        if d.bounds is None:
            lo, hi = np.float32(-np.inf), np.float32(np.inf)
        else:
            lo, hi = d.bounds(settings, ctx)
        lows.append(np.broadcast_to(np.asarray(lo, np.float32).reshape(
            (-1, dim) if np.ndim(lo) == 2 else (-1,)), (n, dim)))
        highs.append(np.broadcast_to(np.asarray(hi, np.float32).reshape(
            (-1, dim) if np.ndim(hi) == 2 else (-1,)), (n, dim)))
    if not lows:
        return np.zeros((n, 0), np.float32), np.zeros((n, 0), np.float32)
    return np.concatenate(lows, axis=1), np.concatenate(highs, axis=1)
