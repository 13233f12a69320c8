"""A JaxMARL-style ``MultiAgentEnv`` view of a market (``make_jaxmarl_env``).

The interface of JaxMARL's ``MultiAgentEnv`` (no dependency on jaxmarl itself)::

    obs, state = env.reset(key)
    obs, state, rewards, dones, infos = env.step(key, state, actions)

with per-agent dicts keyed by ``env.agents`` (``<group>_<i>``): ``obs[a]`` is ``[D]``,
``actions[a]`` ``[P]`` (``[-1, 1]`` by default, see below), ``rewards[a]`` a
scalar, ``dones[a]`` and ``dones["__all__"]`` the market's ``terminated or truncated``;
``infos`` is empty (JaxMARL's baselines reshape every info leaf to one value per agent;
``infos_from_market=True`` returns the market's own per-group ``info`` instead).
``normalize_actions=True`` (the default) makes every action space ``Box(-1, 1, [P])``
(the Brax / MABrax convention of JaxMARL's continuous baselines), mapped per agent onto
its bounds: ``low + (clip(a, -1, 1) + 1) / 2 * (high - low)``; ``normalize_actions=False``
takes market units (clipped to the agent's bounds). Observation spaces are bounded where
the observation's components declare bounds. ``step`` auto-resets like JaxMARL's (``reset_state=`` to choose the state to reset to);
``step_env`` and ``get_obs`` are the pieces. The market params are fixed at
construction, as JaxMARL envs carry none. Everything is pure and jittable, so
``jax.vmap(env.step)`` runs thousands of markets; the market steps once for all agents
and the per-agent dicts are slices of its group arrays.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces

from jaxmarket.adapters.common import agent_slots, group_bounds, obs_bounds
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams
from jaxmarket.market.state import MarketState


class MarketMultiAgentEnv:
    def __init__(self, env: MarketEnv, params: MarketParams, infos_from_market: bool = False,
                 normalize_actions: bool = True):
        self.market, self.params = env, params
        self.infos_from_market = bool(infos_from_market)
        self.normalize_actions = bool(normalize_actions)
        self._slots = agent_slots(env)
        self.agents = [name for name, _, _ in self._slots]
        self.num_agents = len(self.agents)
        P = env.spec.num_products
        obs_box = {g: obs_bounds(env, params, g) for g in env.agent_groups}
        bounds = {g: group_bounds(env, params, g) for g in env.agent_groups}
        self._bounds = bounds
        if self.normalize_actions:
            bounds = {g: (-np.ones_like(lo), np.ones_like(hi)) for g, (lo, hi) in bounds.items()}
        self.observation_spaces = {name: spaces.Box(obs_box[g][0][i], obs_box[g][1][i],
                                                    obs_box[g][0].shape[1:], jnp.float32)
                                   for name, g, i in self._slots}
        self.action_spaces = {name: spaces.Box(bounds[g][0][i], bounds[g][1][i], (P,),
                                               jnp.float32)
                              for name, g, i in self._slots}

    def observation_space(self, agent: str) -> spaces.Box:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Box:
        return self.action_spaces[agent]

    @property
    def name(self) -> str:
        return "jaxmarket"

    @property
    def agent_classes(self) -> dict[str, list[str]]:
        """``{group: [agent names]}``: JaxMARL's agent classes are the market's groups."""
        out: dict[str, list[str]] = {}
        for name, g, _ in self._slots:
            out.setdefault(g, []).append(name)
        return out

    # per-group arrays <-> per-agent dicts
    def _split(self, by_group: dict) -> dict[str, jax.Array]:
        return {name: by_group[g][i] for name, g, i in self._slots}

    def _join(self, actions: dict[str, Any]) -> dict[str, jax.Array]:
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise KeyError(f"actions has no entry for agents {missing}; expected {self.agents}")
        out = {g: jnp.stack([jnp.asarray(actions[a], jnp.float32).reshape(-1) for a in names])
               for g, names in self.agent_classes.items()}
        return {g: self.market_action(g, a) for g, a in out.items()}

    def market_action(self, group: str, action: jax.Array) -> jax.Array:
        """A group's ``[n, P]`` actions in market units (prices, multipliers, budgets)."""
        if not self.normalize_actions:
            return action
        low, high = self._bounds[group]
        return low + (jnp.clip(action, -1.0, 1.0) + 1.0) / 2.0 * (high - low)

    @partial(jax.jit, static_argnums=(0,))
    def reset(self, key: jax.Array) -> tuple[dict, MarketState]:
        obs, state = self.market.reset_env(key, self.params)
        return self._split(obs), state

    def get_obs(self, state: MarketState) -> dict[str, jax.Array]:
        return self._split(self.market.get_obs(state, self.params))

    def step_env(self, key: jax.Array, state: MarketState, actions: dict):
        obs, state, rewards, terminated, info = self.market.step_env(
            key, state, self._join(actions), self.params)
        done = jnp.logical_or(terminated, self.market.is_truncated(state, self.params))
        dones = {a: done for a in self.agents}
        dones["__all__"] = done
        return (self._split(obs), state, self._split(rewards), dones,
                info if self.infos_from_market else {})

    @partial(jax.jit, static_argnums=(0,))
    def step(self, key: jax.Array, state: MarketState, actions: dict,
             reset_state: MarketState | None = None):
        key, key_reset = jax.random.split(key)
        obs_st, state_st, rewards, dones, infos = self.step_env(key, state, actions)
        if reset_state is None:
            obs_re, state_re = self.reset(key_reset)
        else:
            state_re, obs_re = reset_state, self.get_obs(reset_state)
        done = dones["__all__"]
        state = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), state_re, state_st)
        obs = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), obs_re, obs_st)
        return obs, state, rewards, dones, infos
