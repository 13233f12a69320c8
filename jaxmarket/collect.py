"""python -m jaxmarket.collect --config CONFIG --steps N --out DIR ...: record a
scenario's transitions as an offline dataset (jaxmarket.cli.collect)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.collect import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
