"""python -m jaxmarket.offline --dataset D --algo ALGO ...: train and evaluate an offline
learner on a dataset (jaxmarket.cli.offline)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.offline import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
