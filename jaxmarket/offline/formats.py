"""Reading a dataset in any supported format: ``load_dataset(path)`` picks the reader.

=============================  ==========================================================
``path``                       read by
=============================  ==========================================================
``"minari:<dataset id>"``      :func:`jaxmarket.offline.minari_io.load_minari` (a local
                               Minari dataset)
a ``.hdf5`` / ``.h5`` file     :func:`jaxmarket.offline.d4rl.load_d4rl` (D4RL layout)
anything else                  :func:`jaxmarket.offline.dataset.load_native` (the native
                               chunked directory ``python -m jaxmarket.collect`` writes)
=============================  ==========================================================

This module sits above the three readers (each knows only its own format and the
:class:`~jaxmarket.offline.dataset.Dataset` it returns), so none of them imports another.
"""

from __future__ import annotations

from pathlib import Path

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.d4rl import load_d4rl, save_d4rl
from jaxmarket.offline.dataset import Dataset, check_finite, load_native
from jaxmarket.offline.minari_io import load_minari, save_minari

MINARI_PREFIX = "minari:"
HDF5_SUFFIXES = (".hdf5", ".h5")


def load_dataset(path: str | Path, group: str | None = None, verify: bool = True,
                 mmap: bool = True, allow_nonfinite: bool = False) -> Dataset:
    """One group's :class:`Dataset` from a native directory (or a D4RL ``.hdf5`` file, or
    ``"minari:<dataset id>"``, a local Minari dataset).

    ``group`` defaults to the manifest's ``primary`` group (the one ``collect`` made
    noisy), else the only group. Chunk files are memory-mapped; with ``verify`` their
    CRC-32 is checked against the manifest (``group``, ``verify`` and ``mmap`` apply to
    the native format only). A float field holding NaN or +-inf (``log_probs``: +-inf; NaN
    there means unknown) is a :class:`~jaxmarket.offline.dataset.DatasetError` in every
    format unless ``allow_nonfinite``."""
    if str(path).startswith(MINARI_PREFIX):
        ds = load_minari(str(path)[len(MINARI_PREFIX):])
        return check_finite(ds, str(path), allow_nonfinite)
    path = Path(path)
    if path.suffix in HDF5_SUFFIXES:
        return check_finite(load_d4rl(path), str(path), allow_nonfinite)
    return load_native(path, group, verify, mmap, allow_nonfinite)


EXPORT_FORMATS = ("d4rl", "minari")


def export_dataset(ds: Dataset, fmt: str, out: str | Path, normalize_actions: bool = True,
                   description: str = "") -> str:
    """Write one group's dataset as ``fmt``: ``"d4rl"`` (``out`` a ``.hdf5`` file) or
    ``"minari"`` (``out`` a local Minari dataset id, written with its env spec);
    ``normalize_actions`` (default) stores continuous actions in ``[-1, 1]``, False in
    market units (a discrete dataset stores action indices either way); the metadata
    records which, with the market bounds. Returns what :func:`load_dataset` reads it
    back from (the file, or ``"minari:<id>"``)."""
    normalize_actions = bool(normalize_actions) and not ds.discrete
    if fmt == "d4rl":
        if Path(out).suffix not in HDF5_SUFFIXES:
            raise ConfigError("--out", str(out), "a .hdf5 or .h5 file name for --format d4rl")
        return str(save_d4rl(ds, out, normalize_actions=normalize_actions))
    if fmt == "minari":
        save_minari(ds, str(out), description, normalize_actions=normalize_actions)
        return MINARI_PREFIX + str(out)
    raise ConfigError("--format", fmt, "native, " + ", ".join(EXPORT_FORMATS))


__all__ = ["export_dataset", "load_dataset"]
