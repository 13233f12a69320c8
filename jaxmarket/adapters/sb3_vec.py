"""A Stable-Baselines3 ``VecEnv`` over the jitted vector env (``make_sb3_vec_env``).

SB3's own vectorisation of a single-agent env, ``DummyVecEnv([make_env] * n)``, steps
its ``n`` Gymnasium envs one after the other in Python: ``n`` device calls per step.
:class:`MarketSB3VecEnv` is a ``stable_baselines3.common.vec_env.VecEnv`` whose
``n_envs`` markets are the markets of one :class:`jaxmarket.adapters.gym_env.MarketVectorEnv`
(``make_vector_env``): every ``step`` is one jitted, vmapped call for all of them, and
numpy (float32 observations and rewards, bool dones) only at the boundary::

    from stable_baselines3 import PPO
    from jaxmarket.adapters import make_sb3_vec_env

    venv = make_sb3_vec_env("configs/calvano.yaml", n_envs=64)
    PPO("MlpPolicy", venv).learn(10_000)

It follows SB3's ``VecEnv`` contract as ``DummyVecEnv`` does: ``reset()`` returns the
observations only (the seed given to ``seed(s)`` is used by the next ``reset``: the
markets' keys are split from ``jax.random.key(s)``, as ``make_vector_env(...).reset(seed=s)``
splits them); ``step_wait()`` returns ``(obs, rewards, dones, infos)`` with ``dones =
terminated | truncated``, and a finished market is reset in the same step (the vector
env's ``"same_step"`` autoreset): its entry of ``obs`` is the reset observation, and its
``infos[i]`` holds ``"terminal_observation"`` (the observation before the reset) and
``"TimeLimit.truncated"`` (a market never terminates; it is truncated at
``market.episode_length``, so SB3's PPO bootstraps from the terminal observation).
``infos[i]`` also holds market ``i``'s row of the agent's per-step info (``prices``,
``traffic``, ``fees``, ``nonfinite_actions`` ...).

The markets share one Python object, the vector env: ``get_attr(name)`` reads the
single-market value of ``name`` (``observation_space``, ``action_space``, ``render_mode``)
or else the vector env's attribute, once per index asked for; ``set_attr`` sets the
vector env's attribute and therefore needs every index (or none); ``env_method`` calls the
vector env's method once and returns its result for each index asked for.
``env_is_wrapped`` is False everywhere (no Gymnasium wrapper sits between SB3 and the
markets); wrap the VecEnv itself with SB3's ``VecMonitor``, ``VecNormalize`` ... .
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxmarket.adapters.common import acting_group
from jaxmarket.adapters.factories import make_vector_env

Config = str | Path | Mapping[str, Any]

#: the install hint of the ImportError raised without Stable-Baselines3
EXTRA = "pip install 'jaxmarket[clients]'"
#: ``get_attr`` reads these single-market attributes of the vector env (its own are batched)
SINGLE = {"observation_space": "single_observation_space",
          "action_space": "single_action_space"}


@functools.cache
def sb3_vec_env_class():
    """The class ``MarketSB3VecEnv``, a subclass of SB3's ``VecEnv`` (module docstring),
    defined on first use so that this module imports without Stable-Baselines3; an
    ImportError naming the ``clients`` extra without it."""
    try:
        from stable_baselines3.common.vec_env import VecEnv
    except ImportError as err:
        raise ImportError(f"make_sb3_vec_env needs stable-baselines3, which could not be "
                          f"imported ({err}); {EXTRA} installs it (docs/ecosystem.md)",
                          name=err.name) from err
    return _define(VecEnv)


def _define(VecEnv):

    class MarketSB3VecEnv(VecEnv):
        """SB3 ``VecEnv`` over a ``MarketVectorEnv`` with ``"same_step"`` autoreset
        (module docstring)."""

        def __init__(self, venv):
            mode = str(getattr(venv.metadata.get("autoreset_mode"), "name", "")).lower()
            if mode != "same_step":
                raise ValueError("MarketSB3VecEnv needs a vector env with autoreset_mode "
                                 f"'same_step' (SB3 resets a finished env in the same step), "
                                 f"got {venv.metadata.get('autoreset_mode')!r}")
            self.venv = venv
            self.render_mode = None
            self._actions = None
            super().__init__(venv.num_envs, venv.single_observation_space,
                             venv.single_action_space)

        # -- the VecEnv contract ------------------------------------------------------
        def reset(self):
            seed = self._seeds[0]
            obs, _ = self.venv.reset(seed=None if seed is None else int(seed))
            self.reset_infos = [{} for _ in range(self.num_envs)]
            self._reset_seeds()
            self._reset_options()
            self._actions = None
            return np.array(obs, np.float32)      # a writable copy (torch takes it as is)

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = actions

        def step_wait(self):
            if self._actions is None:
                raise RuntimeError("call step_async(actions) before step_wait()")
            actions, self._actions = self._actions, None
            obs, reward, terminated, truncated, info = self.venv.step(actions)
            dones = np.logical_or(terminated, truncated)   # a new (writable) array
            final = info.pop("final_obs")
            info.pop("_final_obs")
            keys = list(info)
            rows = zip(*(np.asarray(info[k]) for k in keys)) if keys else \
                ((),) * self.num_envs
            infos = [dict(zip(keys, row)) for row in rows]
            for i in np.flatnonzero(dones):
                infos[i]["terminal_observation"] = np.array(final[i], np.float32)
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            return np.array(obs, np.float32), np.array(reward, np.float32), dones, infos

        def close(self) -> None:
            self.venv.close()

        def get_attr(self, attr_name: str, indices=None) -> list:
            if attr_name == "render_mode":
                value = self.render_mode
            else:
                value = getattr(self.venv, SINGLE.get(attr_name, attr_name))
            return [value for _ in self._get_indices(indices)]

        def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
            asked = sorted(self._get_indices(indices))
            if asked != list(range(self.num_envs)):
                raise ValueError(f"set_attr({attr_name!r}): the {self.num_envs} markets share "
                                 "one vector env, so an attribute is set for all of them "
                                 f"(indices=None), not for {asked}")
            setattr(self.venv, attr_name, value)

        def env_method(self, method_name: str, *method_args, indices=None,
                       **method_kwargs) -> list:
            result = getattr(self.venv, method_name)(*method_args, **method_kwargs)
            return [result for _ in self._get_indices(indices)]

        def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
            return [False for _ in self._get_indices(indices)]

        def get_images(self):
            raise NotImplementedError("markets do not render images")

        @property
        def market_states(self):
            """The ``n_envs`` market states (a batched ``MarketState``)."""
            return self.venv.market_states

    MarketSB3VecEnv.__module__ = __name__
    MarketSB3VecEnv.__qualname__ = "MarketSB3VecEnv"
    return MarketSB3VecEnv


def make_sb3_vec_env(config: Config, n_envs: int, group: str | None = None,
                     overrides: Sequence[str] = (), **kwargs):
    """A Stable-Baselines3 ``VecEnv`` of ``n_envs`` markets of ``config`` seen by agent
    ``agent`` of ``group`` (default: the scenario's first agent group), stepped by one
    jitted, vmapped call (module docstring). ``kwargs`` are
    :func:`jaxmarket.adapters.make_vector_env`'s (``agent``, ``others``,
    ``normalize_actions``), whose defaults it keeps; the autoreset mode is SB3's own
    (``"same_step"``). Needs stable-baselines3 (``pip install 'jaxmarket[clients]'``)."""
    if "autoreset_mode" in kwargs:
        raise TypeError("make_sb3_vec_env takes no autoreset_mode: SB3 resets a finished "
                        "env in the same step ('same_step')")
    cls = sb3_vec_env_class()
    venv = make_vector_env(config, acting_group(config, overrides, group), n_envs, overrides,
                           autoreset_mode="same_step", **kwargs)
    return cls(venv)
