"""One session-engine design's sessions across a Ray cluster
(``python -m jaxmarket.train CONFIG --ray [ADDRESS]``).

The driver makes the run's sessions exactly as a single process does
(:func:`jaxmarket.sessions.engine.init_sessions` of all ``S`` sessions from the run's key)
and splits them into blocks of consecutive rows (:func:`plan_blocks`); block ``b`` is a
Ray task (:func:`play_block`) that plays its rows with the kernel backend, at the
rounding the driver calibrated for the run's own ``S`` sessions. A session of the kernel
depends on nothing but its own row (its key, tables and step), so block ``b`` plays the
very sessions a single process plays.

Where the single process stops is where the blocks stop: with ``train.session_stop:
periods`` every block plays ``train.num_iterations`` periods; with ``converged`` block
``b`` plays until its own sessions have all converged, at chunk boundary ``D_b``, and the
run stops at ``D = max_b D_b`` (the first boundary at which every session has
converged), so each block with ``D_b < D`` then plays on to ``D`` (its sessions play
their greedy prices, as a single process plays them while other sessions still learn).
The driver joins the blocks' rows in order and writes the run directory as a single
process does (``sessions.csv``, ``summary.json``, ``strategies.npz`` byte for byte; a
checkpoint at ``D``).

Nothing is lost: a finished block is kept in ``blocks/`` of the run directory (its rows
and period, written atomically) as it arrives; a block whose worker or node died is
retried by Ray on another node (``max_retries``); ``--resume`` after the driver itself
died plays only the blocks not kept. ``blocks/plan.json`` holds the blocks' rows and the
period they start from.

Block size (:func:`plan_blocks`): about ``BLOCKS_PER_CPU`` blocks per CPU of the cluster,
so a slow block does not hold the run up, each a multiple of ``WIDTH`` sessions (the
engine's batch granularity), one CPU per task (numba runs the block on one thread).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxmarket.cluster.connect import check_address, connected, describe, import_ray, probe
from jaxmarket.config.errors import ConfigError
from jaxmarket.sessions import engine as eng
from jaxmarket.train.config import resolve_train

#: the run directory's folder of finished blocks
BLOCK_DIR = "blocks"
PLAN_FILE = "plan.json"
#: sessions per block are a multiple of this
WIDTH = eng.GRANULARITY
#: blocks per CPU of the cluster
BLOCKS_PER_CPU = 2
#: Ray retries a block whose worker or node died this often
MAX_RETRIES = 4


def plan_blocks(sessions: int, cpus: int, width: int = WIDTH,
                per_cpu: int = BLOCKS_PER_CPU) -> list[tuple[int, int]]:
    """Rows ``[lo, hi)`` of each block: size ``ceil(S / (per_cpu cpus))`` rounded up to a
    multiple of ``width`` (the last block takes the rest)."""
    size = math.ceil(sessions / max(1, per_cpu * max(1, int(cpus))))
    size = max(width, math.ceil(size / width) * width)
    return [(lo, min(lo + size, sessions)) for lo in range(0, sessions, size)]


# ------------------------------------------------------------------ the task

def _settings(config: dict, sessions: int) -> eng.Settings:
    t = resolve_train(config.get("train"))
    return eng.Settings(sessions=sessions, periods=t.num_iterations, chunk=t.chunk_size,
                        stop=t.session_stop, window=t.session_window, backend="kernel")


def play_block(game: Any, config: dict, leaves: list[np.ndarray], done: int,
               until: int | None, rounding: tuple[bool, ...], threads: int = 1
               ) -> tuple[list[np.ndarray], int, dict]:
    """One block (a Ray task) of the driver's ``game`` (its
    :class:`~jaxmarket.sessions.game.SessionGame`, sent once to every node): its
    sessions' ``leaves`` (the flattened
    :class:`~jaxmarket.sessions.engine.Sessions`, keys as their data) from period
    ``done`` until the engine stops (``until`` None) or to period ``until``; returns
    its leaves, the period reached and where it ran (host, pid, node id, ``wall_s`` of
    the task, ``setup_s`` of it spent making the game and the runner, the
    session-periods it played)."""
    import numba
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    started = time.perf_counter()
    rows = int(leaves[0].shape[0])
    runner = eng.Runner(game, _settings(config, rows), rounding=rounding)
    sessions = _unflatten(game, leaves)
    setup = time.perf_counter() - started   # the runner, the block's sessions
    while (done < until) if until is not None else not runner.finished(sessions, done):
        sessions, done = runner.advance(sessions, done)
    where = {"host": socket.gethostname(), "pid": os.getpid(),
             "wall_s": round(time.perf_counter() - started, 3), "setup_s": round(setup, 3),
             "session_periods": runner.session_periods}
    try:
        import ray
        where["node_id"] = ray.get_runtime_context().get_node_id()
    except Exception:   # not in a Ray worker (tests call it directly)
        where["node_id"] = None
    return _flatten(sessions), done, where


def _flatten(sessions: eng.Sessions) -> list[np.ndarray]:
    plain = sessions._replace(key=jax.random.key_data(sessions.key))
    return [np.asarray(x) for x in jax.tree.leaves(plain)]


def _treedef(game):
    like = eng.init_sessions(game, 1, jax.random.key(0))
    return jax.tree.structure(like._replace(key=jax.random.key_data(like.key)))


def _unflatten(game, leaves: list[np.ndarray]) -> eng.Sessions:
    plain = jax.tree.unflatten(_treedef(game), [jax.numpy.asarray(x) for x in leaves])
    return plain._replace(key=jax.random.wrap_key_data(plain.key))


# ------------------------------------------------------------------ kept blocks

class BlockStore:
    """``blocks/`` of a run directory: ``plan.json`` and one ``NNNNN.npz`` per finished
    block (its leaves and period), each written to a temporary name, synced, renamed."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / BLOCK_DIR

    def plan(self, start: int, sessions: int, cpus: float) -> list[tuple[int, int]]:
        """The kept plan when it starts at ``start`` with ``sessions`` rows (its kept
        blocks stay); else a new one (kept blocks of another start are dropped)."""
        path = self.dir / PLAN_FILE
        if path.is_file():
            kept = json.loads(path.read_text())
            if kept.get("start") == start and kept.get("sessions") == sessions:
                return [tuple(b) for b in kept["blocks"]]
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("*.npz"):
            old.unlink()
        blocks = plan_blocks(sessions, int(cpus))
        self._atomic(path, json.dumps({"start": start, "sessions": sessions,
                                       "blocks": [list(b) for b in blocks]}).encode())
        return blocks

    def load(self, b: int) -> tuple[list[np.ndarray], int] | None:
        path = self.dir / f"{b:05d}.npz"
        if not path.is_file():
            return None
        with np.load(path) as z:
            count = int(z["count"])
            return [z[f"leaf{i:03d}"] for i in range(count)], int(z["done"])

    def save(self, b: int, leaves: list[np.ndarray], done: int) -> None:
        import io
        buf = io.BytesIO()
        np.savez(buf, count=len(leaves), done=done,
                 **{f"leaf{i:03d}": x for i, x in enumerate(leaves)})
        self._atomic(self.dir / f"{b:05d}.npz", buf.getvalue())

    @staticmethod
    def _atomic(path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)


