"""Offline datasets: one agent group's transitions, in memory and on disk.

A :class:`Dataset` is a dict of row-aligned numpy arrays plus metadata. Rows are
transitions of one agent slot of one market ("stream"):

=====================  =========  ==================================================
field                  shape      meaning
=====================  =========  ==================================================
``observations``       ``[N, D]`` the agent's observation before acting
``actions``            ``[N, P]`` its action (prices, multipliers or budgets)
``rewards``            ``[N]``    its reward
``next_observations``  ``[N, D]`` the observation after the step (before an auto-reset)
``terminals``          ``[N]``    the episode ended in a terminal state (never, in a market)
``timeouts``           ``[N]``    the episode was truncated after this step
``log_probs``          ``[N]``    behaviour log-probability (density) of the action; NaN
                                  where the behaviour policy has none
``action_index``       ``[N]``    discrete datasets only: the index into ``action_values``
``stream``             ``[N]``    int32 id of the (market, agent) slot the row comes from
``episode``            ``[N]``    int32 episode number within the stream
``step``               ``[N]``    int32 time step within the episode (0: an initial state)
``info/<name>``        ``[N, P]`` market info of the row (traffic, fees, prices, ...)
=====================  =========  ==================================================

Native on-disk format (a directory)::

    D/manifest.json                       format, version, groups, metadata, chunk list
    D/<group>/<field>.<chunk:05d>.npy     one plain .npy file per field and chunk

Plain ``.npy`` files are memory-mapped by :func:`load_native` (``np.load(mmap_mode="r")``)
so a dataset larger than memory is read lazily; chunks are appended as a collection
streams, and each chunk's row count and CRC-32 per file are in the manifest, so a
truncated or corrupt file is one clear error. Writers build the whole directory under a
temporary name and rename it at the end: a failed or interrupted write leaves nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import shutil
import stat
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxmarket.config.errors import ConfigError, _short
from jaxmarket.config.fields import FLOAT32_MAX, INT32_MAX
from jaxmarket.offline.files import (
    SUFFIX_ROOM,
    describe,
    inside,
    path_problem,
    storage_errno,
    storage_error,
)

FORMAT = "jaxmarket-offline"
VERSION = 2          # 2: each group records its total ``rows``; 1 (still read): it does not
READ_VERSIONS = (1, 2)
CORE = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
INT_FIELDS = ("stream", "episode", "step", "action_index")


@dataclasses.dataclass
class Dataset:
    """One group's transitions (``fields``) and what they mean (``meta``).

    ``meta`` keys: ``group``, ``obs_dim``, ``action_dim``, ``action_low``/``action_high``
    (``[P]`` lists), ``discrete`` (bool), ``action_values`` (``[K, P]`` grid of a discrete
    dataset), ``config`` (the scenario that produced it, if any), ``behaviour``."""

    fields: dict[str, np.ndarray]
    meta: dict[str, Any]

    def __len__(self) -> int:
        return int(self.fields["rewards"].shape[0])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fields[name]

    @property
    def obs_dim(self) -> int:
        return int(self.fields["observations"].shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.fields["actions"].shape[1])

    @property
    def discrete(self) -> bool:
        return bool(self.meta.get("discrete", False))

    def take(self, index: np.ndarray) -> Dataset:
        """The rows ``index`` (a copy, in that order)."""
        return Dataset({k: np.asarray(v)[index] for k, v in self.fields.items()}, dict(self.meta))

    def episodes(self) -> list[np.ndarray]:
        """Row indices of each episode, in time order: rows sorted by ``(stream,
        episode, step)`` and cut wherever the stream or the episode changes."""
        stream, step = np.asarray(self.fields["stream"]), np.asarray(self.fields["step"])
        episode = np.asarray(self.fields["episode"])
        order = np.lexsort((step, episode, stream))
        key = np.stack([stream[order], episode[order]], 1)
        cuts = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1)) + 1
        return [e for e in np.split(order, cuts) if e.size]


def validate(ds: Dataset, where: str = "dataset") -> Dataset:
    """Shapes and dtypes consistent, at least one row; a ``ConfigError`` otherwise."""
    for name in CORE:
        if name not in ds.fields:
            raise ConfigError(f"{where}.{name}", "<missing>", "the fields " + ", ".join(CORE))
    n = len(ds)
    if n == 0:
        raise ConfigError(where, "0 transitions", "a dataset with at least one transition")
    for name, value in ds.fields.items():
        if value.shape[0] != n:
            raise ConfigError(f"{where}.{name}", f"{value.shape[0]} rows",
                              f"{n} rows (as many as rewards)")
    for name in ("observations", "next_observations", "actions"):
        if ds.fields[name].ndim != 2:
            raise ConfigError(f"{where}.{name}", f"shape {ds.fields[name].shape}", "[N, dim]")
    if ds.fields["next_observations"].shape != ds.fields["observations"].shape:
        raise ConfigError(f"{where}.next_observations", ds.fields["next_observations"].shape,
                          f"the shape of observations {ds.fields['observations'].shape}")
    if ds.discrete:
        if "action_index" not in ds.fields or "action_values" not in ds.meta:
            raise ConfigError(f"{where}.action_index", "<missing>",
                              "action_index and meta action_values in a discrete dataset")
        k = len(ds.meta["action_values"])
        idx = np.asarray(ds.fields["action_index"])
        if idx.min() < 0 or idx.max() >= k:
            raise ConfigError(f"{where}.action_index", f"range [{idx.min()}, {idx.max()}]",
                              f"indices in [0, {k - 1}]")
    return ds


def make_dataset(observations, actions, rewards, next_observations=None, terminals=None,
                 timeouts=None, log_probs=None, stream=None, step=None, meta=None,
                 episode=None, **extra) -> Dataset:
    """A validated :class:`Dataset` from arrays (defaults: no terminals or timeouts, one
    stream whose episodes end at the terminals and timeouts, steps counted within them,
    unknown log-probabilities, bounds from the data)."""
    obs = np.asarray(observations, np.float32)
    n = obs.shape[0]
    if n == 0:
        raise ConfigError("dataset", "0 transitions", "a dataset with at least one transition")
    obs = obs.reshape(n, -1)
    act = np.asarray(actions, np.float32).reshape(n, -1)
    term = np.zeros(n, bool) if terminals is None else np.asarray(terminals, bool)
    tout = np.zeros(n, bool) if timeouts is None else np.asarray(timeouts, bool)
    if episode is None:
        episode = np.r_[0, np.cumsum((term | tout)[:-1])]
    episode = np.asarray(episode, np.int32)
    if step is None:
        starts = np.r_[0, np.flatnonzero(episode[1:] != episode[:-1]) + 1]
        step = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    fields = {
        "observations": obs, "actions": act, "rewards": np.asarray(rewards, np.float32).reshape(-1),
        "next_observations": (obs if next_observations is None
                              else np.asarray(next_observations, np.float32).reshape(n, -1)),
        "terminals": term, "timeouts": tout, "episode": episode,
        "log_probs": (np.full(n, np.nan, np.float32) if log_probs is None
                      else np.asarray(log_probs, np.float32)),
        "stream": np.zeros(n, np.int32) if stream is None else np.asarray(stream, np.int32),
        "step": np.asarray(step, np.int32),
    }
    for k, v in extra.items():
        fields[k] = np.asarray(v)
    meta = dict(meta or {})
    meta.setdefault("group", "agent")
    meta.setdefault("obs_dim", obs.shape[1])
    meta.setdefault("action_dim", act.shape[1])
    if n:
        meta.setdefault("action_low", act.min(0).tolist())
        meta.setdefault("action_high", act.max(0).tolist())
    meta.setdefault("discrete", "action_index" in fields)
    return validate(Dataset(fields, meta))


# ----------------------------------------------------------------------------- writing

def _crc(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


class DatasetWriter:
    """Streams chunks of per-group rows into a native dataset directory.

    Everything goes to ``<out>.partial-<pid>`` first; :meth:`close` writes the manifest
    (checked against the schema :func:`check_manifest` reads with, so what is written
    loads) and renames the directory to ``out``; :meth:`abort` (or leaving a ``with``
    block by an exception) removes it. ``out`` is checked first (no NUL byte, names and
    path within the file system's limits: a ``ConfigError`` on ``--out``) and each
    group's metadata against :data:`META_SCHEMA` (a :class:`DatasetError`). A storage
    fault (disk full, read-only, permission) removes the partial directory and is one
    :class:`~jaxmarket.train.rundir.StorageError` line naming the file and what was
    kept."""

    def __init__(self, out: str | Path, meta: Mapping[str, Mapping[str, Any]],
                 extra: Mapping[str, Any] | None = None):
        self.out = Path(out)
        check_out(self.out)
        self.tmp = self.out.with_name(f"{self.out.name}.partial-{os.getpid()}")
        schema = _Schema(f"{self.out}/manifest.json (being written)")
        for g, m in meta.items():
            try:
                plain = json.loads(json.dumps(dict(m), default=_json_default))
            except (TypeError, ValueError) as err:
                raise DatasetError(f"groups.{_name(g)}.meta", _short(str(err)),
                                   "JSON-serialisable metadata") from None
            _check_meta(schema, plain, f"groups.{_name(g)}.meta")
        try:
            if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
                raise ConfigError("--out", str(self.out), "a new or empty directory")
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir(parents=True)
        except OSError as err:
            if storage_errno(err) is None:
                raise
            self.abort()
            raise storage_error(f"creating the dataset directory {self.tmp}", err,
                                "nothing (nothing was written)", "run this again",
                                self.tmp) from None
        self.groups = {g: {"meta": dict(m), "fields": None, "rows": 0, "chunks": []}
                       for g, m in meta.items()}
        self.extra = dict(extra or {})

    def _storage(self, what: str, err: OSError, path: Path):
        """The one-line error of a storage fault while writing ``what`` (the partial
        directory is removed first)."""
        self.abort()
        kept = (f"nothing: the partial dataset {self.tmp} was removed and {self.out} was not "
                "written" if not self.tmp.exists() else
                f"the partial dataset {self.tmp} (it could not be removed: remove it)")
        return storage_error(what, storage_errno(err), kept, "write the dataset again", path)

    def write(self, group: str, fields: Mapping[str, np.ndarray]) -> None:
        entry = self.groups[group]
        index = len(entry["chunks"])
        rows = int(next(iter(fields.values())).shape[0])
        chunk = {"rows": rows, "files": {}}
        spec = {}
        path = self.tmp / group
        try:
            path.mkdir(exist_ok=True)
            for name, value in fields.items():
                value = np.ascontiguousarray(value)
                rel = f"{group}/{name.replace('/', '__')}.{index:05d}.npy"
                path = self.tmp / rel
                np.save(path, value, allow_pickle=False)
                chunk["files"][name] = {"path": rel, "crc32": _crc(path)}
                spec[name] = {"dtype": value.dtype.str, "shape": list(value.shape[1:])}
        except OSError as err:
            if storage_errno(err) is None:
                raise
            raise self._storage(f"writing chunk {index} of group {_name(group)}", err,
                                path) from None
        if entry["fields"] is None:
            entry["fields"] = spec
        entry["chunks"].append(chunk)
        entry["rows"] += rows

    def close(self) -> Path:
        manifest = {"format": FORMAT, "version": VERSION, **self.extra,
                    "groups": self.groups}
        try:
            text = json.dumps(manifest, indent=1, default=_json_default)
            check_manifest(json.loads(text), self.tmp,
                           f"{self.out}/manifest.json (being written)")
        except BaseException:
            self.abort()
            raise
        tmp_manifest = self.tmp / "manifest.json.tmp"
        path = tmp_manifest
        try:
            tmp_manifest.write_text(text)
            path = self.tmp / "manifest.json"
            tmp_manifest.replace(path)
            if self.out.exists():          # an empty directory (checked in __init__)
                path = self.out
                self.out.rmdir()
            path = self.out
            self.tmp.replace(self.out)
        except OSError as err:
            if storage_errno(err) is None:
                raise
            raise self._storage("writing the manifest", err, path) from None
        return self.out

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


def check_out(out: str | Path, key: str = "--out") -> None:
    """A ``ConfigError`` on ``key`` unless ``out`` can name a new file or directory with
    a suffix beside it (``OUT.partial-<pid>``, ``OUT.lock``): no NUL byte, names and path
    within the file system's limits."""
    problem = path_problem(out, room=SUFFIX_ROOM)
    if problem:
        raise ConfigError(key, str(out), f"a path that can be created; {problem}")


def _json_default(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    raise TypeError(f"not JSON serialisable: {type(x)}")


def save_dataset(ds: Dataset | Mapping[str, Dataset], out: str | Path,
                 extra: Mapping[str, Any] | None = None) -> Path:
    """Write one dataset (or ``{group: dataset}``) in the native format, atomically."""
    sets = ds if isinstance(ds, Mapping) else {ds.meta.get("group", "agent"): ds}
    with DatasetWriter(out, {g: d.meta for g, d in sets.items()}, extra) as w:
        for g, d in sets.items():
            w.write(g, d.fields)
    return Path(out)


# ----------------------------------------------------------------------------- reading

class DatasetError(ConfigError):
    """A saved dataset is malformed: its ``manifest.json`` does not follow the schema of
    :func:`check_manifest`, a path it names (itself included) is unusable (a NUL byte, too
    long, a symlink loop, outside the dataset directory, not a regular file), or a chunk
    file it lists is missing, corrupt or holds non-finite numbers. The message names the
    file, the key (or field and row) and what is expected, e.g. ``D/manifest.json:
    groups.seller.chunks[0].files.rewards.crc32: got '<missing>'; allowed: an integer in
    [0, 2**32)``."""


MISSING = "<missing>"
MAX_COUNT = 2 ** 53 - 1          # the largest integer every JSON reader keeps exactly
MAX_DIM = INT32_MAX              # a row's size, a number of markets or agents
MAX_MANIFEST_BYTES = 1 << 30     # read into memory whole


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and abs(value) <= FLOAT32_MAX)


def _name(key: Any) -> str:
    """A key as it appears in an error: itself when short and printable, else its
    bounded repr (a newline in a group name must not break the one-line message)."""
    text = str(key)
    return text if text.isprintable() and len(text) <= 64 else _short(text, 66)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _numbers(value: Any, n: int | None = None) -> bool:
    return (isinstance(value, list) and (n is None or len(value) == n)
            and all(_is_number(v) for v in value))


def _grid(value: Any) -> bool:
    return (isinstance(value, list) and len(value) >= 1 and all(_numbers(r) for r in value)
            and len({len(r) for r in value}) == 1 and len(value[0]) >= 1)


_BOUNDS = "a list of finite numbers, one per action dimension"
# Each group's metadata, key: (required, check, what is expected). A loader needs the
# sizes, the action bounds (the algorithms scale actions between them) and whether the
# actions are discrete; other keys are free-form (JSON) metadata.
META_SCHEMA: dict[str, tuple[bool, Any, str]] = {
    "group": (False, lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "obs_dim": (True, lambda v: _is_int(v) and 0 <= v <= MAX_DIM,
                f"an integer in [0, {MAX_DIM}] (the observation size)"),
    "action_dim": (True, lambda v: _is_int(v) and 1 <= v <= MAX_DIM,
                   f"an integer in [1, {MAX_DIM}] (the action size)"),
    "action_low": (True, _numbers, _BOUNDS + " (the lower action bounds)"),
    "action_high": (True, _numbers, _BOUNDS + " (the upper action bounds)"),
    "discrete": (True, lambda v: isinstance(v, bool), "true or false"),
    "action_values": (False, _grid, "a [K, action_dim] list of lists of finite numbers, K >= 1"),
    "agents_per_market": (False, lambda v: _is_int(v) and 1 <= v <= MAX_DIM,
                          f"an integer in [1, {MAX_DIM}]"),
    "num_markets": (False, lambda v: _is_int(v) and 1 <= v <= MAX_DIM,
                    f"an integer in [1, {MAX_DIM}]"),
    "behaviour": (False, lambda v: isinstance(v, Mapping) and isinstance(v.get("kind"), str),
                  "an object with a string kind"),
    "config": (False, lambda v: v is None or isinstance(v, Mapping),
               "null or an object (the scenario config)"),
    "source": (False, lambda v: isinstance(v, str), "a string"),
    "actions_normalized": (False, lambda v: isinstance(v, bool), "true or false"),
    "market_action_low": (False, _numbers, _BOUNDS),
    "market_action_high": (False, _numbers, _BOUNDS),
}
# the manifest's top level beside format, version and groups (all optional)
TOP_SCHEMA: dict[str, tuple[Any, str]] = {
    "primary": (lambda v: v is None or isinstance(v, str), "null or a group name (a string)"),
    "config": (lambda v: v is None or isinstance(v, Mapping),
               "null or an object (the scenario config)"),
    "steps": (lambda v: v is None or (_is_int(v) and 1 <= v <= MAX_COUNT),
              f"null or an integer in [1, {MAX_COUNT}]"),
    "capacity": (lambda v: v is None or (_is_int(v) and 1 <= v <= MAX_COUNT),
                 f"null or an integer in [1, {MAX_COUNT}]"),
}


class _Schema:
    """Checks one manifest, naming ``file: key`` in every error."""

    def __init__(self, file: Path | str):
        self.file = file

    def error(self, key: str, value: Any, expected: str) -> DatasetError:
        return DatasetError(f"{self.file}: {key}", value, expected)

    def get(self, obj: Mapping, key: str, where: str, kind: type | tuple, expected: str,
            optional: bool = False) -> Any:
        name = f"{where}.{key}" if where else key
        if key not in obj:
            if optional:
                return None
            raise self.error(name, MISSING, expected)
        value = obj[key]
        if kind is int:
            ok = _is_int(value)
        else:
            ok = isinstance(value, kind) and not isinstance(value, bool)
        if not ok:
            raise self.error(name, value, expected)
        return value

    def count(self, obj: Mapping, key: str, where: str, optional: bool = False) -> int | None:
        expected = f"an integer >= 0 and <= {MAX_COUNT} (2**53 - 1)"
        value = self.get(obj, key, where, int, expected, optional)
        if value is not None and not 0 <= value <= MAX_COUNT:
            raise self.error(f"{where}.{key}", value, expected)
        return value


def _chunk_file(schema: _Schema, root: Path, base: Path, rel: Any, key: str) -> Path:
    """``root / rel`` resolved (``base`` is ``root`` resolved), refused unless it is a
    relative path without NUL bytes, within the file system's name and path lengths,
    that stays inside ``root`` (no absolute path, no ``..``, no symlink leading out, no
    symlink loop) and names a regular file or nothing yet (the reader says it is
    missing). Nothing is opened."""
    expected = (f"a relative path inside the dataset directory {root} (no absolute path, "
                "no '..', no symlink leading out of it, no symlink loop, no NUL byte, "
                "within the file system's name and path lengths) naming a regular file")
    if not isinstance(rel, str) or not rel:
        raise schema.error(key, MISSING if rel is None else rel, expected)
    problem = path_problem(root / rel) if "\0" not in rel else "it holds a NUL byte"
    if problem:
        raise schema.error(key, rel, f"{expected}; {problem}")
    parts = rel.replace("\\", "/").split("/")
    if os.path.isabs(rel) or rel.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise schema.error(key, rel, expected)
    real, problem, _ = inside(base, root / rel)
    if problem:
        raise schema.error(key, rel, f"{expected}; {problem}")
    return real


def _check_fields(schema: _Schema, fields: Mapping, where: str) -> None:
    for name, spec in fields.items():
        key = f"{where}.{_name(name)}"
        if not isinstance(spec, Mapping):
            raise schema.error(key, spec, "an object with dtype and shape")
        dtype = schema.get(spec, "dtype", key, str, "a numpy dtype string such as '<f4'")
        try:
            ok = np.dtype(dtype).kind in "biufc"
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise schema.error(f"{key}.dtype", dtype, "a numeric or bool numpy dtype string "
                               "such as '<f4', '<i4' or '|b1'")
        expected = f"a list of integers >= 0 and <= {MAX_DIM} (the shape of a row)"
        shape = schema.get(spec, "shape", key, list, expected)
        if not all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape):
            raise schema.error(f"{key}.shape", shape, expected)


def _check_meta(schema: _Schema, meta: Mapping, where: str,
                fields: Mapping | None = None) -> None:
    """A group's metadata against :data:`META_SCHEMA`, and (given the group's
    ``fields``) the core fields' row shapes against its sizes."""
    for key, (required, ok, expected) in META_SCHEMA.items():
        if key not in meta:
            if required or (key == "action_values" and meta.get("discrete") is True):
                raise schema.error(f"{where}.{key}", MISSING, expected + " (required"
                                   + (" in a discrete dataset" if not required else "") + ")")
            continue
        if not ok(meta[key]):
            raise schema.error(f"{where}.{key}", meta[key], expected)
    P = meta["action_dim"]
    for key in ("action_low", "action_high", "market_action_low", "market_action_high"):
        if key in meta and len(meta[key]) != P:
            raise schema.error(f"{where}.{key}", meta[key], f"a list of {P} finite numbers "
                               f"(one per action dimension: {where}.action_dim = {P})")
    if any(lo > hi for lo, hi in zip(meta["action_low"], meta["action_high"])):
        raise schema.error(f"{where}.action_high", meta["action_high"], "bounds >= "
                           f"{where}.action_low {_short(meta['action_low'])}, one by one")
    if "action_values" in meta and len(meta["action_values"][0]) != P:
        raise schema.error(f"{where}.action_values", meta["action_values"], "a [K, "
                           f"{P}] grid (one value per action dimension: {where}.action_dim "
                           f"= {P})")
    if not fields:
        return
    fk = where.rsplit(".", 1)[0] + ".fields"
    sizes = {"observations": [meta["obs_dim"]], "next_observations": [meta["obs_dim"]],
             "actions": [P], "rewards": [], "terminals": [], "timeouts": []}
    for name, shape in sizes.items():
        if name not in fields:
            raise schema.error(f"{fk}.{name}", MISSING, "the fields " + ", ".join(sizes)
                               + " (every dataset has them)")
        if fields[name]["shape"] != shape:
            source = (f"{where}.obs_dim" if name.endswith("observations") else
                      f"{where}.action_dim" if name == "actions" else "one number per row")
            raise schema.error(f"{fk}.{name}.shape", fields[name]["shape"],
                               f"{shape} ({source})")
    if meta["discrete"]:
        spec = fields.get("action_index")
        if spec is None or np.dtype(spec["dtype"]).kind not in "iu" or spec["shape"]:
            raise schema.error(f"{fk}.action_index", spec if spec is not None else MISSING,
                               "an integer field of one number per row (a discrete "
                               f"dataset: {where}.discrete is true)")


def _check_group(schema: _Schema, root: Path, base: Path, name: str, entry: Any,
                 version: int) -> dict:
    where = f"groups.{_name(name)}"
    if not isinstance(entry, Mapping):
        raise schema.error(where, entry, "an object with meta, fields, rows and chunks")
    meta = schema.get(entry, "meta", where, Mapping, "an object (the group's metadata)")
    chunks = schema.get(entry, "chunks", where, list, "a list of chunks")
    fields = schema.get(entry, "fields", where, (Mapping, type(None)),
                        "an object {field: {dtype, shape}} (null only without chunks)")
    if fields is None and chunks:
        raise schema.error(f"{where}.fields", None, "an object {field: {dtype, shape}}")
    _check_fields(schema, fields or {}, f"{where}.fields")
    _check_meta(schema, meta, f"{where}.meta", fields)
    total = schema.count(entry, "rows", where, optional=version < 2)
    seen: dict[Path, str] = {}
    rows = 0
    for i, chunk in enumerate(chunks):
        ck = f"{where}.chunks[{i}]"
        if not isinstance(chunk, Mapping):
            raise schema.error(ck, chunk, "an object with rows and files")
        rows += schema.count(chunk, "rows", ck)
        files = schema.get(chunk, "files", ck, Mapping, "an object {field: {path, crc32}}")
        for field in fields:
            if field not in files:
                raise schema.error(f"{ck}.files.{_name(field)}", MISSING, "a file for every "
                                   f"field of {where}.fields ({_clip(', '.join(map(_name, fields)))})")
        for field, f in files.items():
            fk = f"{ck}.files.{_name(field)}"
            if field not in fields:
                raise schema.error(f"{ck}.files", field, f"only the fields of {where}.fields "
                                   f"({_clip(', '.join(map(_name, fields)))})")
            if not isinstance(f, Mapping):
                raise schema.error(fk, f, "an object with path and crc32")
            crc = f.get("crc32", MISSING)
            if not (_is_int(crc) and 0 <= crc < 2 ** 32):
                raise schema.error(f"{fk}.crc32", crc, "an integer in [0, 2**32) (the CRC-32 "
                                   "of the file)")
            file = _chunk_file(schema, root, base, f.get("path"), f"{fk}.path")
            if file in seen:
                raise schema.error(f"{fk}.path", f["path"], "a file listed once (it is also "
                                   f"{seen[file]}: a chunk entry is listed twice)")
            seen[file] = f"{fk}.path"
    if total is not None and rows != total:
        raise schema.error(f"{where}.chunks", f"{len(chunks)} chunks of {rows} rows in all",
                           f"chunks adding up to {where}.rows = {total} (a chunk entry was "
                           "removed or added)")
    if total is None:   # version 1: no total; every chunk file of the group must be listed
        for d in {p.parent for p in seen}:
            extra = sorted(str(p.relative_to(base)) for p in d.glob("*.npy")
                           if Path(os.path.realpath(p)) not in seen)
            if extra:
                raise schema.error(f"{where}.chunks", f"no entry for {extra[0]}",
                                   "an entry for every chunk file of the group (a chunk "
                                   "entry was removed)")
    return dict(entry)


def check_manifest(manifest: Any, root: str | Path, file: str | Path | None = None) -> dict:
    """``manifest`` (the parsed ``manifest.json`` of the dataset directory ``root``) checked
    against the schema below; a :class:`DatasetError` naming ``file``, the key and what is
    expected otherwise. Nothing is opened (paths are checked with ``stat``/``realpath``).

    ``{"format": "jaxmarket-offline", "version": 1 | 2, "primary": group | null,
    "config": object | null, "steps": int | null, "capacity": int | null (these four
    optional), ..., "groups": {group: {"meta": {...} (:data:`META_SCHEMA`: obs_dim,
    action_dim, action_low, action_high, discrete required; action_values in a discrete
    dataset), "fields": {field: {"dtype": "<f4", "shape": [d, ...]}}, "rows": total
    (version 2), "chunks": [{"rows": n, "files": {field: {"path": "group/field.00000.npy",
    "crc32": int}}}]}}}``: the core fields' shapes match the sizes of ``meta``; every
    chunk lists exactly the group's fields; each path is relative, resolves inside
    ``root`` and names a regular file (:func:`_chunk_file`); no file is listed twice; the
    chunks' rows add up to the group's ``rows`` (version 1, which has no total: every
    ``.npy`` file beside the listed ones is listed)."""
    root = Path(root)
    base = Path(os.path.realpath(root))
    schema = _Schema(file if file is not None else root / "manifest.json")
    if not isinstance(manifest, Mapping):
        raise schema.error("<top level>", manifest, "a JSON object with format, version and "
                           "groups")
    if manifest.get("format", MISSING) != FORMAT:
        raise schema.error("format", manifest.get("format", MISSING), repr(FORMAT))
    version = manifest.get("version", MISSING)
    if not _is_int(version) or version not in READ_VERSIONS:
        raise schema.error("version", version, " or ".join(map(str, READ_VERSIONS)))
    for key, (ok, expected) in TOP_SCHEMA.items():
        if key in manifest and not ok(manifest[key]):
            raise schema.error(key, manifest[key], expected)
    groups = schema.get(manifest, "groups", "", Mapping, "an object {group: {meta, fields, "
                        "rows, chunks}}")
    if not groups:
        raise schema.error("groups", groups, "at least one group")
    checked = {g: _check_group(schema, root, base, g, e, version) for g, e in groups.items()}
    primary = manifest.get("primary")
    if primary is not None and primary not in checked:
        raise schema.error("primary", primary, "null or one of the groups "
                           + _clip(", ".join(map(_name, checked))))
    return {**manifest, "groups": checked}


def read_manifest(path: str | Path) -> dict:
    """The checked manifest of the dataset directory ``path`` (:func:`check_manifest`).
    The directory and its ``manifest.json`` are checked before the manifest is opened:
    no NUL byte, names and path within the file system's limits, no symlink loop, a
    manifest resolving inside the directory and a regular file of at most 1 GiB."""
    path = Path(path)
    expected = ("a dataset directory holding manifest.json (python -m jaxmarket.collect "
                "--out DIR) or a D4RL .hdf5 file")
    problem = path_problem(path)
    if problem:
        raise DatasetError("--dataset", str(path), f"{expected}; {problem}")
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise DatasetError("--dataset", str(path), f"{expected}; it is a symlink "
                               "loop") from None
        is_dir = False
    mf = path / "manifest.json"
    if not is_dir:
        raise DatasetError("--dataset", str(path), expected)
    real, problem, exists = inside(Path(os.path.realpath(path)), mf)
    if problem:
        raise DatasetError("--dataset", str(mf), f"the dataset's manifest: a regular file "
                           f"inside {path} (no symlink leading out of it, no symlink loop); "
                           f"{problem}")
    if not exists:
        raise DatasetError("--dataset", str(path), expected)
    try:
        if os.stat(real).st_size > MAX_MANIFEST_BYTES:
            raise DatasetError("--dataset", str(mf), "a manifest of at most "
                               f"{MAX_MANIFEST_BYTES} bytes (MAX_MANIFEST_BYTES)")
        text = real.read_bytes()
    except OSError as err:
        raise DatasetError("--dataset", str(mf), f"a readable manifest ({describe(err)})"
                           ) from None
    try:
        manifest = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError("--dataset", str(mf), "a valid JSON manifest "
                           f"({err.msg if hasattr(err, 'msg') else err})") from None
    except (ValueError, RecursionError) as err:   # a 5000-digit integer, deep nesting
        raise DatasetError("--dataset", str(mf), "a valid JSON manifest ("
                           + (str(err).splitlines()[0] if str(err) else type(err).__name__)[:120]
                           + ")") from None
    return check_manifest(manifest, path, mf)


def _first_nonfinite(arr: np.ndarray, allow_nan: bool, block_bytes: int = 1 << 24):
    """``(row, value)`` of the first non-finite number of ``arr`` (NaN allowed with
    ``allow_nan``), read ``block_bytes`` at a time (``arr`` may be memory-mapped); None."""
    if arr.dtype.kind not in "fc" or arr.shape[0] == 0:
        return None
    step = max(1, block_bytes // max(1, arr[:1].nbytes))
    for start in range(0, arr.shape[0], step):
        block = np.asarray(arr[start:start + step])
        bad = np.isinf(block) if allow_nan else ~np.isfinite(block)
        if bad.any():
            flat = bad.reshape(bad.shape[0], -1)
            row = int(np.flatnonzero(flat.any(1))[0])
            value = block.reshape(block.shape[0], -1)[row][flat[row]][0]
            return start + row, float(value) if arr.dtype.kind == "f" else complex(value)
    return None


NAN_ALLOWED = ("log_probs",)   # NaN means "unknown behaviour log-probability"


def check_finite(ds: Dataset, where: str, allow_nonfinite: bool = False,
                 offset: int = 0) -> Dataset:
    """``ds`` unless a float field holds NaN or +-inf (``log_probs``: +-inf; NaN there means
    unknown); a :class:`DatasetError` naming ``where``, the field and the row otherwise.
    ``allow_nonfinite`` skips the check."""
    if allow_nonfinite:
        return ds
    for name, value in ds.fields.items():
        found = _first_nonfinite(value, name in NAN_ALLOWED)
        if found is not None:
            raise _nonfinite_error(where, name, offset + found[0], found[1])
    return ds


def _nonfinite_error(where: str, name: str, row: int, value: Any) -> DatasetError:
    allowed = "finite numbers" + (" or NaN (unknown)" if name in NAN_ALLOWED else "")
    return DatasetError(f"{where}: {name}[{row}]", value, f"{allowed} (load_dataset(..., "
                        "allow_nonfinite=True), --allow-nonfinite on the command line, "
                        "accepts them)")


def load_native(path: str | Path, group: str | None = None, verify: bool = True,
                mmap: bool = True, allow_nonfinite: bool = False) -> Dataset:
    """One group's :class:`Dataset` from a native dataset directory (any format:
    :func:`jaxmarket.offline.formats.load_dataset`).

    ``group`` defaults to the manifest's ``primary`` group (the one ``collect`` made
    noisy), else the only group. The manifest is checked (:func:`check_manifest`). Chunk
    files are memory-mapped; with ``verify`` their CRC-32 is checked against the manifest;
    a float field holding NaN or +-inf (``log_probs``: +-inf) is a :class:`DatasetError`
    unless ``allow_nonfinite``."""
    path = Path(path)
    manifest = read_manifest(path)
    groups = manifest["groups"]
    if group is None:
        group = manifest.get("primary") or (next(iter(groups)) if len(groups) == 1 else None)
        if group is None:
            raise ConfigError("--group", None, "one of " + ", ".join(groups))
    if group not in groups:
        raise ConfigError("--group", group, "one of " + ", ".join(groups))
    entry = groups[group]
    if not entry["chunks"]:
        raise DatasetError("--dataset", str(path), "a dataset with at least one transition")
    parts: dict[str, list[np.ndarray]] = {name: [] for name in entry["fields"]}
    offset = 0
    for chunk in entry["chunks"]:
        for name, f in chunk["files"].items():
            file = path / f["path"]
            arr = _read_chunk(file, f["crc32"], verify, mmap)
            spec = entry["fields"][name]
            if arr.shape != (chunk["rows"], *spec["shape"]) or arr.dtype.str != spec["dtype"]:
                raise DatasetError("--dataset", str(file), f"{chunk['rows']} rows of shape "
                                   f"{spec['shape']} and dtype {spec['dtype']} (manifest.json)")
            found = None if allow_nonfinite else _first_nonfinite(arr, name in NAN_ALLOWED)
            if found is not None:
                raise _nonfinite_error(str(file), name, offset + found[0], found[1])
            parts[name].append(arr)
        offset += chunk["rows"]
    fields = {name: (p[0] if len(p) == 1 else np.concatenate(p)) for name, p in parts.items()}
    meta = dict(entry["meta"])
    meta.setdefault("group", group)
    if "config" in manifest:
        meta.setdefault("config", manifest["config"])
    return validate(Dataset(fields, meta), f"dataset {path}")


def _read_chunk(file: Path, crc: int, verify: bool, mmap: bool) -> np.ndarray:
    if not file.is_file():
        raise DatasetError("--dataset", str(file), "an existing chunk file (listed in "
                           "manifest.json); the dataset is incomplete")
    try:
        if verify and _crc(file) != crc:
            raise DatasetError("--dataset", str(file), "a chunk file whose CRC-32 matches "
                               "manifest.json (the file is corrupt or truncated)")
        return np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
    except DatasetError:
        raise
    except (ValueError, OSError, EOFError) as err:
        text = describe(err) if isinstance(err, OSError) and err.errno else str(err)
        raise DatasetError("--dataset", str(file), "a readable .npy chunk file (the file "
                           f"is corrupt or truncated: {(text.splitlines() or [''])[0]})"
                           ) from None


__all__ = ["Dataset", "DatasetError", "DatasetWriter", "check_finite", "check_manifest",
           "check_out", "load_native", "make_dataset", "read_manifest", "save_dataset",
           "validate"]
