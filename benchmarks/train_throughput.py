"""Training throughput: market steps per second *including learning*, inside the jitted chunk.

Every seller of the market (bench_b: 32 sellers, 8 products, 10 consumers, logit) is a
``ppo_bandit`` (one Gaussian policy per seller; the ``num_envs`` markets of a seed share
the 32 policies), trained by the library's loop: ``jaxmarket.train.loop.make_train``,
``jit(run_chunk)`` with seeds folded into the policy axis, exactly as
``jaxmarket.train.run.Trainer`` does. An
iteration collects ``rollout_length`` vmapped market steps (every seller acting through its
learner) and then calls the learner's ``update``.

The first call of the chunk (trace + compile + one run) is timed as ``compile_s``; then
``--repeats`` further calls are timed and the median gives

    env_steps_per_s = iterations x rollout_length x num_envs x num_seeds / seconds

    python benchmarks/train_throughput.py --config configs/bench_b.yaml --json
    python benchmarks/train_throughput.py --iterations 64 --repeats 3 --rounds 5  # the ratio
    python benchmarks/train_throughput.py --num-envs 4096 --iterations 50
    python benchmarks/train_throughput.py --profile      # what dominates an iteration
    XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python benchmarks/train_throughput.py --devices 1 --devices 2   # side by side

Unless ``--no-env-only``, the market step alone (random actions, same markets and steps)
is timed too and ``ratio_vs_env_only`` = training / env-only (target >= 0.6); with
``--rounds R`` both are timed ``R`` times in turn and the median of the ``R`` ratios is
reported (``ratios_vs_env_only`` lists them). Use a multiple of the bandits'
``buffer_length`` (32) for ``--iterations``, so every timed call holds the same number
of updates.

``--devices N`` shards the seeds x markets over ``N`` local devices exactly as
``python -m jaxmarket.train --devices N`` does (``jaxmarket.train.devices``; default: all
local devices); given more than once, each count is timed in the same process and the
speed-up over the first is printed (``devices_speedup``).

``--profile`` times the same chunk with the learners swapped for cheaper ones (``random``:
the loop and the market only; ``ppo_bandit`` with a buffer longer than the chunk: act +
buffer writes, never an update; ``update_epochs: 1``), the same learners compiled without
one seed holding all the markets, and the market step alone with
random actions.
With ``--json`` the last printed line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import machine, peak_rss_mb
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

from jaxmarket.config.loader import load_config
from jaxmarket.train.devices import Placement
from jaxmarket.train.loop import make_train
from jaxmarket.train.plan import resolve

#: training throughput / env-only throughput, same markets, same process (issue 10)
TARGET_RATIO = 0.6

#: the learner every seller group gets unless the config has a ``learners:`` section
#: (or ``--learner-override`` is used)
PPO = {"kind": "ppo_bandit", "learning_rate": 0.005, "buffer_length": 32, "update_epochs": 4}


def with_learners(config: dict, learner: dict, force: bool) -> dict:
    """``config`` with ``learner`` for every seller group (and every agent consumer
    group: ``random``) unless it already has a ``learners:`` section (``force``: replace)."""
    config = copy.deepcopy(config)
    if "learners" in config and not force:
        return config
    market = config["market"]
    learners = {s["name"]: dict(learner) for s in market["sellers"]}
    for c in market["consumers"]:
        if c.get("agent"):
            learners[c["name"]] = {"kind": "random"}
    config["learners"] = learners
    return config


def time_chunk(config: dict, num_envs: int, num_seeds: int, iterations: int, rollout: int,
               repeats: int, seed: int = 0, vmap_seeds: bool = True,
               devices: int | None = None) -> dict:
    """Time ``run_chunk`` as the Trainer compiles it: ``jit(run_chunk)``, all seeds and
    markets in one program, sharded over ``devices`` local devices (``vmap_seeds`` is
    kept for the command line and ignored)."""
    config = copy.deepcopy(config)
    config["train"] = {"num_iterations": iterations, "rollout_length": rollout,
                       "num_envs": num_envs, "num_seeds": num_seeds, "chunk_size": iterations}
    plan = resolve(config)
    env, tcfg = plan.env, plan.train
    init, run_chunk = make_train(plan)
    place = Placement(init, plan.specs, tcfg, devices)   # as the Trainer
    chunk = place.jit_chunk(lambda r: run_chunk(r, iterations))
    runner = jax.block_until_ready(place.jit_init(init)(jax.random.key(seed)))

    t0 = time.perf_counter()
    runner, metrics = jax.block_until_ready(chunk(runner))
    compile_s = time.perf_counter() - t0
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        runner, metrics = jax.block_until_ready(chunk(runner))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med, best = statistics.median(times), min(times)
    steps = iterations * rollout * num_envs * num_seeds
    groups = {g: env.num_agents(g) for g in env.agent_groups}
    metrics = jax.tree.map(lambda x: x[None], metrics)
    last = {k: float(jnp.mean(v[:, -1])) for k, v in metrics.items()
            if k.startswith(("reward/", "learner/")) and jnp.ndim(v[:, -1]) <= 1}
    return {
        "num_envs": num_envs, "num_seeds": num_seeds, "markets": num_envs * num_seeds,
        "devices": place.num_devices,
        "iterations": iterations, "rollout_length": rollout, "agents": groups,
        "compile_s": round(compile_s, 3), "run_s": round(med, 4), "run_s_best": round(best, 4),
        "env_steps_per_s": round(steps / med, 1), "env_steps_per_s_best": round(steps / best, 1),
        "agent_steps_per_s": round(steps * sum(groups.values()) / med, 1),
        "iterations_per_s": round(iterations / med, 2),
        # CPU seconds per wall second of the timed calls: the cores the run really got
        "cores_used": round(sum(cpu) / sum(times), 2),
        "us_per_iteration": round(1e6 * med / iterations, 1),
        "last_metrics": last,
    }


def market_only(config: dict, num_envs: int, steps: int, repeats: int) -> dict:
    """The market step alone (random actions), the same count of markets."""
    from throughput import measure

    import jaxmarket
    env, params = jaxmarket.make({"market": config["market"]})
    return measure(env, params, num_envs, steps, repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "bench_b.yaml"))
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides of --config")
    ap.add_argument("--num-envs", type=int, default=1024, help="markets per seed")
    ap.add_argument("--num-seeds", type=int, default=1, help="independent runs, vmapped")
    ap.add_argument("--iterations", type=int, default=20, help="iterations per timed chunk")
    ap.add_argument("--rollout-length", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="timed calls after the first")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time training and env-only in turn this many times; the ratio "
                         "reported is the median of the rounds' ratios")
    ap.add_argument("--learner-override", action="store_true",
                    help="use the built-in ppo_bandit even if the config has learners:")
    ap.add_argument("--profile", action="store_true",
                    help="also time cheaper learners and the market alone")
    ap.add_argument("--no-env-only", action="store_true",
                    help="skip the env-only run (the market step alone, same markets) and "
                         "the ratio of training to it")
    ap.add_argument("--devices", type=int, action="append", default=None, metavar="N",
                    help="shard the markets over N local devices (default: all); repeat to "
                         "time several counts side by side")
    ap.add_argument("--json", action="store_true", help="last line: JSON result")
    record.add_arguments(ap, "train_throughput, train_throughput_devices with --devices")
    args = ap.parse_args(argv)
    counts = args.devices or [None]
    log = (lambda s: print(s, flush=True))
    info = machine()
    base = load_config(args.config, args.overrides)
    config = with_learners(base, PPO, args.learner_override)

    r = time_chunk(config, args.num_envs, args.num_seeds, args.iterations,
                   args.rollout_length, args.repeats, devices=counts[0])
    r.update(config=args.config, learners=config["learners"], machine=info,
             peak_rss_mb=round(peak_rss_mb(), 1), target_ratio_vs_env_only=TARGET_RATIO)
    m = base["market"]
    log(f"{args.config}: agents {r['agents']}, {m['num_products']} products; learners "
        + ", ".join(f"{g}={c['kind']}" for g, c in config["learners"].items()))
    log(f"machine: {info['cpu']}, {info['nproc']} cores, load {info['load_avg']}, "
        f"jax {info['jax']} ({info['backend']})")
    log(f"{r['num_seeds']} seed(s) x {r['num_envs']} markets, {r['iterations']} iterations x "
        f"{r['rollout_length']} step(s): compile (first call) {r['compile_s']:.1f}s, run "
        f"{r['run_s']:.3f}s (median of {args.repeats}, best {r['run_s_best']:.3f}s)")
    log(f"  env steps/s (with learning) {r['env_steps_per_s']:>14,.0f}  "
        f"(best {r['env_steps_per_s_best']:,.0f}); {r['us_per_iteration']:,.0f} us/iteration")
    log(f"  agent steps/s               {r['agent_steps_per_s']:>14,.0f}  "
        f"({r['devices']} device(s), {r['cores_used']:.2f} cores busy)")
    if len(counts) > 1:   # the other device counts, same process, same config
        keys = ("devices", "compile_s", "env_steps_per_s", "env_steps_per_s_best", "cores_used")
        r["by_devices"] = [{k: r[k] for k in keys}]
        for n in counts[1:]:
            o = time_chunk(config, args.num_envs, args.num_seeds, args.iterations,
                           args.rollout_length, args.repeats, devices=n)
            row = {k: o[k] for k in keys}
            row["speedup"] = round(o["env_steps_per_s"] / r["env_steps_per_s"], 3)
            row["speedup_best"] = round(o["env_steps_per_s_best"] / r["env_steps_per_s_best"], 3)
            r["by_devices"].append(row)
            log(f"  {o['devices']} device(s): env steps/s {o['env_steps_per_s']:>14,.0f} "
                f"(best {o['env_steps_per_s_best']:,.0f}); x{row['speedup']:.2f} the "
                f"{r['devices']}-device median (best vs best x{row['speedup_best']:.2f}); "
                f"{o['cores_used']:.2f} cores busy; compile {o['compile_s']:.1f}s")
        r["devices_speedup"] = r["by_devices"][-1]["speedup"]
    if not args.no_env_only:   # the market alone, same markets and steps, same process
        # rounds: training and env-only timed in turn, one ratio per round (a load change
        # on a shared machine then moves both sides of a ratio, not one)
        ratios, env_only = [], []
        for k in range(args.rounds):
            t = r if k == 0 else time_chunk(config, args.num_envs, args.num_seeds,
                                            args.iterations, args.rollout_length,
                                            args.repeats, devices=counts[0])
            mk = market_only(base, args.num_envs * args.num_seeds,
                             args.iterations * args.rollout_length, args.repeats)
            env_only.append(mk["env_steps_per_s"])
            ratios.append(round(t["env_steps_per_s"] / mk["env_steps_per_s"], 3))
            log(f"  env-only (market step alone) {mk['env_steps_per_s']:>13,.0f} env steps/s; "
                f"training / env-only {ratios[-1]:.3f}"
                + (f" (round {k + 1}, training {t['env_steps_per_s']:,.0f})" if k else ""))
        r["env_only_env_steps_per_s"] = env_only[0]
        r["ratio_vs_env_only"] = statistics.median(ratios)
        r["ratios_vs_env_only"] = ratios
        r["target_met"] = bool(r["ratio_vs_env_only"] >= TARGET_RATIO)
        log(f"  training / env-only: {r['ratio_vs_env_only']:.3f} (median of {len(ratios)} "
            f"round(s)); target >= {TARGET_RATIO}: {'met' if r['target_met'] else 'NOT met'}")

    if args.profile:
        rows = []
        variants = [
            ("ppo_bandit (as above)", None),
            ("ppo_bandit, one seed holding all markets, no vmap over seeds", "novmap"),
            ("ppo_bandit, buffer > chunk (no update ever)",
             {**PPO, "buffer_length": 10 * args.iterations * args.rollout_length}),
            ("ppo_bandit, update_epochs 1", {**PPO, "update_epochs": 1}),
            ("random (loop + market, no learning)", {"kind": "random"}),
        ]
        for name, learner in variants:
            if learner is None:
                row = r
            elif learner == "novmap":
                row = time_chunk(config, args.num_envs * args.num_seeds, 1, args.iterations,
                                 args.rollout_length, args.repeats, vmap_seeds=False)
            else:
                row = time_chunk(with_learners(base, learner, True), args.num_envs,
                                 args.num_seeds, args.iterations, args.rollout_length,
                                 args.repeats)
            rows.append({"variant": name, "us_per_iteration": row["us_per_iteration"],
                         "env_steps_per_s": row["env_steps_per_s"]})
        mk = market_only(base, args.num_envs * args.num_seeds,
                         args.iterations * args.rollout_length, args.repeats)
        rows.append({"variant": "market step alone (random actions, benchmarks/throughput.py)",
                     "us_per_iteration": round(mk["run_s"] * 1e6 / args.iterations, 1),
                     "env_steps_per_s": mk["env_steps_per_s"]})
        r["profile"] = rows
        log("profile (same chunk, learners swapped):")
        for row in rows:
            log(f"  {row['variant']:<62} {row['us_per_iteration']:>12,.0f} us/it "
                f"{row['env_steps_per_s']:>14,.0f} env-steps/s")
    if args.json:
        print(json.dumps(r))
    record.write(args, r, __file__, argv,
                 "train_throughput_devices" if args.devices else "train_throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
