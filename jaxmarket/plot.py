"""python -m jaxmarket.plot RUN_DIR [--smooth N]: a run's metrics as PNGs
(jaxmarket.cli.plot)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.plot import main
from jaxmarket.cli.plot import cross_play, load_run, plot_run, plot_series, run_groups  # noqa: F401  (tests/test_population.py)

if __name__ == "__main__":
    sys.exit(run_cli(main))
