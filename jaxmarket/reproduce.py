"""python -m jaxmarket.reproduce NAME | DESIGN.yaml [--sessions N] [--periods T]
[--seed S] [--run-dir DIR] [--json] [key=value ...], or --list [--json]: reproduce a
published result from its design file (jaxmarket.cli.reproduce)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.reproduce import main

if __name__ == "__main__":
    exit_process(run_cli(main))
