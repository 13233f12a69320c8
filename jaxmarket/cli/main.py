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
  impulse the impulse response of a trained Q-learning run (docs/analysis.md)
  reproduce reproduce a published result from its design file (docs/reproductions.md)

jaxmarket COMMAND --help shows a command's own options."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from jaxmarket.cli import parser as make_parser
from jaxmarket.cli import run_cli
from jaxmarket.cli.check import main as check_main
from jaxmarket.cli.collect import main as collect_main
from jaxmarket.cli.impulse import main as impulse_main
from jaxmarket.cli.offline import main as offline_main
from jaxmarket.cli.plot import main as plot_main
from jaxmarket.cli.record import main as record_main
from jaxmarket.cli.reproduce import main as reproduce_main
from jaxmarket.cli.sweep.main import main as sweep_main
from jaxmarket.cli.train import main as train_main

COMMANDS = {"train": train_main, "check": check_main, "plot": plot_main,
            "sweep": sweep_main, "collect": collect_main, "offline": offline_main,
            "record": record_main, "impulse": impulse_main,
            "reproduce": reproduce_main}


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
        return run_cli(COMMANDS[argv[0]], argv[1:])
    parser = make_parser("jaxmarket", __doc__)
    parser.add_argument("--version", action="version", version=f"jaxmarket {package_version()}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to run")
    parser.parse_args(argv)   # --version / --help exit here; anything else is an error
    return 2


if __name__ == "__main__":
    sys.exit(main())
