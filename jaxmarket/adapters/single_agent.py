"""A single-agent gymnax ``Environment`` view of a market.

One agent (``group``, slot ``agent``) acts; every other agent follows a fixed policy
from config (any learner kind, typically ``constant``, ``schedule``, ``undercut`` or
``random``; default: hold its reset action). Observation, action and reward are that
agent's row, so gymnax wrappers (``LogWrapper`` ...) and single-agent RL code work
unchanged::

    view = SingleAgentEnv(env, "sellers", agent=0,
                          others={"sellers": {"kind": "constant", "value": 1.5}})
    obs, state = view.reset(key, params)
    obs, state, reward, terminated, truncated, info = view.step(key, state, action, params)

``normalize_actions=True`` exposes ``Box(-1, 1, [P])`` instead of the group's bounds, for
continuous-control code that clips its actions to ``[-1, 1]`` (PureJaxRL's ``ClipAction``,
the Brax convention). An action ``a`` is clipped to ``[-1, 1]`` and mapped per product to
the market action (price, multiplier or budget)::

    price = low + (clip(a, -1, 1) + 1) / 2 * (high - low)

with ``low``, ``high`` that agent's bounds from ``params`` (its row of
``env.action_space(group, params)``): -1 is ``low``, 0 the midpoint, +1 ``high``. The
default (False) passes the action through in market units; the market clips it to its
bounds.

It sits in the adapters layer (above the learners): the other agents' fixed policies are
learners built from their configs.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from jaxmarket.learners.controller import build_learner, group_learner_spec
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams
from jaxmarket.market.state import MarketState, current_actions


@struct.dataclass
class SingleAgentState:
    market: MarketState
    others: Any        # learner states of the fixed policies, per group
    obs: Any           # last market observation dict (fixed policies read it)
    time: jax.Array    # for gymnax wrappers that read state.time


class SingleAgentEnv(environment.Environment):
    def __init__(self, env: MarketEnv, group: str, agent: int = 0,
                 others: Mapping[str, Any] | None = None, params: MarketParams | None = None,
                 normalize_actions: bool = False):
        super().__init__()
        self.normalize_actions = bool(normalize_actions)
        g = env.spec.group(group)
        if not g.agent:
            raise ValueError(f"group {group!r} is not an agent group: {env.agent_groups}")
        if not 0 <= agent < g.count:
            raise ValueError(f"agent must be in [0, {g.count}) for group {group!r}, got {agent}")
        self.env, self.group, self.agent = env, group, agent
        self._params = params
        others = dict(others or {})
        self._policies, self._specs = {}, {}
        if params is not None:
            for name in env.agent_groups:
                if name in others:
                    self._specs[name] = group_learner_spec(env, params, name)
                    self._policies[name] = build_learner(others[name], self._specs[name],
                                                         f"others.{name}")
        elif others:
            raise ValueError("pass params= to build the other agents' fixed policies")

    @property
    def default_params(self) -> MarketParams:
        if self._params is None:
            raise ValueError("SingleAgentEnv was built without params; pass them to reset/step")
        return self._params

    def _bounds(self, params: MarketParams) -> tuple[jax.Array, jax.Array]:
        """This agent's ``[P]`` action bounds (market units) under ``params``."""
        box = self.env.action_space(self.group, params)
        low = jnp.broadcast_to(jnp.asarray(box.low, jnp.float32), box.shape)[self.agent]
        high = jnp.broadcast_to(jnp.asarray(box.high, jnp.float32), box.shape)[self.agent]
        return low, high

    def market_action(self, action, params: MarketParams | None = None) -> jax.Array:
        """The ``[P]`` market action (price, multiplier or budget) sent for a view action.

        With ``normalize_actions``: ``low + (clip(a, -1, 1) + 1) / 2 * (high - low)``;
        otherwise ``a`` unchanged (the market then clips it to ``[low, high]``)."""
        params = self.default_params if params is None else params
        a = jnp.asarray(action, jnp.float32).reshape(-1)
        if not self.normalize_actions:
            return a
        low, high = self._bounds(params)
        return low + (jnp.clip(a, -1.0, 1.0) + 1.0) / 2.0 * (high - low)

    def _joint_actions(self, state: SingleAgentState, action, key, params):
        acts = current_actions(self.env.spec, state.market)
        keys = jax.random.split(key, max(len(self._policies), 1))
        for i, (name, pol) in enumerate(self._policies.items()):
            acts[name], _ = pol.act(state.others[name], state.obs[name], keys[i])
        mine = self.market_action(action, params)
        acts[self.group] = acts[self.group].at[self.agent].set(mine)
        return acts

    def reset_env(self, key, params):
        k_env, k_pol = jax.random.split(key)
        obs, market = self.env.reset_env(k_env, params)
        keys = jax.random.split(k_pol, max(len(self._policies), 1))
        others = {name: pol.init(keys[i], self._specs[name])
                  for i, (name, pol) in enumerate(self._policies.items())}
        state = SingleAgentState(market, others, obs, market.time)
        return obs[self.group][self.agent], state

    def step_env(self, key, state, action, params):
        k_act, k_env = jax.random.split(key)
        acts = self._joint_actions(state, action, k_act, params)
        obs, market, rewards, terminated, info = self.env.step_env(k_env, state.market, acts, params)
        state = state.replace(market=market, obs=obs, time=market.time)
        return (obs[self.group][self.agent], state, rewards[self.group][self.agent],
                terminated, info)

    def is_truncated(self, state, params):
        return self.env.is_truncated(state.market, params)

    def action_space(self, params=None):
        params = self.default_params if params is None else params
        shape = self.env.action_space(self.group, params).shape[1:]
        if self.normalize_actions:
            return spaces.Box(-1.0, 1.0, shape, jnp.float32)
        low, high = self._bounds(params)
        return spaces.Box(low, high, shape, jnp.float32)

    def observation_space(self, params=None):
        params = self.default_params if params is None else params
        box = self.env.observation_space(self.group, params)
        return spaces.Box(-jnp.inf, jnp.inf, box.shape[1:], jnp.float32)

    @property
    def name(self) -> str:
        return f"jaxmarket-{self.group}-{self.agent}"
