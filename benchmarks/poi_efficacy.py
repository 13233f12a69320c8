"""POI exploration efficacy on configs/poi_demand.yaml (docs/poi.md).

    python benchmarks/poi_efficacy.py [--json] [--iterations N] [--seeds S]
                                      [--variants zero,disagreement,gradient,error,poi_obs]

Each variant is the scenario with ``learners.me.external_model.poi.kind`` set to it (the
``zero`` baseline: no bonus), all seeds in one compiled program, equal env steps.
``poi_obs`` is POI as observation: the ``disagreement`` bonus, and the learner a ``ppo``
actor-critic whose observation is the disagreement at ``k = 8`` own prices on a grid
over its range (rivals at their current prices), through a learned embedding of size 4
(:data:`POI_OBS_LEARNER`; the scenario's ``ppo_bandit`` has no observation). Per
seed and phase (before / after the half-time market change) from the held-out error
curve (``model/me/heldout_error``, logged every ``eval_every`` iterations) and the task
reward (``reward/me``, the market's profit, never the bonus):

* AUC: the mean held-out error over the phase (jaxmarket.models.metrics.auc);
* convergence: iterations from the phase start until the smoothed error (5 points)
  falls below ``--threshold`` (never: the phase length);
* asymptotic error: the mean over the phase's last 20% of evaluations;
* reward: the mean task reward over the phase's last 20% of iterations.

Ratios are per seed against the baseline run of the same seed, summarised by the IQM
over seeds with a 95% percentile-bootstrap interval (rliable's definitions). The last
line with ``--json``: ``{"default": NAME, "seeds": S, "variants": {NAME: {"auc_ratio":
[p1, p2], "reward_ratio": [p1, p2], "convergence_iteration": [..],
"asymptotic_error": [..], ...}}}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxmarket.config.loader import load_config
from jaxmarket.models.metrics import asymptotic, auc, convergence, iqm, iqm_interval
from jaxmarket.train.loop import make_train
from jaxmarket.train.plan import resolve
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

CONFIG = ROOT / "configs" / "poi_demand.yaml"
GROUP = "me"
VARIANTS = "zero,disagreement,gradient,error,poi_obs"
# the poi_obs variant's learner: PPO on the POI observations (a bandit market: gamma 0,
# the advantage is the reward minus the critic's value of the observed POI landscape),
# its initial stddev the ppo_bandit's 0.3 (0.5 in the [-1, 1]-rescaled action space)
POI_OBS_LEARNER = {"kind": "ppo", "hidden_sizes": [32, 32], "learning_rate": 0.003,
                   "gamma": 0.0, "gae_lambda": 0.0, "update_epochs": 4, "num_minibatches": 1,
                   "log_std_init": -0.69, "ent_coef": 0.0}
POI_OBS = {"k": 8, "sampler": "grid", "emb_size": 4, "normalize": "running"}


def run_variant(config: dict, kind: str) -> dict:
    config = copy.deepcopy(config)
    model = config["learners"][GROUP]["external_model"]
    if kind == "poi_obs":
        config["learners"][GROUP] = {**POI_OBS_LEARNER, "external_model": model}
        model["poi_obs"] = dict(POI_OBS)
        kind = "disagreement"
    model["poi"] = {**model["poi"], "kind": kind}
    if kind == "zero":
        model["poi"]["beta"] = 0.0
    plan = resolve(config)
    tcfg = plan.train
    init, run_chunk = make_train(plan)
    n, size = tcfg.num_iterations, tcfg.chunk_size
    t0 = time.perf_counter()
    runner = jax.jit(init)(jax.random.key(int(config.get("seed", 0))))
    chunks, errors, rewards, done = {}, [], [], 0
    while done < n:
        length = min(size, n - done)
        if length not in chunks:
            chunks[length] = jax.jit(lambda r, length=length: run_chunk(r, length),
                                     donate_argnums=0)
        runner, m = chunks[length](runner)
        errors.append(np.asarray(m[f"per_seed/model/{GROUP}/heldout_error"]))
        rewards.append(np.asarray(m[f"per_seed/reward/{GROUP}"]))
        done += length
    return {"error": np.concatenate(errors), "reward": np.concatenate(rewards),
            "seconds": time.perf_counter() - t0,
            "at": plan.schedule[0].at if plan.schedule else n,
            "every": plan.models[GROUP].eval_every}


def phase_stats(out: dict, threshold: float) -> dict:
    """Per seed and phase: auc, convergence, asymptotic error, final reward."""
    err, rew, every, at = out["error"], out["reward"], out["every"], out["at"]
    n, S = rew.shape
    t = np.arange(0, n, every)                     # 0-based iterations with an evaluation
    stats = {k: np.zeros((2, S)) for k in ("auc", "convergence", "asymptotic", "reward")}
    for ph, (lo, hi) in enumerate(((0, at), (at, n))):
        keep = (t >= lo) & (t < hi)
        tail = slice(hi - max(1, (hi - lo) // 5), hi)
        for s in range(S):
            e = err[t[keep], s]
            stats["auc"][ph, s] = auc(t[keep], e)
            c = convergence(t[keep] - lo, e, threshold)
            stats["convergence"][ph, s] = hi - lo if c is None else c
            stats["asymptotic"][ph, s] = asymptotic(e)
            stats["reward"][ph, s] = rew[tail, s].mean()
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the summary as JSON last")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--default", default="disagreement", help="the variant the target is for")
    ap.add_argument("--threshold", type=float, default=0.03,
                    help="held-out RMSE below which a phase counts as converged")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    record.add_arguments(ap, "poi_efficacy")
    args = ap.parse_args(argv)
    overrides = [f"train.num_seeds={args.seeds}"] + list(args.overrides)
    if args.iterations:
        overrides.append(f"train.num_iterations={args.iterations}")
    config = load_config(CONFIG, overrides)
    variants = [v for v in args.variants.split(",") if v]
    if "zero" not in variants:
        variants.insert(0, "zero")
    results, stats = {}, {}
    for v in variants:
        results[v] = run_variant(config, v)
        stats[v] = phase_stats(results[v], args.threshold)
        print(f"{v}: {results[v]['seconds']:.1f} s", file=sys.stderr)
    base = stats["zero"]
    summary = {"default": args.default, "seeds": args.seeds,
               "iterations": int(results["zero"]["reward"].shape[0]),
               "change_at": int(results["zero"]["at"]), "threshold": args.threshold,
               "variants": {}}
    print(f"{'variant':<13} {'phase':>5} {'AUC ratio (95% CI)':>24} {'reward ratio (95% CI)':>24}"
          f" {'conv. it':>8} {'asym. err':>9} {'AUC':>7} {'reward':>7} {'s':>6}")
    for v in variants:
        s, row = stats[v], {}
        for name, key in (("auc_ratio", "auc"), ("reward_ratio", "reward")):
            ratios = [iqm_interval(s[key][ph] / base[key][ph]) for ph in range(2)]
            row[name] = [r[0] for r in ratios]
            row[name + "_ci"] = [[r[1], r[2]] for r in ratios]
        row["convergence_iteration"] = [iqm(s["convergence"][ph]) for ph in range(2)]
        row["asymptotic_error"] = [iqm(s["asymptotic"][ph]) for ph in range(2)]
        row["auc"] = [iqm(s["auc"][ph]) for ph in range(2)]
        row["reward"] = [iqm(s["reward"][ph]) for ph in range(2)]
        row["seconds"] = results[v]["seconds"]
        summary["variants"][v] = row
        for ph in range(2):
            a, r = row["auc_ratio_ci"][ph], row["reward_ratio_ci"][ph]
            print(f"{v:<13} {ph + 1:>5} {row['auc_ratio'][ph]:>7.3f} [{a[0]:.3f}, {a[1]:.3f}]"
                  f"  {row['reward_ratio'][ph]:>7.3f} [{r[0]:.3f}, {r[1]:.3f}]"
                  f"  {row['convergence_iteration'][ph]:>8.0f} {row['asymptotic_error'][ph]:>9.4f}"
                  f" {row['auc'][ph]:>7.4f} {row['reward'][ph]:>7.4f} {row['seconds']:>6.0f}")
    if args.json:
        print(json.dumps(summary))
    record.write(args, summary, __file__, argv, "poi_efficacy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
