"""python -m jaxmarket.sweep [CONFIG | --config CONFIG] --grid 'KEY=[v1, v2, ...]' ...
    [--seeds N] [--run-dir DIR] [--metric NAME] [--backend local|ray] [key=value ...]
python -m jaxmarket.sweep --resume DIR [--backend local|ray]

Trains a scenario once per cell of a grid: the Cartesian product of the --grid axes
(each KEY a dotted config path as in overrides, the values a YAML list). Every cell is a
normal training run (python -m jaxmarket.train with the cell's values as overrides and
train.num_seeds=N, all seeds in one compiled program) in DIR/cells/<cell>/; other
key=value overrides apply to every cell. Every cell's config is validated before the
first one runs. At the end DIR holds sweep.csv (one row per cell and seed: the grid
values and the final metrics final/<group>/<metric> of that seed), summary.json (per
cell: mean and sd over seeds) and sweep.png (a heatmap of the mean of --metric over the
first two axes, or a line with a band over seeds for one axis).
--resume DIR runs the cells that have no summary.json (an interrupted cell continues from
its last checkpoint) and rewrites the three files. Compiled programs go to JAX's
persistent compilation cache in DIR/jax_cache (--compile-cache), so cells that differ
only in data (the seed, a market parameter such as a budget or a temperature, a
learner hyperparameter kept per member such as a learning rate) compile once. --backend ray runs cells
as Ray tasks (pip install -e '.[ray]'; --address of a running cluster, a local one by
default). Details: docs/sweeps.md."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from jaxmarket.cli import Interrupted, run_cli
from jaxmarket.compile_cache import compilation_cache
from jaxmarket.cli import parser as make_parser
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import _split_path, load_config

SWEEP_FILE = "sweep.yaml"   # the sweep's own spec, read back by --resume
CACHE_DIR = "jax_cache"     # default persistent compilation cache, inside the sweep directory
FINAL = "final/"            # prefix of the metric columns of sweep.csv
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class SweepInterrupted(Interrupted):
    """Ctrl-C during a sweep (exit code 130 from the CLI): a local cell checkpoints its
    running chunk as the trainer does; Ray cells keep their last checkpoint. The message
    says how to resume the whole sweep."""

    def __init__(self, cell: int | None, run_dir: str):
        self.iteration, self.run_dir, self.cell = 0, run_dir, cell
        where = f" in cell {cell}" if cell is not None else ""
        Exception.__init__(self, f"sweep interrupted{where}; resume with "
                                 f"python -m jaxmarket.sweep --resume {run_dir}")


# ----------------------------------------------------------------------------- the grid

@dataclass(frozen=True)
class Axis:
    key: str            # the dotted path as given, e.g. market.distributor.temperature
    values: tuple       # YAML values, numeric strings such as 1e-3 read as numbers

    @property
    def path(self) -> tuple:
        return tuple(_split_path(self.key))


def _canonical(parts: Sequence) -> str:
    """Path parts -> the spelling config errors use: ``market.sellers[0].count``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out


def _number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; the config validators take it as
    the number it spells, and so does the sweep (in its CSV, summary and plot)."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value) if not value.strip().lstrip("+-").isdigit() else int(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def yaml_text(value: Any) -> str:
    """A value as the YAML text of a ``key=value`` override that reads back equal."""
    text = yaml.safe_dump([value], default_flow_style=True, width=10**9).strip()[1:-1]
    if yaml.safe_load(text) != value:   # pragma: no cover - safe_dump round-trips
        raise ConfigError("--grid", value, "a value that YAML writes and reads back")
    return text


