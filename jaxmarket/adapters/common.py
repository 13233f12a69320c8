"""What every adapter shares: building the market, naming the agents, and the key chain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.scenario import make
from jaxmarket.market.spec import MarketParams


def build(config: str | Path | Mapping[str, Any],
          overrides: Sequence[str] = ()) -> tuple[MarketEnv, MarketParams]:
    """:func:`jaxmarket.market.scenario.make` (``jaxmarket.make``) with the adapters' argument
    names (a YAML path or a mapping)."""
    if isinstance(overrides, str):
        raise TypeError(f"overrides must be a list of 'key=value' strings, got the string "
                        f"{overrides!r}; wrap it in a list")
    return make(config, overrides)


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
    """A ConfigError naming the config line to add when one of ``groups`` observes nothing
    (``Box(0,)``: the stateless bandit scenarios). Stable-Baselines3's and SuperSuit's
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
                              f"'{path}.observation=[{{kind: {example}}}]' (docs/ecosystem.md)")


def to_market_units(action, low, high):
    """``[-1, 1]`` actions mapped linearly onto ``[low, high]`` (clipped first): -1 is
    ``low``, 0 the midpoint, +1 ``high``. Works on numpy and JAX arrays alike."""
    xp = jnp if isinstance(action, jax.Array) else np
    return low + (xp.clip(action, -1.0, 1.0) + 1.0) / 2.0 * (high - low)
