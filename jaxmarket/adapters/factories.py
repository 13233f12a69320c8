"""The adapters' factories (re-exported by :mod:`jaxmarket.adapters`, docs/ecosystem.md).

The PettingZoo and Gymnasium modules are imported on first use, so ``jaxmarket.adapters``
imports without the ``adapters`` extra; when that import fails, the error says what is
installed and what is needed, with the real import error chained to it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxmarket.adapters.common import DEFAULT_OBSERVATION, build_observing, require_observations
from jaxmarket.adapters.jaxmarl_env import MarketMultiAgentEnv

Config = str | Path | Mapping[str, Any]

#: what the ``adapters`` extra installs (pyproject.toml)
REQUIRED = {"gymnasium": "1.1", "pettingzoo": "1.24"}
AUTORESET_MODES = ("same_step", "next_step")
Observation = Sequence[Mapping[str, Any]] | None


def _installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def needs(module: str, what: str):
    """Import ``module`` (an adapter needing the ``adapters`` extra), or an ImportError
    that names what is installed and what is needed, chained to the real error."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        have = ", ".join(f"{n} {_installed(n)}" for n in REQUIRED)
        want = ", ".join(f"{n}>={v}" for n, v in REQUIRED.items())
        raise ImportError(f"{what} could not import {err.name or module}: {err} "
                          f"(installed: {have}; the adapters need {want}: "
                          "pip install -U 'jaxmarket[adapters]')", name=err.name) from err


def _autoreset(mode: Any) -> str:
    text = str(getattr(mode, "name", mode)).lower()
    if text not in AUTORESET_MODES:
        raise ValueError(f"autoreset_mode must be one of {AUTORESET_MODES} (or gymnasium's "
                         f"AutoresetMode.SAME_STEP / NEXT_STEP), got {mode!r}")
    return text


def make_parallel_env(config: Config, overrides: Sequence[str] = (), *,
                      normalize_actions: bool = True,
                      default_observation: Observation = DEFAULT_OBSERVATION):
    """A PettingZoo ``ParallelEnv`` of one market: agents ``<group>_<i>``, ``Box`` spaces
    from the market's bounds and observation sizes (:mod:`jaxmarket.adapters.parallel`).
    ``normalize_actions`` (default): every action space is ``Box(-1, 1, [P])``, mapped
    onto the agent's bounds; False: market units. A group that observes nothing
    observes ``default_observation`` (:data:`jaxmarket.adapters.common.DEFAULT_OBSERVATION`,
    its own price; ``()``: none, a ConfigError)."""
    mod = needs("jaxmarket.adapters.parallel", "make_parallel_env")
    env, params = build_observing(config, overrides, None, default_observation)
    require_observations(env, params, env.agent_groups, "make_parallel_env")
    return mod.MarketParallelEnv(env, params, normalize_actions=normalize_actions)


def make_gymnasium_env(config: Config, group: str, overrides: Sequence[str] = (), *,
                       agent: int = 0, others: Mapping[str, Any] | None = None,
                       normalize_actions: bool = True,
                       default_observation: Observation = DEFAULT_OBSERVATION,
                       allow_empty_observation: bool = False):
    """A Gymnasium ``Env`` for agent ``agent`` of ``group``; the groups in ``others``
    follow fixed policies given as learner configs, the rest hold their reset action
    (:mod:`jaxmarket.adapters.gym_env`). ``normalize_actions`` (default): a
    ``Box(-1, 1, [P])`` action mapped onto the agent's bounds; False: market units. If
    ``group`` observes nothing it observes ``default_observation`` (its own price; the
    other groups keep their configs). ``allow_empty_observation``: with
    ``default_observation=()``, a ``Box(0,)`` observation instead of the ConfigError (what
    a recorded stateless dataset's Minari env spec rebuilds)."""
    mod = needs("jaxmarket.adapters.gym_env", "make_gymnasium_env")
    env, params = build_observing(config, overrides, [group], default_observation)
    view = mod.make_view(env, params, group, agent, others, normalize_actions)
    if not allow_empty_observation:
        require_observations(env, params, [group], "make_gymnasium_env")
    return mod.MarketGymnasiumEnv(view, params)


def make_vector_env(config: Config, group: str, num_envs: int, overrides: Sequence[str] = (), *,
                    agent: int = 0, others: Mapping[str, Any] | None = None,
                    normalize_actions: bool = True, autoreset_mode: Any = "next_step",
                    default_observation: Observation = DEFAULT_OBSERVATION):
    """A Gymnasium ``VectorEnv`` of ``num_envs`` markets, each seen by one agent as in
    :func:`make_gymnasium_env`; one jitted, vmapped device call per step for all.
    ``autoreset_mode``: ``"next_step"`` (the default, Gymnasium's own: the next ``step``
    resets a finished market; what its observation wrappers need) or ``"same_step"`` (a
    finished market's next observation is already the reset one), or gymnasium's
    ``AutoresetMode`` member."""
    mode = _autoreset(autoreset_mode)
    mod = needs("jaxmarket.adapters.gym_env", "make_vector_env")
    env, params = build_observing(config, overrides, [group], default_observation)
    view = mod.make_view(env, params, group, agent, others, normalize_actions)
    require_observations(env, params, [group], "make_vector_env")
    return mod.MarketVectorEnv(view, params, num_envs, autoreset_mode=mode)


def make_jaxmarl_env(config: Config, overrides: Sequence[str] = (), *,
                     infos_from_market: bool = False,
                     normalize_actions: bool = True,
                     default_observation: Observation = DEFAULT_OBSERVATION
                     ) -> MarketMultiAgentEnv:
    """A JaxMARL-style ``MultiAgentEnv`` of one market: ``reset(key)``,
    ``step(key, state, actions)``, per-agent dicts and ``dones["__all__"]``;
    ``normalize_actions`` (default): every action space is ``Box(-1, 1, [P])``; False:
    market units. A group that observes nothing observes ``default_observation``."""
    env, params = build_observing(config, overrides, None, default_observation)
    require_observations(env, params, env.agent_groups, "make_jaxmarl_env")
    return MarketMultiAgentEnv(env, params, infos_from_market=infos_from_market,
                               normalize_actions=normalize_actions)