def parse_axis(item: str) -> Axis:
    """``'KEY=[v1, v2]'`` -> :class:`Axis`; a one-line ConfigError naming ``--grid KEY``
    unless the values are a non-empty YAML list of distinct values."""
    if "=" not in item:
        raise ConfigError("--grid", item, "KEY=[v1, v2, ...] with a dotted KEY, e.g. "
                          "'market.distributor.temperature=[0.1, 0.5]'")
    key, text = (s.strip() for s in item.split("=", 1))
    where = f"--grid {key}"
    try:
        parts = _split_path(key)
    except ConfigError:
        raise ConfigError(where, key, "a dotted path like market.sellers[0].count") from None
    try:
        values = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        raise ConfigError(where, text, "a YAML list of values, e.g. [0.1, 0.5]") from None
    if not isinstance(values, list) or not values:
        raise ConfigError(where, values if text else text,
                          "a non-empty YAML list of values, e.g. [0.1, 0.5]")
    values = [_number(v) for v in values]
    for i, v in enumerate(values):
        if any(v == w and type(v) is type(w) for w in values[:i]):
            raise ConfigError(where, values, "distinct values (" + yaml_text(v) + " twice)")
    if _canonical(parts) == "train.num_seeds":
        raise ConfigError(where, values, "not a grid axis: the seeds of every cell are "
                          "--seeds N (the rows of sweep.csv)")
    return Axis(key, tuple(values))


def _prefix(a: tuple, b: tuple) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


@dataclass
class Sweep:
    """What a sweep runs: the scenario file (``config``, its path as given, and
    ``scenario``, its content read when the sweep started: every cell, and a resumed one,
    runs from that copy), the grid axes, the seeds and the shared overrides."""

    config: str
    axes: list[Axis]
    seeds: int | None = None
    overrides: list[str] = field(default_factory=list)
    scenario: dict = field(default_factory=dict)

    def cells(self) -> list[dict[str, Any]]:
        """Every combination, the first axis varying slowest (``itertools.product``)."""
        return [dict(zip([a.key for a in self.axes], combo))
                for combo in itertools.product(*(a.values for a in self.axes))]

    def cell_overrides(self, values: dict[str, Any]) -> list[str]:
        """The ``python -m jaxmarket.train`` overrides that make one cell."""
        seeds = [] if self.seeds is None else [f"train.num_seeds={self.seeds}"]
        return [*self.overrides, *(f"{k}={yaml_text(v)}" for k, v in values.items()), *seeds]

    def to_yaml(self) -> dict:
        return {"config": self.config, "grid": {a.key: list(a.values) for a in self.axes},
                "seeds": self.seeds, "overrides": list(self.overrides),
                "scenario": self.scenario}

    @classmethod
    def from_yaml(cls, raw: dict) -> "Sweep":
        return cls(raw["config"], [Axis(k, tuple(v)) for k, v in raw["grid"].items()],
                   raw["seeds"], list(raw["overrides"]), raw["scenario"])


def make_sweep(config: str, grid: Sequence[str], seeds: int | None = None,
               overrides: Sequence[str] = ()) -> Sweep:
    """Parse and cross-check the command line (not the cells: :func:`validate`)."""
    if not grid:
        raise ConfigError("--grid", None, "at least one --grid 'KEY=[v1, v2, ...]'")
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise ConfigError("--seeds", seeds, "an integer >= 1")
    axes = [parse_axis(item) for item in grid]
    for i, a in enumerate(axes):
        for b in axes[:i]:
            if a.path == b.path:
                raise ConfigError(f"--grid {a.key}", list(a.values), "each key once (a "
                                  "duplicate --grid; put every value in one list)")
            if _prefix(a.path, b.path):
                raise ConfigError(f"--grid {a.key}", list(a.values),
                                  f"a key that does not overlap --grid {b.key}")
    for item in overrides:
        if "=" not in item:
            raise ConfigError("overrides", item, "KEY=VALUE with a dotted KEY")
        path = tuple(_split_path(item.split("=", 1)[0].strip()))
        if seeds is not None and _canonical(path) == "train.num_seeds":
            raise ConfigError("train.num_seeds", item, "set by --seeds in a sweep")
        for a in axes:
            if _prefix(a.path, path):
                raise ConfigError(f"--grid {a.key}", list(a.values),
                                  f"a key that no key=value override also sets ({item})")
    scenario = load_config(config)   # a missing file or bad YAML: named once, not per cell
    return Sweep(str(config), axes, seeds, list(overrides), scenario)


