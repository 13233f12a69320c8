"""Joining a Ray cluster for one command (``--ray [ADDRESS]``).

:func:`connected` is the whole life of the driver's Ray session: the head's port is
tried first (a refused or silent head is one line and exit code 1 within
``CONNECT_TIMEOUT_S`` seconds, never Ray's minute of retries), then ``ray.init`` joins
the cluster at ``ADDRESS`` (``HOST:PORT`` of the head's GCS, or ``auto``: the cluster
``ray start`` left on this machine), or, with no address, starts a Ray of this machine's
own for the command. Everything Ray and its C++ core print on the driver's standard
error while the session lasts (its log lines, worker deaths) goes to ``ray.log`` in the
run directory instead of the user's terminal, and so do the cluster's error messages
Ray's driver prints on standard output from a thread of its own (a node's death, a
task's retry, the raylet's state dump: :func:`errors_to`); the command's own messages
still reach the terminal. :func:`describe` is the cluster as ``run.json``
records it: each alive node's id, host, address, CPUs and GPUs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxmarket.cluster import ClusterError
from jaxmarket.config.errors import ConfigError

#: the file in the run directory that holds Ray's own output
RAY_LOG = "ray.log"
#: seconds the head's port is given to answer
CONNECT_TIMEOUT_S = 10.0


def import_ray(flag: str = "--ray") -> Any:
    """The ``ray`` module, or a ConfigError naming ``flag`` and the install command."""
    try:
        import ray
    except ImportError:
        raise ConfigError(flag, "ray", "an installed ray: pip install 'jaxmarket[ray]'") \
            from None
    return ray


def check_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT``, None for ``auto``; a ConfigError otherwise."""
    if address == "auto":
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("--ray", address, "the head's HOST:PORT (as `ray start --head` "
                          "prints it, e.g. 10.0.0.1:6379) or auto")
    return host.strip("[]"), int(port)


def probe(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A ClusterError unless a TCP connection to the head's port opens within
    ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except socket.timeout:
        why = f"no answer within {timeout:.0f} s"
    except OSError as err:
        why = err.strerror or str(err)
    raise ClusterError(f"ray cluster: the head at {host}:{port} cannot be reached ({why}); "
                       "start it with `ray start --head --port=PORT` or check the address")


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """The process's file descriptor 2 (C++ libraries, handlers made before) into
    ``path`` (appended); ``sys.stderr`` (this package's messages) stays on the
    terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)
    previous = sys.stderr
    sys.stderr = open(os.dup(saved), "w", buffering=1, closefd=True)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = previous
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def errors_to(path: Path) -> Iterator[None]:
    """The cluster's error messages into ``path`` (appended) for the ``with`` block.

    Ray's driver prints them on ``sys.stdout`` from its error-listening thread through
    ``ray._private.worker.print_to_stdstream`` (``log_to_driver=False`` does not stop
    them); that function, looked up at each message, writes them to ``path`` instead.
    Where a Ray version has no such function, nothing is changed."""
    import ray._private.worker as worker
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or not hasattr(worker, "print_worker_logs"):
        yield
        return
    with open(path, "a", buffering=1) as log:
        worker.print_to_stdstream = \
            lambda data, ignore_prefix: worker.print_worker_logs(data, log, ignore_prefix)
        try:
            yield
        finally:
            worker.print_to_stdstream = original


@contextlib.contextmanager
def connected(address: str | None, log_dir: Path) -> Iterator[Any]:
    """The ``ray`` module joined to the cluster at ``address`` (None: a Ray of this
    machine's own, shut down at the end) for the ``with`` block; Ray's output in
    ``log_dir/ray.log``."""
    target = None if address is None else check_address(address)
    ray = import_ray()
    if target is not None:
        probe(*target)
    log_dir.mkdir(parents=True, exist_ok=True)
    with stderr_to(log_dir / RAY_LOG):
        if ray.is_initialized():   # a caller's own session (a notebook, a test)
            yield ray
            return
        kwargs = dict(log_to_driver=False, logging_level="ERROR")
        # a local Ray forks its servers from this (JAX-threaded) process: harmless there
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        try:
            if address is None:
                ray.init(include_dashboard=False, **kwargs)
            else:
                ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError) as err:
            raise ClusterError(f"ray cluster: cannot join {address or 'a local Ray'}: "
                               f"{str(err).splitlines()[0][:200]} (details: "
                               f"{log_dir / RAY_LOG})") from None
        with errors_to(log_dir / RAY_LOG):
            try:
                yield ray
            finally:
                ray.shutdown()


def describe(ray: Any, address: str | None) -> dict:
    """The cluster as ``run.json`` records it: the address (``local``: a Ray of this
    machine's own) and each alive node's id, host, address, CPUs and GPUs."""
    nodes = [{"node_id": n["NodeID"], "host": n.get("NodeManagerHostname"),
              "address": n.get("NodeManagerAddress"),
              "cpus": float(n["Resources"].get("CPU", 0.0)),
              "gpus": float(n["Resources"].get("GPU", 0.0))}
             for n in ray.nodes() if n.get("Alive")]
    return {"address": address or "local", "nodes": nodes,
            "cpus": sum(n["cpus"] for n in nodes), "gpus": sum(n["gpus"] for n in nodes)}


__all__ = ["CONNECT_TIMEOUT_S", "RAY_LOG", "check_address", "connected", "describe",
           "errors_to", "import_ray", "probe", "stderr_to"]