# ------------------------------------------------------------------ the driver

class BlockRun:
    """The driver's side: ``play(sessions, done)`` for
    :meth:`jaxmarket.sessions.run.SessionRun.train`."""

    def __init__(self, run: Any, ray: Any, cluster: dict, segment: dict):
        self.run, self.ray, self.cluster, self.segment = run, ray, cluster, segment
        self.store = BlockStore(run.run_dir)
        self.total = run.settings.sessions
        self.rounding = run.runner.rounding(self.total)
        self.config = run.config
        self.blocks: list[tuple[int, int]] = []
        self.where: dict[int, list[dict]] = {}   # each block's task runs
        self.task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(play_block)

    def finished(self, state: list[np.ndarray], done: int) -> bool:
        s = self.run.settings
        if done >= s.periods:
            return True
        converged = state[self._converged_leaf()]
        return s.stop == "converged" and bool(np.all(converged))

    def _converged_leaf(self) -> int:
        like = eng.init_sessions(self.run.game, 1, jax.random.key(0))
        paths = jax.tree_util.tree_leaves_with_path(
            like._replace(key=jax.random.key_data(like.key)))
        return next(i for i, (p, _) in enumerate(paths)
                    if jax.tree_util.keystr(p) == ".learner.converged")

    def _run_tasks(self, jobs: dict[int, tuple[list[np.ndarray], int, int | None]],
                   state: dict[int, tuple[list[np.ndarray], int]], phase: str) -> None:
        config, game = self.ray.put(self.config), self.ray.put(self.run.game)
        pending = {self.task.remote(game, config, leaves, done, until, self.rounding): b
                   for b, (leaves, done, until) in jobs.items()}
        count, started = 0, time.perf_counter()
        while pending:
            ready, _ = self.ray.wait(list(pending), num_returns=1)
            b = pending.pop(ready[0])
            leaves, done, where = self.ray.get(ready[0])
            self.store.save(b, leaves, done)
            state[b] = (leaves, done)
            self.where.setdefault(b, []).append(where)
            count += 1
            lo, hi = self.blocks[b]
            print(f"block {b + 1}/{len(self.blocks)} {phase} on {where['host']} "
                  f"(node {str(where['node_id'])[:8]}): sessions {lo}-{hi - 1} at period "
                  f"{done:,d}; {count}/{len(jobs)} of this phase, "
                  f"{time.perf_counter() - started:.1f} s", flush=True)

    def play(self, sessions: eng.Sessions, done: int) -> tuple[eng.Sessions, int]:
        started = time.perf_counter()
        start = done
        self.blocks = self.store.plan(start, self.total, self.cluster["cpus"])
        full = _flatten(sessions)
        state: dict[int, tuple[list[np.ndarray], int]] = {}
        for b in range(len(self.blocks)):
            kept = self.store.load(b)
            if kept is not None:
                state[b] = kept
        kept = set(state)
        if state:
            print(f"blocks kept from before: {len(state)} of {len(self.blocks)}", flush=True)
        print(f"{len(self.blocks)} blocks of about {self.blocks[0][1] - self.blocks[0][0]} "
              f"sessions on {len(self.cluster['nodes'])} node(s), "
              f"{self.cluster['cpus']:g} CPUs", flush=True)
        jobs = {}
        for b, (lo, hi) in enumerate(self.blocks):
            leaves, at = state.get(b, ([x[lo:hi] for x in full], start))
            if not self.finished(leaves, at):
                jobs[b] = (leaves, at, None)
        self._run_tasks(jobs, state, "played")
        end = max(at for _, at in state.values())
        if any(at > self.run.settings.periods for _, at in state.values()):
            raise ConfigError("train.num_iterations", self.run.settings.periods,
                              f"an integer >= {end} (the run's kept blocks)")
        behind = {b: (leaves, at, end) for b, (leaves, at) in state.items() if at < end}
        if behind:   # converged early: their sessions play on to where the run stops
            self._run_tasks(behind, state, f"played on to period {end:,d}")
        merged = [np.concatenate([state[b][0][i] for b in range(len(self.blocks))])
                  for i in range(len(full))]
        self.segment["cluster"] = {
            **self.cluster, "play_s": round(time.perf_counter() - started, 3),
            "blocks": [{"sessions": [lo, hi], "runs": self.where.get(b, []),
                        "kept_from_before": b in kept}
                       for b, (lo, hi) in enumerate(self.blocks)]}
        nodes: dict[str, int] = {}
        for runs in self.where.values():
            for w in runs:
                name = f"{w['host']} (node {str(w['node_id'])[:8]})"
                nodes[name] = nodes.get(name, 0) + 1
        if nodes:
            print("blocks played per node: " + ", ".join(f"{h} {k}" for h, k in nodes.items()),
                  flush=True)
        return _unflatten(self.run.game, merged), end


