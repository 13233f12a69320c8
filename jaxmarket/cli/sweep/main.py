"""python -m jaxmarket.sweep [CONFIG | --config CONFIG] --grid 'KEY=[v1, v2, ...]' ...
    [--seeds N] [--run-dir DIR] [--metric NAME] [--backend local|ray] [--ray [ADDRESS]]
    [key=value ...]
python -m jaxmarket.sweep --resume DIR [--backend local|ray] [--ray [ADDRESS]]

Trains a scenario once per cell of a grid: the Cartesian product of the --grid axes
(each KEY a dotted config path as in overrides, the values a YAML list). Every cell is a
normal training run (python -m jaxmarket.train with the cell's values as overrides and
train.num_seeds=N, all seeds in one compiled program) in DIR/cells/<cell>/; other
key=value overrides apply to every cell. Every cell's config is validated before the
first one runs. At the end DIR holds sweep.csv (one row per cell and seed: the grid
values and the final metrics final/<group>/<metric> of that seed), summary.json (per
cell: mean and sd over seeds) and sweep.png (a heatmap of the mean of --metric over the
first two axes, or a line with a band over seeds for one axis).
--resume DIR runs the cells that have no published result (an interrupted cell continues from
its last checkpoint) and rewrites the three files. Compiled programs go to JAX's
persistent compilation cache in DIR/jax_cache (--compile-cache), so cells that differ
only in data (the seed, a market parameter such as a budget or a temperature, a
learner hyperparameter kept per member such as a learning rate) compile once. --backend ray runs cells
as Ray tasks (pip install 'jaxmarket[ray]'; --address of a running cluster, a local one by
default); --ray ADDRESS is the same on the cluster whose head is ADDRESS, the sweep
directory on storage every node sees, a cell whose node is lost resumed from its last
checkpoint elsewhere (docs/cluster.md). Details: docs/sweeps.md."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import yaml

from jaxmarket.cli import parser as make_parser
from jaxmarket.cli.sweep.backends import import_ray, run_local, run_ray
from jaxmarket.cli.sweep.grid import Sweep, describe_values, make_sweep
from jaxmarket.cli.sweep.results import write_results
from jaxmarket.cli.sweep.validation import check_metric, validate
from jaxmarket.cli.train import DEFAULT_CONFIG, split_positional
from jaxmarket.cluster.connect import check_address
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import safe_load
from jaxmarket.train.publish import published
from jaxmarket.train.run import require_new_dir
from jaxmarket.train.rundir import lock_dir

SWEEP_FILE = "sweep.yaml"   # the sweep's own spec, read back by --resume
CACHE_DIR = "jax_cache"     # default persistent compilation cache, inside the sweep directory


def run_sweep(sweep: Sweep | None, run_dir: str | Path | None, resume: bool = False,
              metric: str | None = None, backend: str = "local",
              address: str | None = None, compile_cache: str | Path | None = CACHE_DIR,
              command: str | None = None) -> dict:
    """Validate every cell, run those without a summary.json (all of them unless
    ``resume``), then write sweep.csv, summary.json and sweep.png into ``run_dir``.
    With ``resume`` the spec is ``run_dir``'s sweep.yaml (``sweep`` must be None).
    ``compile_cache``: the persistent compilation cache's directory, relative to
    ``run_dir`` (default ``jax_cache``), or None for none."""
    if backend not in ("local", "ray"):
        raise ConfigError("--backend", backend, "local or ray")
    if resume:
        run_dir = Path(run_dir)
        if not (run_dir / SWEEP_FILE).is_file():
            raise ConfigError("--resume", str(run_dir), f"a sweep directory holding {SWEEP_FILE}")
        sweep = Sweep.from_yaml(safe_load((run_dir / SWEEP_FILE).read_text(),
                                          str(run_dir / SWEEP_FILE)))
    else:
        if run_dir is None:
            run_dir = f"runs/sweep-{Path(sweep.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = require_new_dir(run_dir, "that sweep: python -m jaxmarket.sweep --resume")
    cells = validate(sweep)
    metric = check_metric(metric, cells)
    if backend == "ray":
        import_ray()   # before anything is written
        if address is not None:
            check_address(address)
    with lock_dir(run_dir, "sweep directory"):   # one writer: a second sweep stops here
        if not resume:   # another sweep may have started it since the check above
            require_new_dir(run_dir, "that sweep: python -m jaxmarket.sweep --resume")
        todo = [c for c in cells
                if not published(run_dir / "cells" / str(c.index))]
        (run_dir / "cells").mkdir(parents=True, exist_ok=True)
        if not resume:
            (run_dir / SWEEP_FILE).write_text(yaml.safe_dump(sweep.to_yaml(), sort_keys=False))
        print(f"sweep directory: {run_dir} ({len(cells)} cells, {len(todo)} to run)", flush=True)
        cache = None if compile_cache is None else str((run_dir / compile_cache).absolute())
        if backend == "ray":
            run_ray(sweep, cells, run_dir, todo, cache, address, command)
        else:
            run_local(sweep, cells, run_dir, todo, cache)
        summary = write_results(sweep, cells, run_dir, metric)
    return {**summary, "run_dir": str(run_dir), "ran": [c.index for c in todo]}


def finish_message(summary: dict) -> str:
    d, metric = summary["run_dir"], summary["metric"]
    lines = [f"{len(summary['cells'])} cells ({len(summary['ran'])} run now); {metric} "
             "(mean +- sd over seeds):"]
    for c in summary["cells"]:
        sd = c["sd"].get(metric)
        lines.append(f"  cell {c['cell']}: {describe_values(c['values'])}: {c['mean'][metric]:.6g}"
                     + (f" +- {sd:.3g}" if sd is not None else ""))
    lines += [f"files in {d}/",
              "  sweep.csv      one row per cell and seed: the grid values and "
              "final/<group>/<metric>",
              "  summary.json   per cell: its values, mean and sd over seeds of each final metric",
              f"  sweep.png      {metric}, mean over seeds",
              f"  cells/<cell>/  each cell's run (python -m jaxmarket.plot {d}/cells/0)"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = make_parser("python -m jaxmarket.sweep", __doc__)
    parser.add_argument("--config", default=None, help="scenario YAML (or the first "
                        "positional argument; default configs/budget_monopoly.yaml)")
    parser.add_argument("--grid", action="append", default=[], metavar="'KEY=[v1, v2, ...]'",
                        help="one axis of the grid (repeat for more; cells are the product)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="train.num_seeds of every cell (default: the scenario's)")
    parser.add_argument("--run-dir", default=None, help="output directory (default "
                        "runs/sweep-NAME-TIME)")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="run the unfinished cells of a sweep and rewrite its results")
    parser.add_argument("--metric", default=None, help="the metric sweep.png shows "
                        "(default final/<first group>/mean_reward)")
    parser.add_argument("--backend", default="local", choices=("local", "ray"))
    parser.add_argument("--address", default=None, help="ray: a cluster address (default: "
                        "start a local Ray)")
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="the cells as Ray tasks on the cluster whose head is ADDRESS "
                             "(HOST:PORT or auto; none: a Ray of this machine's own); --run-dir "
                             "on storage every node sees (docs/cluster.md)")
    parser.add_argument("--compile-cache", default=CACHE_DIR, metavar="DIR",
                        help="JAX's persistent compilation cache for the cells, relative to "
                             f"the sweep directory (default {CACHE_DIR}; 'none': no cache)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides for every cell, e.g. train.num_iterations=500")
    args = parser.parse_intermixed_args(argv)
    if args.ray is not None:   # --ray [ADDRESS] is --backend ray [--address ADDRESS]
        if args.backend == "local" and "--backend" in argv:
            raise ConfigError("--ray", args.ray, "no --backend local with --ray")
        args.backend = "ray"
        args.address = None if args.ray == "local" else args.ray
    command = "python -m jaxmarket.sweep " + shlex.join(argv)
    positional, overrides = split_positional(args.overrides)
    cache = None if args.compile_cache.strip().lower() == "none" else args.compile_cache
    if args.resume:
        if args.config or positional or args.grid or overrides or args.seeds is not None \
                or args.run_dir:
            raise ConfigError("--resume", args.resume, "only --metric, --backend, --address, "
                              "--ray and --compile-cache with --resume: the sweep's own sweep.yaml "
                              "is used")
        summary = run_sweep(None, args.resume, resume=True, metric=args.metric,
                            backend=args.backend, address=args.address, compile_cache=cache,
                            command=command)
    else:
        if args.config and positional:
            raise ConfigError("config", positional, f"one scenario file (--config {args.config} "
                              "was given too)")
        config = args.config or positional or str(DEFAULT_CONFIG)
        sweep = make_sweep(config, args.grid, args.seeds, overrides)
        summary = run_sweep(sweep, args.run_dir, metric=args.metric, backend=args.backend,
                            address=args.address, compile_cache=cache, command=command)
    print(finish_message(summary))
    return 0
