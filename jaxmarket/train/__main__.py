"""python -m jaxmarket.train [CONFIG] [key=value ...]: train the learners of a scenario
(jaxmarket.cli.train)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
