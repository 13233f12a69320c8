"""python -m jaxmarket.collect --config CONFIG --steps N --out DIR [options] [key=value ...]
python -m jaxmarket.collect --policy RUN_DIR --steps N --out DIR [options]

Records an offline dataset: rolls the scenario's train.num_envs x train.num_seeds markets
N steps in a compiled loop (every agent group acting through its learner's initial
state, or a trained run's last checkpoint with --policy) and writes every agent group's
transitions (obs, action, reward, next obs, terminal/timeout, behaviour log-probability,
market info) to DIR chunk by chunk. --capacity M keeps a uniform reservoir sample of M
rows per group instead. --noise SIGMA or --grid K [--epsilon E] make the --group (default
the first agent group) a noisy behaviour policy with exact propensities. DIR is written
under a temporary name and renamed when complete. Format: docs/offline.md.

--format d4rl writes the --group's transitions as a D4RL HDF5 file (--out FILE.hdf5),
--format minari as a local Minari dataset (--out DATASET_ID, with an env spec that
rebuilds the market); their continuous actions are stored in [-1, 1] (what d3rlpy
assumes; --normalize-actions says so explicitly), or in market units with
--market-units; the file's metadata records which, with the market bounds, so the
readers map them back. docs/ecosystem.md.

A full disk, a read-only or a forbidden path while writing is one line naming the file
and what was kept (nothing: the partial output is removed), exit code 1."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from jaxmarket.cli import parser as make_parser
from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.collect import collect
from jaxmarket.offline.dataset import check_out
from jaxmarket.offline.formats import EXPORT_FORMATS, export_dataset, load_dataset
from jaxmarket.train.rundir import lock_beside


def main(argv: list[str]) -> int:
    p = make_parser("python -m jaxmarket.collect", __doc__)
    p.add_argument("--config", default=None, help="scenario YAML")
    p.add_argument("--policy", default=None, metavar="RUN_DIR",
                   help="a trained run directory: its scenario and learner states")
    p.add_argument("--steps", type=int, required=True, help="steps of every market")
    p.add_argument("--out", required=True, help="new dataset directory")
    p.add_argument("--capacity", type=int, default=None,
                   help="keep a uniform reservoir sample of this many rows per group")
    p.add_argument("--chunk", type=int, default=1000, help="steps per compiled chunk")
    p.add_argument("--group", default=None, help="the group made noisy (default: the first)")
    p.add_argument("--noise", type=float, default=None, help="truncated-Gaussian std")
    p.add_argument("--grid", type=int, default=None, help="discrete: number of price levels")
    p.add_argument("--epsilon", type=float, default=0.1, help="discrete: exploration rate")
    p.add_argument("--seed", type=int, default=None, help="overrides the scenario's seed")
    p.add_argument("--format", default="native", choices=("native", *EXPORT_FORMATS),
                   help="native directory (every group), d4rl .hdf5 or minari id (--group)")
    p.add_argument("--normalize-actions", action="store_true",
                   help="d4rl/minari: actions in [-1, 1] (the default)")
    p.add_argument("--market-units", action="store_true",
                   help="d4rl/minari: actions in market units instead of [-1, 1]")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    for item in args.overrides:
        if "=" not in item:
            raise ConfigError("overrides", item, "KEY=VALUE settings, e.g. train.num_envs=64")
    for flag, given in (("--normalize-actions", args.normalize_actions),
                        ("--market-units", args.market_units)):
        if given and args.format == "native":
            raise ConfigError(flag, True, "--format d4rl or minari (a native dataset keeps "
                              "market units and records its bounds)")
    if args.normalize_actions and args.market_units:
        raise ConfigError("--market-units", True, "one of --market-units and "
                          "--normalize-actions (the default), not both")
    normalize = not args.market_units

    def run(out):
        return collect(args.config, args.steps, out, policy_dir=args.policy,
                       overrides=args.overrides, capacity=args.capacity, chunk=args.chunk,
                       group=args.group, noise=args.noise, grid=args.grid,
                       epsilon=args.epsilon, seed=args.seed, progress=True)

    if args.format != "minari":   # a path: one that can be created (before the lock)
        check_out(args.out)
    if args.format == "native":
        # one writer per output: OUT.lock beside it (OUT itself appears by a rename at the end)
        with lock_beside(args.out, "dataset directory"):
            summary = run(args.out)
    else:       # collect natively into a temporary directory, then export the one group
        with tempfile.TemporaryDirectory(prefix="jaxmarket-collect-") as tmp:
            summary = run(Path(tmp) / "native")
            ds = load_dataset(Path(tmp) / "native", group=args.group)
            summary["out"] = export_dataset(ds, args.format, args.out,
                                            normalize_actions=normalize)
        summary.update(format=args.format, normalize_actions=normalize and not ds.discrete,
                       group=ds.meta["group"])
    print(json.dumps(summary))
    return 0
