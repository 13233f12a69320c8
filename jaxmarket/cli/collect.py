"""python -m jaxmarket.collect --config CONFIG --steps N --out DIR [options] [key=value ...]
python -m jaxmarket.collect --policy RUN_DIR --steps N --out DIR [options]

Records an offline dataset: rolls the scenario's train.num_envs x train.num_seeds markets
N steps in a compiled loop (every agent group acting through its learner's initial
state, or a trained run's last checkpoint with --policy) and writes every agent group's
transitions (obs, action, reward, next obs, terminal/timeout, behaviour log-probability,
market info) to DIR chunk by chunk. --capacity M keeps a uniform reservoir sample of M
rows per group instead. --noise SIGMA or --grid K [--epsilon E] make the --group (default
the first agent group) a noisy behaviour policy with exact propensities. DIR is written
under a temporary name and renamed when complete. Format: docs/offline.md."""

from __future__ import annotations

import json

from jaxmarket.cli import parser as make_parser
from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.collect import collect
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
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    for item in args.overrides:
        if "=" not in item:
            raise ConfigError("overrides", item, "KEY=VALUE settings, e.g. train.num_envs=64")
    # one writer per output: OUT.lock beside it (OUT itself appears by a rename at the end)
    with lock_beside(args.out, "dataset directory"):
        summary = collect(args.config, args.steps, args.out, policy_dir=args.policy,
                          overrides=args.overrides, capacity=args.capacity, chunk=args.chunk,
                          group=args.group, noise=args.noise, grid=args.grid,
                          epsilon=args.epsilon, seed=args.seed, progress=True)
    print(json.dumps(summary))
    return 0
