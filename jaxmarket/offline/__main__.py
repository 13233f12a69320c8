"""python -m jaxmarket.offline --dataset D --algo ALGO ...: train and evaluate an offline
learner on a dataset (jaxmarket.cli.offline)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.offline import main

if __name__ == "__main__":
    exit_process(run_cli(main))
