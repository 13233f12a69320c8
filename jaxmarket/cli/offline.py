"""python -m jaxmarket.offline --dataset D --algo ALGO [--run-dir R] [options] [key=value ...]
python -m jaxmarket.offline --resume R [--steps N]

Trains an offline algorithm (bc, cql, iql, td3_bc, dm, dr) on a dataset directory made
by python -m jaxmarket.collect (or a D4RL .hdf5 file), in compiled chunks of --chunk
updates, writing R/metrics.csv as it trains (the chunk's mean losses and the --eval
evaluators: sim = value in the scenario's simulator, fqe, ope = IPS/SNIPS/DM/DR,
action_diff, value, td) and an orbax checkpoint per chunk. Stops after --steps updates,
or earlier by --time-budget, --patience/--target on --metric, or a non-finite value.
key=value settings are the algorithm's hyperparameters (e.g. gamma=0.9 hidden=[64,64]).
--resume continues R from its last checkpoint, bit-identical to an uninterrupted run.
--export-onnx FILE.onnx writes the final policy as ONNX, checked with onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from jaxmarket.cli import parser as make_parser
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import safe_load
from jaxmarket.offline.algos import device_data, make_algo, sample_batch
from jaxmarket.offline.files import storage_errno, storage_error
from jaxmarket.offline.fit import fit, write_fit_config
from jaxmarket.offline.formats import load_dataset
from jaxmarket.offline.fqe import FQE
from jaxmarket.offline.onnx_export import export_onnx, onnx_max_abs_diff, policy_key
from jaxmarket.offline.ope import BanditOPE
from jaxmarket.offline.scorers import action_difference, td_error, value_estimate
from jaxmarket.offline.simulate import SimulatorValue
from jaxmarket.offline.stop import Stop
from jaxmarket.train.rundir import is_empty, lock_dir
from jaxmarket.train.tracking import with_tracker

EVALUATORS = ("sim", "fqe", "ope", "action_diff", "value", "td")


def build_evaluators(names: list[str], ds, gamma: float, horizon: int, fqe_steps: int,
                     algo=None) -> dict:
    out = {}
    for name in names:
        if name not in EVALUATORS:
            raise ConfigError("--eval", name, "names from " + ", ".join(EVALUATORS))
        if algo is not None and name in ("value", "td") and algo.q_value is None:
            raise ConfigError("--eval", name, f"sim, fqe, action_diff or ope with {algo.name} "
                              "(value and td need an algorithm with a critic)")
        if algo is not None and name in ("ope", "fqe") and ds.discrete and algo.probs is None:
            raise ConfigError("--eval", name, f"an algorithm with action probabilities "
                              f"({algo.name} has none)")
        if name == "sim":
            out[name] = SimulatorValue(ds, steps=horizon, gamma=gamma)
        elif name == "fqe":
            out[name] = FQE(ds, gamma=gamma, steps=fqe_steps)
        elif name == "ope":
            out[name] = BanditOPE(ds)
        elif name == "action_diff":
            out[name] = action_difference(ds)
        elif name == "value":
            out[name] = value_estimate(ds)
        else:
            out[name] = td_error(ds, gamma)
    return out


EVAL_COLUMNS = {"sim": ("sim/mean_reward", "sim/discounted_return"), "fqe": ("fqe",),
                "ope": ("ope/ips", "ope/snips", "ope/dm", "ope/dr", "ope/ess"),
                "action_diff": ("action_diff",), "value": ("value",), "td": ("td",)}


def metric_columns(algo, ds, evals: list[str], batch_size: int) -> list[str]:
    """The columns of metrics.csv: the algorithm's training metrics (from the traced, not
    compiled, update) and the evaluators' columns."""
    state = jax.eval_shape(algo.init, jax.random.key(0))
    batch = jax.eval_shape(lambda: sample_batch(jax.random.key(0), device_data(ds, algo.norm),
                                                batch_size))
    _, metrics = jax.eval_shape(algo.update, state, batch, jax.random.key(0))
    return ["step", *metrics, *(c for e in evals for c in EVAL_COLUMNS[e])]


