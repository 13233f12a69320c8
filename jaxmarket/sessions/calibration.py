"""The kernel's rounding, kept beside JAX's persistent compilation cache.

Before the numba kernel plays a design, :meth:`jaxmarket.sessions.engine.Runner.rounding`
asks XLA's program of the same update which rounding of its multiply-adds it uses
(:func:`jaxmarket.sessions.kernel.calibrate`). That takes an XLA chunk and a kernel chunk
on probe sessions, about 2 s of every run's start. The answer is a function of XLA's
program and of the machine, so it is kept where the compiled programs are kept: one file
per question in ``<jax_compilation_cache_dir>/jaxmarket-rounding/``, named by the SHA-256
of everything the answer depends on:

* the game: its outcome tables (``reward``, ``obs``, ``fees``), grid, turns, period
  outcome probabilities, memory (``k > 1``) and the learner's resolved settings
  (functions excluded: what they compute is in the tables);
* the question: the batch size and the first period of the greedy tail;
* the programs: the source of :mod:`jaxmarket.sessions` and :mod:`jaxmarket.learners`, and
  the JAX, jaxlib and numba versions;
* the machine: the CPU model and flags of ``/proc/cpuinfo``, ``XLA_FLAGS``.

A run without a compilation cache (``--compile-cache none``) calibrates every time.
A file that cannot be read is ignored and written again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

#: the folder of the kept answers inside JAX's compilation cache directory
FOLDER = "jaxmarket-rounding"


def cache_dir() -> Path | None:
    """``<jax_compilation_cache_dir>/jaxmarket-rounding``, or None without a cache."""
    base = jax.config.jax_compilation_cache_dir
    return None if not base else Path(base) / FOLDER


@functools.lru_cache(maxsize=1)
def _programs_and_machine() -> bytes:
    """The source of the packages whose programs decide the answer, the versions of
    JAX, jaxlib and numba, the CPU and XLA_FLAGS."""
    import jaxlib
    import numba
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in ("sessions", "learners"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = "".join(sorted({line for line in f
                                  if line.startswith(("model name", "flags"))}))
    except OSError:
        pass
    for part in (jax.__version__, jaxlib.__version__, numba.__version__, cpu,
                 os.environ.get("XLA_FLAGS", "")):
        digest.update(part.encode() + b"\0")
    return digest.digest()


def _settings_text(settings: Any) -> str:
    """The learner's resolved settings as text, functions left out."""
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return repr(sorted((k, v) for k, v in fields.items() if not callable(v)))


def fingerprint(game: Any, size: int, tail_start: int) -> str:
    """SHA-256 of the question ``(game, size, tail_start)`` on these programs and this
    machine (module docstring)."""
    digest = hashlib.sha256(_programs_and_machine())
    for table in (game.reward, game.obs, game.fees, *jax.tree.leaves(game.grid)):
        array = np.asarray(table)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    memory = () if game.memory == 1 else (game.memory,)   # memory k > 1: the history
    digest.update(repr((type(game.grid).__name__, game.radix, game.turns, game.probs,
                        _settings_text(game.settings), int(size),
                        int(tail_start)) + memory).encode())
    return digest.hexdigest()


def kept_rounding(game: Any, size: int, tail_start: int,
                  calibrate: Callable[[], tuple[bool, ...] | None]
                  ) -> tuple[bool, ...] | None:
    """The answer kept for ``(game, size, tail_start)``, else ``calibrate()``'s, kept
    (written to a temporary name, then renamed)."""
    folder = cache_dir()
    if folder is None:
        return calibrate()
    path = folder / f"{fingerprint(game, size, tail_start)}.json"
    try:
        kept = json.loads(path.read_text())["rounding"]
        if kept is None or (isinstance(kept, list) and kept
                            and all(isinstance(x, bool) for x in kept)):
            return None if kept is None else tuple(kept)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = calibrate()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"rounding": None if found is None else list(found)}))
        tmp.replace(path)
    except OSError:   # a read-only cache: the answer is still right, only not kept
        pass
    return found


__all__ = ["FOLDER", "cache_dir", "fingerprint", "kept_rounding"]
