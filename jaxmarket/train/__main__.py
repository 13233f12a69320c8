"""python -m jaxmarket.train [CONFIG] [key=value ...]: train the learners of a scenario
(jaxmarket.cli.train)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.train import main

if __name__ == "__main__":
    exit_process(run_cli(main))
