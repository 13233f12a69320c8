"""python -m jaxmarket.check [CONFIG] [key=value ...]: validate a scenario and print it
with every default filled in (jaxmarket.cli.check)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.check import main

if __name__ == "__main__":
    exit_process(run_cli(main))
