"""jaxmarket reproduce NAME | DESIGN.yaml [--sessions N] [--periods T] [--seed S]
                    [--run-dir DIR] [--ray [ADDRESS]] [--json] [key=value ...]
jaxmarket reproduce --list [--json]

Reproduces a published result: runs the design's config with its overrides on the
session engine, or on the regular trainer where the session engine does not play it
(the same run as python -m jaxmarket.train CONFIG OVERRIDES), into
--run-dir (default runs/reproduce-NAME-TIME) and writes reproduction.json there: the
figure's value over sessions, its 95% bootstrap CI, the published number and the
verdict (docs/reproductions.md). NAME is a shipped design (--list shows them); a
DESIGN.yaml file is a design of your own. --sessions, --periods and --seed set
train.num_seeds, train.num_iterations and seed after the design's overrides; further
key=value overrides follow them. --ray plays a session-engine design's sessions as
blocks on a Ray cluster (docs/cluster.md), with the files a single process writes.
--json prints reproduction.json as the last line
(with --list: the designs as one JSON list)."""

from __future__ import annotations

import json
import shlex

from jaxmarket.cli import parser as make_parser
from jaxmarket.cli.train_run import ray_cluster
from jaxmarket.config.errors import ConfigError
from jaxmarket.sessions import reproduce as rep


def main(argv: list[str]) -> int:
    parser = make_parser("jaxmarket reproduce", __doc__)
    parser.add_argument("design", nargs="?", default=None, metavar="NAME|DESIGN.yaml",
                        help="a shipped design (--list) or a design YAML file")
    parser.add_argument("--list", action="store_true", help="list the shipped designs")
    parser.add_argument("--json", action="store_true",
                        help="print reproduction.json (with --list: the designs) as JSON last")
    parser.add_argument("--sessions", type=int, default=None, metavar="N",
                        help="sessions (train.num_seeds; default: the design's)")
    parser.add_argument("--periods", type=int, default=None, metavar="T",
                        help="periods per session at most (train.num_iterations)")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed")
    parser.add_argument("--run-dir", default=None,
                        help="output directory (default runs/reproduce-NAME-TIME)")
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="a session-engine design: its sessions as blocks on the Ray "
                             "cluster whose head is ADDRESS (HOST:PORT or auto; none: a Ray "
                             "of this machine's own)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="further dotted overrides, e.g. train.chunk_size=10000")
    args = parser.parse_intermixed_args(argv)
    if args.list:
        if args.design is not None or args.overrides:
            raise ConfigError("--list", args.design or args.overrides[0],
                              "no design or overrides with --list")
        designs = rep.list_designs()
        if args.json:
            print(json.dumps([d.listing() for d in designs], ensure_ascii=False))
        else:
            for d in designs:
                print(f"{d.name}  {d.figure}  published {rep.published_text(d.published)}  "
                      f"({d.source})")
        return 0
    if args.design is None:
        raise ConfigError("design", None, "a shipped design name (jaxmarket reproduce --list) "
                          "or a design YAML file")
    for item in args.overrides:
        if "=" not in item:
            raise ConfigError("overrides", item, "KEY=VALUE settings after the design, e.g. "
                              "train.chunk_size=10000")
    design = rep.find_design(args.design)
    overrides = rep.command_overrides(args.sessions, args.periods, args.seed, args.overrides)
    result = rep.reproduce(design, args.run_dir, overrides,
                           command="jaxmarket reproduce " + shlex.join(argv),
                           cluster=ray_cluster(args))
    print(rep.result_lines(result))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    return 0
