"""python -m jaxmarket.plot RUN_DIR [--smooth N]: a run's metrics as PNGs
(jaxmarket.cli.plot)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.plot import main
# the plotting API the notebooks and docs use: jaxmarket.plot.plot_run(...)
from jaxmarket.cli.plot import cross_play, load_run, plot_run, plot_series, run_groups  # noqa: F401

if __name__ == "__main__":
    sys.exit(run_cli(main))
