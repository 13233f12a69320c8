"""Market structure (static, hashable) and params (arrays) resolved from a config.

``resolve_market(raw_market_section) -> (MarketSpec, MarketParams)`` validates
everything before anything compiles; every problem is a :class:`ConfigError` naming
the dotted field, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.combinators.observations import build_observation, history_length
from jaxmarket.combinators.rewards import build_reward
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import (INT32_MAX, Field, check_mapping, lookup_kind,
                                     resolve_entity_array)
from jaxmarket.config.precheck import (CONSUMER_ARRAYS, SELLER_ARRAYS, check_move_order,
                                       group_values)
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS


def freeze(x: Any) -> Any:
    """Nested dicts/lists -> hashable nested tuples (for static structure)."""
    if isinstance(x, Mapping):
        return tuple((k, freeze(v)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return tuple(freeze(v) for v in x)
    return x


def thaw(x: Any) -> Any:
    """Inverse of :func:`freeze` for configs (tuples of pairs -> dicts)."""
    if isinstance(x, tuple) and x and all(isinstance(i, tuple) and len(i) == 2 and
                                          isinstance(i[0], str) for i in x):
        return {k: thaw(v) for k, v in x}
    if isinstance(x, tuple):
        return [thaw(v) for v in x]
    return x


# ---------------------------------------------------------------- field tables
_GROUP_COMMON = {
    "name": Field("any"),
    "count": Field("int", 1, low=1, doc="number of entities/agents"),
    "reward": Field("any", None, optional=True, doc="reward component list (agents)"),
    "observation": Field("any", None, optional=True, doc="observation component list (agents)"),
}
CONSUMER_FIELDS: dict[str, Field] = {
    **_GROUP_COMMON,
    "agent": Field("bool", False, doc="true: an agent whose action is its budget"),
    "budget": Field("entity", 1.0, low=0.0, doc="most paid per query (initial budget of agents)"),
    "budget_low": Field("entity", 0.0, low=0.0, doc="agents: lowest budget"),
    "budget_high": Field("entity", 1.0, low=0.0, doc="agents: highest budget"),
    "base_price": Field("entity", 1.0, low=0.0, low_open=True,
                        doc="price a multiplier of 1 stands for"),
    "queries": Field("entity", 1.0, low=0.0, doc="queries sent per step (before demand process)"),
    "demand": Field("any", None, optional=True, doc="demand process {kind: ...}"),
}
SELLER_FIELDS: dict[str, Field] = {
    **_GROUP_COMMON,
    "action": Field("choice", "price", choices=("price", "multiplier", "quantity"),
                    doc="the action is a price, a multiplier of consumers' base prices, or "
                        "a quantity (Cournot: distributor cournot)"),
    "low": Field("entity", 0.0, low=0.0, doc="lowest price/multiplier/quantity"),
    "high": Field("entity", 10.0, low=0.0, doc="highest price/multiplier/quantity"),
    "initial": Field("entity", None, low=0.0, optional=True,
                     doc="price/multiplier/quantity at reset (default: midpoint of [low, high])"),
    "cost": Field("entity", 0.0, low=0.0, doc="marginal cost per query served"),
    "quality": Field("entity", 0.0, doc="logit quality a_i"),
    "reliability": Field("entity", 1.0, low=0.0, high=1.0, doc="query success probability"),
    "latency": Field("entity", 0.0, low=0.0, doc="response time"),
    "freshness": Field("entity", 0.0, low=0.0, doc="blocks behind chain head"),
    "stake": Field("entity", 1.0, low=0.0, doc="allocated stake"),
    "value": Field("entity", 0.0, low=0.0, doc="valuation per query (auction bidders)"),
}
MOVE_ORDERS = ("simultaneous", "alternating")
MARKET_FIELDS: dict[str, Field] = {
    "num_products": Field("int", 1, low=1),
    "episode_length": Field("int", None, low=1, optional=True,
                            doc="steps before truncation (null: never)"),
    "consumers": Field("any"),
    "sellers": Field("any"),
    "distributor": Field("any"),
    "move_order": Field("choice", "simultaneous", choices=MOVE_ORDERS,
                        doc="simultaneous: every seller acts every period; alternating: "
                            "seller s (flat index) acts only when time % num_sellers == s"),
}
NEVER = INT32_MAX   # an episode length: never truncate


@dataclass(frozen=True)
class GroupSpec:
    name: str
    side: str        # "consumer" | "seller"
    count: int
    agent: bool
    action: str      # "price" | "multiplier" | "quantity" | "budget" | "none"
    offset: int      # first index in the flat seller or consumer axis
    reward: Any      # frozen reward config (agents)
    observation: Any  # frozen observation config (agents)
    demand_kind: str = "constant"


@dataclass(frozen=True)
class MarketSpec:
    num_products: int
    consumers: tuple[GroupSpec, ...]
    sellers: tuple[GroupSpec, ...]
    distributor: str
    distributor_options: Any
    history: int
    move_order: str = "simultaneous"   # "simultaneous" | "alternating" (sellers)

    @property
    def groups(self) -> tuple[GroupSpec, ...]:
        return self.consumers + self.sellers

    @property
    def agent_groups(self) -> tuple[GroupSpec, ...]:
        return tuple(g for g in self.groups if g.agent)

    def group(self, name: str) -> GroupSpec:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no group named {name!r}; groups: {[g.name for g in self.groups]}")

    @property
    def num_sellers(self) -> int:
        return sum(g.count for g in self.sellers)

    @property
    def num_consumers(self) -> int:
        return sum(g.count for g in self.consumers)


@struct.dataclass
class ConsumerParams:
    budget: Any
    budget_low: Any
    budget_high: Any
    base_price: Any
    queries: Any
    demand: Any  # dict of demand-process arrays


@struct.dataclass
class SellerParams:
    low: Any
    high: Any
    initial: Any
    cost: Any
    quality: Any
    reliability: Any
    latency: Any
    freshness: Any
    stake: Any
    value: Any


@struct.dataclass
class MarketParams:
    consumers: Any     # dict name -> ConsumerParams
    sellers: Any       # dict name -> SellerParams
    distributor: Any   # dict name -> array
    episode_length: Any  # int32 scalar (2**31 - 1: never)


def _as_list(value: Any, where: str, what: str) -> list:
    if not isinstance(value, list) or not value:
        raise ConfigError(where, value, f"a non-empty list of {what} groups")
    return value


def _resolve_groups(items: list, side: str, table: dict, P: int, where: str, taken: set,
                    ) -> tuple[list[GroupSpec], dict]:
    groups, params, offset = [], {}, 0
    for i, raw in enumerate(items):
        at = f"{where}[{i}]"
        vals = group_values(raw, table, at, side, taken)
        name, n = vals["name"], vals["count"]
        arrays = {}
        for key in (CONSUMER_ARRAYS if side == "consumer" else SELLER_ARRAYS):
            value = vals[key]
            if value is None:
                continue
            arrays[key] = resolve_entity_array(table[key], value, f"{at}.{key}", n, P)
        agent = vals["agent"] if side == "consumer" else True
        if side == "seller":
            if np.any(arrays["low"] > arrays["high"]):
                raise ConfigError(f"{at}.low", raw.get("low", 0.0),
                                  f"values <= high ({raw.get('high', 10.0)})")
            mid = 0.5 * (arrays["low"] + arrays["high"])
            arrays["initial"] = np.clip(arrays.get("initial", mid), arrays["low"], arrays["high"])
            action = vals["action"]
            demand_kind, demand = "constant", {}
            p = SellerParams(**{k: arrays[k] for k in SELLER_ARRAYS})
        else:
            if agent and np.any(arrays["budget_low"] > arrays["budget_high"]):
                raise ConfigError(f"{at}.budget_low", raw.get("budget_low", 0.0),
                                  f"values <= budget_high ({raw.get('budget_high', 1.0)})")
            action = "budget" if agent else "none"
            demand_kind, demand = _resolve_demand(vals["demand"], f"{at}.demand")
            p = ConsumerParams(**{k: arrays[k] for k in CONSUMER_ARRAYS}, demand=demand)
        reward_cfg = vals["reward"]
        obs_cfg = vals["observation"]
        if agent:
            if reward_cfg is None:
                reward_cfg = [{"kind": "profit"}] if side == "seller" else [{"kind": "regret_ratio"}]
            if obs_cfg is None:
                obs_cfg = []
            build_reward(reward_cfg, n, f"{at}.reward", side)   # validate now
            build_observation(obs_cfg, f"{at}.observation")
        else:
            for key in ("reward", "observation"):
                if vals[key] is not None:
                    raise ConfigError(f"{at}.{key}", vals[key], "nothing: only agent groups "
                                      "(agent: true) have rewards and observations")
        groups.append(GroupSpec(name, side, n, agent, action, offset, freeze(reward_cfg),
                                freeze(obs_cfg), demand_kind))
        params[name] = p
        offset += n
    return groups, params


def _resolve_demand(raw: Any, where: str) -> tuple[str, dict]:
    raw = {"kind": "constant"} if raw is None else raw
    kind, d = lookup_kind(raw, DEMANDS, where)
    vals = check_mapping(d.params, raw, where)
    if d.check is not None:
        d.check(vals, where)
    return kind, {k: np.asarray(v, np.float32) for k, v in vals.items()}


def _resolve_distributor(raw: Any, where: str) -> tuple[str, Any, dict]:
    kind, d = lookup_kind(raw, DISTRIBUTORS, where)
    vals = check_mapping({**d.params, **d.options}, raw, where)
    if d.check is not None:
        d.check(vals, where)
    params = {k: np.asarray(vals[k], np.float32) for k in d.params}
    options = {k: vals[k] for k in d.options}
    return kind, freeze(options), params


def resolve_market(raw: Any, where: str = "market") -> tuple[MarketSpec, MarketParams]:
    """Validate a ``market:`` mapping and build (structure, params as numpy arrays)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(where, raw, "a mapping with num_products, consumers, sellers, distributor")
    vals = check_mapping(MARKET_FIELDS, raw, where, ignore=())
    P = vals["num_products"]
    taken: set = set()
    consumers, cparams = _resolve_groups(_as_list(vals["consumers"], f"{where}.consumers", "consumer"),
                                         "consumer", CONSUMER_FIELDS, P, f"{where}.consumers", taken)
    sellers, sparams = _resolve_groups(_as_list(vals["sellers"], f"{where}.sellers", "seller"),
                                       "seller", SELLER_FIELDS, P, f"{where}.sellers", taken)
    kind, options, dparams = _resolve_distributor(vals["distributor"], f"{where}.distributor")
    accepted = DISTRIBUTORS[kind].actions
    for i, g in enumerate(sellers):
        if g.action not in accepted:
            raise ConfigError(f"{where}.sellers[{i}].action", g.action,
                              f"one of {', '.join(accepted)} (the seller actions distributor "
                              f"{kind!r} accepts)")
    if not DISTRIBUTORS[kind].dense and any(g.action == "multiplier" for g in sellers):
        base = np.concatenate([cparams[g.name].base_price for g in consumers])
        if np.any(base != base[0:1]):
            raise ConfigError(f"{where}.consumers[*].base_price", base.tolist(),
                              f"the same base price for every consumer of a product with "
                              f"distributor {kind!r} and multiplier sellers (dense kinds: "
                              + ", ".join(k for k, d in DISTRIBUTORS.items() if d.dense) + ")")
    hist = max([history_length(thaw(g.observation)) for g in consumers + sellers if g.agent],
               default=0)
    ep = vals["episode_length"]
    move_order = check_move_order(vals["move_order"], sum(g.count for g in sellers), ep,
                                   f"{where}.move_order")
    spec = MarketSpec(P, tuple(consumers), tuple(sellers), kind, options, hist, move_order)
    params = MarketParams(consumers=cparams, sellers=sparams, distributor=dparams,
                          episode_length=np.int32(NEVER if ep is None else ep))
    return spec, params


def to_device(params: MarketParams) -> MarketParams:
    """numpy leaves -> jax arrays."""
    import jax
    return jax.tree.map(jnp.asarray, params)


