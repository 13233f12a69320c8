"""What the D4RL and Minari exports share: actions normalised to ``[-1, 1]`` (what d3rlpy
and most continuous-control code assume) and the Gymnasium env spec a Minari dataset
carries so that ``MinariDataset.recover_environment()`` (and ``d3rlpy.datasets.get_minari``)
can rebuild the market.

``normalized(ds)`` maps a continuous dataset's actions ``a`` in ``[low, high]`` (the
dataset's ``action_low`` / ``action_high``, per product) to ``2 (a - low) / (high - low)
- 1``; ``meta["actions_normalized"]`` is then True and ``meta["market_action_low"]`` /
``["market_action_high"]`` keep the bounds, so :func:`to_market` maps them back (the
readers do). That is the inverse of the adapters' ``normalize_actions`` mapping, so a
policy trained on the export acts in the recovered env with ``normalize_actions=True``.

``env_spec(ds, normalize_actions)`` is a ``gymnasium.envs.registration.EnvSpec`` whose
entry point is ``jaxmarket.adapters.registration:make_env`` (a string: this layer does not
import the adapters) with the dataset's scenario (``meta["config"]``), group and
``normalize_actions``; agent 0 of the group acts and every other agent follows the
scenario's own learners, as ``python -m jaxmarket.collect`` without ``--policy`` ran
them; ``max_episode_steps`` is the market's ``episode_length``, else the dataset's longest
episode (d3rlpy's ``get_minari`` needs one). A dataset that observes nothing (a
stateless scenario) rebuilds the market the same, ``Box(0,)`` observations
(``default_observation=[]``, ``allow_empty_observation=True``), not with the adapters'
default observation. None when the dataset has no scenario or is discrete.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.dataset import Dataset

ENV_ENTRY_POINT = "jaxmarket.adapters.registration:make_env"
ENV_ID = "jaxmarket/market-v0"


def _bounds(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if "action_low" not in ds.meta or "action_high" not in ds.meta:
        raise ConfigError("--normalize-actions", True, "a dataset with action bounds "
                          "(meta action_low / action_high)")
    return (np.asarray(ds.meta["action_low"], np.float32).reshape(-1),
            np.asarray(ds.meta["action_high"], np.float32).reshape(-1))


def normalized(ds: Dataset) -> Dataset:
    """``ds`` with continuous actions mapped from its bounds onto ``[-1, 1]``."""
    if ds.discrete:
        raise ConfigError("--normalize-actions", True, "a continuous dataset (a discrete "
                          "one stores action indices)")
    if ds.meta.get("actions_normalized"):
        return ds
    low, high = _bounds(ds)
    span = np.where(high > low, high - low, 1.0).astype(np.float32)
    acts = np.asarray(ds["actions"], np.float32)
    scaled = np.clip(2.0 * (acts - low) / span - 1.0, -1.0, 1.0).astype(np.float32)
    meta = {**ds.meta, "actions_normalized": True, "market_action_low": low.tolist(),
            "market_action_high": high.tolist(),
            "action_low": [-1.0] * low.size, "action_high": [1.0] * high.size}
    return Dataset({**ds.fields, "actions": scaled}, meta)


def to_market(actions: np.ndarray, low: Any, high: Any) -> np.ndarray:
    """Normalised actions back in market units: ``low + (a + 1) / 2 (high - low)``."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    return (low + (np.asarray(actions, np.float32) + 1.0) / 2.0 * (high - low)).astype(
        np.float32)


def env_spec_kwargs(ds: Dataset, normalize_actions: bool) -> dict | None:
    """The keyword arguments of the env spec (see the module docstring), or None."""
    config = ds.meta.get("config")
    if not config or ds.discrete:
        return None
    # the other groups' fixed policies: their learner configs without the training-only
    # population-based-training block
    learners = {g: ({k: v for k, v in cfg.items() if k != "pbt"}
                    if isinstance(cfg, dict) else cfg)
                for g, cfg in (config.get("learners") or {}).items()}
    kwargs = {"config": config, "group": str(ds.meta.get("group")), "agent": 0,
              "others": learners or None, "normalize_actions": bool(normalize_actions)}
    if ds.obs_dim == 0:      # recorded observing nothing: rebuilt so, not with own_price
        kwargs.update(default_observation=[], allow_empty_observation=True)
    return kwargs


def horizon(ds: Dataset) -> int:
    """``max_episode_steps`` of the env spec: the market's ``episode_length``, else the
    longest episode of the dataset (d3rlpy wraps the recovered env in a time limit)."""
    length = ((ds.meta.get("config") or {}).get("market") or {}).get("episode_length")
    if length:
        return int(length)
    return int(max(len(e) for e in ds.episodes()))


def env_spec(ds: Dataset, normalize_actions: bool = False):
    """A Gymnasium ``EnvSpec`` rebuilding the dataset's market, or None."""
    kwargs = env_spec_kwargs(ds, normalize_actions)
    if kwargs is None:
        return None
    from gymnasium.envs.registration import EnvSpec
    return EnvSpec(id=ENV_ID, entry_point=ENV_ENTRY_POINT, kwargs=kwargs,
                   max_episode_steps=horizon(ds))


__all__ = ["ENV_ENTRY_POINT", "env_spec", "env_spec_kwargs", "normalized", "to_market"]
