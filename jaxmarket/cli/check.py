"""python -m jaxmarket.check [CONFIG] [key=value ...]: print the resolved scenario
(groups, shapes, kinds, parameters, the train settings and each learner with its
defaults filled in) or the configuration error on one line (exit code 2). Without
CONFIG it checks the shipped default, configs/budget_monopoly.yaml. The line before the
last names the engine train.engine resolves to (and why not sessions); the last is the
memory the run needs against the device's (a run that cannot fit is a configuration
error naming the setting to lower); --json prints that estimate as JSON instead.

--equilibrium also solves the static one-shot game of every learning group on the
market's own reward (jaxmarket.equilibrium, docs/equilibrium.md) and prints each group's
Nash equilibrium and joint optimum; with --json the last line is that result as JSON,
{"<group>": {"nash": [[...]], "joint": [[...]], "converged": ..., "nash_reward": [...],
"joint_reward": [...], ...}}."""

from __future__ import annotations

from jaxmarket.cli import parser as make_parser
from jaxmarket.cli.train import DEFAULT_CONFIG, split_positional
from jaxmarket.config.loader import load_config
from jaxmarket.config.precheck import precheck


def main(argv: list[str]) -> int:
    parser = make_parser("python -m jaxmarket.check", __doc__)
    parser.add_argument("config", nargs="?", default=None,
                        help="scenario YAML (default: the shipped configs/budget_monopoly.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="optional dotted overrides, e.g. 'market.sellers[0].count=3'")
    parser.add_argument("--json", action="store_true",
                        help="print the memory estimate as JSON (its terms, bytes, the "
                             "setting sizing each, the device's memory); with "
                             "--equilibrium: the equilibria, as one JSON line")
    parser.add_argument("--equilibrium", action="store_true",
                        help="also solve every learning group's static Nash equilibrium and "
                             "joint optimum on the market's own one-shot reward")
    args = parser.parse_intermixed_args(argv)
    positional, overrides = split_positional(([args.config] if args.config else [])
                                             + args.overrides)
    config = load_config(positional or DEFAULT_CONFIG, overrides)
    if not args.equilibrium or "learners" in config:   # (--equilibrium: learners first)
        precheck(config, "check")   # a config error here costs no jax import
    from jaxmarket.cli import describe  # jax and the training stack: only now
    return describe.run(args, config)
