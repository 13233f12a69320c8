"""Adapters to other ecosystems' environment APIs (docs/ecosystem.md).

``make_parallel_env(config, overrides=(), ...)``  PettingZoo ``ParallelEnv`` of one market
``make_gymnasium_env(config, group, ...)``        Gymnasium ``Env``: one agent, others fixed
``make_vector_env(config, group, num_envs, ...)`` Gymnasium ``VectorEnv``: jitted, vmapped markets
``make_jaxmarl_env(config, overrides=())``        JaxMARL-style ``MultiAgentEnv`` (pure JAX)
``make_sb3_vec_env(config, n_envs, group=None)``  Stable-Baselines3 ``VecEnv`` over the vector env
``SingleAgentEnv(env, group, ...)``               gymnax ``Environment``: one agent, others fixed

``config`` is a scenario YAML path or mapping, ``overrides`` dotted ``key=value``
strings, as for :func:`jaxmarket.make`. The PettingZoo and Gymnasium adapters need the
``adapters`` extra (``pip install 'jaxmarket[adapters]'``); the JaxMARL one and
``SingleAgentEnv`` need nothing beyond jaxmarket; ``make_sb3_vec_env`` needs
stable-baselines3 (``pip install 'jaxmarket[clients]'``). Every adapter but ``SingleAgentEnv``
builds every shipped scenario as shipped: actions in ``[-1, 1]`` mapped onto the bounds
(``normalize_actions=False``: market units), a group that observes nothing observing
its own price (``default_observation``, :data:`jaxmarket.adapters.common.DEFAULT_OBSERVATION`),
observation spaces bounded where the observation kinds declare bounds, and the vector
env in gymnasium's ``NEXT_STEP`` autoreset mode.

Importing this package registers ``gym.make`` ids ``jaxmarket/<scenario>-v0`` for the
shipped scenarios when gymnasium is installed (:mod:`jaxmarket.adapters.registration`).
"""

from __future__ import annotations

from jaxmarket.adapters.factories import (
    make_gymnasium_env,
    make_jaxmarl_env,
    make_parallel_env,
    make_vector_env,
)
from jaxmarket.adapters.jaxmarl_env import MarketMultiAgentEnv
from jaxmarket.adapters.registration import env_id, register_envs, register_if_installed
from jaxmarket.adapters.sb3_vec import make_sb3_vec_env
from jaxmarket.adapters.single_agent import SingleAgentEnv

__all__ = ["MarketMultiAgentEnv", "SingleAgentEnv", "env_id", "make_gymnasium_env",
           "make_jaxmarl_env", "make_parallel_env", "make_sb3_vec_env", "make_vector_env",
           "register_envs"]

register_if_installed()
