"""Environment throughput: vmapped ``env.step`` over many markets inside a jitted ``lax.scan``.

Each scan step draws random actions in-graph from every agent group's action space
(``env.action_space(g, params).sample(k)``), then runs
``jax.vmap(env.step, in_axes=(0, 0, 0, None))`` over ``num_envs`` markets -- demand
processes, distributor, rewards, observations and the auto-reset ``select`` included.
The rollout is compiled ahead of time (``compile_s``: lower + XLA compile) and its first
call is timed as well (``first_call_s`` = compile + one run, ``.block_until_ready()``:
what a plain first call of the jitted function costs); then ``--repeats`` further calls
are timed and their median gives the throughput (the best call is reported too).

    python benchmarks/throughput.py --config configs/bench_b.yaml --num-envs 4096 --steps 200 --json
    python benchmarks/throughput.py --config configs/bench_b.yaml --breakdown
    python benchmarks/throughput.py --against-minimal  # and the hand-written yardstick
    python benchmarks/throughput.py --sweep            # cost vs market size, 3 distributors
    python benchmarks/throughput.py --sweep --json     # last line: a JSON list

With ``--json`` the last printed line is JSON. ``--sweep`` builds its markets itself
(``C`` consumers with budgets spread over [1, 2.4], ``S`` price-setting sellers in
[0, 3], ``P`` products) for the distributor kinds ``logit``, ``cheapest`` and
``proportional`` and reports the cost of one market step in microseconds and that cost
divided by ``(C + S) * P``: a flat ratio means the cost grows like
``(consumers + sellers) x products``, not like their product.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import jaxmarket
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.env import MarketEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

#: issue 10's step-speed target: bench_b at 4,096 markets at least as fast as the
#: hand-written minimal step timed in the same run (``--against-minimal``); absolute
#: steps/s targets are retired (they depend on the machine and its load)
TARGET_RATIO_VS_MINIMAL = 1.0
TARGET_PEAK_RSS_MB = 2048

# (consumers, sellers, products); the last one is the largest market the sweep covers
SWEEP_SIZES = [
    (10, 32, 8),                       # bench_b's size
    (100, 100, 16), (1000, 10, 16), (10, 1000, 16), (1000, 1000, 1), (1000, 1000, 16),
]
SWEEP_KINDS = ("logit", "cheapest", "proportional")


# --------------------------------------------------------------------------- helpers

#: the hand-written yardstick (a plain JAX step of the bench_b market), in this directory
MINIMAL_SCRIPT = Path(__file__).resolve().parent / "minimal_step.py"


def run_minimal(script: str, num_envs: int, steps: int, seconds: float = 5.0) -> float:
    """env_steps_per_s of the hand-written minimal bench_b step, run in this process
    (``runpy``) with the same market count and scan length."""
    import contextlib
    import io
    import runpy
    if not Path(script).is_file():
        raise SystemExit(f"throughput.py: error: --minimal-script: {script} does not exist")
    argv, out = sys.argv, io.StringIO()
    sys.argv = [script, "--num-envs", str(num_envs), "--steps", str(steps),
                "--seconds", str(seconds)]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as done:           # the script's own exit; only a failure stops here
        if done.code not in (None, 0):
            raise
    finally:
        sys.argv = argv
    return float(json.loads(out.getvalue().strip().splitlines()[-1])["env_steps_per_s"])

def peak_rss_mb() -> float:
    """Peak resident set size of this process (MB): ru_maxrss (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 / 2**20 if sys.platform == "darwin" else 1 / 1024
    try:
        import psutil
        now = psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover - psutil is a dependency of the dev env
        now = 0.0
    return max(peak * scale, now)


def machine() -> dict:
    """The machine a figure was measured on (:func:`record.machine_info`)."""
    return record.machine_info()


def total_agents(env: MarketEnv) -> int:
    return sum(env.num_agents(g) for g in env.agent_groups)


def random_actions(env: MarketEnv, params, key: jax.Array, num_envs: int) -> dict:
    """``{group: [num_envs, n, P]}`` uniform in each group's action box, drawn in-graph."""
    keys = jax.random.split(key, len(env.agent_groups))
    return {g: jax.vmap(env.action_space(g, params).sample)(jax.random.split(k, num_envs))
            for g, k in zip(env.agent_groups, keys)}


def make_rollout(env: MarketEnv, params, num_envs: int, steps: int) -> Callable:
    """``rollout(key, states) -> (states, mean reward per step [steps])``, jitted."""
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def body(carry, _):
        key, states = carry
        key, k_act, k_step = jax.random.split(key, 3)
        actions = random_actions(env, params, k_act, num_envs)
        _, states, rewards, _, _, _ = vstep(jax.random.split(k_step, num_envs), states,
                                            actions, params)
        # a scalar per step keeps rewards live without storing [steps, num_envs, ...]
        total = sum(jnp.mean(r) for r in rewards.values())
        return (key, states), total

    @jax.jit
    def rollout(key, states):
        (_, states), out = jax.lax.scan(body, (key, states), None, length=steps)
        return states, out

    return rollout


def time_calls(fn: Callable, args_fn: Callable[[int], tuple], repeats: int,
               min_total_s: float = 0.0) -> dict:
    """Compile ``fn`` ahead of time (``compile_s``), time its first call
    (``first_call_s``: the first call of the jitted function pays trace + compile + one
    run) and then ``repeats`` further calls (more, up to 20, until ``min_total_s`` of
    timed calls). Everything ``block_until_ready``."""
    args0 = args_fn(0)
    t0 = time.perf_counter()
    compiled = fn.lower(*args0).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args0))
    first_run = time.perf_counter() - t0
    times: list[float] = []
    cpu: list[float] = []
    while len(times) < repeats or (sum(times) < min_total_s and len(times) < 20):
        args = args_fn(len(times) + 1)
        jax.block_until_ready(args)
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"compile_s": compile_s, "first_call_s": compile_s + first_run, "times": times,
            "cpu_times": cpu}


