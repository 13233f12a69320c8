"""A sweep's results from its cells' summaries: ``sweep.csv`` (one row per cell and
seed), ``summary.json`` (per cell: mean and sd over seeds) and ``sweep.png`` (what it
draws: :func:`plot_data`; the figure: :func:`jaxmarket.analysis.plots.sweep_figure`)."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxmarket.analysis.plots import sweep_figure
from jaxmarket.cli.sweep.grid import Sweep, yaml_text
from jaxmarket.cli.sweep.validation import FINAL, Cell
from jaxmarket.train.publish import read_summary


def collect(cells: list[Cell], run_dir: Path) -> tuple[list[str], list[dict], dict]:
    """sweep.csv's header and rows (one per cell and seed) and summary.json's content,
    from each cell's summary.json ``per_seed``."""
    keys = {k: csv_column(k) for k in cells[0].values}
    metric_cols = dict.fromkeys(c for cell in cells for c in cell.columns())
    rows, summaries = [], []
    for cell in cells:
        s = read_summary(run_dir / "cells" / str(cell.index))
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
    fig = sweep_figure(data, f"{metric}: mean over seeds{extra}")
    fig.savefig(run_dir / "sweep.png", dpi=100)
    return summary


__all__ = ["collect", "csv_column", "plot_data", "write_csv", "write_results"]
