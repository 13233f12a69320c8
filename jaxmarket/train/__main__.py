"""``python -m jaxmarket.train [--config FILE] [--run-dir DIR] [key=value ...]``
``python -m jaxmarket.train --resume DIR``

Trains the learners of a scenario; with no arguments, the shipped default
(``configs/legacy_default.yaml``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxmarket.cli import run_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "legacy_default.yaml"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.train", description=__doc__)
    parser.add_argument("--config", default=None, help=f"scenario YAML (default {DEFAULT_CONFIG.name})")
    parser.add_argument("--run-dir", default=None, help="output directory (default runs/NAME-TIME)")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run")
    parser.add_argument("--tracker", default="files", choices=("files", "sacred", "tensorboard"))
    parser.add_argument("--mongo-url", default=None, help="sacred: a MongoDB URL instead of files")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. seed=3")
    args = parser.parse_args(argv)
    from jaxmarket.train.run import resume_run, start_run
    if args.resume:
        if args.config or args.overrides:
            parser.error("--resume takes the run directory's own config; no --config/overrides")
        summary = resume_run(args.resume, args.tracker, args.mongo_url)
    else:
        config = args.config or str(DEFAULT_CONFIG)
        summary = start_run(config, args.overrides, args.run_dir, args.tracker, args.mongo_url)
    print(json.dumps(summary["final"], indent=2))
    if summary.get("stopped"):
        print(f"stopped: {summary['stopped']}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
