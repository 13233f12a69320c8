"""The yardstick for the simulator's market step: a hand-written step of the bench_b market.

``configs/bench_b.yaml``: 10 consumers, 32 price-setting sellers, 8 products. Every step
draws each seller's 8 prices uniformly in [0, 3), lets each consumer consider only the
sellers priced within its budget for the product, splits the consumer's queries among
them by a logit over ``-price / temperature`` (with an outside option of utility 0) and
adds up the sellers' revenue. It is written the way a reader would first write it: one
``exp`` per consumer x seller x product, a ``[C, S, P]`` mask, no observations, rewards,
history, learners or auto-reset. ``benchmarks/throughput.py --against-minimal`` runs it
in the same process, before and after the simulator's step, and prints the ratio.

    python benchmarks/minimal_step.py --num-envs 4096 --steps 200      # last line: JSON

The JSON has ``env_steps_per_s`` (markets x steps / seconds per timed call, the mean over
``--seconds`` of repeated calls), ``compile_s`` and ``timed_calls``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

# bench_b's market (configs/bench_b.yaml)
CONSUMERS, SELLERS, PRODUCTS = 10, 32, 8
BUDGETS = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4)      # per product, every consumer
QUERIES = 100.0                                          # per consumer and product
PRICE_HIGH = 3.0
TEMPERATURE = 0.5


def allocate(prices: jax.Array) -> jax.Array:
    """Queries each seller receives, ``[S, P]``, for the sellers' prices ``[S, P]``."""
    budgets = jnp.broadcast_to(jnp.asarray(BUDGETS, jnp.float32), (CONSUMERS, PRODUCTS))
    affordable = prices[None, :, :] <= budgets[:, None, :]                  # [C, S, P]
    utility = -prices[None, :, :] / TEMPERATURE
    # stabilise by the best affordable utility, floored at the outside option's 0
    shift = jnp.max(jnp.where(affordable, utility, -jnp.inf), axis=1, keepdims=True)
    shift = jnp.maximum(shift, 0.0)
    weight = jnp.where(affordable, jnp.exp(utility - shift), 0.0)           # C*S*P exps
    total = weight.sum(axis=1, keepdims=True) + jnp.exp(-shift)             # + outside
    return (QUERIES * weight / total).sum(axis=0)


def step(revenue: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    prices = jax.random.uniform(key, (SELLERS, PRODUCTS), maxval=PRICE_HIGH)
    step_revenue = jnp.sum(prices * allocate(prices))
    return revenue + step_revenue, step_revenue


def rollout(key: jax.Array, steps: int) -> jax.Array:
    """Total revenue of one market over ``steps`` steps."""
    total, _ = jax.lax.scan(step, jnp.float32(0.0), jax.random.split(key, steps))
    return total


def measure(num_envs: int = 4096, steps: int = 200, seconds: float = 5.0) -> dict:
    """Time ``num_envs`` vmapped markets x ``steps`` scanned steps (one jitted call)."""
    run = jax.jit(jax.vmap(lambda k: rollout(k, steps)))
    keys = jax.random.split(jax.random.key(0), num_envs)
    t0 = time.perf_counter()
    run(keys).block_until_ready()
    compile_s = time.perf_counter() - t0
    calls, t0 = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - t0 < seconds:
        run(keys).block_until_ready()
        calls += 1
    per_call = (time.perf_counter() - t0) / calls
    return {"env_steps_per_s": num_envs * steps / per_call, "compile_s": compile_s,
            "timed_calls": calls, "num_envs": num_envs, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/minimal_step.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-envs", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds of timed calls")
    record.add_arguments(ap, "minimal_step")
    args = ap.parse_args(argv)
    r = measure(args.num_envs, args.steps, args.seconds)
    print(f"minimal bench_b step: {r['env_steps_per_s']:,.0f} env-steps/s "
          f"({r['timed_calls']} calls, compile {r['compile_s']:.2f}s; jax {jax.__version__} "
          f"{jax.default_backend()})", flush=True)
    print(json.dumps(r))
    record.write(args, r, __file__, argv, "minimal_step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
