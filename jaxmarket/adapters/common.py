"""What every adapter shares: building the market (with the default observation of a
group that observes nothing), naming the agents, bounded spaces and the key chain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.observations import BoundsContext, observation_bounds
from jaxmarket.combinators.saturate import PRICE_MAX
from jaxmarket.config.errors import ConfigError
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.scenario import make
from jaxmarket.market.spec import MarketParams, thaw

#: what the adapters give an agent group whose config observes nothing (the stateless
#: bandit scenarios): its own current action value, ``[P]`` per agent (a seller's
#: price, multiplier or quantity; a consumer agent's budget). Every agent kind has it,
#: it tells the agent nothing about its rivals (only what it chose itself last period,
#: so the game's information stays the bandit's), and it is bounded by the action's own
#: bounds. ``default_observation=()`` keeps ``Box(0,)``.
DEFAULT_OBSERVATION: tuple[dict, ...] = ({"kind": "own_price"},)


def build(config: str | Path | Mapping[str, Any],
          overrides: Sequence[str] = ()) -> tuple[MarketEnv, MarketParams]:
    """:func:`jaxmarket.market.scenario.make` (``jaxmarket.make``) with the adapters' argument
    names (a YAML path or a mapping)."""
    if isinstance(overrides, str):
        raise TypeError(f"overrides must be a list of 'key=value' strings, got the string "
                        f"{overrides!r}; wrap it in a list")
    return make(config, overrides)


def _flow(value: Any) -> str:
    """A YAML flow rendering of an observation list (an override's value)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if value is None:
        return "null"
    return str(value)


def build_observing(config: str | Path | Mapping[str, Any], overrides: Sequence[str] = (),
                    groups: Sequence[str] | None = None,
                    default_observation: Sequence[Mapping[str, Any]] | None = DEFAULT_OBSERVATION,
                    ) -> tuple[MarketEnv, MarketParams]:
    """:func:`build`, where every agent group of ``groups`` (None: all) whose config
    observes nothing observes ``default_observation`` instead (one more override,
    ``market.<side>[i].observation=[...]``). The other groups are left as configured
    (their fixed policies are the scenario's learners)."""
    env, params = build(config, overrides)
    if not default_observation:
        return env, params
    if not isinstance(default_observation, (list, tuple)) or not all(
            isinstance(c, Mapping) and "kind" in c for c in default_observation):
        raise ConfigError("default_observation", default_observation,
                          "a list of observation components like [{kind: own_price}], "
                          "or () for none")
    wanted = env.agent_groups if groups is None else groups
    dims = obs_dims(env, params)
    empty = [g for g in wanted if dims.get(g) == 0]
    if not empty:
        return env, params
    line = _flow([dict(c) for c in default_observation])
    extra = [f"{group_path(env, g)}.observation={line}" for g in empty]
    return build(config, [*overrides, *extra])


def acting_group(config: str | Path | Mapping[str, Any], overrides: Sequence[str],
                 group: str | None) -> str:
    """``group``, or by default the scenario's first agent group."""
    if group is not None:
        return group
    env, _ = build(config, overrides)
    return env.agent_groups[0]


def agent_slots(env: MarketEnv) -> list[tuple[str, str, int]]:
    """``(name, group, index)`` of every agent, groups in ``env.agent_groups`` order,
    named ``<group>_<index>``."""
    return [(f"{g}_{i}", g, i) for g in env.agent_groups for i in range(env.num_agents(g))]


def group_bounds(env: MarketEnv, params: MarketParams, group: str) -> tuple[np.ndarray, np.ndarray]:
    """The group's ``[n, P]`` action bounds as float32 numpy arrays."""
    box = env.action_space(group, params)
    low = np.broadcast_to(np.asarray(box.low, np.float32), box.shape).copy()
    high = np.broadcast_to(np.asarray(box.high, np.float32), box.shape).copy()
    return low, high


def obs_dims(env: MarketEnv, params: MarketParams) -> dict[str, int]:
    """Observation size ``D`` of each agent group."""
    return {g: int(env.observation_space(g, params).shape[1]) for g in env.agent_groups}


def quote_bounds(env: MarketEnv, params: MarketParams) -> tuple[np.ndarray, np.ndarray]:
    """``[S, P]`` range of every seller's quoted price (``MarketEnv._quoted_prices``): a
    price or quantity seller's action, capped at ``PRICE_MAX / S``, so its bounds capped
    the same; a multiplier seller's quote (multiplier x a consumer's base price) is left
    unbounded."""
    P, S = env.spec.num_products, env.spec.num_sellers
    cap = np.float32(PRICE_MAX / S)
    lows, highs = [], []
    for g in env.spec.sellers:
        shape = (g.count, P)
        if g.action == "multiplier":
            lows.append(np.full(shape, -np.inf, np.float32))
            highs.append(np.full(shape, np.inf, np.float32))
            continue
        p = params.sellers[g.name]
        lows.append(np.minimum(np.broadcast_to(np.asarray(p.low, np.float32), shape), cap))
        highs.append(np.minimum(np.broadcast_to(np.asarray(p.high, np.float32), shape), cap))
    return np.concatenate(lows, 0), np.concatenate(highs, 0)


def obs_bounds(env: MarketEnv, params: MarketParams, group: str) -> tuple[np.ndarray, np.ndarray]:
    """The group's ``[n, D]`` observation bounds, float32: what each component declares
    (:func:`jaxmarket.combinators.observations.observation_bounds`), ``-inf`` / ``inf``
    where it declares none."""
    g = env.spec.group(group)
    view = jax.eval_shape(lambda k: env.view(env.reset_env(k, params)[1], params, g),
                          jax.random.key(0))
    own_low, own_high = group_bounds(env, params, group)
    q_low, q_high = quote_bounds(env, params)
    index = np.arange(g.offset, g.offset + g.count) if g.side == "seller" \
        else np.zeros(g.count, np.int64)
    ctx = BoundsContext(own_low, own_high, q_low, q_high, index, g.side,
                        int(np.asarray(params.episode_length)))
    return observation_bounds(thaw(g.observation), view, ctx, f"{group_path(env, group)}.observation")


def initial_key(seed: int | None, rng: np.random.Generator) -> jax.Array:
    """The first key of an adapter's chain: ``jax.random.key(seed)``, or one drawn from
    ``rng`` when no seed is given."""
    if seed is None:
        seed = int(rng.integers(0, 2**31 - 1))
    elif not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    return jax.random.key(int(seed))


def check_action(action: Any, shape: tuple[int, ...], who: str) -> np.ndarray:
    """An action as a float32 array of ``shape``, or a one-line ValueError."""
    a = np.asarray(action, np.float32)
    if a.size != int(np.prod(shape)):
        raise ValueError(f"{who}: action must have shape {shape}, got {a.shape}")
    return a.reshape(shape)


def group_path(env: MarketEnv, group: str) -> str:
    """The config entry of ``group``: ``market.sellers[i]`` or ``market.consumers[i]``."""
    for side, groups in (("sellers", env.spec.sellers), ("consumers", env.spec.consumers)):
        for i, g in enumerate(groups):
            if g.name == group:
                return f"market.{side}[{i}]"
    raise ValueError(f"no group {group!r} in the market: {[g.name for g in env.spec.groups]}")


def require_observations(env: MarketEnv, params: MarketParams, groups: Sequence[str],
                         who: str) -> None:
    """A ConfigError naming the config line to add when one of ``groups`` still observes
    nothing (``Box(0,)``: a stateless scenario built with ``default_observation=()``).
    Stable-Baselines3's and SuperSuit's
    feature extractors and JaxMARL's ``batchify`` stop on an empty observation, so the
    adapters refuse it up front instead of handing clients a space they cannot use."""
    dims = obs_dims(env, params)
    for g in groups:
        if dims[g] == 0:
            path = group_path(env, g)
            side = env.spec.group(g).side
            example = "own_price" if side == "seller" else "market_price"
            raise ConfigError(f"{path}.observation", [],
                              f"at least one observation feature for {who} (group {g!r} "
                              "observes nothing, Box(0,), which Stable-Baselines3, SuperSuit "
                              "and JaxMARL cannot use); add e.g. the override "
                              f"'{path}.observation=[{{kind: {example}}}]', or keep the "
                              "adapters' default_observation (docs/ecosystem.md)")


def to_market_units(action, low, high):
    """``[-1, 1]`` actions mapped linearly onto ``[low, high]`` (clipped first): -1 is
    ``low``, 0 the midpoint, +1 ``high``. Works on numpy and JAX arrays alike."""
    xp = jnp if isinstance(action, jax.Array) else np
    return low + (xp.clip(action, -1.0, 1.0) + 1.0) / 2.0 * (high - low)