def measure(env: MarketEnv, params, num_envs: int, steps: int, repeats: int, seed: int = 0,
            min_total_s: float = 0.0, devices: int | None = None) -> dict:
    """Throughput of ``steps`` vmapped steps of ``num_envs`` markets, the markets sharded
    over ``devices`` local devices (None: all that divide them; jaxmarket.train.devices)."""
    from jaxmarket.train.devices import shard_markets
    rollout = make_rollout(env, params, num_envs, steps)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    _, states = reset(jax.random.split(jax.random.key(seed), num_envs), params)
    states, devices = shard_markets(states, num_envs, devices)
    jax.block_until_ready(states)

    def args(i):
        return jax.random.key(seed + 1 + i), states

    t = time_calls(rollout, args, repeats, min_total_s)
    median, best = statistics.median(t["times"]), min(t["times"])
    n = num_envs * steps
    agents = total_agents(env)
    return {
        "num_envs": num_envs, "steps": steps, "agents_per_env": agents, "devices": devices,
        "compile_s": round(t["compile_s"], 3),        # lower + XLA compile (AOT)
        "first_call_s": round(t["first_call_s"], 3),  # compile + the first run
        "timed_calls": len(t["times"]),
        # CPU seconds this process used per timed call / wall seconds: on a shared
        # machine, how many cores the run actually got
        "cores_used": round(sum(t["cpu_times"]) / sum(t["times"]), 2),
        "run_s": round(median, 4), "run_s_best": round(best, 4),
        "env_steps_per_s": round(n / median, 1),
        "env_steps_per_s_best": round(n / best, 1),
        "agent_steps_per_s": round(n * agents / median, 1),
        "us_per_env_step": round(1e6 * median / n, 4),
    }


# --------------------------------------------------------------------------- breakdown

def breakdown(env: MarketEnv, params, num_envs: int, steps: int, repeats: int) -> list[dict]:
    """Cost of the parts of one step, each alone in the same vmapped scan.

    Parts: random actions; ``step_env`` without auto-reset; the full ``step``
    (auto-reset included); the distributor alone on the same quotes; ``reset_env``
    alone (what auto-reset computes every step before the ``select``).
    """
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(
        jax.random.split(jax.random.key(0), num_envs), params)

    def scan(part):
        def body(carry, _):
            key, states = carry
            key, k_act, k_step = jax.random.split(key, 3)
            actions = random_actions(env, params, k_act, num_envs)
            states, scalar = part(jax.random.split(k_step, num_envs), states, actions)
            return (key, states), scalar

        @jax.jit
        def run(key, states):
            return jax.lax.scan(body, (key, states), None, length=steps)
        return run

    def actions_only(keys, states, actions):
        return states, sum(jnp.mean(a) for a in actions.values())

    def step_env(keys, states, actions):
        _, st, r, _, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(keys, states, actions,
                                                                         params)
        return st, sum(jnp.mean(x) for x in r.values())

    def full_step(keys, states, actions):
        _, st, r, _, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, states, actions,
                                                                       params)
        return st, sum(jnp.mean(x) for x in r.values())

    def distributor(keys, states, actions):
        price = jnp.concatenate([actions[g.name] for g in env.spec.sellers], axis=1)
        # the quotes of the carried states (a closure constant of 1024 markets' quotes
        # compiled to a program twice as slow)
        q = jax.vmap(lambda s: env._quotes(s, params, s.queries))(states).replace(price=price)
        alloc = jax.vmap(lambda k, qq: env._distributor.allocate(
            k, qq, params.distributor, env._options))(keys, q)
        return states, jnp.mean(alloc.traffic) + jnp.mean(alloc.spend)

    def reset_only(keys, states, actions):
        obs, st = jax.vmap(env.reset_env, in_axes=(0, None))(keys, params)
        return states, jnp.mean(st.price_history) + sum(jnp.mean(o) for o in obs.values())

    parts = [("random actions", actions_only), ("distributor only", distributor),
             ("reset_env only", reset_only), ("step_env (no auto-reset)", step_env),
             ("step (with auto-reset)", full_step)]
    rows = []
    for name, part in parts:
        t = time_calls(scan(part), lambda i: (jax.random.key(i), states), repeats)
        med = statistics.median(t["times"])
        rows.append({"part": name, "us_per_env_step": round(1e6 * med / (num_envs * steps), 4),
                     "compile_s": round(t["compile_s"], 2)})
    return rows