def check_kernel(run: Any, address: str | None) -> None:
    """A ConfigError unless the run plays on the kernel backend (the only one whose
    sessions do not depend on the batch they share: XLA's rounding may change with the
    batch size)."""
    if run.runner.backend != "kernel":
        why = run.runner.note or "train.session_backend is xla"
        raise ConfigError("--ray", address or "local",
                          "a design the session engine's kernel backend plays (its sessions "
                          "are the single process's whatever the block; this run is on xla: "
                          f"{why})")


def play_on_cluster(run: Any, segments: list[dict], address: str | None,
                    sessions: eng.Sessions, done: int) -> dict:
    """``run.train`` with the sessions played as blocks on the cluster at ``address``
    (None: a Ray of this machine's own); Ray's output in ``ray.log``."""
    check_kernel(run, address)
    with connected(address, run.run_dir) as ray:
        cluster = describe(ray, address)
        segments[-1]["cluster"] = cluster
        blocks = BlockRun(run, ray, cluster, segments[-1])
        return run.train(sessions, done, segments, play=blocks.play)


class OnCluster:
    """A sessions run's blocks on the Ray cluster at ``address`` (None: a Ray of this
    machine's own), for :func:`jaxmarket.sessions.run.start` and ``resume``."""

    def __init__(self, address: str | None):
        self.address = address

    def check(self, run: Any) -> None:
        """Before anything is written: ray installed, the address well formed and its
        head answering, the design on the kernel backend."""
        import_ray()
        if self.address is not None:
            target = check_address(self.address)
            if target is not None:
                probe(*target)
        check_kernel(run, self.address)

    def train(self, run: Any, sessions: eng.Sessions, done: int, segments: list[dict]
              ) -> dict:
        return play_on_cluster(run, segments, self.address, sessions, done)


__all__ = ["BLOCKS_PER_CPU", "OnCluster", "BLOCK_DIR", "BlockRun", "BlockStore", "WIDTH", "check_kernel",
           "plan_blocks", "play_block", "play_on_cluster"]
