"""Experiment tracking: files in the run directory (always), plus optionally sacred
(FileStorageObserver in ``RUN_DIR/sacred`` or a MongoObserver for a ``mongodb://`` URL),
TensorBoard (tensorboardX event files in ``RUN_DIR/tensorboard``) or Weights & Biases
(a W&B run in ``RUN_DIR/wandb``, with every seed's series too)."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxmarket.config.errors import ConfigError, Interrupted


def sync_dir(path: Path) -> None:
    """fsync a directory (a rename or a new file in it made durable); best effort where
    the file system cannot."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CsvMetrics:
    """``metrics.csv`` (and the other row files: ``seeds.csv``, ``pbt.csv``,
    ``mapping.csv``): rows in iteration order, appended as training goes, each append
    synced to disk before the checkpoint that covers it is saved."""

    def __init__(self, path: Path):
        self.path = path

    def truncate_after(self, iteration: int) -> None:
        """Drop rows past ``iteration`` (work lost with an interrupted chunk): the file is
        cut after the longest run of rows, from the top, whose iterations do not go back
        and do not pass ``iteration`` (a row cut by a crash mid-append is dropped too);
        at iteration 0 the file is removed (a new start writes its header)."""
        if not self.path.exists():
            return
        if iteration == 0:
            self.path.unlink()
            return
        with self.path.open("rb") as f:
            data = f.read()
        end = data.find(b"\n") + 1   # the header
        previous = -math.inf
        while end and end < len(data):
            nl = data.find(b"\n", end)
            if nl < 0:
                break
            try:
                it = float(data[end:nl].split(b",", 1)[0])
            except ValueError:
                break
            if it > iteration or it < previous:
                break
            previous, end = it, nl + 1
        if end < len(data):
            with self.path.open("r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

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
            os.fsync(f.fileno())   # on disk before the checkpoint that covers it
        if new:
            sync_dir(self.path.parent)


def read_metrics(path: Path) -> tuple[list[str], Any]:
    with Path(path).open() as f:
        rows = list(csv.reader(f))
    header, data = rows[0], np.asarray(rows[1:], dtype=np.float64).reshape(-1, len(rows[0]))
    return header, data


def count_rows(path: Path) -> int:
    """Data rows of a metrics CSV (its lines but the header), counted without parsing."""
    lines, last = 0, b"\n"
    with Path(path).open("rb") as f:
        while block := f.read(1 << 24):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n") - 1


def _tail_lines(path: Path, enough: Callable[[list[bytes]], bool]) -> tuple[bytes, list[bytes]]:
    """The header line and the last complete data lines of a CSV, read backwards in
    growing blocks until ``enough(lines)`` (or the whole file is read)."""
    with Path(path).open("rb") as f:
        header = f.readline()
        begin = f.tell()
        pos, buf, block, lines = f.seek(0, 2), b"", 1 << 16, []
        while pos > begin:
            step = min(block, pos - begin)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
            parts = buf.split(b"\n")
            lines = [x for x in (parts[1:] if pos > begin else parts) if x.strip()]
            if enough(lines):
                break
            block *= 2
    return header, lines


def _parse(header: bytes, lines: list[bytes]) -> tuple[list[str], np.ndarray]:
    """As :func:`read_metrics` parses (csv, then NumPy's float64 of the text)."""
    head = next(csv.reader([header.decode()]))
    rows = list(csv.reader(x.decode() for x in lines))
    return head, np.asarray(rows, dtype=np.float64).reshape(-1, len(head))


def read_last_rows(path: Path, n: int) -> tuple[list[str], np.ndarray]:
    """The header and the last ``n`` rows of a metrics CSV, parsed as :func:`read_metrics`
    parses them, reading only the end of the file."""
    header, lines = _tail_lines(path, lambda lines: len(lines) >= n)
    return _parse(header, lines[-n:] if n else [])


def read_rows_since(path: Path, iteration: float) -> tuple[list[str], np.ndarray]:
    """The header and the rows of iterations ``>= iteration`` of a metrics CSV (rows in
    iteration order, ``iteration`` the first column), reading only the end of the file."""
    def enough(lines):
        return bool(lines) and float(lines[0].split(b",", 1)[0]) < iteration
    header, lines = _tail_lines(path, enough)
    head, data = _parse(header, lines)
    return head, data[data[:, 0] >= iteration]


class ParquetRows:
    """The per-seed rows as Parquet (``train.seeds_format: parquet``): a directory
    ``seeds.parquet/`` of parts, one per appended chunk, each written under a temporary
    name and renamed (a crash leaves whole parts only), named by their first and last
    iteration so that sorting the names sorts the rows. Columns as ``seeds.csv``:
    ``iteration`` and ``seed`` int64, the metrics float64. pandas and pyarrow read the
    directory as one table (``pandas.read_parquet(RUN/seeds.parquet)``)."""

    def __init__(self, path: Path):
        self.path = path

    def parts(self) -> list[Path]:
        return sorted(self.path.glob("part-*.parquet")) if self.path.is_dir() else []

    @staticmethod
    def _span(part: Path) -> tuple[int, int]:
        _, first, last = part.stem.split("-")
        return int(first), int(last)

    def _write(self, table: Any) -> None:
        import pyarrow.parquet as pq
        it = table.column("iteration")
        first, last = it[0].as_py(), it[len(it) - 1].as_py()
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / f"part-{first:010d}-{last:010d}.parquet"
        tmp = final.with_suffix(".tmp")
        pq.write_table(table, tmp)
        with tmp.open("rb+") as f:   # on disk before the checkpoint that covers it
            os.fsync(f.fileno())
        tmp.replace(final)
        sync_dir(self.path)

    def append(self, rows: list[dict[str, float]]) -> None:
        if not rows:
            return
        import pyarrow as pa
        columns = {k: [r[k] for r in rows] for k in rows[0]}
        self._write(pa.table({k: pa.array(v, pa.int64() if k in ("iteration", "seed")
                                          else pa.float64()) for k, v in columns.items()}))

    def truncate_after(self, iteration: int) -> None:
        """Drop rows past ``iteration`` (parts after it removed, one across it cut)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        for tmp in self.path.glob("*.tmp") if self.path.is_dir() else []:
            tmp.unlink()
        for part in self.parts():
            first, last = self._span(part)
            if first > iteration:
                part.unlink()
            elif last > iteration:
                table = pq.read_table(part)
                part.unlink()
                self._write(table.filter(pc.less_equal(table.column("iteration"), iteration)))

    def read(self, since: float = -math.inf) -> tuple[list[str], np.ndarray] | None:
        """``(header, rows)`` of iterations ``>= since`` (only the parts that hold them
        are read); None without any part."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        parts = [p for p in self.parts() if self._span(p)[1] >= since]
        if not parts:
            return None
        table = pa.concat_tables([pq.read_table(p) for p in parts])
        data = np.column_stack([table.column(c).to_numpy().astype(np.float64)
                                for c in table.column_names])
        return list(table.column_names), data[data[:, 0] >= since]


def seed_rows_file(run_dir: Path, seeds_format: str) -> CsvMetrics | ParquetRows:
    """The writer of the per-seed rows: ``seeds.csv`` or ``seeds.parquet/``."""
    if seeds_format == "parquet":
        return ParquetRows(run_dir / "seeds.parquet")
    return CsvMetrics(run_dir / "seeds.csv")


def read_seed_rows(run_dir: Path, seeds_format: str = "csv", since: float = -math.inf
                   ) -> tuple[list[str], np.ndarray] | None:
    """The per-seed rows of iterations ``>= since`` (``seeds.csv`` or
    ``seeds.parquet/``), read from the end; None when the run has none."""
    if seeds_format == "parquet":
        return ParquetRows(run_dir / "seeds.parquet").read(since)
    path = run_dir / "seeds.csv"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    return read_rows_since(path, since)


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
        try:
            from sacred import Experiment
            from sacred.observers import FileStorageObserver, MongoObserver
        except ImportError as err:   # not installed, or its pkg_resources is gone
            raise ConfigError("--tracker", "sacred", "sacred importable (here: "
                              f"{type(err).__name__}: {err}): pip install "
                              "'jaxmarket[sacred]' (sacred plus setuptools<81, whose "
                              "pkg_resources it imports)") from None
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
