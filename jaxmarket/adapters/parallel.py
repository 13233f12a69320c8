"""PettingZoo ``ParallelEnv`` of one market (``jaxmarket.adapters.make_parallel_env``).

Agents are named ``<group>_<i>``; each acts with a ``[P]`` array (by default,
``normalize_actions=True``, a ``Box(-1, 1, [P])`` action mapped linearly onto its bounds,
``low + (clip(a, -1, 1) + 1) / 2 * (high - low)``; with ``normalize_actions=False``
prices, multipliers or budgets in market units, clipped to its bounds) and observes its
``[D]`` row, in a ``Box`` bounded where the observation's components declare bounds. One
``step`` is one jitted call of the market's ``step_env`` for all agents at once; the
dicts are built from its outputs on the host. Episodes end for every agent together
(``truncated`` when ``time >= episode_length``; ``terminated`` never), and then
``agents`` is empty until ``reset``.

Keys: ``reset(seed=s)`` starts the chain at ``jax.random.key(s)`` (no seed: one drawn from
``np_random``); every reset and step splits it, ``key, sub = jax.random.split(key)``, and
passes ``sub`` to the market's ``reset_env`` / ``step_env``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from jaxmarket.adapters.common import (
    agent_slots,
    check_action,
    group_bounds,
    initial_key,
    obs_bounds,
    to_market_units,
)
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams


class MarketParallelEnv(ParallelEnv):
    metadata = {"name": "jaxmarket_parallel_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, env: MarketEnv, params: MarketParams, normalize_actions: bool = True):
        self.market, self.params = env, params
        self.normalize_actions = bool(normalize_actions)
        self._slots = agent_slots(env)
        self.possible_agents = [name for name, _, _ in self._slots]
        self.agents: list[str] = []
        self.render_mode = None
        P = env.spec.num_products
        obs_box = {g: obs_bounds(env, params, g) for g in env.agent_groups}
        bounds = {g: group_bounds(env, params, g) for g in env.agent_groups}
        market_bounds = dict(bounds)
        if self.normalize_actions:
            bounds = {g: (-np.ones_like(lo), np.ones_like(hi)) for g, (lo, hi) in bounds.items()}
        self.observation_spaces = {name: spaces.Box(obs_box[g][0][i], obs_box[g][1][i],
                                                    obs_box[g][0].shape[1:], np.float32)
                                   for name, g, i in self._slots}
        self.action_spaces = {name: spaces.Box(bounds[g][0][i], bounds[g][1][i], (P,), np.float32)
                              for name, g, i in self._slots}
        self._shape = {g: (env.num_agents(g), P) for g in env.agent_groups}
        self._np_random, _ = seeding.np_random()
        self._key = None
        self._state = None

        def reset(key, params):
            key, sub = jax.random.split(key)
            obs, state = env.reset_env(sub, params)
            return key, obs, state

        def step(key, state, actions, params):
            if self.normalize_actions:
                actions = {g: to_market_units(a, *market_bounds[g]) for g, a in actions.items()}
            key, sub = jax.random.split(key)
            obs, state, rewards, terminated, info = env.step_env(sub, state, actions, params)
            return key, obs, state, rewards, terminated, env.is_truncated(state, params), info

        self._reset, self._step = jax.jit(reset), jax.jit(step)

    # spaces: the same object on every call (PettingZoo's API test checks it)
    def observation_space(self, agent: str) -> spaces.Box:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Box:
        return self.action_spaces[agent]

    @functools.cached_property
    def agent_groups(self) -> dict[str, list[str]]:
        """``{group: [agent names]}``."""
        out: dict[str, list[str]] = {}
        for name, g, _ in self._slots:
            out.setdefault(g, []).append(name)
        return out

    def _per_agent(self, by_group: dict) -> dict[str, Any]:
        return {name: by_group[g][i] for name, g, i in self._slots}

    def _infos(self, info: dict | None) -> dict[str, dict]:
        if info is None:
            return {name: {} for name in self.possible_agents}
        return {name: {k: v[g][i] for k, v in info.items() if g in v}
                for name, g, i in self._slots}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._np_random, _ = seeding.np_random(seed)
        if seed is not None or self._key is None:
            self._key = initial_key(seed, self._np_random)
        self._key, obs, self._state = self._reset(self._key, self.params)
        self.agents = list(self.possible_agents)
        obs = jax.device_get(obs)
        return self._per_agent(obs), self._infos(None)

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise RuntimeError("the episode is over (no agents left): call reset() first")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"actions has no entry for agents {missing}; every live agent acts")
        unknown = [a for a in actions if a not in self.action_spaces]
        if unknown:
            raise ValueError(f"unknown agents {unknown}; agents are {self.possible_agents}")
        grouped = {g: np.zeros(shape, np.float32) for g, shape in self._shape.items()}
        for name, g, i in self._slots:
            grouped[g][i] = check_action(actions[name], self._shape[g][1:], f"agent {name}")
        self._key, obs, self._state, rewards, terminated, truncated, info = self._step(
            self._key, self._state, grouped, self.params)
        obs, rewards, terminated, truncated, info = jax.device_get(
            (obs, rewards, terminated, truncated, info))
        term, trunc = bool(terminated), bool(truncated)
        out = (self._per_agent(obs),
               {name: float(r) for name, r in self._per_agent(rewards).items()},
               {name: term for name in self.possible_agents},
               {name: trunc for name in self.possible_agents},
               self._infos(info))
        if term or trunc:
            self.agents = []
        return out

    def state(self) -> Any:
        """The market state (a ``MarketState`` pytree) after the last reset or step."""
        return self._state

    def render(self) -> None:
        return None

    def close(self) -> None:
        return None
