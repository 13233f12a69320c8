"""python -m jaxmarket.plot RUN_DIR [--smooth N]: a run's metrics as PNGs
(:mod:`jaxmarket.cli.plot`; the plotting library is :mod:`jaxmarket.analysis.plots`)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.plot import main

if __name__ == "__main__":
    exit_process(run_cli(main))
