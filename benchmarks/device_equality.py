"""Why training on N devices is not bit-identical to one device on XLA:CPU, op by op.

    python benchmarks/device_equality.py          # about 20 s on 2 cores
    python benchmarks/device_equality.py --json   # last line: JSON

Three findings, each printed with a yes/no ("bitwise equal?"):

1. **YNNPACK reductions.** From 4,096 input elements XLA:CPU runs a reduction in
   YNNPACK, which adds in a vectorised tree order; below, XLA's own loop adds in
   sequence. ``jnp.sum(x, -1)`` over ``[511, 8]`` equals the sequential sum, over
   ``[512, 8]`` it does not. So the per-device batch size changes the last bits of
   every per-market sum: bench_b's ``env.step`` vmapped over 32 markets and over the
   first 8 of them differ (the sellers' profit, a sum over 8 products). Compiled with
   ``compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}`` (no YNNPACK
   fusions; ``JAXMARKET_NO_YNN=1`` in the trainer) both are bitwise equal -- but bench_b
   training runs about 7x slower, so it is not the default.
2. **GSPMD all-reduce.** A sum over the sharded axis becomes per-device partial sums
   and an all-reduce: ``jnp.sum`` of 4,096 floats on 8 devices differs from 1 device.
   The trainer's means over seeds and markets (metrics, a learner's loss) are such sums.
3. **GSPMD partitioning of the per-policy update.** A Gaussian PPO bandit's update
   (replicated parameters, per-slot buffers sharded over 8 devices) gives other
   parameters than on one device even with (1) switched off: the partitioned program is
   fused differently (Adam's bias correction lands in another fusion), so it rounds
   differently. Nothing in the sharding can prevent this; only a learner written with
   explicit per-shard reductions (``shard_map``) and per-shard random streams could.

4. **Whole training runs** (``Trainer`` with ``devices=1`` and ``devices=8``, 12
   iterations, checkpoints compared array by array, ``metrics.csv`` column by column):
   the small scenario of ``tests/test_devices.py`` (32 markets, ``ppo_bandit`` + ``ucb1``)
   and bench_b at 8 seeds x 64 markets. Which arrays and metric columns differ shows
   where (1)-(3) reach the results.

Discrete results (counters, arm pulls, a grid bandit's prices) stay identical; floats
agree to about 1e-6 relative after a few iterations (tests/test_devices.py checks 1e-5).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

ROOT = Path(__file__).resolve().parents[1]
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


def ynn_threshold() -> dict:
    x = np.random.default_rng(0).random((512, 8), np.float32)
    seq = x[:, 0].copy()
    for j in range(1, 8):
        seq = seq + x[:, j]
    out = {}
    for name, opts in (("default", None), ("no_ynn", NO_YNN)):
        f = jax.jit(lambda a: jnp.sum(a, -1), compiler_options=opts)
        out[name] = {rows: bool(np.array_equal(np.asarray(f(x[:rows])), seq[:rows]))
                     for rows in (511, 512)}
    return out


def env_step_batches() -> dict:
    import jaxmarket
    env, params = jaxmarket.make(str(ROOT / "configs" / "bench_b.yaml"))
    E = 32
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(
        jax.random.split(jax.random.key(0), E), params)
    keys = jax.random.split(jax.random.key(1), len(env.agent_groups))
    actions = {g: jax.vmap(env.action_space(g, params).sample)(jax.random.split(k, E))
               for g, k in zip(env.agent_groups, keys)}
    skeys = jax.random.split(jax.random.key(2), E)
    out = {}
    for name, opts in (("default", None), ("no_ynn", NO_YNN)):
        step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)), compiler_options=opts)
        full = step(skeys, states, actions, params)[2]["sellers"]         # rewards [E, 32]
        part = step(*jax.tree.map(lambda x: x[:8], (skeys, states, actions)), params)[2]
        out[name] = bool(np.array_equal(np.asarray(full)[:8], np.asarray(part["sellers"])))
    return out


def allreduce_sum() -> bool:
    x = jnp.asarray(np.random.default_rng(1).random(4096, np.float32) * 10)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]), ("markets",))
    f = jax.jit(jnp.sum, compiler_options=NO_YNN)
    one = f(x)
    eight = f(jax.device_put(x, NamedSharding(mesh, P("markets"))))
    return bool(np.asarray(one) == np.asarray(eight))


def bandit_update() -> bool:
    from jaxmarket.config.loader import load_config
    from jaxmarket.learners.base import Transition
    from jaxmarket.train.plan import resolve
    config = load_config(str(ROOT / "configs" / "bench_b.yaml"),
                         ["train.num_envs=8", "train.num_seeds=8",
                          "learners.sellers.buffer_length=4", "learners.sellers.update_epochs=1"])
    plan = resolve(config)
    learners, specs = plan.learners, plan.specs
    learner, spec = learners["sellers"], specs["sellers"]
    A, T = spec.num_agents, 4
    rng = np.random.default_rng(0)
    aux = {"sample": jnp.asarray(rng.random((T, A, 8), np.float32) * 3),
           "log_prob": jnp.asarray(-rng.random((T, A), np.float32))}
    batch = Transition(obs=jnp.zeros((T, A, 0)), action=aux["sample"],
                       reward=jnp.asarray(rng.random((T, A), np.float32) * 30),
                       next_obs=jnp.zeros((T, A, 0)), done=jnp.zeros((T, A), bool), aux=aux)
    state = learner.init(jax.random.key(0), spec)
    params = []
    for n in (1, 8):
        mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:n]), ("markets",))
        rep, slots = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "markets"))
        s_sh = jax.tree.map(lambda x, s=slots, r=rep: s if x.ndim >= 2 and x.shape[1] == A
                            else r, state)
        b_sh = jax.tree.map(lambda x, s=slots, r=rep: s if x.ndim >= 2 else r, batch)
        f = jax.jit(learner.update, in_shardings=(s_sh, b_sh), out_shardings=(s_sh, rep),
                    compiler_options=NO_YNN)
        new, _ = f(jax.device_put(state, s_sh), jax.device_put(batch, b_sh))
        params.append(np.asarray(new.params["log_std"]))
    return bool(np.array_equal(*params))


def training_runs() -> dict:
    """Per scenario: how many runner arrays and metrics columns differ (bitwise) between
    a 1-device and an 8-device run of 12 iterations, and the largest relative difference."""
    import csv
    import tempfile

    import yaml
    sys.path.insert(0, str(ROOT / "tests"))
    from test_devices import CONFIG as SMALL

    from jaxmarket.train.plan import resolve

    from jaxmarket.train.trainer import Trainer
    from jaxmarket.train.tracking import Tracker
    bench_b = yaml.safe_load((ROOT / "configs" / "bench_b.yaml").read_text())
    bench_b["train"] = {"num_iterations": 12, "rollout_length": 2, "num_envs": 64,
                        "num_seeds": 8, "chunk_size": 6}
    bench_b["learners"]["sellers"].update(buffer_length=4, update_epochs=2)
    out = {}
    for name, config in (("small_32_markets", SMALL), ("bench_b_8x64_markets", bench_b)):
        leaves, rows = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for n in (1, 8):
                d = Path(tmp) / f"d{n}"
                t = Trainer(resolve(config), d, devices=n)
                d.mkdir()
                t.train(Tracker(), t.initial_runner(), 0)
                runner, _ = t.restore()
                leaves[n] = {jax.tree_util.keystr(p): np.asarray(x)
                             for p, x in jax.tree_util.tree_leaves_with_path(runner)}
                with open(d / "metrics.csv") as f:
                    rows[n] = list(csv.DictReader(f))
        arrays = [k for k in leaves[1] if not np.array_equal(leaves[1][k], leaves[8][k])]
        columns = sorted({k for a, b in zip(rows[1], rows[8]) for k in a if a[k] != b[k]})
        rel = max([float(np.max(np.abs(leaves[8][k] - leaves[1][k]))
                         / max(float(np.max(np.abs(leaves[1][k]))), 1e-30)) for k in arrays]
                  + [0.0])
        out[name] = {"arrays": len(leaves[1]), "arrays_differing": arrays,
                     "metric_columns": len(rows[1][0]), "columns_differing": columns,
                     "max_relative_difference": rel}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="last line: JSON result")
    ap.add_argument("--no-training", action="store_true",
                    help="skip finding 4 (two short training runs per scenario, ~40 s)")
    record.add_arguments(ap, "device_equality")
    args = ap.parse_args(argv)
    r = {"jax": jax.__version__, "devices": len(jax.devices()),
         "ynn_sum_equals_sequential": ynn_threshold(),
         "env_step_32_vs_8_markets_bitwise": env_step_batches(),
         "sum_1_vs_8_devices_bitwise": allreduce_sum(),
         "ppo_bandit_update_1_vs_8_devices_bitwise": bandit_update()}
    y = r["ynn_sum_equals_sequential"]
    print(f"jax {r['jax']}, {r['devices']} CPU devices")
    print("1. sum over [rows, 8] == sequential sum: default "
          f"511 rows {y['default'][511]}, 512 rows {y['default'][512]}; no YNNPACK "
          f"511 {y['no_ynn'][511]}, 512 {y['no_ynn'][512]}")
    e = r["env_step_32_vs_8_markets_bitwise"]
    print(f"   bench_b env.step rewards, 32 vs 8 markets bitwise: default {e['default']}, "
          f"no YNNPACK {e['no_ynn']}")
    print(f"2. sum of 4096 floats, 1 vs 8 devices bitwise: {r['sum_1_vs_8_devices_bitwise']}")
    print("3. ppo_bandit update, 1 vs 8 devices bitwise (no YNNPACK): "
          f"{r['ppo_bandit_update_1_vs_8_devices_bitwise']}")
    if not args.no_training:
        r["training_1_vs_8_devices"] = runs = training_runs()
        for name, t in runs.items():
            print(f"4. {name}: runner arrays differing {len(t['arrays_differing'])} of "
                  f"{t['arrays']}, metrics columns differing {len(t['columns_differing'])} "
                  f"of {t['metric_columns']} ({', '.join(t['columns_differing']) or '-'}); "
                  f"largest relative difference {t['max_relative_difference']:.1e}")
    if args.json:
        print(json.dumps(r))
    record.write(args, r, __file__, argv, "device_equality")
    return 0


if __name__ == "__main__":
    sys.exit(main())
