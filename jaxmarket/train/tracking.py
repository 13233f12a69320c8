"""Experiment tracking: files in the run directory (always), plus optionally sacred
(FileStorageObserver in ``RUN_DIR/sacred`` or a MongoObserver for a ``mongodb://`` URL),
TensorBoard (tensorboardX event files in ``RUN_DIR/tensorboard``) or Weights & Biases
(a W&B run in ``RUN_DIR/wandb``, with every seed's series too)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Callable

from jaxmarket.config.errors import ConfigError, Interrupted


class CsvMetrics:
    """``metrics.csv``: one row per iteration, appended as training goes."""

    def __init__(self, path: Path):
        self.path = path

    def truncate_after(self, iteration: int) -> None:
        """Drop rows past ``iteration`` (work lost with an interrupted chunk)."""
        if not self.path.exists():
            return
        with self.path.open(newline="") as f:
            raw = f.read()
        # a row cut by a crash mid-append lies after the last checkpoint: dropped too
        text = raw if raw.endswith("\n") else raw[:raw.rfind("\n") + 1]
        rows = list(csv.reader(text.splitlines()))
        if not rows:
            if text != raw:
                self.path.write_text(text)
            return
        keep = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= iteration]
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            csv.writer(f).writerows(keep)
        tmp.replace(self.path)

    def append(self, rows: list[dict[str, float]]) -> None:
        if not rows:
            return
        new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)
            f.flush()


def read_metrics(path: Path) -> tuple[list[str], Any]:
    import numpy as np
    with Path(path).open() as f:
        rows = list(csv.reader(f))
    header, data = rows[0], np.asarray(rows[1:], dtype=np.float64).reshape(-1, len(rows[0]))
    return header, data


class Tracker:
    """No-op base: files only."""

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        pass

    def artifact(self, path: Path) -> None:
        pass

    def close(self) -> None:
        pass


class TensorboardTracker(Tracker):
    def __init__(self, run_dir: Path):
        from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, iteration, metrics):
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, iteration)

    def close(self):
        self.writer.flush()
        self.writer.close()


class SacredTracker(Tracker):
    def __init__(self, run):
        self.run = run

    def log(self, iteration, metrics):
        for name, value in metrics.items():
            self.run.log_scalar(name, float(value), iteration)

    def artifact(self, path):
        self.run.add_artifact(str(path))


class SeedRowsTail:
    """The rows appended to ``seeds.csv`` since the last call, read incrementally (the
    file can hold millions of rows: each byte is read once)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.header = path, 0, None

    def rows(self) -> list[dict[str, float]]:
        if not self.path.exists():
            return []
        with self.path.open() as f:
            f.seek(self.offset)
            text = f.read()
        end = text.rfind("\n") + 1          # whole lines only
        self.offset += len(text[:end].encode())
        lines = text[:end].splitlines()
        if self.header is None and lines:
            self.header, lines = lines[0].split(","), lines[1:]
        return [dict(zip(self.header, map(float, line.split(",")))) for line in lines if line]


class WandbTracker(Tracker):
    """A W&B run (``wandb.init`` in ``RUN_DIR/wandb``; ``WANDB_MODE=offline`` keeps it
    local, ``WANDB_PROJECT`` names the project, default ``jaxmarket``). Per chunk, at
    its last iteration: every column of ``metrics.csv`` (means over seeds, and the
    per-member ``.../m<k>`` series of populations) and every seed's row of ``seeds.csv``
    as ``seed/<s>/<metric>``. ``summary.json`` and ``metrics.csv`` are saved with the
    run at the end."""

    def __init__(self, run_dir: Path, config: dict):
        import wandb
        self.seeds = SeedRowsTail(run_dir / "seeds.csv")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "jaxmarket"),
                              name=run_dir.name, dir=str(run_dir), config=config)

    def log(self, iteration, metrics):
        data = {k: float(v) for k, v in metrics.items()}
        for row in self.seeds.rows():
            if int(row["iteration"]) == int(iteration):
                data.update({f"seed/{int(row['seed'])}/{k}": v for k, v in row.items()
                             if k not in ("iteration", "seed")})
        self.run.log(data, step=int(iteration))

    def artifact(self, path):
        self.run.save(str(path), base_path=str(Path(path).parent), policy="now")

    def close(self):
        self.run.finish()


def with_tracker(kind: str, run_dir: Path, config: dict, body: Callable[[Tracker], Any],
                 mongo_url: str | None = None) -> Any:
    """Run ``body(tracker)`` inside the chosen tracker's context."""
    if kind == "files":
        return body(Tracker())
    if kind == "tensorboard":
        tracker = TensorboardTracker(run_dir)
        try:
            return body(tracker)
        finally:
            tracker.close()
    if kind == "wandb":
        try:
            import wandb
        except ImportError:
            raise ConfigError("--tracker", "wandb", "wandb installed: pip install "
                              "'jaxmarket[wandb]'") from None
        try:
            tracker = WandbTracker(Path(run_dir), config)
        except wandb.errors.UsageError as err:   # e.g. online without an API key
            raise ConfigError("--tracker wandb", str(err).splitlines()[0],
                              "a W&B login (wandb login) or WANDB_MODE=offline") from None
        try:
            return body(tracker)
        finally:
            tracker.close()
    if kind == "sacred":
        from sacred import Experiment
        from sacred.observers import FileStorageObserver, MongoObserver
        ex = Experiment("jaxmarket", save_git_info=False)
        ex.add_config({"scenario": config})
        ex.observers.append(MongoObserver(url=mongo_url) if mongo_url
                            else FileStorageObserver(str(run_dir / "sacred")))
        result = {}

        @ex.main
        def _main(_run):
            try:
                result["value"] = body(SacredTracker(_run))
            except Interrupted as err:   # re-raised below: sacred would print a traceback
                result["interrupted"] = err

        ex.run(options={"--loglevel": "ERROR"})
        if "interrupted" in result:
            raise result["interrupted"]
        return result.get("value")
    raise ValueError(f"unknown tracker {kind!r}: files, sacred, tensorboard, wandb")
