"""``gym.make`` ids for the shipped scenarios: ``jaxmarket/<config name>-v0``.

``import jaxmarket.adapters`` registers, when gymnasium is installed (without it nothing
is imported and nothing registered), one id per file of the shipped ``configs/``::

    import gymnasium as gym
    import jaxmarket.adapters                       # registers jaxmarket/*-v0
    env = gym.make("jaxmarket/logit_duopoly-v0", others={"sellers": {"kind": "constant",
                   "value": 1.5}})
    venv = gym.make_vec("jaxmarket/logit_duopoly-v0", num_envs=8,
                        vectorization_mode="vector_entry_point")

Every id builds as shipped: actions in ``[-1, 1]`` (``normalize_actions=False``: market
units), a stateless scenario's agent observing its own price (the adapters'
``default_observation``), and the vector entry point in gymnasium's ``NEXT_STEP``
autoreset mode (``autoreset_mode="same_step"`` as a keyword argument for the other one;
gymnasium passes ``vector_kwargs`` only to its own ``SyncVectorEnv`` /
``AsyncVectorEnv``, ``vectorization_mode="sync"`` / ``"async"``, and refuses them for
any vector entry point).

``gym.make("jaxmarket.adapters:jaxmarket/calvano-v0")`` imports the module itself. The
keyword arguments are those of :func:`jaxmarket.adapters.make_gymnasium_env` (``group``
defaults to the scenario's first agent group; ``config`` is the registered scenario) and,
for ``make_vec``, :func:`jaxmarket.adapters.make_vector_env`. The entry points are
:func:`make_env` and :func:`make_vector`, which take ``config`` as a shipped scenario's
name, a YAML path or a mapping (what a Minari export's env spec stores).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxmarket.adapters.common import acting_group
from jaxmarket.adapters.factories import make_gymnasium_env, make_vector_env
from jaxmarket.config.loader import SHIPPED_CONFIGS

NAMESPACE = "jaxmarket"
VERSION = 0
ENTRY_POINT = "jaxmarket.adapters.registration:make_env"
VECTOR_ENTRY_POINT = "jaxmarket.adapters.registration:make_vector"


def env_id(name: str) -> str:
    """The ``gym.make`` id of the shipped scenario ``name``: ``jaxmarket/<name>-v0``."""
    return f"{NAMESPACE}/{name}-v{VERSION}"


def shipped_scenarios() -> list[str]:
    """Names of the shipped scenario files (``configs/<name>.yaml``), sorted."""
    return sorted(p.stem for p in Path(SHIPPED_CONFIGS).glob("*.yaml"))


def _source(config: str | Path | Mapping[str, Any]):
    """A shipped scenario's bare name -> its file; anything else unchanged."""
    if isinstance(config, str) and "/" not in config and not config.endswith((".yaml", ".yml")):
        path = Path(SHIPPED_CONFIGS) / f"{config}.yaml"
        if not path.is_file():
            raise ValueError(f"no shipped scenario {config!r}; shipped: "
                             + ", ".join(shipped_scenarios()))
        return str(path)
    return config


def make_env(config: str | Path | Mapping[str, Any], group: str | None = None,
             overrides: Sequence[str] = (), **kwargs):
    """``gym.make``'s entry point: :func:`jaxmarket.adapters.make_gymnasium_env`."""
    config = _source(config)
    return make_gymnasium_env(config, acting_group(config, overrides, group), overrides, **kwargs)


def make_vector(config: str | Path | Mapping[str, Any], num_envs: int = 1,
                group: str | None = None, overrides: Sequence[str] = (), **kwargs):
    """``gym.make_vec``'s vector entry point: :func:`jaxmarket.adapters.make_vector_env`."""
    config = _source(config)
    return make_vector_env(config, acting_group(config, overrides, group), num_envs, overrides,
                           **kwargs)


def register_envs() -> list[str]:
    """Register ``jaxmarket/<name>-v0`` for every shipped scenario (ids already
    registered are kept); returns the ids. Needs gymnasium."""
    import gymnasium as gym
    ids = []
    for name in shipped_scenarios():
        i = env_id(name)
        if i not in gym.registry:
            gym.register(i, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT,
                         kwargs={"config": name})
        ids.append(i)
    return ids


def register_if_installed() -> bool:
    """:func:`register_envs` when gymnasium is installed; without it, import nothing."""
    try:
        found = importlib.util.find_spec("gymnasium") is not None
    except ValueError:           # sys.modules["gymnasium"] is None: blocked, as if absent
        found = False
    if not found:
        return False
    register_envs()
    return True
