"""One Gaussian bandit update on a full buffer, alone: the learner's ``update`` call that
fills the buffer's last row and runs the ``update_epochs`` PPO epochs.

Shapes of the training benchmark (``train_throughput.py`` on bench_b): ``--seeds`` x
``--markets`` markets of ``--sellers`` sellers, ``--products`` products, one policy per
seller and seed (the layout ``python -m jaxmarket.train`` gives independent sellers),
buffer ``--buffer`` rows. The buffer is filled through the learner's own ``act`` and
``update`` (rewards: a concave function of the price plus noise), then the call that
triggers the update is timed ``--repeats`` times on copies of the same state::

    python benchmarks/bandit_update.py                      # bench_b: 2 x 512 x 32 x 8, 32 rows
    python benchmarks/bandit_update.py --layout slots --json

``--layout slots`` numbers each seed's policies backwards, which takes the per-slot
buffer (the path of populations and other layouts) on the same problem, so the two
paths are timed on the same numbers. Prints the median wall and CPU milliseconds and
``compile_s`` (the first call); ``--json``: the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jaxmarket.learners  # noqa: E402,F401  (the package registers the learner kinds)
from jaxmarket.learners.base import LEARNERS, LearnerSpec, Transition  # noqa: E402
from throughput import machine  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)


def build(seeds: int, markets: int, sellers: int, products: int, buffer: int, epochs: int,
          layout: str):
    A = seeds * markets * sellers
    slot = np.arange(A)
    policy = (slot // (markets * sellers)) * sellers + slot % sellers
    if layout == "slots":   # each seed's policies numbered backwards: the per-slot buffer
        policy = (policy // sellers) * sellers + sellers - 1 - policy % sellers
    spec = LearnerSpec(num_agents=A, obs_dim=0, num_products=products,
                       action_low=np.zeros((A, products), np.float32),
                       action_high=np.full((A, products), 3.0, np.float32),
                       num_policies=seeds * sellers, policy_index=tuple(int(p) for p in policy),
                       num_markets=seeds * markets, num_sessions=seeds)
    learner = LEARNERS["ppo_bandit"].make(
        {"learning_rate": 0.005, "buffer_length": buffer, "update_epochs": epochs}, spec)
    return spec, learner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--markets", type=int, default=512, help="markets per seed")
    ap.add_argument("--sellers", type=int, default=32)
    ap.add_argument("--products", type=int, default=8)
    ap.add_argument("--buffer", type=int, default=32, help="buffer_length")
    ap.add_argument("--epochs", type=int, default=4, help="update_epochs")
    ap.add_argument("--layout", choices=("features", "slots"), default="features")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    record.add_arguments(ap, "bandit_update or bandit_update_slots (--layout slots)")
    args = ap.parse_args(argv)

    spec, learner = build(args.seeds, args.markets, args.sellers, args.products, args.buffer,
                          args.epochs, args.layout)
    A = spec.num_agents
    act = jax.jit(learner.act)
    update = jax.jit(learner.update, donate_argnums=0)
    copy = jax.jit(lambda s: jax.tree.map(jnp.copy, s))

    def transition(state, key):
        k1, k2 = jax.random.split(key)
        action, aux = act(state, jnp.zeros((A, 0)), k1)
        reward = -jnp.square(action - 1.3).sum(-1) + 0.1 * jax.random.normal(k2, (A,))
        return Transition(obs=jnp.zeros((1, A, 0)), action=action[None], reward=reward[None],
                          next_obs=jnp.zeros((1, A, 0)), done=jnp.zeros((1, A), bool),
                          aux=jax.tree.map(lambda x: x[None], aux))

    state = learner.init(jax.random.key(0), spec)
    key = jax.random.key(1)
    compile_s = None
    for _ in range(args.buffer - 1):
        key, k = jax.random.split(key)
        step = transition(state, k)
        t0 = time.perf_counter()
        state, _ = jax.block_until_ready(update(state, step))
        compile_s = compile_s or time.perf_counter() - t0   # the first call: trace + compile
    last = transition(state, jax.random.fold_in(key, 1))
    _, metrics = jax.block_until_ready(update(copy(state), last))
    assert int(metrics["num_updates"]) == 1
    wall, cpu = [], []
    for _ in range(args.repeats):
        s = jax.block_until_ready(copy(state))
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(update(s, last))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    r = {"layout": args.layout, "seeds": args.seeds, "markets": args.markets,
         "sellers": args.sellers, "products": args.products, "buffer": args.buffer,
         "epochs": args.epochs, "samples": A * args.buffer,
         "compile_s": round(compile_s or 0.0, 3), "update_ms": round(1e3 * statistics.median(wall), 2),
         "update_ms_best": round(1e3 * min(wall), 2),
         "update_cpu_ms": round(1e3 * statistics.median(cpu), 2),
         "loss": float(metrics["loss"]), "machine": machine()}
    print(f"ppo_bandit update, {args.layout} buffer: {args.seeds} x {args.markets} markets x "
          f"{args.sellers} sellers x {args.products} products, {args.buffer} rows, "
          f"{args.epochs} epochs ({r['samples']:,} slot samples)")
    print(f"  compile (first call) {compile_s:.1f}s; update {r['update_ms']:.1f} ms "
          f"(median of {args.repeats}, best {r['update_ms_best']:.1f}), "
          f"{r['update_cpu_ms']:.1f} ms CPU")
    if args.json:
        print(json.dumps(r))
    record.write(args, r, __file__, argv,
                 "bandit_update_slots" if args.layout == "slots" else "bandit_update")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
