"""python -m jaxmarket.check [CONFIG] [key=value ...]: validate a scenario and print it
with every default filled in (jaxmarket.cli.check)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.check import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
