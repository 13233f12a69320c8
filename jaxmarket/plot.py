"""python -m jaxmarket.plot RUN_DIR [--smooth N]: a run's metrics as PNGs
(:mod:`jaxmarket.cli.plot`; the plotting library is :mod:`jaxmarket.analysis.plots`)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.plot import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
