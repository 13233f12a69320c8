"""Adapters to other ecosystems' environment APIs (docs/ecosystem.md).

``make_parallel_env(config, overrides=())``       PettingZoo ``ParallelEnv`` of one market
``make_gymnasium_env(config, group, ...)``        Gymnasium ``Env``: one agent, others fixed
``make_vector_env(config, group, num_envs, ...)`` Gymnasium ``VectorEnv``: jitted, vmapped markets
``make_jaxmarl_env(config, overrides=())``        JaxMARL-style ``MultiAgentEnv`` (pure JAX)
``SingleAgentEnv(env, group, ...)``               gymnax ``Environment``: one agent, others fixed

``config`` is a scenario YAML path or mapping, ``overrides`` dotted ``key=value``
strings, as for :func:`jaxmarket.make`. The PettingZoo and Gymnasium adapters need the
``adapters`` extra (``pip install 'jaxmarket[adapters]'``); the JaxMARL one and
``SingleAgentEnv`` need nothing beyond jaxmarket.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxmarket.adapters.common import build
from jaxmarket.adapters.jaxmarl_env import MarketMultiAgentEnv
from jaxmarket.adapters.single_agent import SingleAgentEnv

__all__ = ["make_parallel_env", "make_gymnasium_env", "make_vector_env", "make_jaxmarl_env",
           "MarketMultiAgentEnv", "SingleAgentEnv"]

Config = str | Path | Mapping[str, Any]


def _needs(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{what} needs {err.name}: pip install 'jaxmarket[adapters]'") from None


def make_parallel_env(config: Config, overrides: Sequence[str] = ()):
    """A PettingZoo ``ParallelEnv`` of one market: agents ``<group>_<i>``, ``Box`` spaces
    from the market's bounds and observation sizes (:mod:`jaxmarket.adapters.parallel`)."""
    mod = _needs("jaxmarket.adapters.parallel", "make_parallel_env")
    return mod.MarketParallelEnv(*build(config, overrides))


def make_gymnasium_env(config: Config, group: str, overrides: Sequence[str] = (), *,
                       agent: int = 0, others: Mapping[str, Any] | None = None,
                       normalize_actions: bool = False):
    """A Gymnasium ``Env`` for agent ``agent`` of ``group``; the groups in ``others``
    follow fixed policies given as learner configs, the rest hold their reset action
    (:mod:`jaxmarket.adapters.gym_env`)."""
    mod = _needs("jaxmarket.adapters.gym_env", "make_gymnasium_env")
    env, params = build(config, overrides)
    view = mod.make_view(env, params, group, agent, others, normalize_actions)
    return mod.MarketGymnasiumEnv(view, params)


def make_vector_env(config: Config, group: str, num_envs: int, overrides: Sequence[str] = (), *,
                    agent: int = 0, others: Mapping[str, Any] | None = None,
                    normalize_actions: bool = False):
    """A Gymnasium ``VectorEnv`` of ``num_envs`` markets, each seen by one agent as in
    :func:`make_gymnasium_env`; one jitted, vmapped device call per step for all."""
    mod = _needs("jaxmarket.adapters.gym_env", "make_vector_env")
    env, params = build(config, overrides)
    view = mod.make_view(env, params, group, agent, others, normalize_actions)
    return mod.MarketVectorEnv(view, params, num_envs)


def make_jaxmarl_env(config: Config, overrides: Sequence[str] = (), *,
                     infos_from_market: bool = False,
                     normalize_actions: bool = False) -> MarketMultiAgentEnv:
    """A JaxMARL-style ``MultiAgentEnv`` of one market: ``reset(key)``,
    ``step(key, state, actions)``, per-agent dicts and ``dones["__all__"]``;
    ``normalize_actions``: every action space is ``Box(-1, 1, [P])``."""
    return MarketMultiAgentEnv(*build(config, overrides), infos_from_market=infos_from_market,
                               normalize_actions=normalize_actions)