# --------------------------------------------------------------------------- sweep

def sweep_config(consumers: int, sellers: int, products: int, kind: str) -> dict:
    """A bench_b-like market of the given size; distributor settings only where the kind
    has them (``temperature``/``outside_option`` are logit-only)."""
    budgets = [[1.0 + 1.4 * i / max(consumers - 1, 1)] for i in range(consumers)]  # [C, 1]
    dist: dict[str, Any] = {"kind": kind}
    wanted = {"temperature": 0.5, "outside_option": True}
    allowed = set(DISTRIBUTORS[kind].params) | set(DISTRIBUTORS[kind].options)
    dist.update({k: v for k, v in wanted.items() if k in allowed})
    return {"market": {
        "num_products": products,
        "consumers": [{"name": "consumers", "count": consumers, "budget": budgets,
                       "queries": 100.0}],
        "sellers": [{"name": "sellers", "count": sellers, "action": "price", "low": 0.0,
                     "high": 3.0, "cost": 0.1, "quality": 1.0,
                     "reward": [{"kind": "profit"}]}],
        "distributor": dist,
    }}


def sweep_envs(consumers: int, sellers: int, products: int, budget: int) -> int:
    """num_envs (a power of 2 in [1, 4096]) with num_envs x (C + S) x P near ``budget``."""
    n = budget // ((consumers + sellers) * products)
    return 1 << max(0, min(12, n.bit_length() - 1))


