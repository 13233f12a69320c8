"""python -m jaxmarket.record ... --out FILE.gif|.mp4: render an episode of a trained run
or a dataset (jaxmarket.cli.record)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.record import main

if __name__ == "__main__":
    exit_process(run_cli(main))
