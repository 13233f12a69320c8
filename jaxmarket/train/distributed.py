"""Training across processes (hosts): ``python -m jaxmarket.train --distributed``.

:func:`initialize` calls :func:`jax.distributed.initialize` with the coordinator address,
process count and process id from the flags (``--coordinator-address HOST:PORT
--num-processes N --process-id I``) or from ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``; with none of them JAX detects the cluster
itself (Cloud TPU pods, SLURM, Open MPI, Kubernetes). CPU processes exchange data with
gloo collectives (``jax_cpu_collectives_implementation``). The mesh then spans every
process's devices (``jaxmarket.train.devices.make_mesh``), each process holding a
contiguous block of the seeds x markets.

Before anything compiles, :func:`check_same` compares a hash of every process's resolved
config and flags (a one-line ``ConfigError`` if they differ), and process 0's run
directory is the one every process uses (:func:`broadcast_text`). Only process 0 writes
files; orbax's checkpoint saves are collective (every process calls ``save``, orbax
writes from process 0 and synchronises them).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading

import numpy as np

from jaxmarket.config.errors import ConfigError

#: seconds a process of a distributed run waits for the others before it says so and stops
WAIT_S = 30
FLAGS = "--coordinator-address, --num-processes, --process-id"
AUTO = ("a cluster JAX detects by itself (Cloud TPU pod, SLURM, Open MPI, Kubernetes), or "
        "--coordinator-address HOST:PORT --num-processes N --process-id I")


def _setting(flag, env: str, kind=str):
    value = flag if flag is not None else os.environ.get(env)
    if value is None or kind is str:
        return value
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(env, value, "an integer") from None


def initialize(address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> tuple[int, int]:
    """Join the distributed run; returns ``(process_index, process_count)``. Must come
    before the first training program is compiled."""
    address = _setting(address, "JAX_COORDINATOR_ADDRESS")
    num_processes = _setting(num_processes, "JAX_NUM_PROCESSES", int)
    process_id = _setting(process_id, "JAX_PROCESS_ID", int)
    given = [v is not None for v in (address, num_processes, process_id)]
    if any(given) and not all(given):
        missing = [f for f, g in zip(("--coordinator-address", "--num-processes",
                                      "--process-id"), given) if not g]
        raise ConfigError("--distributed", ", ".join(missing) + " missing",
                          f"all three of {FLAGS} (or their JAX_* variables), or none of "
                          "them on a cluster JAX detects by itself")
    if all(given):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError("--coordinator-address", address, "HOST:PORT, e.g. 10.0.0.1:1234")
        if num_processes < 1:
            raise ConfigError("--num-processes", num_processes, "a positive integer")
        if not 0 <= process_id < num_processes:
            raise ConfigError("--process-id", process_id,
                              f"an integer in [0, {num_processes - 1}] (--num-processes "
                              f"{num_processes})")
    import jax
    from jax.extend.backend import clear_backends
    # importing jaxmarket already started a (single-process) backend through a
    # dependency's module-level array: drop it, so the distributed one replaces it
    clear_backends()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = wait_seconds()
    if all(given):
        print(f"distributed: process {process_id} of {num_processes} waiting up to "
              f"{timeout} s for the others at {address}", flush=True)
    # JAX aborts the process (a C++ fatal error and its stack) when its deadline passes:
    # a watchdog says what was awaited in one line and exits 1 before that
    if all(given):
        others = [i for i in range(num_processes) if i != process_id]
        waited = (f"the coordinator at {address} and processes {others} (each runs the "
                  "same command with its own --process-id)")
    else:
        waited = "the processes of the cluster JAX detected"
    watchdog = threading.Timer(timeout, _give_up, (f"distributed: waited {timeout} s for "
                                                   f"{waited}; none came",))
    watchdog.daemon = True
    watchdog.start()
    try:
        if all(given):
            jax.distributed.initialize(address, num_processes, process_id,
                                       initialization_timeout=timeout + 60)
        else:
            jax.distributed.initialize(initialization_timeout=timeout + 60)
    except (ValueError, RuntimeError) as err:
        if all(given):
            raise
        raise ConfigError("--distributed", str(err).splitlines()[0][:160], AUTO) from None
    finally:
        watchdog.cancel()
    return jax.process_index(), jax.process_count()


def _give_up(message: str) -> None:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    os._exit(1)


def wait_seconds() -> int:
    """Seconds a process waits for its peers (``JAXMARKET_DISTRIBUTED_TIMEOUT``, default
    ``WAIT_S``)."""
    value = os.environ.get("JAXMARKET_DISTRIBUTED_TIMEOUT", str(WAIT_S))
    try:
        seconds = int(value)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise ConfigError("JAXMARKET_DISTRIBUTED_TIMEOUT", value, "a positive integer of seconds")
    return seconds


def config_hash(config: dict, **flags) -> str:
    """A hash of the resolved config and the flags that shape the run."""
    text = json.dumps({"config": config, "flags": flags}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _gather(words: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(words))


def check_same(digest: str, what: str = "config") -> None:
    """A one-line ``ConfigError`` on every process unless all processes hold the same
    ``digest`` (checked before compiling the training program)."""
    import jax
    if jax.process_count() == 1:
        return
    words = np.frombuffer(bytes.fromhex(digest)[:16], np.int32).copy()   # 4 words
    rows = _gather(words).reshape(jax.process_count(), -1)
    differ = [i for i in range(rows.shape[0]) if not np.array_equal(rows[i], rows[0])]
    if differ:
        raise ConfigError("--distributed", f"process(es) {differ} differ from process 0",
                          f"the same {what} on every process (scenario file, overrides, "
                          "--devices, --resume)")


def broadcast_text(text: str, size: int = 1024) -> str:
    """Process 0's ``text`` (at most ``size`` UTF-8 bytes) on every process."""
    import jax
    if jax.process_count() == 1:
        return text
    from jax.experimental import multihost_utils
    raw = text.encode()[:size]
    buf = np.zeros(size + 1, np.int32)
    buf[0] = len(raw)
    buf[1:1 + len(raw)] = np.frombuffer(raw, np.uint8)
    out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    return bytes(out[1:1 + int(out[0])].astype(np.uint8)).decode()


def wait_for_primary(name: str) -> None:
    """Every process waits here until all reach it (process 0 has written its files)."""
    import jax
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"jaxmarket:{name}")


__all__ = ["WAIT_S", "broadcast_text", "check_same", "config_hash", "initialize", "wait_for_primary",
           "wait_seconds"]
