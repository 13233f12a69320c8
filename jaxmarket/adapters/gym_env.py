"""Gymnasium views of one agent of a market (``make_gymnasium_env``, ``make_vector_env``).

Both wrap :class:`jaxmarket.adapters.single_agent.SingleAgentEnv` (the gymnax view): one
agent of ``group`` acts, the other agent groups named in ``others`` follow fixed
policies given as learner configs (``{"kind": "constant", "value": 1.5}``, ``undercut``,
``random`` ...) and every other agent holds its reset action. Observation, action
(``[P]``) and reward are that agent's. ``normalize_actions=True`` (the factories'
default) exposes ``Box(-1, 1, [P])`` mapped linearly onto the agent's bounds. The
observation space is bounded where the observation's components declare bounds
(:func:`jaxmarket.adapters.common.obs_bounds`).

``MarketGymnasiumEnv`` is a ``gymnasium.Env``: one jitted call per ``reset`` / ``step``
(``SingleAgentEnv.reset_env`` / ``step_env``, no auto-reset). ``MarketVectorEnv`` is a
``gymnasium.vector.VectorEnv`` over ``num_envs`` markets: every ``step`` is one jitted,
vmapped call for all of them, with one of gymnasium's two autoreset modes
(``metadata["autoreset_mode"]``):

* ``"same_step"`` (``AutoresetMode.SAME_STEP``): the gymnax ``step``; a
  finished market's next observation is already the reset one, and
  ``infos["final_obs"]`` holds the observation before it, masked by ``infos["_final_obs"]``.
* ``"next_step"`` (``AutoresetMode.NEXT_STEP``, the default: what gymnasium's
  ``SyncVectorEnv`` does by default and its observation wrappers ``NormalizeObservation``,
  ``FlattenObservation``, ``DtypeObservation`` need): a finished market returns its last
  observation; the next ``step`` ignores that market's action and resets it (reward 0,
  not terminated, not truncated; ``infos["_<key>"]`` is False for it).

Keys: ``reset(seed=s)`` starts the chain at ``jax.random.key(s)`` (no seed: drawn from
``np_random``); each call splits it, ``key, sub = jax.random.split(key)``, and uses
``sub`` (the vector env splits ``sub`` into ``num_envs`` keys, one per market; with
``"next_step"`` a market's key goes to its ``step_env``, or to its ``reset_env`` in the
step that resets it).
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from jaxmarket.adapters.common import check_action, initial_key, obs_bounds
from jaxmarket.adapters.single_agent import SingleAgentEnv
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams


def _agent_info(info: dict, group: str, agent: int) -> dict:
    """The agent's row of every per-group entry of the market's ``info`` (``[..., n, P]``
    -> ``[..., P]``, so it works on a batch of markets too)."""
    return {k: v[group][..., agent, :] for k, v in info.items()
            if isinstance(v, dict) and group in v}


def _spaces(view: SingleAgentEnv, params: MarketParams) -> tuple[spaces.Box, spaces.Box]:
    act = view.action_space(params)
    obs_low, obs_high = obs_bounds(view.env, params, view.group)
    low = np.broadcast_to(np.asarray(act.low, np.float32), act.shape)
    high = np.broadcast_to(np.asarray(act.high, np.float32), act.shape)
    return (spaces.Box(obs_low[view.agent], obs_high[view.agent], obs_low.shape[1:], np.float32),
            spaces.Box(low, high, act.shape, np.float32))


def make_view(env: MarketEnv, params: MarketParams, group: str, agent: int = 0,
              others: Mapping[str, Any] | None = None,
              normalize_actions: bool = True) -> SingleAgentEnv:
    if group not in env.agent_groups:
        raise ValueError(f"group must be one of the agent groups {env.agent_groups}, "
                         f"got {group!r}")
    return SingleAgentEnv(env, group, agent=agent, others=others, params=params,
                          normalize_actions=normalize_actions)


class MarketGymnasiumEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, view: SingleAgentEnv, params: MarketParams):
        self.view, self.params = view, params
        self.observation_space, self.action_space = _spaces(view, params)
        self._key = None
        self._state = None
        group, agent = view.group, view.agent

        def reset(key, params):
            key, sub = jax.random.split(key)
            obs, state = view.reset_env(sub, params)
            return key, obs, state

        def step(key, state, action, params):
            key, sub = jax.random.split(key)
            obs, state, reward, terminated, info = view.step_env(sub, state, action, params)
            truncated = view.is_truncated(state, params)
            return key, obs, state, reward, terminated, truncated, _agent_info(info, group, agent)

        self._reset, self._step = jax.jit(reset), jax.jit(step)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None or self._key is None:
            self._key = initial_key(seed, self.np_random)
        self._key, obs, self._state = self._reset(self._key, self.params)
        return np.asarray(obs), {}

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        a = check_action(action, self.action_space.shape, self.view.name)
        self._key, obs, self._state, reward, terminated, truncated, info = self._step(
            self._key, self._state, a, self.params)
        obs, reward, terminated, truncated, info = jax.device_get(
            (obs, reward, terminated, truncated, info))
        return obs, float(reward), bool(terminated), bool(truncated), info

    @property
    def market_state(self):
        """The market state (``MarketState``) after the last reset or step."""
        return None if self._state is None else self._state.market


def _next_step(view: SingleAgentEnv, n: int):
    """The NEXT_STEP vector step: markets flagged in ``resetting`` reset (action ignored,
    reward 0, not done), the others step without auto-reset."""
    group, agent = view.group, view.agent

    def one(key, state, action, resetting, params):
        obs_s, state_s, reward, terminated, info = view.step_env(key, state, action, params)
        truncated = view.is_truncated(state_s, params)
        obs_r, state_r = view.reset_env(key, params)
        pick = (lambda r, s: jax.lax.select(resetting, r, s))
        keep = jnp.logical_not(resetting)
        return (pick(obs_r, obs_s), jax.tree.map(pick, state_r, state_s),
                jnp.where(resetting, 0.0, reward), jnp.logical_and(terminated, keep),
                jnp.logical_and(truncated, keep), info)

    def step(key, states, actions, resetting, params):
        key, sub = jax.random.split(key)
        obs, states, reward, terminated, truncated, info = jax.vmap(
            one, in_axes=(0, 0, 0, 0, None))(jax.random.split(sub, n), states, actions,
                                             resetting, params)
        infos = _agent_info(info, group, agent)
        valid = jnp.logical_not(resetting)
        infos.update({f"_{k}": valid for k in list(infos)})
        return key, obs, states, reward, terminated, truncated, infos

    return step


class MarketVectorEnv(VectorEnv):
    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, view: SingleAgentEnv, params: MarketParams, num_envs: int,
                 autoreset_mode: str = "next_step"):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
                or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if autoreset_mode not in ("same_step", "next_step"):
            raise ValueError(f"autoreset_mode must be 'same_step' or 'next_step', got "
                             f"{autoreset_mode!r}")
        self.autoreset_mode = (AutoresetMode.NEXT_STEP if autoreset_mode == "next_step"
                               else AutoresetMode.SAME_STEP)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self._resetting = np.zeros(int(num_envs), bool)
        self.view, self.params, self.num_envs = view, params, int(num_envs)
        self.single_observation_space, self.single_action_space = _spaces(view, params)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._key = None
        self._states = None
        n, group, agent = self.num_envs, view.group, view.agent

        def reset(key, params):
            key, sub = jax.random.split(key)
            obs, states = jax.vmap(view.reset, in_axes=(0, None))(jax.random.split(sub, n), params)
            return key, obs, states

        def step(key, states, actions, params):
            key, sub = jax.random.split(key)
            obs, states, reward, terminated, truncated, info = jax.vmap(
                view.step, in_axes=(0, 0, 0, None))(jax.random.split(sub, n), states, actions,
                                                    params)
            infos = _agent_info(info, group, agent)
            infos["final_obs"] = info["final_observation"]
            infos["_final_obs"] = jnp.logical_or(terminated, truncated)
            return key, obs, states, reward, terminated, truncated, infos

        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            step = _next_step(view, n)
        self._reset, self._step = jax.jit(reset), jax.jit(step)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if isinstance(seed, (list, tuple)):
            raise TypeError("seed must be one int (the markets get keys split from it), "
                            f"got {seed!r}")
        if seed is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(seed)
        if seed is not None or self._key is None:
            self._key = initial_key(seed, self.np_random)
        self._key, obs, self._states = self._reset(self._key, self.params)
        self._resetting = np.zeros(self.num_envs, bool)
        return np.asarray(obs), {}

    def step(self, actions):
        if self._states is None:
            raise RuntimeError("call reset() before step()")
        a = check_action(actions, self.action_space.shape, f"{self.view.name} x {self.num_envs}")
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._key, obs, self._states, reward, terminated, truncated, infos = self._step(
                self._key, self._states, a, self._resetting, self.params)
            out = jax.device_get((obs, reward, terminated, truncated, infos))
            self._resetting = np.logical_or(out[2], out[3])
            return out
        self._key, obs, self._states, reward, terminated, truncated, infos = self._step(
            self._key, self._states, a, self.params)
        return jax.device_get((obs, reward, terminated, truncated, infos))

    @property
    def market_states(self):
        """The ``num_envs`` market states (a batched ``MarketState``)."""
        return None if self._states is None else self._states.market
