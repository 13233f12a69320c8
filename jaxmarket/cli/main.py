"""jaxmarket COMMAND [ARGS ...]      (the same as python -m jaxmarket.COMMAND ARGS ...)
jaxmarket --version

Commands:
  train   train the learners of a scenario (default: the shipped budget_monopoly.yaml)
  check   validate a scenario and print it with every default filled in
  plot    plot a run directory's metrics
  sweep   run a grid of settings x seeds
  collect record a scenario's transitions as an offline dataset
  offline train and evaluate an offline learner on a dataset
  record  render an episode of a trained run or a dataset to a GIF or MP4
  impulse the impulse response of a trained Q-learning run (docs/analysis.md)
  reproduce reproduce a published result from its design file (docs/reproductions.md)

jaxmarket COMMAND --help shows a command's own options."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from jaxmarket.cli import parser as make_parser
from jaxmarket.cli import exit_process, run_cli

# each command's module, imported when the command runs: `jaxmarket --help` and a
# command's config error import no command's heavy dependencies
COMMANDS = {"train": "jaxmarket.cli.train", "check": "jaxmarket.cli.check",
            "plot": "jaxmarket.cli.plot", "sweep": "jaxmarket.cli.sweep.main",
            "collect": "jaxmarket.cli.collect", "offline": "jaxmarket.cli.offline",
            "record": "jaxmarket.cli.record", "impulse": "jaxmarket.cli.impulse",
            "reproduce": "jaxmarket.cli.reproduce"}


def package_version() -> str:
    """pyproject's version, from the installed metadata ("unknown" in a source tree that
    was never pip-installed), as ``jaxmarket.__version__``."""
    try:
        return version("jaxmarket")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        return run_cli(importlib.import_module(COMMANDS[argv[0]]).main, argv[1:])
    parser = make_parser("jaxmarket", __doc__)
    parser.add_argument("--version", action="version", version=f"jaxmarket {package_version()}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to run")
    parser.parse_args(argv)   # --version / --help exit here; anything else is an error
    return 2


def console() -> None:
    """The ``jaxmarket`` console script: :func:`main` as the process's exit."""
    exit_process(main())


if __name__ == "__main__":
    console()