# ------------------------------------------------------------------------ validation

@dataclass
class Cell:
    index: int
    values: dict[str, Any]
    overrides: list[str]
    config: dict
    groups: list[str]
    num_products: int

    def columns(self) -> list[str]:
        """The ``final/`` columns this cell contributes to sweep.csv."""
        cols = []
        for g in self.groups:
            cols += [f"{FINAL}{g}/mean_price/p{j}" for j in range(self.num_products)]
            cols.append(f"{FINAL}{g}/mean_reward")
            cols += [f"{FINAL}{g}/mean_traffic/p{j}" for j in range(self.num_products)]
        return cols


def _grid_error(err: ConfigError, sweep: Sweep, cell: int, values: dict) -> ConfigError:
    """A cell's config error, named after the ``--grid`` key it comes from (the error's
    field is that key, inside it or above it), else with the cell's values appended."""
    field_path = err.field
    for a in sweep.axes:
        key = _canonical(a.path)
        if field_path == key or field_path.startswith((key + ".", key + "[")) \
                or key.startswith((field_path + ".", field_path + "[")):
            where = "" if field_path == key else f"{field_path}, "
            return ConfigError(f"--grid {a.key}", err.value,
                               f"{err.allowed} ({where}sweep cell {cell})")
    shown = ", ".join(f"{k}={yaml_text(v)}" for k, v in values.items())
    return ConfigError(err.field, err.value, f"{err.allowed} (sweep cell {cell}: {shown})")


def validate(sweep: Sweep) -> list[Cell]:
    """Load and validate every cell's config as ``python -m jaxmarket.train`` would
    before compiling (train and learners sections, the market, the learner specs and the
    early-stop metric): a one-line ConfigError before anything runs or is written."""
    from jaxmarket.train.plan import resolve

    cells = []
    for i, values in enumerate(sweep.cells()):
        overrides = sweep.cell_overrides(values)
        try:
            config = load_config(sweep.scenario, overrides)
            env = resolve(config).env
        except ConfigError as err:
            raise _grid_error(err, sweep, i, values) from None
        cells.append(Cell(i, values, overrides, config, list(env.agent_groups),
                          int(env.spec.num_products)))
    return cells


def default_metric(cells: list[Cell]) -> str:
    """The first agent group's ``mean_reward``."""
    return f"{FINAL}{cells[0].groups[0]}/mean_reward"


def check_metric(metric: str | None, cells: list[Cell]) -> str:
    if metric is None:
        return default_metric(cells)
    names = list(dict.fromkeys(c for cell in cells for c in cell.columns()))
    if metric not in names and f"{FINAL}{metric}" in names:
        metric = f"{FINAL}{metric}"
    if metric not in names:
        raise ConfigError("--metric", metric, "one of " + ", ".join(names))
    return metric


# -------------------------------------------------------------------------- running

def run_cell(scenario: dict, overrides: list[str], cell_dir: str,
             compile_cache: str | None = None) -> dict:
    """One cell: the summary.json of a finished cell; an interrupted one (a config.yaml
    and maybe checkpoints) continues from its last checkpoint with ``resume_run`` (the
    result is bit-identical to an uninterrupted run); a new one runs with ``start_run``,
    as ``python -m jaxmarket.train CONFIG --run-dir CELL_DIR OVERRIDES`` does
    (``scenario`` is CONFIG's content: ``load_config`` reads a mapping as it reads the
    file)."""
    from jaxmarket.train.run import resume_run, start_run

    path = Path(cell_dir)
    if (path / "summary.json").is_file():
        return json.loads((path / "summary.json").read_text())
    with compilation_cache(compile_cache):
        if (path / "config.yaml").is_file():
            if load_config(path / "config.yaml") != load_config(scenario, overrides):
                raise ConfigError("--resume", str(path), "a cell whose config.yaml is the "
                                  "sweep's (it was changed; delete the cell to run it anew)")
            return resume_run(str(path))
        if path.exists():   # created but killed before its config.yaml was written: empty
            shutil.rmtree(path)
        return start_run(scenario, overrides, str(path))


