"""Every cell of a sweep validated before the first one runs (:func:`validate`: each
cell's config loaded and prepared as ``python -m jaxmarket.train`` would, a config error
named after the ``--grid`` key it comes from) and the ``--metric`` checked against the
columns the cells will have."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxmarket.cli.sweep.grid import Sweep, canonical, yaml_text
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions.run import choose_engine
from jaxmarket.train.plan import resolve

FINAL = "final/"            # prefix of the metric columns of sweep.csv


@dataclass
class Cell:
    index: int
    values: dict[str, Any]
    overrides: list[str]
    config: dict
    groups: list[str]
    num_products: int
    plan: Any = None   # the cell's RunPlan (what a local run trains; Ray tasks resolve anew)
    engine: str = "loop"   # "sessions": a session-engine cell (one row per session)

    def columns(self) -> list[str]:
        """The ``final/`` columns this cell contributes to sweep.csv (a sessions cell:
        each session's greedy-cycle price, reward and profit gain)."""
        cols = []
        for g in self.groups:
            cols += [f"{FINAL}{g}/mean_price/p{j}" for j in range(self.num_products)]
            cols.append(f"{FINAL}{g}/mean_reward")
            if self.engine == "sessions":
                cols.append(f"{FINAL}{g}/profit_gain")
                continue
            cols += [f"{FINAL}{g}/mean_traffic/p{j}" for j in range(self.num_products)]
        return cols


def _grid_error(err: ConfigError, sweep: Sweep, cell: int, values: dict) -> ConfigError:
    """A cell's config error, named after the ``--grid`` key it comes from (the error's
    field is that key, inside it or above it), else with the cell's values appended."""
    field_path = err.field
    for a in sweep.axes:
        key = canonical(a.path)
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
    cells = []
    for i, values in enumerate(sweep.cells()):
        overrides = sweep.cell_overrides(values)
        try:
            config = load_config(sweep.scenario, overrides)
            engine, _, plan = choose_engine(config)   # a sessions cell: its session plan
            plan = resolve(config) if engine == "loop" else plan
        except ConfigError as err:
            raise _grid_error(err, sweep, i, values) from None
        cells.append(Cell(i, values, overrides, config, list(plan.groups),
                          int(plan.env.spec.num_products), plan, engine))
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


__all__ = ["FINAL", "Cell", "check_metric", "default_metric", "validate"]