def parse_hyper(items: list[str]) -> dict:
    hyper = {}
    for item in items:
        if "=" not in item:
            raise ConfigError("hyperparameters", item, "KEY=VALUE settings, e.g. gamma=0.9")
        k, v = item.split("=", 1)
        hyper[k.strip()] = safe_load(v, f"hyperparameters {k.strip()}", marks=False)
    return hyper


def main(argv: list[str]) -> int:
    p = make_parser("python -m jaxmarket.offline", __doc__)
    p.add_argument("--dataset", default=None, help="dataset directory or D4RL .hdf5 file")
    p.add_argument("--group", default=None, help="the dataset's group (default: its primary)")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="accept NaN/inf in the dataset (refused by default)")
    p.add_argument("--algo", default=None, help="bc, cql, iql, td3_bc, dm or dr")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/offline-ALGO)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run")
    p.add_argument("--steps", type=int, default=None, help="total updates (default 10000)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--chunk", type=int, default=1000, help="updates per compiled chunk")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", default="", help="comma-separated: " + ", ".join(EVALUATORS))
    p.add_argument("--graph-eval", default="", help="comma-separated, run inside the "
                   "compiled chunk every --graph-every updates (evaluations.csv): sim, "
                   "action_diff, value, td")
    p.add_argument("--graph-every", type=int, default=100)
    p.add_argument("--eval-gamma", type=float, default=0.9, help="discount of sim and fqe")
    p.add_argument("--eval-horizon", type=int, default=200, help="sim: steps per rollout")
    p.add_argument("--fqe-steps", type=int, default=5000)
    p.add_argument("--metric", default=None, help="the metrics.csv column of --patience/--target")
    p.add_argument("--mode", default="max", choices=("max", "min"))
    p.add_argument("--patience", type=int, default=None)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS")
    p.add_argument("--tracker", default="files",
                   choices=("files", "tensorboard", "sacred", "wandb"),
                   help="also log each row there (as python -m jaxmarket.train does)")
    p.add_argument("--export-onnx", default=None, metavar="FILE.onnx",
                   help="write the final policy as ONNX (the onnx extra)")
    p.add_argument("hyper", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "offline.json").is_file():
            raise ConfigError("--resume", str(run_dir), "a run directory holding offline.json")
        try:
            info = json.loads((run_dir / "offline.json").read_text())
        except (OSError, ValueError) as err:   # unreadable, not UTF-8 or not JSON
            raise ConfigError(f"{run_dir / 'offline.json'}", str(err).splitlines()[0][:120],
                              "the run's offline.json as written (restore it)") from None
        if not isinstance(info, dict) or not isinstance(info.get("stop"), dict):
            raise ConfigError(f"{run_dir / 'offline.json'}", "not the run's settings",
                              "the run's offline.json as written (restore it)")
        if args.steps is not None:
            info["stop"]["steps"] = args.steps
    else:
        if not args.dataset or not args.algo:
            raise ConfigError("--dataset/--algo", None, "both (or --resume RUN_DIR)")
        run_dir = Path(args.run_dir or f"runs/offline-{args.algo}")
        if run_dir.exists() and not is_empty(run_dir):
            raise ConfigError("--run-dir", str(run_dir), "a new or empty directory (to continue "
                              f"it: python -m jaxmarket.offline --resume {run_dir})")
        info = {"dataset": str(Path(args.dataset).absolute()), "group": args.group,
                "allow_nonfinite": args.allow_nonfinite,
                "algo": args.algo, "hyper": parse_hyper(args.hyper),
                "batch_size": args.batch_size, "chunk": args.chunk, "seed": args.seed,
                "eval": [e for e in args.eval.split(",") if e],
                "graph_eval": [e for e in args.graph_eval.split(",") if e],
                "graph_every": args.graph_every,
                "eval_gamma": args.eval_gamma, "eval_horizon": args.eval_horizon,
                "fqe_steps": args.fqe_steps,
                "stop": {"steps": args.steps or 10_000, "time_s": args.time_budget,
                         "metric": args.metric, "patience": args.patience,
                         "target": args.target, "mode": args.mode}}
    if args.export_onnx and not args.export_onnx.endswith(".onnx"):
        raise ConfigError("--export-onnx", args.export_onnx, "a file name ending in .onnx")
    ds = load_dataset(info["dataset"], info["group"],
                      allow_nonfinite=info.get("allow_nonfinite", False))   # older offline.json: no key
    algo = make_algo(info["algo"], ds, **info["hyper"])
    if args.export_onnx:
        policy_key(algo)   # exportable? (before training)
    stop = Stop(**info["stop"])
    graph_names = info.get("graph_eval", [])
    for name in graph_names:
        if name not in ("sim", "action_diff", "value", "td"):
            raise ConfigError("--graph-eval", name, "names from sim, action_diff, value, td")
    graph = build_evaluators(graph_names, ds, info["eval_gamma"], info["eval_horizon"],
                             info["fqe_steps"], algo)
    if "sim" in graph:
        graph["sim"] = graph["sim"].graph
    if stop.metric is not None:   # a column metrics.csv will have, checked before training
        columns = set(metric_columns(algo, ds, info["eval"], info["batch_size"]))
        columns |= {f"graph/{c}" for e in graph_names for c in EVAL_COLUMNS[e]}
        if stop.metric not in columns:
            raise ConfigError("--metric", stop.metric, "one of the metrics.csv columns: "
                              + ", ".join(sorted(columns)))
    evaluators = build_evaluators(info["eval"], ds, info["eval_gamma"], info["eval_horizon"],
                                  info["fqe_steps"], algo)
    with lock_dir(run_dir, "offline run directory"):   # one writer (creates the directory)
        if not args.resume and not is_empty(run_dir):       # started by another meanwhile
            raise ConfigError("--run-dir", str(run_dir), "a new or empty directory (to "
                              f"continue it: python -m jaxmarket.offline --resume {run_dir})")
        try:
            write_fit_config(run_dir, info)
        except OSError as err:
            if storage_errno(err) is None:
                raise
            kept = ("the run as it was (nothing more was trained)" if args.resume else
                    "nothing (nothing was trained)")
            raise storage_error(f"writing {run_dir / 'offline.json'}", storage_errno(err),
                                kept, "run this again", run_dir / "offline.json") from None
        result = with_tracker(args.tracker, run_dir, info, lambda tracker: fit(
            algo, ds, evaluators=evaluators, stop=stop, batch_size=info["batch_size"],
            chunk=info["chunk"], seed=info["seed"], run_dir=run_dir, resume=bool(args.resume),
            verbose=True, logger=tracker, graph_evaluators=graph,
            graph_every=info.get("graph_every", 100)))
        return _finish(args, algo, ds, run_dir, info, result)