def _progress(total: int, done: int):
    from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total} cells"),
                   TextColumn("{task.fields[cell]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                   disable=not os.isatty(2) and os.environ.get("JAXMARKET_PROGRESS") != "1")
    task = bar.add_task("sweep", total=total, completed=done, cell="")
    return bar, task


def _describe(values: dict) -> str:
    return ", ".join(f"{k}={yaml_text(v)}" for k, v in values.items())


def _run_local(sweep: Sweep, cells: list[Cell], run_dir: Path, todo: list[Cell],
               cache: str | None) -> None:
    bar, task = _progress(len(cells), len(cells) - len(todo))
    # rich >= 14.1 nests the trainer's bar inside this one; older versions allow one live
    # display, so this one pauses while a cell runs
    nested = hasattr(bar.console, "_live_stack")
    with bar:
        for n, cell in enumerate(todo):
            bar.update(task, cell=f"cell {cell.index}: {_describe(cell.values)}")
            print(f"sweep cell {cell.index} ({n + 1}/{len(todo)} to run): "
                  f"{_describe(cell.values)}", flush=True)
            if not nested:
                bar.stop()
            try:
                run_cell(sweep.scenario, cell.overrides,
                         str(run_dir / "cells" / str(cell.index)), cache)
            except (Interrupted, KeyboardInterrupt):
                raise SweepInterrupted(cell.index, str(run_dir)) from None
            if not nested:
                bar.start()
            bar.update(task, advance=1)


def _run_ray(sweep: Sweep, cells: list[Cell], run_dir: Path, todo: list[Cell],
             cache: str | None, address: str | None) -> None:
    ray = import_ray()
    started = not ray.is_initialized()
    if started and address:
        ray.init(address=address)
    elif started:   # a local Ray: quiet, no dashboard
        ray.init(log_to_driver=False, include_dashboard=False)
    try:
        task_fn = ray.remote(num_cpus=1)(run_cell)
        scenario = ray.put(sweep.scenario)
        pending = {task_fn.remote(scenario, c.overrides,
                                  str((run_dir / "cells" / str(c.index)).absolute()), cache): c
                   for c in todo}
        bar, task = _progress(len(cells), len(cells) - len(todo))
        with bar:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                cell = pending.pop(done[0])
                ray.get(done[0])   # a failed cell raises here (ray.exceptions.RayTaskError)
                print(f"sweep cell {cell.index} done: {_describe(cell.values)}", flush=True)
                bar.update(task, advance=1, cell=f"cell {cell.index} done")
    except KeyboardInterrupt:
        raise SweepInterrupted(None, str(run_dir)) from None
    finally:
        if started:
            ray.shutdown()


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend", "ray", "an installed ray: pip install -e '.[ray]' "
                          "(or pip install 'ray[default]')") from None
    return ray


# --------------------------------------------------------------------------- results

