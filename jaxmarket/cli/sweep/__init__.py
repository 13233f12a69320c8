"""``python -m jaxmarket.sweep``: a scenario trained once per cell of a grid x seeds.

    grid.py        the --grid axes parsed and cross-checked: make_sweep -> Sweep
    validation.py  every cell's config validated before anything runs; --metric
    backends.py    running the cells: here one by one, or as Ray tasks
    results.py     sweep.csv, summary.json and sweep.png's numbers (plot_data; the
                   figure is jaxmarket.analysis.plots.sweep_figure)
    main.py        run_sweep and the command line (main; not re-exported here, so
                   jaxmarket.cli.sweep.main stays the module)
"""

from __future__ import annotations

from jaxmarket.cli.sweep.backends import SweepInterrupted, run_cell
from jaxmarket.cli.sweep.grid import Axis, Sweep, make_sweep, parse_axis, yaml_text
from jaxmarket.cli.sweep.main import CACHE_DIR, SWEEP_FILE, finish_message, run_sweep
from jaxmarket.cli.sweep.results import plot_data, write_results
from jaxmarket.cli.sweep.validation import Cell, check_metric, validate

__all__ = ["CACHE_DIR", "SWEEP_FILE", "Axis", "Cell", "Sweep", "SweepInterrupted",
           "check_metric", "finish_message", "make_sweep", "parse_axis",
           "plot_data", "run_cell", "run_sweep", "validate", "write_results", "yaml_text"]
