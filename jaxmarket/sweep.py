"""python -m jaxmarket.sweep CONFIG --grid 'KEY=[v1, v2, ...]' ...: a grid of settings x
seeds (jaxmarket.cli.sweep)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.sweep.main import main

if __name__ == "__main__":
    exit_process(run_cli(main))