def collect(cells: list[Cell], run_dir: Path) -> tuple[list[str], list[dict], dict]:
    """sweep.csv's header and rows (one per cell and seed) and summary.json's content,
    from each cell's summary.json ``per_seed``."""
    keys = {k: csv_column(k) for k in cells[0].values}
    metric_cols = dict.fromkeys(c for cell in cells for c in cell.columns())
    rows, summaries = [], []
    for cell in cells:
        s = json.loads((run_dir / "cells" / str(cell.index) / "summary.json").read_text())
        per_seed = s["per_seed"]
        table: dict[str, list[float]] = {}
        for g in cell.groups:
            for name, per in per_seed[g].items():
                if isinstance(per[0], list):
                    for j in range(len(per[0])):
                        table[f"{FINAL}{g}/{name}/p{j}"] = [float(p[j]) for p in per]
                else:
                    table[f"{FINAL}{g}/{name}"] = [float(p) for p in per]
        metric_cols.update(dict.fromkeys(table))   # any per-seed metric the trainer adds
        num_seeds = len(next(iter(table.values())))
        for seed in range(num_seeds):
            rows.append({"cell": cell.index, "seed": seed,
                         **{keys[k]: _csv_value(v) for k, v in cell.values.items()},
                         **{c: v[seed] for c, v in table.items()}})
        summaries.append({
            "cell": cell.index, "values": cell.values, "run_dir": f"cells/{cell.index}",
            "iterations": s.get("iterations"), "stopped": s.get("stopped"),
            "num_seeds": num_seeds,
            "mean": {c: float(np.mean(v)) for c, v in table.items()},
            "sd": {c: (float(np.std(v, ddof=1)) if len(v) > 1 else None)
                   for c, v in table.items()},
        })
    header = ["cell", "seed", *keys.values(), *metric_cols]   # dict: insertion order
    return header, rows, {"cells": summaries}


def csv_column(key: str) -> str:
    """A grid key's sweep.csv column: the key itself, or ``grid:KEY`` for ``seed`` (the
    scenario's seed as an axis), which would clash with the seed-index column."""
    return f"grid:{key}" if key in ("cell", "seed") else key


def _csv_value(v: Any) -> Any:
    return v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else yaml_text(v)


def write_csv(path: Path, header: list[str], rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, restval="")
        w.writeheader()
        for row in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    tmp.replace(path)


def _label(v: Any) -> str:
    return v if isinstance(v, str) else yaml_text(v)


def plot_data(summary: dict, metric: str | None = None) -> dict:
    """What sweep.png draws, as numbers, from a sweep's summary.json content.

    Two or more axes: ``{"kind": "heatmap", "metric", "rows": axis 0 key, "cols": axis 1
    key, "row_labels", "col_labels", "array"}``, ``array[i, j]`` the mean over seeds of
    the cell with axis-0 value ``i`` and axis-1 value ``j`` (averaged over the cells of
    any further axes). One axis: ``{"kind": "line", "metric", "key", "labels", "x"
    (numbers, or positions for non-numeric values), "mean", "low", "high"}``: the mean
    over seeds and the band from the minimum to the maximum over seeds of each cell."""
    grid = summary["grid"]
    keys = list(grid)
    metric = metric or summary["metric"]
    cells = {c["cell"]: c for c in summary["cells"]}
    shape = [len(v) for v in grid.values()]
    means = np.full(shape, np.nan)
    for combo_index, combo in enumerate(itertools.product(*(range(n) for n in shape))):
        means[combo] = cells[combo_index]["mean"].get(metric, np.nan)
    if len(keys) >= 2:
        array = means.reshape(shape[0], shape[1], -1).mean(axis=2)
        return {"kind": "heatmap", "metric": metric, "rows": keys[0], "cols": keys[1],
                "row_labels": [_label(v) for v in grid[keys[0]]],
                "col_labels": [_label(v) for v in grid[keys[1]]], "array": array}
    values = grid[keys[0]]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    low = np.array([cells[i]["seed_min"].get(metric, np.nan) for i in range(len(values))])
    high = np.array([cells[i]["seed_max"].get(metric, np.nan) for i in range(len(values))])
    return {"kind": "line", "metric": metric, "key": keys[0],
            "labels": [_label(v) for v in values],
            "x": np.array(values, float) if numeric else np.arange(len(values), dtype=float),
            "mean": means.astype(float), "low": low, "high": high}


