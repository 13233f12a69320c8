"""A real multi-process Ray cluster on this machine: the cluster tests
(tests/test_cluster.py) and the cluster benchmark (benchmarks/cluster.py) run on it.

Every process of it (the head, each worker node, the driver commands) runs in a network
namespace the fixture makes itself (``unshare -n`` with ``ip link set lo up``, joined
with ``nsenter``), so the nodes take 127.0.0.1 and nothing is sent to any address but
loopback. The head has no CPUs (tasks run on the worker nodes), each worker node
``cpus``. Token authentication with a fresh token, no usage statistics. Stopping ends
exactly the process groups the fixture started (never ``ray stop``, which ends every Ray
process of the machine). Needs root (unshare), iproute2 (ip) and util-linux (nsenter):
docs/testing.md."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PORT = 6379
RAY = str(Path(sys.executable).with_name("ray"))


class LocalCluster:
    def __init__(self, workers: int = 2, cpus: int = 1):
        self.temp = tempfile.mkdtemp(prefix="jm-ray-")   # short: Unix socket paths
        self.env = {**os.environ, "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0",
                    "JAXMARKET_PROGRESS": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.holder = subprocess.Popen(
            ["unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep 3600"],
            start_new_session=True)
        self.nodes: list[subprocess.Popen] = []
        self.address = f"127.0.0.1:{PORT}"
        try:
            deadline = time.time() + 10
            while not self._lo_up():
                if self.holder.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the cluster tests need root, unshare and ip "
                                       "(docs/testing.md): the network namespace did not "
                                       "start")
                time.sleep(0.05)
            self._start(["--head", f"--port={PORT}", "--num-cpus=0",
                         "--include-dashboard=false", f"--temp-dir={self.temp}"])
            for _ in range(workers):
                self.add_worker(cpus)
            self.wait_nodes(workers + 1)
        except BaseException:
            self.stop()
            raise

    def _lo_up(self) -> bool:
        out = subprocess.run(self.ns(["ip", "-o", "link", "show", "lo"]), capture_output=True,
                             text=True)
        return out.returncode == 0 and "UP" in out.stdout

    def ns(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", *argv]

    def _start(self, args: list[str]) -> subprocess.Popen:
        log = open(Path(self.temp) / f"node{len(self.nodes)}.log", "wb")
        proc = subprocess.Popen(self.ns([RAY, "start", "--block", "--disable-usage-stats",
                                         "--node-ip-address=127.0.0.1", *args]),
                                env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.nodes.append(proc)
        deadline = time.time() + 90   # one node at a time: each up before the next starts
        while b"block forever" not in Path(log.name).read_bytes():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"a Ray node did not start:\n"
                                   f"{Path(log.name).read_text()[-2000:]}")
            time.sleep(0.1)
        return proc

    def add_worker(self, cpus: int = 1) -> subprocess.Popen:
        return self._start([f"--address={self.address}", f"--num-cpus={cpus}"])

    def wait_nodes(self, count: int, timeout: float = 60.0) -> None:
        code = ("import ray, time, sys\n"
                f"ray.init(address='{self.address}', log_to_driver=False, "
                "logging_level='ERROR')\n"
                f"end = time.time() + {timeout}\n"
                f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
                "    if time.time() > end: sys.exit(1)\n"
                "    time.sleep(0.2)\n")
        out = subprocess.run(self.ns([sys.executable, "-c", code]), env=self.env,
                             capture_output=True, text=True, timeout=timeout + 60)
        if out.returncode != 0:
            raise RuntimeError(f"{count} Ray nodes did not come up:\n{out.stderr[-2000:]}")

    def run(self, argv: list[str], cwd: str | Path, timeout: float = 600,
            **kw) -> subprocess.CompletedProcess:
        """A command in the namespace, as the user runs it."""
        return subprocess.run(self.ns(argv), env=self.env, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, **kw)

    def popen(self, argv: list[str], cwd: str | Path, stdout, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.ns(argv), env=self.env, cwd=cwd, stdout=stdout,
                                stderr=subprocess.STDOUT, start_new_session=True, **kw)

    def raylet(self, node: int) -> int:
        """The pid of node ``node``'s raylet (a child of its ``ray start``)."""
        import psutil
        for child in psutil.Process(self.nodes[node].pid).children(recursive=True):
            if "raylet" in child.name() or any("raylet" in a for a in child.cmdline()[:1]):
                return child.pid
        raise RuntimeError(f"node {node} has no raylet")

    def kill_node(self, node: int) -> None:
        """SIGKILL node ``node``'s raylet (the node is lost: its workers die with it)."""
        os.kill(self.raylet(node), signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM to each process group the fixture started, a few seconds for Ray to
        end its servers, then SIGKILL to whatever of the groups is left."""
        groups = [*self.nodes, self.holder]
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for proc in groups:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            end = time.time() + grace
            for proc in groups:
                try:
                    proc.wait(timeout=max(0.1, end - time.time()))
                except subprocess.TimeoutExpired:
                    pass
        shutil.rmtree(self.temp, ignore_errors=True)


__all__ = ["LocalCluster"]
