"""python -m jaxmarket.train [CONFIG | --config CONFIG] [--run-dir DIR] [key=value ...]
python -m jaxmarket.train --resume DIR [train.num_iterations=N ...]
python -m jaxmarket.train --resume DIR --allow-config-change FIELD... [FIELD=VALUE ...]
python -m jaxmarket.train CONFIG --devices N            (default: every local device)
python -m jaxmarket.train CONFIG --ray [ADDRESS]         (a sessions design on a Ray cluster)
python -m jaxmarket.train CONFIG --distributed [--coordinator-address HOST:PORT
                          --num-processes N --process-id I]

Trains the learners of a scenario; with no arguments, the shipped default
(configs/budget_monopoly.yaml). train.engine (auto, loop, sessions) picks the engine: the
session engine plays the pricing literature's independent Q-learning sessions against
the market's outcome tables (train.num_seeds sessions, docs/sessions.md); auto takes it
wherever the design is one it plays exactly and says why not otherwise. Overrides are dotted key=value settings (quote the ones
with brackets: 'market.sellers[0].count=3'). --resume continues an interrupted run from
its last checkpoint, or extends a finished one with train.num_iterations=N; a config.yaml
changed since the run started is refused unless --allow-config-change names the changed
fields (all: accept config.yaml as it is).
Ctrl-C finishes the running chunk, checkpoints it and says how to resume.
On a terminal a progress bar; otherwise (a log) plain lines: when a chunk program is
compiled, then every --progress-every seconds the iteration, rate and ETA.
--devices shards the seeds x markets over N local devices; --distributed joins a
multi-process run (every process runs the same command; docs/scaling.md); --ray plays a
session-engine design's sessions as blocks on a Ray cluster (docs/cluster.md)."""

from __future__ import annotations

import math
import shlex

from jaxmarket.cli import parser as make_parser
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import DEFAULT_CONFIG, load_config
from jaxmarket.config.precheck import precheck
from jaxmarket.sessions.warmup import fork_compile


def split_positional(items: list[str]) -> tuple[str | None, list[str]]:
    """``train x.yaml a=1`` -> ("x.yaml", ["a=1"]): a first positional argument without
    ``=`` is the scenario file (as ``check`` takes it)."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    for item in items:
        if "=" not in item:
            raise ConfigError("overrides", item, "KEY=VALUE settings after the scenario file, "
                              "e.g. train.num_seeds=8")
    return None, items


def check_progress_every(value: str) -> float:
    """``--progress-every`` as a number of seconds > 0 (a ConfigError otherwise)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError("--progress-every", value, "a number of seconds > 0")
    return seconds


def main(argv: list[str]) -> int:
    parser = make_parser("python -m jaxmarket.train", __doc__)
    parser.add_argument("--config", default=None,
                        help=f"scenario YAML (default {DEFAULT_CONFIG.name}); may also be "
                             "given as the first positional argument")
    parser.add_argument("--run-dir", default=None, help="output directory (default runs/NAME-TIME)")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="continue a run (overrides: only train.num_iterations and the "
                             "stop rules)")
    parser.add_argument("--allow-config-change", nargs="+", action="extend", default=[],
                        metavar="FIELD",
                        help="--resume: accept these fields of config.yaml changed since the "
                             "run started (dotted, e.g. market.sellers[0].budget; "
                             "jaxmarket_version: another package version; all: config.yaml as "
                             "it is); FIELD=VALUE settings of them may follow")
    parser.add_argument("--tracker", default="files", choices=("files", "sacred", "tensorboard", "wandb"))
    parser.add_argument("--mongo-url", default=None, help="sacred: a MongoDB URL instead of files")
    parser.add_argument("--compile-cache", default=None, metavar="DIR",
                        help="JAX's persistent compilation cache: a second run of the same "
                             "scenario loads its compiled programs (default: $JAXMARKET_"
                             "COMPILE_CACHE, else ~/.cache/jaxmarket/xla; 'none': off)")
    parser.add_argument("--devices", type=int, default=None, metavar="N",
                        help="local devices to shard the seeds x markets over (default: "
                             "every local device that divides them)")
    parser.add_argument("--distributed", action="store_true",
                        help="join a multi-process run (jax.distributed.initialize; with no "
                             "address flags: JAX_COORDINATOR_ADDRESS etc., or the cluster's "
                             "auto-detection on Cloud TPU pods and SLURM)")
    parser.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                        help="--distributed: process 0's address")
    parser.add_argument("--num-processes", type=int, default=None, metavar="N",
                        help="--distributed: number of processes")
    parser.add_argument("--process-id", type=int, default=None, metavar="I",
                        help="--distributed: this process's index, 0 .. N-1")
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="a session-engine design: its sessions as blocks on the Ray "
                             "cluster whose head is ADDRESS (HOST:PORT or auto; none: a Ray "
                             "of this machine's own); the run directory is the one a single "
                             "process writes (docs/cluster.md)")
    parser.add_argument("--progress-every", default="30", metavar="SECONDS",
                        help="when stdout is not a terminal: seconds between plain progress "
                             "lines (iteration, rate, ETA; default 30)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. seed=3 'market.sellers[0].count=3'")
    args = parser.parse_intermixed_args(argv)
    # FIELD=VALUE after --allow-config-change are settings (argparse gave them to it)
    overrides_given = [f for f in args.allow_config_change if "=" in f]
    args.allow_config_change = [f for f in args.allow_config_change if "=" not in f]
    positional, overrides = split_positional(args.overrides + overrides_given)
    if args.allow_config_change and not args.resume:
        raise ConfigError("--allow-config-change", " ".join(args.allow_config_change),
                          "only with --resume (a new run takes its config as given)")
    address_flags = (args.coordinator_address, args.num_processes, args.process_id)
    if not args.distributed and any(v is not None for v in address_flags):
        raise ConfigError("--coordinator-address/--num-processes/--process-id",
                          " ".join(str(v) for v in address_flags if v is not None),
                          "only with --distributed")
    if args.devices is not None and args.devices < 1:
        raise ConfigError("--devices", args.devices, "a positive integer")
    args.progress_every = check_progress_every(args.progress_every)
    args.command = "python -m jaxmarket.train " + shlex.join(argv)
    if not args.resume:   # the scenario's config errors, before jax is imported
        if args.config and positional:
            raise ConfigError("config", positional, f"one scenario file (--config {args.config} "
                              "was given too)")
        loaded = load_config(args.config or positional or str(DEFAULT_CONFIG), overrides)
        precheck(loaded, "train", say=print)
        # the kernel compiled in child processes beside the start-up (numba's cache empty)
        fork_compile(loaded)
    from jaxmarket.cli import train_run  # jax and the training stack: only now
    return train_run.run(args, positional, overrides)
