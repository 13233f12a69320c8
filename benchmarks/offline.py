"""Offline pipeline benchmark (docs/offline.md, docs/benchmarks.md).

    python benchmarks/offline.py [--json] [--quick]

(a) FQE vs truth: logs of a noisy heuristic pricer (constant 1.4 + truncated-Gaussian
    noise, sigma 0.3) in benchmarks/offline_duopoly.yaml; FQE of the fixed policy
    "price 1.6" against its discounted value (gamma 0.9) simulated from the same reset
    state. Target: within 3%.
(b) Offline policy vs the heuristic: IQL (and CQL) trained on those logs, their greedy
    policy's simulated discounted value against the noisy heuristic's; the IQL policy
    exported to ONNX and run with onnxruntime on every logged observation
    (onnx_max_abs_diff, target <= 1e-5).
(c) Bandit OPE: epsilon-greedy logs (6 price levels, epsilon 0.5, known propensities) of
    the noisy-demand logit monopoly (benchmarks/offline_bandit.yaml), split into
    independent batches; IPS, SNIPS, DM and DR of a fixed target policy against its
    simulated value: bias and RMSE over the batches.
(d) fit throughput: CQL updates per second (d3rlpy's defaults: batch 256, 256x256
    networks, 10 sampled actions) on the duopoly logs, a compiled chunk timed after a
    warm-up; IQL's at the same sizes too.

With --json the last line is JSON with keys fqe_estimate, true_value,
offline_policy_value, heuristic_value, ope, onnx_max_abs_diff, fit_updates_per_s (and
details). --quick: smaller data and fewer updates (a smoke run, not the reported figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxmarket.offline import (
    bias_rmse,
    collect,
    fit,
    fqe_value,
    load_dataset,
    make_algo,
    ope_estimates,
    policy_value,
)
from jaxmarket.offline.algos import device_data
from jaxmarket.offline.behaviour import truncated_gaussian
from jaxmarket.offline.fit import make_chunk
from jaxmarket.offline.onnx_export import export_onnx, onnx_max_abs_diff
from jaxmarket.offline.scenario import load_scenario
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

DUOPOLY = ROOT / "benchmarks" / "offline_duopoly.yaml"
BANDIT = ROOT / "benchmarks" / "offline_bandit.yaml"
GAMMA, HORIZON = 0.9, 200
HEURISTIC, SIGMA, FIXED = 1.4, 0.3, 1.6
TARGET = np.array([0.0, 0.0, 0.2, 0.6, 0.2, 0.0])     # OPE target over the 6 price levels


def constant(price):
    return lambda obs: jnp.full((obs.shape[0], 1), price, jnp.float32)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true")
    record.add_arguments(p, "offline or offline_quick (--quick)")
    args = p.parse_args(argv)
    q = args.quick
    t_start = time.perf_counter()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # ------------------------------------------------------------ (a) FQE vs truth
        steps = 50 if q else 200
        collect(str(DUOPOLY), steps=steps, out=tmp / "market", noise=SIGMA)
        ds = load_dataset(tmp / "market")
        sc = load_scenario(str(DUOPOLY))
        truth = policy_value(sc, "seller", constant(FIXED), HORIZON, GAMMA)["discounted_return"]
        est = fqe_value(ds, constant(FIXED), gamma=GAMMA, steps=2000 if q else 10000)
        out.update(fqe_estimate=est, true_value=truth,
                   fqe_relative_error=abs(est - truth) / abs(truth), rows=len(ds))
        print(f"(a) FQE of price {FIXED}: {est:.4f}  true {truth:.4f}  "
              f"error {100 * out['fqe_relative_error']:.2f}%  ({len(ds)} logged rows)")
        # -------------------------------------------------- (b) offline policy vs heuristic
        low, high = sc.bounds("seller")
        noisy = truncated_gaussian(SIGMA, np.tile(low, (sc.num_markets, 1)),
                                   np.tile(high, (sc.num_markets, 1)))
        heuristic = policy_value(
            sc, "seller", lambda obs, k: noisy(obs, k, jnp.full((obs.shape[0], 1), HEURISTIC),
                                               {})[0],
            HORIZON, GAMMA, stochastic=True)["discounted_return"]
        values, prices = {}, {}
        for name, hyper in (("iql", {}), ("cql", {"num_samples": 4})):
            algo = make_algo(name, ds, gamma=GAMMA, hidden=[64, 64], **hyper)
            res = fit(algo, ds, stop=1000 if q else 10000, chunk=1000 if q else 2500)
            values[name] = policy_value(sc, "seller", lambda o, a=algo, s=res.state: a.policy(s, o),
                                        HORIZON, GAMMA)["discounted_return"]
            prices[name] = float(algo.policy(res.state, ds["observations"][:1])[0, 0])
            if name == "iql":   # the learned policy to ONNX, checked with onnxruntime
                onnx_path = export_onnx(algo, res.state, tmp / "iql.onnx")
                out["onnx_max_abs_diff"] = onnx_max_abs_diff(algo, res.state, onnx_path,
                                                             ds["observations"])
        out.update(offline_policy_value=values["iql"], cql_policy_value=values["cql"],
                   heuristic_value=heuristic, first_prices=prices)
        print(f"(b) discounted value: IQL {values['iql']:.4f}  CQL {values['cql']:.4f}  "
              f"noisy heuristic {heuristic:.4f}  (first prices {prices}); IQL policy as "
              f"ONNX: max abs diff {out['onnx_max_abs_diff']:.2e}")
        # ------------------------------------------------------------ (c) bandit OPE
        batches, per = (5, 640) if q else (20, 1280)
        collect(str(BANDIT), steps=batches * per // 64, out=tmp / "bandit", grid=6, epsilon=0.5)
        bd = load_dataset(tmp / "bandit")
        grid = np.asarray(bd.meta["action_values"])[:, 0]
        bsc = load_scenario(str(BANDIT))
        per_price = [policy_value(bsc, "seller", constant(float(v)), 500 if q else 2000,
                                  GAMMA)["mean_reward"] for v in grid]
        truth_ope = float(TARGET @ np.asarray(per_price))
        order = np.random.default_rng(0).permutation(len(bd))
        est = {k: [] for k in ("ips", "snips", "dm", "dr", "ess")}
        for b in range(batches):
            part = bd.take(order[b * per:(b + 1) * per])
            dm = make_algo("dm", part, learning_rate=0.01)
            state = fit(dm, part, stop=300 if q else 1000, chunk=1000, seed=b).state
            table = dm.extras["reward_table"](state, part["observations"])
            probs = jnp.broadcast_to(jnp.asarray(TARGET, jnp.float32), (len(part), 6))
            e = ope_estimates(part["rewards"], jnp.exp(part["log_probs"]), probs,
                              jnp.asarray(part["action_index"]), table)
            for k in est:
                est[k].append(float(e[k]))
        out["ope"] = {k: bias_rmse(est[k], truth_ope) for k in ("ips", "snips", "dm", "dr")}
        out.update(ope_true_value=truth_ope, ope_batches=batches, ope_rows_per_batch=per,
                   ope_mean_ess=float(np.mean(est["ess"])))
        print(f"(c) OPE, true value {truth_ope:.4f}, {batches} batches of {per} rows, "
              f"mean ESS {out['ope_mean_ess']:.0f}: " + "  ".join(
                  f"{k} bias {v['bias']:+.4f} rmse {v['rmse']:.4f}" for k, v in out["ope"].items()))
        # ------------------------------------------------------------ (d) throughput
        for name, hyper in (("cql", {}), ("iql", {})):   # default sizes: 256x256
            algo = make_algo(name, ds, gamma=GAMMA, **hyper)
            run = make_chunk(algo, 256)
            data = device_data(ds, algo.norm)
            state = jax.jit(algo.init)(jax.random.key(0))
            n = 50 if q else (200 if name == "cql" else 1000)
            state, _ = run(state, data, jax.random.key(1), n)          # compile + warm-up
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            state, m = run(state, data, jax.random.key(2), n)
            jax.block_until_ready(m)
            out["fit_updates_per_s" if name == "cql" else f"fit_updates_per_s_{name}"] = (
                n / (time.perf_counter() - t0))
        print(f"(d) fit, batch 256, 256x256 networks: CQL {out['fit_updates_per_s']:.1f} "
              f"updates/s (10 sampled actions), IQL {out['fit_updates_per_s_iql']:.0f} updates/s")
    out.update(seconds=round(time.perf_counter() - t_start, 1), quick=q, jax=jax.__version__,
               nproc=os.cpu_count(), machine=platform.processor() or platform.machine(),
               loadavg=os.getloadavg()[0])
    if args.json:
        print(json.dumps(out))
    record.write(args, out, __file__, argv, "offline_quick" if args.quick else "offline")
    return out


if __name__ == "__main__":
    main()