def run_sweep(sizes, kinds, element_budget: int, steps: int, repeats: int, min_total_s: float,
              log: Callable[[str], None]) -> list[dict]:
    rows = []
    log(f"{'kind':>12} {'C':>5} {'S':>5} {'P':>3} {'envs':>5} {'us/step':>12} "
        f"{'ns/((C+S)P)':>12} {'ns/(CSP)':>10} {'compile s':>9}")
    for (c, s, p) in sizes:
        for kind in kinds:
            env, params = jaxmarket.make(sweep_config(c, s, p, kind))
            n = sweep_envs(c, s, p, element_budget)
            r = measure(env, params, n, steps, repeats, min_total_s=min_total_s)
            us = r["us_per_env_step"]
            row = {"kind": kind, "consumers": c, "sellers": s, "products": p, "num_envs": n,
                   "steps": steps, "us_per_env_step": us,
                   "ns_per_entity_product": round(1e3 * us / ((c + s) * p), 3),
                   "ns_per_consumer_seller_product": round(1e3 * us / (c * s * p), 5),
                   "compile_s": r["compile_s"], "timed_calls": r["timed_calls"]}
            rows.append(row)
            log(f"{kind:>12} {c:>5} {s:>5} {p:>3} {n:>5} {us:>12.2f} "
                f"{row['ns_per_entity_product']:>12.2f} {row['ns_per_consumer_seller_product']:>10.4f} "
                f"{r['compile_s']:>9.1f}")
    return rows


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/bench_b.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides of --config")
    ap.add_argument("--num-envs", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the first")
    ap.add_argument("--json", action="store_true", help="last line: JSON result")
    ap.add_argument("--devices", type=int, default=None, metavar="N",
                    help="shard the markets over N local devices (default: all)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the parts of a step (actions, distributor, reset, step_env)")
    ap.add_argument("--sweep", action="store_true",
                    help="cost per market step vs size for logit, cheapest, proportional")
    ap.add_argument("--sweep-steps", type=int, default=5, help="scan length per sweep point")
    ap.add_argument("--sweep-budget", type=int, default=1 << 16,
                    help="num_envs x (C + S) x P per sweep point (sets num_envs)")
    ap.add_argument("--sweep-min-time", type=float, default=0.5,
                    help="seconds of timed calls per sweep point (more calls if faster)")
    ap.add_argument("--quick", action="store_true", help="small sweep (smoke test)")
    ap.add_argument("--against-minimal", action="store_true",
                    help="also run the hand-written minimal bench_b step in this process "
                         "(before and after this one) and print the ratio")
    ap.add_argument("--minimal-script", default=str(MINIMAL_SCRIPT),
                    help="the yardstick script (prints JSON with env_steps_per_s)")
    record.add_arguments(ap, "throughput, throughput_sweep, throughput_breakdown or "
                             "throughput_against_minimal, by mode")
    args = ap.parse_args(argv)
    info = machine()
    log = (lambda s: print(s, flush=True))

    if args.sweep:
        sizes = SWEEP_SIZES[:2] if args.quick else SWEEP_SIZES
        log(f"sweep: {info}")
        t0 = time.perf_counter()
        rows = run_sweep(sizes, SWEEP_KINDS, args.sweep_budget, args.sweep_steps,
                         1, args.sweep_min_time, log)
        log(f"sweep took {time.perf_counter() - t0:.0f}s; peak RSS {peak_rss_mb():.0f} MB")
        if args.json:
            print(json.dumps(rows))
        record.write(args, rows, __file__, argv, "throughput_sweep", machine=info)
        return 0

    env, params = jaxmarket.make(args.config, args.overrides)
    minimal = []
    if args.against_minimal:
        minimal.append(run_minimal(args.minimal_script, args.num_envs, args.steps))
    r = measure(env, params, args.num_envs, args.steps, args.repeats, devices=args.devices)
    if args.against_minimal:
        minimal.append(run_minimal(args.minimal_script, args.num_envs, args.steps))
        r["minimal_env_steps_per_s"] = round(statistics.mean(minimal), 1)
        r["minimal_runs"] = [round(m, 1) for m in minimal]
        r["ratio_vs_minimal"] = round(r["env_steps_per_s"] / r["minimal_env_steps_per_s"], 3)
    r["peak_rss_mb"] = round(peak_rss_mb(), 1)
    r["config"] = args.config
    # a ratio measured side by side (None without --against-minimal), and the memory cap
    r["target_met"] = (bool(r["ratio_vs_minimal"] >= TARGET_RATIO_VS_MINIMAL and
                            r["peak_rss_mb"] < TARGET_PEAK_RSS_MB)
                       if args.against_minimal else None)
    r["machine"] = info
    s = env.spec
    log(f"{args.config}: {s.num_consumers} consumers, {s.num_sellers} sellers, "
        f"{s.num_products} products, distributor {s.distributor}, "
        f"{r['agents_per_env']} agents per market")
    log(f"machine: {info['cpu']}, {info['nproc']} cores, load {info['load_avg']}, "
        f"jax {info['jax']} ({info['backend']})")
    log(f"{args.num_envs} envs x {args.steps} steps: compile {r['compile_s']:.2f}s "
        f"(first call {r['first_call_s']:.2f}s), run {r['run_s']:.3f}s "
        f"(median of {r['timed_calls']}, best {r['run_s_best']:.3f}s; "
        f"{r['cores_used']:.2f} cores busy on average; {r['devices']} device(s))")
    log(f"  env steps/s   {r['env_steps_per_s']:>14,.0f}  (best {r['env_steps_per_s_best']:,.0f})")
    log(f"  agent steps/s {r['agent_steps_per_s']:>14,.0f}")
    log(f"  us / env step {r['us_per_env_step']:>14.3f}")
    log(f"  peak RSS      {r['peak_rss_mb']:>11,.0f} MB")
    if args.against_minimal:
        log(f"  minimal step  {r['minimal_env_steps_per_s']:>14,.0f}  (runs before and after: "
            f"{r['minimal_runs']}); ratio {r['ratio_vs_minimal']:.3f}")
        log(f"  target (bench_b at 4096 envs) >= {TARGET_RATIO_VS_MINIMAL} x the minimal step "
            f"and < {TARGET_PEAK_RSS_MB} MB peak RSS: "
            f"{'met' if r['target_met'] else 'NOT met'}")
    else:
        log("  target: a ratio to the minimal step, measured with --against-minimal")
    if args.breakdown:
        rows = breakdown(env, params, args.num_envs, args.steps, args.repeats)
        r["breakdown"] = rows
        log("breakdown (each part alone, same scan; us per env step):")
        for row in rows:
            log(f"  {row['part']:<28} {row['us_per_env_step']:10.3f}")
    if args.json:
        print(json.dumps(r))
    record.write(args, r, __file__, argv, "throughput_against_minimal" if args.against_minimal
                 else "throughput_breakdown" if args.breakdown else "throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