def make_figure(data: dict, title: str = ""):
    from matplotlib.figure import Figure

    if data["kind"] == "heatmap":
        a = data["array"]
        fig = Figure(figsize=(1.4 * a.shape[1] + 3, 0.8 * a.shape[0] + 2.2))
        ax = fig.add_subplot()
        im = ax.imshow(a, cmap="viridis", aspect="auto", origin="upper")
        fig.colorbar(im, ax=ax, label=data["metric"])
        ax.set_xticks(range(a.shape[1]), data["col_labels"])
        ax.set_yticks(range(a.shape[0]), data["row_labels"])
        ax.set_xlabel(data["cols"])
        ax.set_ylabel(data["rows"])
        mid = np.nanmean(a) if np.isfinite(a).any() else 0.0
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                ax.text(j, i, f"{a[i, j]:.4g}", ha="center", va="center",
                        color="black" if a[i, j] > mid else "white", fontsize=9)
    else:
        fig = Figure(figsize=(6.5, 4))
        ax = fig.add_subplot()
        ax.plot(data["x"], data["mean"], marker="o", label="mean over seeds")
        ax.fill_between(data["x"], data["low"], data["high"], alpha=0.25,
                        label="min-max over seeds")
        ax.set_xticks(data["x"], data["labels"])
        ax.set_xlabel(data["key"])
        ax.set_ylabel(data["metric"])
        ax.legend()
    ax.set_title(title or data["metric"], fontsize=10)
    fig.tight_layout()
    return fig


def write_results(sweep: Sweep, cells: list[Cell], run_dir: Path, metric: str) -> dict:
    """sweep.csv, summary.json and sweep.png from the cells' summaries."""
    header, rows, summary = collect(cells, run_dir)
    for cell_summary in summary["cells"]:
        mine = [r for r in rows if r["cell"] == cell_summary["cell"]]
        cell_summary["seed_min"] = {c: min(r[c] for r in mine) for c in cell_summary["mean"]}
        cell_summary["seed_max"] = {c: max(r[c] for r in mine) for c in cell_summary["mean"]}
    summary = {"config": sweep.config, "grid": {a.key: list(a.values) for a in sweep.axes},
               "seeds": sweep.seeds, "overrides": sweep.overrides, "metric": metric,
               **summary}
    write_csv(run_dir / "sweep.csv", header, rows)
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(run_dir / "summary.json")
    data = plot_data(summary, metric)
    extra = f" (mean over {', '.join(list(summary['grid'])[2:])})" if len(sweep.axes) > 2 else ""
    fig = make_figure(data, f"{metric}: mean over seeds{extra}")
    fig.savefig(run_dir / "sweep.png", dpi=100)
    return summary


# ------------------------------------------------------------------------------ entry

def run_sweep(sweep: Sweep | None, run_dir: str | Path | None, resume: bool = False,
              metric: str | None = None, backend: str = "local",
              address: str | None = None, compile_cache: str | Path | None = CACHE_DIR) -> dict:
    """Validate every cell, run those without a summary.json (all of them unless
    ``resume``), then write sweep.csv, summary.json and sweep.png into ``run_dir``.
    With ``resume`` the spec is ``run_dir``'s sweep.yaml (``sweep`` must be None).
    ``compile_cache``: the persistent compilation cache's directory, relative to
    ``run_dir`` (default ``jax_cache``), or None for none."""
    if backend not in ("local", "ray"):
        raise ConfigError("--backend", backend, "local or ray")
    if resume:
        run_dir = Path(run_dir)
        if not (run_dir / SWEEP_FILE).is_file():
            raise ConfigError("--resume", str(run_dir), f"a sweep directory holding {SWEEP_FILE}")
        sweep = Sweep.from_yaml(yaml.safe_load((run_dir / SWEEP_FILE).read_text()))
    else:
        if run_dir is None:
            run_dir = f"runs/sweep-{Path(sweep.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        from jaxmarket.train.run import require_new_dir
        run_dir = require_new_dir(run_dir, "that sweep: python -m jaxmarket.sweep --resume")
    cells = validate(sweep)
    metric = check_metric(metric, cells)
    if backend == "ray":
        import_ray()   # before anything is written
    todo = [c for c in cells if not (run_dir / "cells" / str(c.index) / "summary.json").is_file()]
    (run_dir / "cells").mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / SWEEP_FILE).write_text(yaml.safe_dump(sweep.to_yaml(), sort_keys=False))
    print(f"sweep directory: {run_dir} ({len(cells)} cells, {len(todo)} to run)", flush=True)
    cache = None if compile_cache is None else str((run_dir / compile_cache).absolute())
    if backend == "ray":
        _run_ray(sweep, cells, run_dir, todo, cache, address)
    else:
        _run_local(sweep, cells, run_dir, todo, cache)
    summary = write_results(sweep, cells, run_dir, metric)
    return {**summary, "run_dir": str(run_dir), "ran": [c.index for c in todo]}