def _finish(args, algo, ds, run_dir: Path, info: dict, result) -> int:
    """Write the ONNX export and summary.json; a storage fault there is one line (the
    training is complete and checkpointed: --resume writes them again)."""
    try:
        return _write_finish(args, algo, ds, run_dir, info, result)
    except Exception as err:
        cause = storage_errno(err)
        if cause is None:
            raise
        again = f"python -m jaxmarket.offline --resume {run_dir}" + (
            f" --export-onnx {args.export_onnx}" if args.export_onnx else "")
        raise storage_error(
            "writing " + (f"the ONNX export {args.export_onnx} or " if args.export_onnx
                          else "") + f"{run_dir / 'summary.json'}", cause,
            f"the run in {run_dir}, trained to update {result.steps} (its checkpoints and "
            "metrics.csv)", f"write them again with {again}", run_dir) from None


def _write_finish(args, algo, ds, run_dir: Path, info: dict, result) -> int:
    summary = {"run_dir": str(run_dir), "algo": info["algo"], "steps": result.steps,
               "stopped": result.stopped, "updates_per_s": round(result.updates_per_s, 1),
               "final": result.history[-1] if result.history else {}}
    if args.export_onnx:
        export_onnx(algo, result.state, args.export_onnx)
        summary["onnx"] = args.export_onnx
        summary["onnx_max_abs_diff"] = onnx_max_abs_diff(algo, result.state, args.export_onnx,
                                                         ds["observations"][:4096])
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(run_dir / "summary.json")
    print(json.dumps(summary))
    return 0
