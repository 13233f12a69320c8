"""Training throughput of a population against the same learners without one.

bench_b (32 sellers, 8 products, 10 consumers, logit), every seller an actor-critic
``ppo`` learner observing its own price and traffic, trained by the library's loop
(``benchmarks/train_throughput.py``'s ``time_chunk``: ``jit(run_chunk)`` as the Trainer
compiles it), at the same number of markets in four settings:

* ``single``: no population (one parameter set per seller position, today's default);
* ``sync``: ``population: K``, market e driven by member e mod K;
* ``resample``: a balanced redraw of whole markets to members after every episode
  (``every: 1``, episode_length = rollout_length, so every iteration draws);
* ``resample_mixed``: the same, one draw per agent (``mix_in_env: true``).

Targets (ratios in one run): sync >= 0.8 x single, resample >= 0.6 x sync.

    python benchmarks/population_throughput.py --json
    python benchmarks/population_throughput.py --num-envs 256 --members 8 --iterations 10

With ``--json`` the last printed line is JSON with the keys ``single_env_steps_per_s``,
``sync_env_steps_per_s``, ``resample_env_steps_per_s``, ``resample_mixed_env_steps_per_s``,
``num_envs``, ``members`` and the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import machine  # noqa: E402
from train_throughput import time_chunk  # noqa: E402

from jaxmarket.config.loader import load_config  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

PPO = {"kind": "ppo", "hidden_sizes": [32, 32], "num_minibatches": 2, "update_epochs": 2}
OBSERVATION = [{"kind": "own_price"}, {"kind": "own_traffic"}]


def settings(members: int) -> dict:
    return {
        "single": None,
        "sync": {"population": members, "mapping": "sync"},
        "resample": {"population": members, "mapping": {"kind": "resample", "every": 1}},
        "resample_mixed": {"population": members,
                           "mapping": {"kind": "resample", "every": 1, "mix_in_env": True}},
    }


def scenario(base: dict, population: dict | None, rollout: int) -> dict:
    config = copy.deepcopy(base)
    config["market"]["episode_length"] = rollout
    for seller in config["market"]["sellers"]:
        seller["observation"] = OBSERVATION
    config["learners"] = {s["name"]: {**PPO, **(population or {})}
                          for s in config["market"]["sellers"]}
    return config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "bench_b.yaml"))
    ap.add_argument("--num-envs", type=int, default=256, help="markets (one seed)")
    ap.add_argument("--members", type=int, default=8, help="population size K")
    ap.add_argument("--iterations", type=int, default=10, help="iterations per timed chunk")
    ap.add_argument("--rollout-length", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the first")
    ap.add_argument("--json", action="store_true", help="last line: JSON result")
    record.add_arguments(ap, "population_throughput")
    args = ap.parse_args(argv)
    if args.num_envs % args.members:
        ap.error(f"--num-envs ({args.num_envs}) must be a multiple of --members ({args.members})")
    base = load_config(args.config)
    info = machine()
    out = {"num_envs": args.num_envs, "members": args.members, "iterations": args.iterations,
           "rollout_length": args.rollout_length, "config": args.config, "learner": PPO,
           "machine": info}
    print(f"{args.config}, ppo sellers observing {[o['kind'] for o in OBSERVATION]}, "
          f"{args.num_envs} markets, K = {args.members}; machine: {info['cpu']}, "
          f"{info['nproc']} cores, load {info['load_avg']}", flush=True)
    for name, population in settings(args.members).items():
        r = time_chunk(scenario(base, population, args.rollout_length), args.num_envs, 1,
                       args.iterations, args.rollout_length, args.repeats)
        out[f"{name}_env_steps_per_s"] = r["env_steps_per_s"]
        out[f"{name}_compile_s"] = r["compile_s"]
        print(f"  {name:<15} {r['env_steps_per_s']:>12,.0f} env-steps/s  "
              f"(best {r['env_steps_per_s_best']:,.0f}; compile {r['compile_s']:.1f} s)",
              flush=True)
    out["sync_over_single"] = round(out["sync_env_steps_per_s"] / out["single_env_steps_per_s"], 3)
    out["resample_over_sync"] = round(out["resample_env_steps_per_s"]
                                      / out["sync_env_steps_per_s"], 3)
    out["resample_mixed_over_sync"] = round(out["resample_mixed_env_steps_per_s"]
                                            / out["sync_env_steps_per_s"], 3)
    out["targets_met"] = {"sync >= 0.8 single": out["sync_over_single"] >= 0.8,
                          "resample >= 0.6 sync": out["resample_over_sync"] >= 0.6,
                          "resample_mixed >= 0.6 sync": out["resample_mixed_over_sync"] >= 0.6}
    print(f"  sync / single {out['sync_over_single']:.3f} (target >= 0.8); resample / sync "
          f"{out['resample_over_sync']:.3f}, mixed / sync {out['resample_mixed_over_sync']:.3f} "
          "(target >= 0.6)")
    if args.json:
        print(json.dumps(out))
    record.write(args, out, __file__, argv, "population_throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
