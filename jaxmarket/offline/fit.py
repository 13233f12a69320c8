"""``fit``: train an offline algorithm on a fixed dataset (d3rlpy's ``_run``, in JAX).

The dataset lives on the device; each chunk of ``chunk`` updates is one jitted
``lax.scan`` that draws its minibatches there (``randint`` indices, a gather), so no
batch crosses to the host. Between chunks the host: averages the chunk's training
metrics, runs the evaluators (``evaluators[name](algo, state) -> float | dict``), appends
the row to ``run_dir/metrics.csv`` and to ``logger``, calls the ``callbacks``, saves an
orbax checkpoint (atomic: orbax writes a temporary directory and renames it) and checks
the :class:`~jaxmarket.offline.stop.Stop` rules.

The key of the chunk starting at update ``n`` is ``fold_in(key(seed), n)``, so a run
resumed from the checkpoint at update ``n`` (``resume=True``) replays nothing and ends
bit-identical to an uninterrupted one (same ``chunk``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.algos.common import Algo, device_data, sample_batch
from jaxmarket.offline.dataset import Dataset
from jaxmarket.offline.files import storage_errno, storage_error
from jaxmarket.offline.stop import Stop, StopTracker
from jaxmarket.train.rundir import RunDirError


@dataclasses.dataclass
class FitResult:
    state: Any
    steps: int
    stopped: str | None
    history: list[dict[str, float]]
    seconds: float
    updates_per_s: float


def make_chunk(algo: Algo, batch_size: int, graph: Mapping[str, Callable] | None = None,
               every: int = 100):
    """``run(state, data, key, length) -> (state, metrics [length])``: ``length``
    updates on minibatches drawn on device. ``graph`` evaluators (jittable
    ``fn(algo, state) -> scalar | dict``) run inside the scan after every ``every``-th
    update of the chunk and after its last (a ``lax.cond``; NaN elsewhere), as metrics
    ``graph/<name>[/<key>]``."""
    graph = dict(graph or {})

    def evaluate(state):
        out = {}
        for name, fn in graph.items():   # static: the evaluators given
            value = fn(algo, state)
            if isinstance(value, Mapping):
                out.update({f"graph/{name}/{k}": jnp.asarray(v, jnp.float32)
                            for k, v in value.items()})
            else:
                out[f"graph/{name}"] = jnp.asarray(value, jnp.float32)
        return out

    def one(carry, inp):
        state, data = carry
        key, i, length = inp
        k_batch, k_update = jax.random.split(key)
        state, metrics = algo.update(state, sample_batch(k_batch, data, batch_size), k_update)
        if graph:
            shapes = jax.eval_shape(evaluate, state)
            at = ((i + 1) % every == 0) | (i == length - 1)
            metrics = {**metrics, "graph/_at": at.astype(jnp.float32), **jax.lax.cond(
                at, evaluate,
                lambda s: {k: jnp.full(v.shape, jnp.nan, v.dtype) for k, v in shapes.items()},
                state)}
        return (state, data), metrics

    def run(state, data, key, length):
        steps = jnp.arange(length, dtype=jnp.int32)
        (state, _), metrics = jax.lax.scan(
            one, (state, data), (jax.random.split(key, length), steps,
                                 jnp.full((length,), length, jnp.int32)))
        return state, metrics

    return jax.jit(run, static_argnums=3, donate_argnums=0)


_CHUNKS: dict[tuple, tuple[Algo, Any, Any]] = {}


def _chunk_for(algo: Algo, batch_size: int, graph: Mapping[str, Callable] | None = None,
               every: int = 100):
    """The compiled chunk of ``algo`` (cached: fitting the same algorithm again, e.g. a
    resume in the same process, does not recompile)."""
    graph = dict(graph or {})
    key = (id(algo), batch_size, tuple((k, id(v)) for k, v in graph.items()), every)
    hit = _CHUNKS.get(key)
    if hit is None or hit[0] is not algo or any(a is not b for a, b in
                                                zip(hit[1].values(), graph.values())):
        if len(_CHUNKS) >= 16:
            _CHUNKS.pop(next(iter(_CHUNKS)))
        hit = _CHUNKS[key] = (algo, graph, make_chunk(algo, batch_size, graph, every))
    return hit[2]


def _saveable(state: Any) -> dict:
    return {f"leaf{i:05d}": x for i, x in enumerate(jax.tree.leaves(state)) if np.size(x) > 0}


def _restore_tree(saved: dict, target: Any) -> Any:
    leaves, treedef = jax.tree.flatten(target)
    out = [saved[f"leaf{i:05d}"] if np.size(x) > 0 else jnp.zeros(x.shape, x.dtype)
           for i, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, out)


def _evaluate(evaluators: Mapping[str, Callable], algo: Algo, state: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, fn in evaluators.items():
        value = fn(algo, state)
        if isinstance(value, Mapping):
            out.update({f"{name}/{k}": float(v) for k, v in value.items()})
        else:
            out[name] = float(value)
    return out


def _read_rows(path: Path, upto: int) -> list[dict[str, float]]:
    """The rows of ``path`` up to update ``upto``; a last line cut by a crash or a full
    disk (no line break at its end: past the checkpoint) is dropped, any other damaged
    line is a :class:`~jaxmarket.train.rundir.RunDirError` naming it."""
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    rows = []
    for n, r in enumerate(csv.DictReader(lines), 2):
        try:
            row = {k: float(v) for k, v in r.items()}
            step = int(row["step"])
        except (TypeError, ValueError, KeyError, OverflowError):
            raise RunDirError(f"offline run directory error: {path} line {n} is damaged; "
                              "restore the file, or start the run again in a new "
                              "directory") from None
        if step <= upto:
            rows.append(row)
    return rows


def _write_rows(path: Path, rows: list[dict[str, float]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    tmp.replace(path)


def _append_row(path: Path, row: dict[str, float]) -> None:
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def fit(algo: Algo, dataset: Dataset, *, evaluators: Mapping[str, Callable] | None = None,
        callbacks: Sequence[Callable] = (), stop: Stop | int | None = None,
        logger: Any = None, batch_size: int = 256, chunk: int = 1000, seed: int = 0,
        run_dir: str | Path | None = None, resume: bool = False, eval_every: int = 1,
        checkpoint_every: int = 1, verbose: bool = False,
        graph_evaluators: Mapping[str, Callable] | None = None,
        graph_every: int = 100) -> FitResult:
    """Train ``algo`` on ``dataset``; see the module docstring. ``stop`` may be an int
    (a number of updates). ``callbacks[i](step, state, row)`` may return a string (a
    reason) to stop. ``logger`` is a callable ``(step, row)`` or has ``.log(step, row)``
    (a :class:`jaxmarket.train.tracking.Tracker`). ``graph_evaluators`` (jittable, e.g.
    the scorers or ``SimulatorValue.graph``) run inside the compiled chunk every
    ``graph_every`` updates: each value goes to ``run_dir/evaluations.csv`` (one row per
    evaluated update) and the chunk's last one to its ``metrics.csv`` row."""
    stop = Stop(steps=stop) if isinstance(stop, int) else (stop or Stop())
    for name, value in (("batch_size", batch_size), ("chunk", chunk), ("eval_every", eval_every),
                        ("checkpoint_every", checkpoint_every), ("graph_every", graph_every)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"fit.{name}", value, "an integer >= 1")
    evaluators = dict(evaluators or {})
    want = (int(algo.norm.obs_mean.shape[0]), int(algo.norm.act_low.shape[0]))
    if (dataset.obs_dim, dataset.action_dim) != want:
        raise ConfigError("dataset", f"obs_dim {dataset.obs_dim}, action_dim "
                          f"{dataset.action_dim}", f"the spaces {algo.name} was built for: "
                          f"obs_dim {want[0]}, action_dim {want[1]}")
    if algo.discrete != dataset.discrete or (algo.discrete and len(algo.action_values)
                                            != len(dataset.meta["action_values"])):
        raise ConfigError("dataset", "discrete" if dataset.discrete else "continuous",
                          f"the action space {algo.name} was built for")
    data = device_data(dataset, algo.norm)
    base = jax.random.key(seed)
    state = jax.jit(algo.init)(jax.random.fold_in(base, 0x5EED))
    run = _chunk_for(algo, batch_size, graph_evaluators, graph_every)
    evals_path = None if run_dir is None or not graph_evaluators else Path(run_dir) / "evaluations.csv"
    done, history, tracker = 0, [], StopTracker(stop)
    ckpt, metrics_path = None, None
    stage, box = ["preparing the run directory"], [None]   # for a storage error's line
    try:
        if run_dir is not None:
            run_dir = Path(run_dir)
            metrics_path = run_dir / "metrics.csv"
            has_ckpt = ((run_dir / "checkpoints").is_dir()
                        and any((run_dir / "checkpoints").iterdir()))
            if has_ckpt and not resume:
                raise ConfigError("run_dir", str(run_dir), "a new directory (or resume=True / "
                                  "--resume to continue it)")
            stage[0] = f"creating the run directory {run_dir}"
            run_dir.mkdir(parents=True, exist_ok=True)
            stage[0] = f"opening the checkpoints in {run_dir / 'checkpoints'}"
            ckpt = box[0] = ocp.CheckpointManager(
                (run_dir / "checkpoints").absolute(),
                options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                                     enable_async_checkpointing=False))
            latest = ckpt.latest_step() if resume else None
            if latest is not None:
                target = jax.eval_shape(lambda: state)
                saved = ckpt.restore(latest, args=ocp.args.StandardRestore(_saveable(target)))
                state, done = _restore_tree(saved, target), int(latest)
                history = _read_rows(metrics_path, done)
                for row in history:   # replay the stop rules' state (best value, patience)
                    tracker.check(row, 0.0)
            stage[0] = f"writing {metrics_path}"
            _write_rows(metrics_path, history)
            if graph_evaluators:
                evals = run_dir / "evaluations.csv"
                stage[0] = f"writing {evals}"
                _write_rows(evals, _read_rows(evals, done))
        if done >= stop.steps:
            return FitResult(state, done, None, history, 0.0, 0.0)
        t0, chunk_index, stopped, update_time = time.perf_counter(), done // chunk, None, 0.0
        start = done
        while done < stop.steps:
            length = min(chunk, stop.steps - done)
            t1 = time.perf_counter()
            state, metrics = run(state, data, jax.random.fold_in(base, done), length)
            metrics = jax.device_get(metrics)
            update_time += time.perf_counter() - t1
            done += length
            chunk_index += 1
            row = {"step": float(done)}
            graph = {k: np.asarray(metrics.pop(k), np.float64) for k in list(metrics)
                     if k.startswith("graph/")}
            row.update({k: float(np.mean(np.asarray(v, np.float64)))
                        for k, v in metrics.items()})
            if graph:
                at = np.flatnonzero(graph.pop("graph/_at") > 0)   # the evaluated updates
                rows_g = [{"step": float(done - length + i + 1),
                           **{k: float(v[i]) for k, v in graph.items()}} for i in at]
                row.update({k: v for k, v in rows_g[-1].items() if k != "step"})
                if evals_path is not None:
                    stage[0] = f"appending the rows up to update {done} to {evals_path}"
                    for r in rows_g:
                        _append_row(evals_path, r)
            if evaluators and (chunk_index % eval_every == 0 or done >= stop.steps):
                row.update(_evaluate(evaluators, algo, state))
            history.append(row)
            if metrics_path is not None:
                stage[0] = f"appending the row of update {done} to {metrics_path}"
                _append_row(metrics_path, row)
            if logger is not None:
                (logger.log if hasattr(logger, "log") else logger)(done, dict(row))
            if verbose:
                print(" ".join(f"{k}={v:.5g}" for k, v in row.items()), flush=True)
            reason = tracker.check(row, time.perf_counter() - t0)
            for cb in callbacks:
                out = cb(done, state, row)
                if out and reason is None:
                    reason = str(out) if isinstance(out, str) else f"callback at step {done}"
            finite = all(math.isfinite(v) for v in row.values())
            if ckpt is not None and finite and (chunk_index % checkpoint_every == 0 or reason
                                                or done >= stop.steps):
                stage[0] = f"saving the checkpoint at update {done}"
                ckpt.save(done, args=ocp.args.StandardSave(_saveable(state)))
                ckpt.wait_until_finished()
            if reason:
                stopped = reason
                break
        seconds = time.perf_counter() - t0
        # updates per second of the compiled chunks (the first chunk's compile included)
        return FitResult(state, done, stopped, history, seconds,
                         (done - start) / update_time if update_time > 0 else 0.0)
    except Exception as err:
        cause = storage_errno(err) if run_dir is not None else None
        if cause is None:
            raise
        raise _storage_error(Path(run_dir), stage[0], cause, box[0]) from None


def _storage_error(run_dir: Path, stage: str, err: OSError, ckpt) -> Exception:
    """One line: what failed, what is kept (the last checkpoint and the metrics.csv rows
    up to it: a resume drops later rows), how to resume."""
    try:
        kept = ckpt.latest_step() if ckpt is not None else None
    except (OSError, ValueError, RuntimeError):   # the manager may fail on the broken storage
        kept = None
    what = (f"the checkpoint at update {kept} and the metrics.csv rows up to it" if kept
            is not None else "no checkpoint yet (a resume starts at update 0)")
    return storage_error(stage, err, what, f"resume with python -m jaxmarket.offline "
                         f"--resume {run_dir} (or fit(..., run_dir={str(run_dir)!r}, "
                         "resume=True))", run_dir)


def write_fit_config(run_dir: Path, info: dict) -> None:
    tmp = run_dir / "offline.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(run_dir / "offline.json")


__all__ = ["FitResult", "fit", "make_chunk", "write_fit_config"]
