"""jaxmarket COMMAND [ARGS ...]      (the same as python -m jaxmarket.COMMAND ARGS ...)
jaxmarket --version

Commands:
  train   train the learners of a scenario (default: the shipped legacy_default.yaml)
  check   validate a scenario and print it with every default filled in
  plot    plot a run directory's metrics
  sweep   run a grid of settings x seeds
  collect record a scenario's transitions as an offline dataset
  offline train and evaluate an offline learner on a dataset
  record  render an episode of a trained run or a dataset to a GIF or MP4

jaxmarket COMMAND --help shows a command's own options."""

from __future__ import annotations

import importlib
import sys

import jaxmarket
from jaxmarket.cli import parser as make_parser
from jaxmarket.cli import run_cli

COMMANDS = {"train": "jaxmarket.train.__main__", "check": "jaxmarket.check",
            "plot": "jaxmarket.plot", "sweep": "jaxmarket.sweep",
            "collect": "jaxmarket.collect", "offline": "jaxmarket.offline.__main__",
            "record": "jaxmarket.record"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module(COMMANDS[argv[0]])
        return run_cli(module.main, argv[1:])
    parser = make_parser("jaxmarket", __doc__)
    parser.add_argument("--version", action="version", version=f"jaxmarket {jaxmarket.__version__}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to run")
    parser.parse_args(argv)   # --version / --help exit here; anything else is an error
    return 2


if __name__ == "__main__":
    sys.exit(main())
