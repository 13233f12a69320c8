"""Host side of training: chunks, progress, metrics, checkpoints, early stop, resume.

Brax-style split: the compiled ``run_chunk`` does many iterations (all seeds and
markets in one program); between chunks the host appends ``metrics.csv``, moves the progress bar, logs to
the tracker, writes an orbax checkpoint every ``checkpoint_every`` chunks (orbax writes
to a temporary directory and renames it: atomic) and checks the stop conditions.
``resume(run_dir)`` restores the last checkpoint and replays nothing: chunk boundaries
are the same, so on CPU the result is bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import yaml
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from jaxmarket import make
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.controller import build_controller, group_learner_spec
from jaxmarket.train.config import TrainConfig, resolve_train, resolve_training
from jaxmarket.train.loop import Runner, make_train, tile_spec
from jaxmarket.train.summary import write_summary
from jaxmarket.train.tracking import CsvMetrics, Tracker, with_tracker


def prepare(config: dict):
    """Everything static: env, params, learners, specs, train config (validated)."""
    tcfg = resolve_training(config)
    if "learners" not in config:
        raise ConfigError("learners", "<missing>", "a learners: section mapping each agent group "
                          "to a learner config")
    env, params = make(config)
    base_specs = {g: group_learner_spec(env, params, g) for g in env.agent_groups}
    specs = {g: tile_spec(s, tcfg.num_envs, tcfg.num_seeds) for g, s in base_specs.items()}
    learners = build_controller(env, params, config["learners"], specs=specs)
    return env, params, learners, specs, tcfg


def _saveable(tree: Any) -> dict:
    """Runner -> flat dict of its non-empty leaves (orbax refuses zero-size arrays)."""
    return {f"leaf{i:05d}": x for i, x in enumerate(jax.tree.leaves(tree)) if x.size > 0}


def _unsaveable(saved: dict, target: Any) -> Any:
    leaves, treedef = jax.tree.flatten(target)
    out = [saved[f"leaf{i:05d}"] if x.size > 0 else jnp.zeros(x.shape, x.dtype)
           for i, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, out)


def _flatten_metrics(metrics: dict[str, np.ndarray], start: int) -> list[dict[str, float]]:
    """[chunk, ...] arrays (already means over seeds, markets and agents) -> one row per
    iteration; per-product vectors expand to name/p{j}."""
    columns: dict[str, np.ndarray] = {}
    for name, value in metrics.items():
        v = np.asarray(value, np.float64)
        if v.ndim == 1:
            columns[name] = v
        else:
            for j in range(v.shape[1]):
                columns[f"{name}/p{j}"] = v[:, j]
    n = next(iter(columns.values())).shape[0]
    return [{"iteration": start + i + 1, **{k: float(c[i]) for k, c in columns.items()}}
            for i in range(n)]


class Trainer:
    def __init__(self, config: dict, run_dir: Path):
        self.config, self.run_dir = config, Path(run_dir)
        self.env, self.params, self.learners, self.specs, self.tcfg = prepare(config)
        init, run_chunk = make_train(self.env, self.params, self.learners, self.specs, self.tcfg)
        self._init = jax.jit(init)
        self._chunks: dict[int, Any] = {}
        self._run_chunk = run_chunk
        self.metrics = CsvMetrics(self.run_dir / "metrics.csv")
        self.ckpt = ocp.CheckpointManager(
            (self.run_dir / "checkpoints").absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                                 enable_async_checkpointing=False))

    def chunk_fn(self, length: int):
        if length not in self._chunks:
            # the runner is donated: XLA updates the learners' buffers in place (without
            # donation it copied a bandit's whole sample buffer on every step)
            self._chunks[length] = jax.jit(lambda r: self._run_chunk(r, length),
                                           donate_argnums=0)
        return self._chunks[length]

    def initial_runner(self) -> Runner:
        return self._init(jax.random.key(int(self.config.get("seed", 0))))

    def restore(self) -> tuple[Runner, int]:
        step = self.ckpt.latest_step()
        target = jax.eval_shape(self.initial_runner)
        if step is None:
            return self.initial_runner(), 0
        saved = self.ckpt.restore(step, args=ocp.args.StandardRestore(_saveable(target)))
        return _unsaveable(saved, target), int(step)

    def train(self, tracker: Tracker, start_runner: Runner, start: int) -> dict:
        tcfg = self.tcfg
        self.metrics.truncate_after(start)
        runner, done_iters = start_runner, start
        total = tcfg.num_iterations
        chunk_index = start // tcfg.chunk_size
        stopped = None
        crash_after = int(os.environ.get("JAXMARKET_KILL_AFTER_CHUNK", "0"))  # crash tests
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} it"),
                      TextColumn("{task.fields[speed]}"), TextColumn("{task.fields[reward]}"),
                      TimeElapsedColumn(), TimeRemainingColumn(),
                      disable=not os.isatty(2) and os.environ.get("JAXMARKET_PROGRESS") != "1") as bar:
            task = bar.add_task("training", total=total, completed=done_iters, speed="", reward="")
            import time
            while done_iters < total:
                length = min(tcfg.chunk_size, total - done_iters)
                t0 = time.perf_counter()
                runner, metrics = self.chunk_fn(length)(runner)
                metrics = jax.device_get(metrics)
                dt = time.perf_counter() - t0
                rows = _flatten_metrics(metrics, done_iters)
                self.metrics.append(rows)
                for row in rows[-1:]:
                    tracker.log(row["iteration"], {k: v for k, v in row.items() if k != "iteration"})
                done_iters += length
                chunk_index += 1
                steps = length * tcfg.rollout_length * tcfg.num_envs * tcfg.num_seeds
                rewards = {k: v for k, v in rows[-1].items() if k.startswith("reward/")}
                bar.update(task, completed=done_iters, speed=f"{steps / dt:,.0f} env-steps/s",
                           reward=" ".join(f"{k[7:]}={v:.4g}" for k, v in rewards.items()))
                if chunk_index % tcfg.checkpoint_every == 0 or done_iters >= total:
                    self.ckpt.save(done_iters, args=ocp.args.StandardSave(_saveable(runner)))
                    self.ckpt.wait_until_finished()
                if crash_after and chunk_index >= crash_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                stopped = self._stop_reason(rows)
                if stopped:
                    if self.ckpt.latest_step() != done_iters:
                        self.ckpt.save(done_iters, args=ocp.args.StandardSave(_saveable(runner)))
                        self.ckpt.wait_until_finished()
                    break
        summary = write_summary(self.run_dir, self.env, stopped=stopped, iterations=done_iters)
        tracker.artifact(self.run_dir / "summary.json")
        tracker.artifact(self.run_dir / "metrics.csv")
        return summary

    def _stop_reason(self, rows: list[dict[str, float]]) -> str | None:
        if self.tcfg.stop_on_nan:
            for row in rows:
                # market metrics only: a learner may report NaN for "no update this
                # iteration", while NaN parameters show up in prices and rewards at once
                bad = [k for k, v in row.items() if k.split("/")[0] in ("reward", "price", "traffic")
                       and not math.isfinite(v)]
                if bad:
                    return f"non-finite metric {bad[0]} at iteration {int(row['iteration'])}"
        rule = self.tcfg.early_stop
        if rule:
            name = rule["metric"]
            if name not in rows[-1]:
                raise ConfigError("train.early_stop.metric", name,
                                  "one of the metrics: " + ", ".join(k for k in rows[-1] if k != "iteration"))
            value = rows[-1][name]
            if ("above" in rule and value > rule["above"]) or ("below" in rule and value < rule["below"]):
                return f"early stop: {name}={value:.6g} at iteration {int(rows[-1]['iteration'])}"
        return None


def start_run(config_path: str | None, overrides: list[str], run_dir: str | None,
              tracker: str = "files", mongo_url: str | None = None) -> dict:
    config = load_config(config_path, overrides)
    _ = resolve_train(config.get("train"))
    if run_dir is None:
        import time
        run_dir = f"runs/{Path(config_path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(run_dir)
    if (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").iterdir()):
        raise ConfigError("--run-dir", str(run_dir), "a new directory (use --resume to continue it)")
    trainer = Trainer(config, run_dir)   # validates everything before writing
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(run_dir / "config.yaml")
    print(f"run directory: {run_dir}")
    return with_tracker(tracker, run_dir, config,
                        lambda t: trainer.train(t, trainer.initial_runner(), 0), mongo_url)


def resume_run(run_dir: str, tracker: str = "files", mongo_url: str | None = None) -> dict:
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("--resume", str(run_dir), "a run directory holding config.yaml")
    config = load_config(run_dir / "config.yaml")
    trainer = Trainer(config, run_dir)
    runner, start = trainer.restore()
    print(f"resuming {run_dir} from iteration {start}")
    return with_tracker(tracker, run_dir, config, lambda t: trainer.train(t, runner, start),
                        mongo_url)


def final_learner_state(run_dir: str | Path) -> Any:
    """The last checkpointed Runner of a run (for analysis and tests)."""
    config = load_config(Path(run_dir) / "config.yaml")
    trainer = Trainer(config, Path(run_dir))
    runner, _ = trainer.restore()
    return runner


__all__ = ["start_run", "resume_run", "final_learner_state", "Trainer", "TrainConfig"]
