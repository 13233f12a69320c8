"""Minari export and import (local datasets, written with Minari's own API).

``save_minari(ds, dataset_id)`` writes one group's dataset with
``minari.create_dataset_from_buffers`` into Minari's local root (``MINARI_DATASETS_PATH``,
default ``~/.minari/datasets``): one Minari episode per episode of the dataset, split
further where consecutive rows do not chain (``next_observations[t] !=
observations[t + 1]``, as in a reservoir sample), each ending in a truncation unless it
ended in a terminal. The observation space is a ``Box`` of the observation size, the
action space a ``Box`` between the dataset's bounds (discrete datasets: ``Discrete(K)``
with the action index). Per-step infos carry ``log_prob``, ``stream``, ``episode`` and
``step``; the dataset metadata (group, grid, bounds, ``actions_normalized`` with the
market bounds) is JSON in the description.

``load_minari(dataset_id)`` reads it back with ``minari.load_dataset``: observations
``[T + 1, D]`` per episode become ``observations = obs[:-1]``, ``next_observations =
obs[1:]``, ``terminals``/``timeouts`` from ``terminations``/``truncations``.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.dataset import Dataset, make_dataset
from jaxmarket.offline.export import env_spec, normalized, to_market
from jaxmarket.offline.files import storage_errno, storage_error


def _minari():
    try:
        import minari
    except ModuleNotFoundError:
        raise ConfigError("minari", "not installed", "pip install 'jaxmarket[offline]'") from None
    return minari


def _fragments(ds: Dataset) -> list[np.ndarray]:
    obs, nxt = np.asarray(ds["observations"]), np.asarray(ds["next_observations"])
    out = []
    for e in ds.episodes():
        breaks = np.flatnonzero(np.any(nxt[e][:-1] != obs[e][1:], axis=-1)) + 1
        out.extend(np.split(e, breaks))
    return out


def save_minari(ds: Dataset, dataset_id: str, description: str = "",
                normalize_actions: bool = False, with_env: bool = True):
    """Write ``ds`` as the local Minari dataset ``dataset_id`` (e.g.
    ``"jaxmarket/duopoly/seller-v0"``); returns the Minari dataset.

    ``normalize_actions``: continuous actions stored in ``[-1, 1]`` with a ``Box(-1, 1)``
    action space (:func:`jaxmarket.offline.export.normalized`). ``with_env``: attach the
    env spec that rebuilds the market (:func:`jaxmarket.offline.export.env_spec`), so
    ``recover_environment()`` and ``d3rlpy.datasets.get_minari`` work; a dataset without
    a scenario or without observations gets none. A storage fault is one
    :class:`~jaxmarket.train.rundir.StorageError` line (a partial dataset removed)."""
    minari = _minari()
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer

    if dataset_id in minari.list_local_datasets():
        raise ConfigError("dataset_id", dataset_id, "a Minari id not used locally yet")
    spec = env_spec(ds, normalize_actions) if with_env else None
    if normalize_actions:
        ds = normalized(ds)
    obs, nxt = np.asarray(ds["observations"], np.float32), np.asarray(ds["next_observations"], np.float32)
    if ds.discrete:
        acts = np.asarray(ds["action_index"], np.int64)
        action_space = gym.spaces.Discrete(len(ds.meta["action_values"]))
    else:
        acts = np.asarray(ds["actions"], np.float32)
        action_space = gym.spaces.Box(np.asarray(ds.meta["action_low"], np.float32),
                                      np.asarray(ds.meta["action_high"], np.float32),
                                      (ds.action_dim,), np.float32)
    # the recovered env's own (bounded where the observation kinds declare bounds) space,
    # so dataset and env agree; unbounded without an env spec
    observation_space = gym.spaces.Box(-np.inf, np.inf, (ds.obs_dim,), np.float32)
    if spec is not None:
        recovered = gym.make(spec)
        observation_space = recovered.observation_space
        recovered.close()
    buffers = []
    for i, e in enumerate(_fragments(ds)):
        term = np.asarray(ds["terminals"])[e]
        trunc = np.asarray(ds["timeouts"])[e].copy()
        trunc[-1] = not term[-1]

        def pad(x, fill):
            return np.r_[np.asarray(x), fill]

        buffers.append(EpisodeBuffer(
            id=i, observations=np.concatenate([obs[e], nxt[e][-1:]]),
            actions=acts[e], rewards=list(np.asarray(ds["rewards"], np.float64)[e]),
            terminations=list(term), truncations=list(trunc),
            infos={"log_prob": pad(np.asarray(ds["log_probs"], np.float64)[e], np.nan),
                   "stream": pad(np.asarray(ds["stream"])[e], -1),
                   "episode": pad(np.asarray(ds["episode"])[e], -1),
                   "step": pad(np.asarray(ds["step"])[e], -1)}))
    meta = {k: ds.meta[k] for k in ("group", "action_low", "action_high", "discrete",
                                    "action_values", "actions_normalized",
                                    "market_action_low", "market_action_high") if k in ds.meta}
    meta["actions_normalized"] = bool(ds.meta.get("actions_normalized", False))
    where = Path(os.environ.get("MINARI_DATASETS_PATH")
                 or Path("~/.minari/datasets").expanduser()) / dataset_id
    existed = where.exists()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # minari's notes on optional metadata
            return minari.create_dataset_from_buffers(
                dataset_id, buffers, env=spec, observation_space=observation_space,
                action_space=action_space, algorithm_name="jaxmarket.collect",
                description=json.dumps({"jaxmarket": meta, "text": description}),
                data_format="hdf5")
    except Exception as err:
        cause = storage_errno(err)
        if cause is None:
            raise
        if not existed:
            shutil.rmtree(where, ignore_errors=True)
        kept = (f"{where} as it was" if existed else
                f"nothing (the partial Minari dataset {where} was removed)" if not where.exists()
                else f"the partial Minari dataset {where} (it could not be removed: remove it)")
        raise storage_error(f"writing the Minari dataset {dataset_id}", cause, kept,
                            "write it again", where) from None


def load_minari(dataset_id: str) -> Dataset:
    """A local Minari dataset as a :class:`Dataset` (see the module docstring)."""
    minari = _minari()
    if dataset_id not in minari.list_local_datasets():
        raise ConfigError("--dataset", dataset_id, "a local Minari dataset id (minari list local)")
    md = minari.load_dataset(dataset_id)
    try:
        meta = json.loads(md.storage.metadata.get("description") or "{}").get("jaxmarket", {})
    except json.JSONDecodeError:
        meta = {}
    cols = {k: [] for k in ("obs", "next", "act", "rew", "term", "trunc", "logp", "stream",
                            "episode", "step")}
    for n, ep in enumerate(md.iterate_episodes()):
        T = len(ep.rewards)
        o = np.asarray(ep.observations, np.float32).reshape(T + 1, -1)
        cols["obs"].append(o[:-1])
        cols["next"].append(o[1:])
        cols["act"].append(np.asarray(ep.actions).reshape(T, -1) if not meta.get("discrete")
                           else np.asarray(ep.actions).reshape(T))
        cols["rew"].append(np.asarray(ep.rewards))
        cols["term"].append(np.asarray(ep.terminations, bool))
        cols["trunc"].append(np.asarray(ep.truncations, bool))
        infos = ep.infos or {}

        def get(k, default, infos=infos, T=T):
            return np.asarray(infos[k])[:T] if k in infos else default

        cols["logp"].append(get("log_prob", np.full(T, np.nan)))
        cols["stream"].append(get("stream", np.zeros(T, np.int32)))
        cols["episode"].append(get("episode", np.full(T, n, np.int32)))
        cols["step"].append(get("step", np.arange(T)))
    if not cols["rew"]:
        raise ConfigError("--dataset", dataset_id, "a Minari dataset with at least one episode")
    c = {k: np.concatenate(v) for k, v in cols.items()}
    extra, meta = {}, dict(meta)
    if meta.get("discrete"):
        values = np.asarray(meta["action_values"], np.float32)
        extra["action_index"] = c["act"].astype(np.int32)
        c["act"] = values[c["act"]]
    else:
        space = md.spec.action_space
        meta.setdefault("action_low", np.asarray(space.low, np.float32).reshape(-1).tolist())
        meta.setdefault("action_high", np.asarray(space.high, np.float32).reshape(-1).tolist())
        if meta.pop("actions_normalized", False):   # back to market units and bounds
            meta["action_low"] = meta.pop("market_action_low")
            meta["action_high"] = meta.pop("market_action_high")
            c["act"] = to_market(c["act"], meta["action_low"], meta["action_high"])
    meta["source"] = f"minari:{dataset_id}"
    return make_dataset(c["obs"], c["act"], c["rew"], c["next"], c["term"], c["trunc"],
                        c["logp"], c["stream"], c["step"], meta, c["episode"], **extra)


__all__ = ["load_minari", "save_minari"]
