"""Ground-truth scenarios at full length: learned value vs theory, error, wall time.

Each scenario trains its config with ``jaxmarket.train.run.start_run`` (into a temporary
directory) and compares the learned price or bid with the number theory gives
(``jaxmarket.market.economics``, computed from the config's own parameters; docs/ground_truths.md):

* ``legacy_budget``  -- legacy default market (``configs/budget_monopoly.yaml``; learner
  settings overridden, see ``LEGACY``), PPO bandit: p* = budget;
* ``logit_monopoly`` -- one seller, logit demand: the Lambert-W monopoly price;
* ``duopoly_nash``   -- two independent sellers: the static Nash price;
* ``duopoly_team``   -- two sellers sharing the team reward: the joint-monopoly price;
* ``second_price``   -- a learning bidder against a U[0, 1] rival: bid = value.

"Learned" is the Gaussian policy's mean (final checkpoint) averaged over seeds; also
shown: the largest per-seed error and the price actually played (the summary's
``mean_price``: samples incl. exploration, last 10 % of the iterations, all seeds).
Wall time includes compiling (most of it: the training itself runs at thousands of
iterations per second).

    python benchmarks/ground_truths.py                  # all, 8 seeds each
    python benchmarks/ground_truths.py --only duopoly_nash duopoly_team --seeds 4
    python benchmarks/ground_truths.py --json           # last line: JSON list
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compile_timer import CompileTimer
from throughput import machine

from jaxmarket.market import economics
from jaxmarket.config.loader import load_config
from jaxmarket.train.slots import per_seed
from jaxmarket.train.run import final_learner_state, start_run
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

CONFIGS = ROOT / "configs"

#: learner settings for the legacy default market that do not overshoot the budget cliff
#: (the config's own lr 0.01 / one market per seed jumps over it after ~10k iterations)
LEGACY = ["learners.seller.learning_rate=0.001", "learners.seller.stddev_low=0.002",
          "learners.seller.buffer_length=4", "train.num_envs=8",
          "train.num_iterations=30000", "train.chunk_size=10000", "train.checkpoint_every=1"]


def logit_economy(config: dict) -> dict:
    seller = config["market"]["sellers"][0]
    dist = config["market"]["distributor"]
    return {"quality": float(seller["quality"]), "cost": float(seller["cost"]),
            "outside_quality": float(dist.get("outside_quality", 0.0)),
            "mu": float(dist["temperature"])}


def target_budget(config):
    return float(config["market"]["consumers"][0]["budget"]), "budget b"


def target_monopoly(config):
    return economics.monopoly_price(**logit_economy(config)), "c + mu (1 + W(e^((a-c-mu-a0)/mu)))"


def target_nash(config):
    return economics.nash_price(2, **logit_economy(config)), "static Nash p_N"


def target_joint(config):
    return economics.joint_monopoly_price(2, **logit_economy(config)), "joint monopoly p_M"


def target_value(config):
    bidder = next(s for s in config["market"]["sellers"] if s["name"] == "bidder")
    return float(bidder["value"]), "value v"


# name: (config, group, overrides, target)
SCENARIOS = {
    "legacy_budget": ("budget_monopoly", "seller", LEGACY, target_budget),
    "logit_monopoly": ("logit_monopoly", "seller", [], target_monopoly),
    "duopoly_nash": ("logit_duopoly", "sellers", [], target_nash),
    "duopoly_team": ("logit_duopoly_team", "sellers", [], target_joint),
    "second_price": ("second_price", "bidder", [], target_value),
}


def run_scenario(name: str, seeds: int, workdir: Path) -> dict:
    config_name, group, overrides, target_fn = SCENARIOS[name]
    overrides = overrides + [f"train.num_seeds={seeds}"]
    run_dir = workdir / name
    t0 = time.perf_counter()
    with redirect_stdout(StringIO()), CompileTimer() as compiled:
        summary = start_run(str(CONFIGS / f"{config_name}.yaml"), overrides, str(run_dir))
    wall = time.perf_counter() - t0
    config = load_config(run_dir / "config.yaml")
    runner = final_learner_state(run_dir)
    params = runner.learners[group].params
    # policy-stacked over the folded seeds: [seeds * policies, products] -> per seed
    mean = np.asarray(per_seed(params["mean"], seeds), np.float64)   # [seeds, policies, P]
    std = np.exp(np.asarray(per_seed(params["log_std"], seeds), np.float64))
    target, formula = target_fn(config)
    learned = float(mean.mean())
    row = {
        "scenario": name, "config": f"configs/{config_name}.yaml", "overrides": overrides,
        "theory": round(target, 6), "formula": formula, "learned": round(learned, 6),
        "abs_error": round(learned - target, 6),
        "rel_error": round((learned - target) / target, 6),
        "max_seed_abs_error": round(float(np.abs(mean - target).max()), 6),
        "per_seed": [round(float(x), 4) for x in mean.mean(axis=(1, 2))],
        "played_price": round(summary["final"][group]["mean_price"][0], 6),
        "final_stddev": round(float(std.mean()), 5),
        "mean_reward": round(summary["final"][group]["mean_reward"], 6),
        "iterations": summary["iterations"], "seeds": seeds,
        "train": {k: config["train"][k] for k in ("num_envs", "rollout_length")},
        "wall_s": round(wall, 1), "compile_s": round(compiled.seconds, 2),
        "stopped": summary["stopped"],
    }
    if name.startswith("duopoly"):
        econ = logit_economy(config)
        p_n, p_m = economics.nash_price(2, **econ), economics.joint_monopoly_price(2, **econ)
        row["error_over_gap"] = round((learned - target) / (p_m - p_n), 5)
        pi_n, pi_m = (economics.logit_profits([p, p], econ["quality"], econ["cost"],
                                              econ["outside_quality"], econ["mu"])[0]
                      for p in (p_n, p_m))
        row["profit_gain"] = round(float(economics.profit_gain(row["mean_reward"], pi_n, pi_m)), 4)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=None)
    ap.add_argument("--seeds", type=int, default=8, help="num_seeds for every scenario")
    ap.add_argument("--json", action="store_true", help="last line: JSON list of results")
    record.add_arguments(ap, "ground_truths")
    args = ap.parse_args(argv)
    info = machine()
    print(f"machine: {info['cpu']}, {info['nproc']} cores, load {info['load_avg']}, "
          f"jax {info['jax']} ({info['backend']})", flush=True)
    print(f"{'scenario':<15} {'theory':>9} {'learned':>9} {'error':>9} {'rel':>8} "
          f"{'max seed':>9} {'played':>9} {'iters':>6} {'wall s':>7}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ground_truths_") as tmp:
        for name in args.only or SCENARIOS:
            row = run_scenario(name, args.seeds, Path(tmp))
            row["machine"] = info
            rows.append(row)
            extra = (f"  ({row['error_over_gap']:+.4f} of the Nash-monopoly gap, profit gain "
                     f"{row['profit_gain']:.3f})" if "error_over_gap" in row else "")
            print(f"{name:<15} {row['theory']:>9.4f} {row['learned']:>9.4f} "
                  f"{row['abs_error']:>+9.4f} {100 * row['rel_error']:>+7.2f}% "
                  f"{row['max_seed_abs_error']:>9.4f} {row['played_price']:>9.4f} "
                  f"{row['iterations']:>6} {row['wall_s']:>7.1f}{extra}", flush=True)
    if args.json:
        print(json.dumps(rows))
    record.write(args, rows, __file__, argv, "ground_truths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
