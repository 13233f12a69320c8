"""python -m jaxmarket.sweep CONFIG --grid 'KEY=[v1, v2, ...]' ...: a grid of settings x
seeds (jaxmarket.cli.sweep)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.sweep.main import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
