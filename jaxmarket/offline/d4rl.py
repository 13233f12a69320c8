"""D4RL-layout HDF5 files (the format D4RL and d3rlpy ship), read and written with h5py.

A D4RL file holds one stream of consecutive transitions, episodes back to back::

    observations [N, D]   actions [N, P]   rewards [N]   terminals [N]   timeouts [N]
    next_observations [N, D]          (optional; D4RL's own files often lack it)
    infos/action_log_probs [N]        (optional: behaviour log-probabilities)

An episode ends after a row whose ``terminals`` or ``timeouts`` is set. Without
``next_observations`` the next row's observation is used, and rows after which no
observation follows within the episode (a timeout, the file's last row) are dropped, as
``d4rl.qlearning_dataset`` does; a terminal row keeps its own observation as a placeholder
(it is never bootstrapped). Imported rows get ``stream`` = episode number and ``step`` =
position in the episode, so :meth:`Dataset.episodes` gives the file's episodes back.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.dataset import Dataset, check_out, make_dataset
from jaxmarket.offline.export import normalized, to_market
from jaxmarket.offline.files import storage_errno, storage_error

REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")


def _h5py():
    try:
        import h5py
    except ModuleNotFoundError:
        raise ConfigError("h5py", "not installed", "pip install 'jaxmarket[offline]'") from None
    return h5py


def load_d4rl(path: str | Path) -> Dataset:
    h5py = _h5py()

    path = Path(path)
    if not path.is_file():
        raise ConfigError("--dataset", str(path), "an existing .hdf5 file")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise ConfigError("--dataset", str(path), "a readable HDF5 file (it is corrupt or "
                          f"truncated: {str(err).splitlines()[0]})") from None
    try:
        with f:
            missing = [k for k in REQUIRED if k not in f]
            if missing:
                raise ConfigError(f"{path}:{missing[0]}", "<missing>",
                                  "the D4RL keys " + ", ".join(REQUIRED))
            try:
                arr = {k: np.asarray(f[k]) for k in REQUIRED}
                nxt = np.asarray(f["next_observations"]) if "next_observations" in f else None
                logp = (np.asarray(f["infos/action_log_probs"])
                        if "infos/action_log_probs" in f else None)
                attrs = dict(f.attrs)
            except (OSError, ValueError) as err:
                raise ConfigError("--dataset", str(path), "readable D4RL arrays (the file is "
                                  f"corrupt or truncated: {str(err).splitlines()[0]})") from None
    except OSError as err:
        raise ConfigError("--dataset", str(path), f"a readable HDF5 file ({err})") from None
    n = arr["rewards"].shape[0]
    for k, v in {**arr, **({"next_observations": nxt} if nxt is not None else {})}.items():
        if v.shape[0] != n:
            raise ConfigError(f"{path}:{k}", f"{v.shape[0]} rows", f"{n} rows (as many as rewards)")
    obs = arr["observations"].reshape(n, -1).astype(np.float32)
    actions = arr["actions"]
    discrete = np.issubdtype(actions.dtype, np.integer)
    terminals, timeouts = arr["terminals"].astype(bool), arr["timeouts"].astype(bool)
    end = terminals | timeouts
    episode = np.r_[0, np.cumsum(end[:-1])].astype(np.int32)
    starts = np.r_[0, np.flatnonzero(end[:-1]) + 1]
    step = (np.arange(n) - starts[episode]).astype(np.int32)
    keep = np.ones(n, bool)
    if nxt is None:
        nxt = np.empty_like(obs)
        nxt[:-1] = obs[1:]
        nxt[-1] = obs[-1]
        nxt[terminals] = obs[terminals]
        keep = ~(timeouts & ~terminals)
        keep[-1] = keep[-1] and bool(terminals[-1])
    meta = {"group": str(attrs.get("group", "agent")), "source": str(path)}
    extra = {}
    if discrete:
        index = actions.reshape(n).astype(np.int32)
        k = int(attrs.get("num_actions", index.max() + 1))
        values = np.asarray(attrs["action_values"], np.float32).reshape(k, -1) \
            if "action_values" in attrs else np.arange(k, dtype=np.float32)[:, None]
        actions = values[index]
        extra["action_index"] = index
        meta.update(discrete=True, action_values=values.tolist())
    if "action_low" in attrs:
        meta["action_low"] = np.asarray(attrs["action_low"], np.float32).reshape(-1).tolist()
        meta["action_high"] = np.asarray(attrs["action_high"], np.float32).reshape(-1).tolist()
    if bool(attrs.get("actions_normalized", False)) and not discrete:
        # written with normalize_actions: [-1, 1] back to market units (the bounds above)
        actions = to_market(np.asarray(actions, np.float32).reshape(n, -1),
                            meta["action_low"], meta["action_high"])
    ds = make_dataset(obs, np.asarray(actions, np.float32).reshape(n, -1), arr["rewards"],
                      nxt.reshape(n, -1), terminals, timeouts, logp, np.zeros(n, np.int32), step,
                      meta, episode, **extra)
    return ds if keep.all() else ds.take(np.flatnonzero(keep))


def save_d4rl(ds: Dataset, path: str | Path, normalize_actions: bool = False) -> Path:
    """Write ``ds`` in D4RL layout, episodes back to back (rows ordered by stream and
    step, a timeout after each episode that did not end), with ``next_observations``;
    atomically (a temporary file, then a rename). ``normalize_actions``: continuous
    actions stored in ``[-1, 1]`` (d3rlpy's assumption; :func:`jaxmarket.offline.export.
    normalized`), the attrs ``actions_normalized`` and the market bounds ``action_low`` /
    ``action_high`` telling :func:`load_d4rl` how to map them back."""
    h5py = _h5py()

    path = Path(path)
    check_out(path)
    if normalize_actions:
        ds = normalized(ds)
    order = np.concatenate(ds.episodes())
    terminals = np.asarray(ds["terminals"])[order]
    timeouts = np.asarray(ds["timeouts"])[order].copy()
    ends = np.cumsum([len(e) for e in ds.episodes()]) - 1
    timeouts[ends] |= ~terminals[ends]
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    existed = path.exists()
    try:
        with h5py.File(tmp, "w") as f:
            f["observations"] = np.asarray(ds["observations"])[order]
            f["next_observations"] = np.asarray(ds["next_observations"])[order]
            f["actions"] = (np.asarray(ds["action_index"])[order] if ds.discrete
                            else np.asarray(ds["actions"])[order])
            f["rewards"] = np.asarray(ds["rewards"])[order]
            f["terminals"] = terminals
            f["timeouts"] = timeouts
            if not np.isnan(np.asarray(ds["log_probs"])).all():
                f["infos/action_log_probs"] = np.asarray(ds["log_probs"])[order]
            f.attrs["group"] = str(ds.meta.get("group", "agent"))
            if "action_low" in ds.meta:    # the market bounds, normalised or not
                for k in ("action_low", "action_high"):
                    f.attrs[k] = np.asarray(ds.meta.get(f"market_{k}", ds.meta[k]), np.float32)
            f.attrs["actions_normalized"] = bool(ds.meta.get("actions_normalized", False))
            if ds.discrete:
                f.attrs["action_values"] = np.asarray(ds.meta["action_values"], np.float32)
                f.attrs["num_actions"] = len(ds.meta["action_values"])
        tmp.replace(path)
    except BaseException as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        cause = storage_errno(err) if isinstance(err, Exception) else None
        if cause is None:
            raise
        kept = (f"{path} as it was" if existed else f"nothing ({path} was not written)")
        if tmp.exists():
            kept += f"; the partial file {tmp} could not be removed: remove it"
        raise storage_error(f"writing the D4RL file {path}", cause, kept,
                            "write it again", tmp) from None
    return path


__all__ = ["load_d4rl", "save_d4rl"]
