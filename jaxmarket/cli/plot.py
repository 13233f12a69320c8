"""``python -m jaxmarket.plot RUN_DIR [RUN_DIR ...] [--smooth N] [--seeds] [--compare]``: PNGs
of prices (budgets for consumer agents), traffic and rewards over training, one figure
per agent group with a line per product, written to RUN_DIR/plots/<group>.png. The lines
are the mean over seeds from RUN_DIR/metrics.csv; when the run's per-seed rows
(seeds.csv or seeds.parquet/) hold two or more seeds, a shaded band around each line
spans the minimum to the maximum over seeds. --seeds draws one thin line per seed
instead, with the 95% bootstrap interval of the mean over seeds as the band. --smooth N
draws a trailing moving average over N iterations (1: the raw values). --compare prints
a table of the runs' summaries (mean over seeds and 95% interval per figure) instead of
plotting."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from jaxmarket.analysis.plots import check_smooth, plot_run
from jaxmarket.analysis.runs import compare_rows
from jaxmarket.cli import plain


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.plot",
                                     description=plain(__doc__))
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    # a string checked by check_smooth, so a bad value is a ConfigError (exit code 2
    # with one line naming --smooth) rather than argparse's usage dump
    parser.add_argument("--smooth", default="1", metavar="N",
                        help="trailing moving average over N iterations (default 1: raw)")
    parser.add_argument("--seeds", action="store_true",
                        help="a line per seed, and the 95%% bootstrap interval of the mean "
                             "as the band (default: the min-max band)")
    parser.add_argument("--compare", action="store_true",
                        help="print a table of the runs' summaries instead of plotting")
    args = parser.parse_args(argv)
    if args.compare:
        print(compare_table(compare_rows(args.run_dirs)))
        return 0
    for run_dir in args.run_dirs:
        for path in plot_run(run_dir, check_smooth(args.smooth), args.seeds):
            print(path)
    return 0


def compare_table(rows: list[dict]) -> str:
    """:func:`~jaxmarket.analysis.runs.compare_rows` as text: a row per figure, a column
    per run (numbers to 4 significant digits, ``-`` where a run lacks the figure)."""
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "run"]
    head = ["", *(Path(r["run"]).name or r["run"] for r in rows)]

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    table = [head] + [[k, *(cell(r.get(k)) for r in rows)] for k in keys]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip()
                     for row in table)