def finish_message(summary: dict) -> str:
    d, metric = summary["run_dir"], summary["metric"]
    lines = [f"{len(summary['cells'])} cells ({len(summary['ran'])} run now); {metric} "
             "(mean +- sd over seeds):"]
    for c in summary["cells"]:
        sd = c["sd"].get(metric)
        lines.append(f"  cell {c['cell']}: {_describe(c['values'])}: {c['mean'][metric]:.6g}"
                     + (f" +- {sd:.3g}" if sd is not None else ""))
    lines += [f"files in {d}/",
              "  sweep.csv      one row per cell and seed: the grid values and "
              "final/<group>/<metric>",
              "  summary.json   per cell: its values, mean and sd over seeds of each final metric",
              f"  sweep.png      {metric}, mean over seeds",
              f"  cells/<cell>/  each cell's run (python -m jaxmarket.plot {d}/cells/0)"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = make_parser("python -m jaxmarket.sweep", __doc__)
    parser.add_argument("--config", default=None, help="scenario YAML (or the first "
                        "positional argument; default configs/legacy_default.yaml)")
    parser.add_argument("--grid", action="append", default=[], metavar="'KEY=[v1, v2, ...]'",
                        help="one axis of the grid (repeat for more; cells are the product)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="train.num_seeds of every cell (default: the scenario's)")
    parser.add_argument("--run-dir", default=None, help="output directory (default "
                        "runs/sweep-NAME-TIME)")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="run the unfinished cells of a sweep and rewrite its results")
    parser.add_argument("--metric", default=None, help="the metric sweep.png shows "
                        "(default final/<first group>/mean_reward)")
    parser.add_argument("--backend", default="local", choices=("local", "ray"))
    parser.add_argument("--address", default=None, help="ray: a cluster address (default: "
                        "start a local Ray)")
    parser.add_argument("--compile-cache", default=CACHE_DIR, metavar="DIR",
                        help="JAX's persistent compilation cache for the cells, relative to "
                             f"the sweep directory (default {CACHE_DIR}; 'none': no cache)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides for every cell, e.g. train.num_iterations=500")
    args = parser.parse_intermixed_args(argv)
    from jaxmarket.train.__main__ import DEFAULT_CONFIG, split_positional

    positional, overrides = split_positional(args.overrides)
    cache = None if args.compile_cache.strip().lower() == "none" else args.compile_cache
    if args.resume:
        if args.config or positional or args.grid or overrides or args.seeds is not None \
                or args.run_dir:
            raise ConfigError("--resume", args.resume, "only --metric, --backend, --address "
                              "and --compile-cache with --resume: the sweep's own sweep.yaml "
                              "is used")
        summary = run_sweep(None, args.resume, resume=True, metric=args.metric,
                            backend=args.backend, address=args.address, compile_cache=cache)
    else:
        if args.config and positional:
            raise ConfigError("config", positional, f"one scenario file (--config {args.config} "
                              "was given too)")
        config = args.config or positional or str(DEFAULT_CONFIG)
        sweep = make_sweep(config, args.grid, args.seeds, overrides)
        summary = run_sweep(sweep, args.run_dir, metric=args.metric, backend=args.backend,
                            address=args.address, compile_cache=cache)
    print(finish_message(summary))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
