"""python -m jaxmarket.collect --config CONFIG --steps N --out DIR ...: record a
scenario's transitions as an offline dataset (jaxmarket.cli.collect)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.collect import main

if __name__ == "__main__":
    exit_process(run_cli(main))
