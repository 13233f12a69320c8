"""A run's checkpoints: the :class:`~jaxmarket.train.loop.Runner` saved leaf by leaf
with orbax into ``run_dir/checkpoints/<iteration>`` (orbax writes to a temporary
directory and renames it: atomic), the newest two kept. Restoring takes the newest
checkpoint that restores; a damaged one is reported in one line, removed, and the next
older one is tried."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxmarket.train.rundir import RunDirError

CHECKPOINTS_DIR = "checkpoints"
KEEP = 2
#: bytes of one stored chunk of an array at most: chunks are written and read on every
#: core at once (a 648 MB Q table as one chunk restores in about twice the time)
CHUNK_BYTES = 16 << 20


def _handler() -> ocp.PyTreeCheckpointHandler:
    """orbax's handler of the leaves, their chunks stored as they are: zstd (orbax's
    default) halves learned Q tables for about 3 CPU-seconds per 648 MB written (three
    firms' tables of 1000 sessions; stored: 1.4). The stored format is the one
    ``StandardCheckpointHandler`` writes, and a checkpoint compressed by it restores:
    each chunk's codec is read from the array's own metadata."""
    return ocp.PyTreeCheckpointHandler(use_compression=False)


# When an orbax save or restore fails (a full disk, a damaged file), orbax's event loop
# closes while tensorstore still completes the other reads and writes: their callbacks
# then meet a closed loop ("Event loop is closed", as unraisable exceptions), the
# abandoned tasks are logged at garbage collection ("Task exception was never
# retrieved") and, at exit, their coroutines find Python shutting down. The failure
# itself is reported in one line (or recovered from); this is its echo, kept off stderr.
def _orbax_echo(exc: BaseException | None, obj: object = None) -> bool:
    text = str(exc)
    return ((isinstance(exc, RuntimeError) and text == "Event loop is closed")
            or (isinstance(exc, ImportError) and "Python is likely shutting down" in text)
            or "orbax" in repr(obj) or "async_serialize" in repr(obj)
            or _closed_orbax_coroutine(exc, obj))


_ORBAX_SOURCE = f"{os.sep}orbax{os.sep}"
#: orbax's reading coroutines (orbax/checkpoint/_src/serialization): those a failed
#: restore abandons
_ORBAX_READERS = ("_read_shard", "_read_array_index_and_device_put", "_read_and_create_array",
                  "async_deserialize", "_deserialize_arrays", "_deserialize_shardings")


def _closed_orbax_coroutine(exc: BaseException | None, obj: object) -> bool:
    """One of orbax's own coroutines, closed while it waited, raised on its way out: a
    restore that fails on one array (a checkpoint of another shape) leaves the reads of
    the others suspended on orbax's closed event loop; the garbage collector closes them,
    and orbax's reader (``_read_array_index_and_device_put``) turns the GeneratorExit into
    ``Exception: Encountered error while reading array index ...``, which Python echoes
    as "Exception ignored in: <coroutine object ...>" with a TensorStore spec (some 60
    lines for each array). The object is a bare coroutine (its repr names the function, not
    orbax) and the exception orbax's wrapper, so only the coroutine's code tells."""
    code = getattr(obj, "cr_code", None)
    if code is None or _ORBAX_SOURCE not in code.co_filename:
        return False
    seen = 0
    while exc is not None and seen < 8:   # closing it threw GeneratorExit in: the cause
        if isinstance(exc, GeneratorExit):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _raised_in_orbax(record: logging.LogRecord) -> bool:
    """Whether the record's exception was raised in orbax's code (its traceback)."""
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
        if _ORBAX_SOURCE in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


class _QuietOrbaxEcho(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if record.name == "asyncio":   # an abandoned task's or gathering future's failure
            return not ("exception was never retrieved" in msg
                        and ("orbax" in msg or _raised_in_orbax(record)))
        # orbax's background threads log the failure they pass on (absl, ERROR)
        return not (record.levelno >= logging.ERROR and "orbax" in record.pathname
                    and "raised an exception" in msg)


_installed = False


def _quiet_orbax_echo() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _orbax_echo(unraisable.exc_value, unraisable.object):
            previous(unraisable)

    sys.unraisablehook = hook
    # the same reads, never started when the loop closed: a warning at their collection
    warnings.filterwarnings("ignore", category=RuntimeWarning, message="coroutine "
                            f"'({'|'.join(_ORBAX_READERS)})' was never awaited")
    quiet = _QuietOrbaxEcho()
    for name in ("asyncio", "absl"):
        logging.getLogger(name).addFilter(quiet)


class _Uncopied(np.ndarray):
    """A numpy array orbax writes without first copying it (its defensive copy guards an
    asynchronous save against later writes to the array; :meth:`Checkpoints.save` waits
    for the write, so nothing writes to it meanwhile). The copy of 1000 sessions' Q
    tables of three firms (648 MB) added about 2 s to a save."""

    def __deepcopy__(self, memo):
        return self


def _uncopied(x: Any) -> Any:
    """``x`` viewed as :class:`_Uncopied` (no copy) where it is a numpy array."""
    return x.view(_Uncopied) if type(x) is np.ndarray else x


def saveable(tree: Any) -> dict:
    """Runner -> flat dict of its non-empty leaves (orbax refuses zero-size arrays)."""
    return {f"leaf{i:05d}": x for i, x in enumerate(jax.tree.leaves(tree)) if x.size > 0}


def unsaveable(saved: dict, target: Any) -> Any:
    """The inverse of :func:`saveable` on the structure of ``target``."""
    leaves, treedef = jax.tree.flatten(target)
    out = [saved[f"leaf{i:05d}"] if x.size > 0 else jnp.zeros(x.shape, x.dtype)
           for i, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, out)


class Checkpoints:
    """The checkpoints of ``run_dir``. ``primary``: this process removes damaged ones (in
    a distributed run every process saves its shards; orbax's primary host, process 0,
    creates the directory, writes the metadata and commits the step: the run directory
    must be storage every process sees)."""

    def __init__(self, run_dir: Path, primary: bool = True):
        self.run_dir, self.primary = Path(run_dir), primary
        self._manager: ocp.CheckpointManager | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / CHECKPOINTS_DIR

    @property
    def manager(self) -> ocp.CheckpointManager:
        # created on first use: a run that fails validation leaves no directory behind
        if self._manager is None:
            _quiet_orbax_echo()
            self._manager = ocp.CheckpointManager(
                self.path.absolute(),
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=KEEP, create=True, enable_async_checkpointing=False,
                    multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=0)),
                item_handlers=_handler())
        return self._manager

    def latest(self) -> int | None:
        return self.manager.latest_step()

    def save(self, runner: Any, iteration: int) -> None:
        """The runner at ``iteration`` (once: a second save of one iteration is none)."""
        if self.manager.latest_step() != iteration:
            leaves = {k: _uncopied(x) for k, x in saveable(runner).items()}
            chunked = {k: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES) for k in leaves}
            self.manager.save(iteration, args=ocp.args.PyTreeSave(leaves, save_args=chunked))
            self.manager.wait_until_finished()

    def restore(self, target: Any, report: Callable[[str], None] = print
                ) -> tuple[Any, int] | None:
        """``(saved tree of target's structure, iteration)`` of the newest checkpoint that
        restores (``target``: shapes with shardings, restored in place); None without any;
        :class:`~jaxmarket.train.rundir.RunDirError` when none restores."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None
        bad = []
        for step in steps:
            try:
                like = saveable(target)   # each leaf as the target's (type, sharding)
                saved = self.manager.restore(step, args=ocp.args.PyTreeRestore(
                    like, restore_args=ocp.checkpoint_utils.construct_restore_args(like)))
            except Exception as err:   # orbax/tensorstore raise many types for damaged files
                why = " ".join(f"{type(err).__name__}: {err}".split())
                bad.append((int(step), why[:120] + ("..." if len(why) > 120 else "")))
                self.close()   # a failed restore can leave the manager confused
                continue
            if bad:
                self.drop([s for s, _ in bad])
                report(f"checkpoint at iteration {bad[0][0]} cannot be restored ({bad[0][1]})"
                       + "".join(f"; nor the one at {s}" for s, _ in bad[1:])
                       + f"; removed, resuming from the one at iteration {int(step)}")
            return unsaveable(saved, target), int(step)
        raise RunDirError(
            f"run directory error: no checkpoint in {self.path} can be "
            f"restored (iteration {bad[0][0]}: {bad[0][1]}" + "".join(
                f"; iteration {s}: {why}" for s, why in bad[1:]) + "); start the run again: python -m "
            f"jaxmarket.train {self.run_dir / 'config.yaml'} --run-dir NEW_DIR")

    def fits(self, target: Any) -> bool:
        """Whether some committed checkpoint holds ``target``'s arrays (the same names and
        shapes, read from orbax's metadata: nothing is restored); True without any, or
        where the metadata cannot be read (restoring then names the damage)."""
        steps = self.steps()
        if not steps:
            return True
        want = {k: tuple(x.shape) for k, x in saveable(target).items()}
        reader = ocp.CheckpointManager(self.path.absolute(), item_handlers=_handler())
        try:
            for step in steps:
                try:
                    meta = reader.item_metadata(step)
                    got = {k: tuple(meta[k].shape) for k in meta}
                except Exception:   # damaged metadata: restore() reports it
                    return True
                if got == want:
                    return True
            return False
        finally:
            reader.close()

    def drop(self, steps: list[int]) -> None:
        """Remove the checkpoints of ``steps`` (damaged ones)."""
        if self.primary:
            for step in steps:
                shutil.rmtree(self.path / str(step), ignore_errors=True)
        self.close()   # a manager that has not seen them

    def clear_unfinished(self) -> None:
        """Remove saves a crash or a full disk left unfinished (``N.orbax-checkpoint-tmp``;
        orbax would remove them itself, with a warning on stderr)."""
        if self.primary and self.path.is_dir():
            for p in self.path.glob("*.orbax-checkpoint-tmp"):
                shutil.rmtree(p, ignore_errors=True)

    def steps(self) -> list[int]:
        """The committed checkpoints' iterations, oldest first."""
        return sorted(int(s) for s in self.manager.all_steps())

    def close(self) -> None:
        """Stop the manager's background threads (on every way out: a manager left
        open echoes its pending work on a closed event loop); the next use opens it."""
        manager, self._manager = self._manager, None
        if manager is not None:
            try:
                manager.close()
            except Exception:   # closing after a failed save: the failure is reported
                pass


__all__ = ["CHECKPOINTS_DIR", "Checkpoints", "saveable", "unsaveable"]
