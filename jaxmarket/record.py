"""python -m jaxmarket.record ... --out FILE.gif|.mp4: render an episode of a trained run
or a dataset (jaxmarket.cli.record)."""

import sys

from jaxmarket.cli import run_cli
from jaxmarket.cli.record import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
