"""What every adapter shares: building the market, naming the agents, and the key chain."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np

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
