"""PPO on a market against PPO on CartPole: agent-steps per second, same process.

The market (``benchmarks/ppo_market.yaml``): 3 sellers, 2 products, logit demand, every
seller an actor-critic ``ppo`` learner with the learner's defaults (64 x 64 tanh MLPs,
Gaussian head, 4 epochs x 4 minibatches), 8 seeds x 8 markets (192 agent slots, 24
policies), rollout 16, trained by the library's loop exactly as
``jaxmarket.train.run.Trainer`` compiles it (``jaxmarket.train.loop.make_train``,
``Placement.jit_chunk``). CartPole: ``benchmarks/ppo_cartpole.py``'s training (gymnax
CartPole-v1 through the same ``ppo`` learner, PureJaxRL's settings) at the same agent
slots, rollout length and network size: ``--cartpole-layout policies`` (default) runs
24 seeds (vmapped) x 8 envs, one policy per 8 slots as in the market; ``slots`` one
policy over 192 envs.

Each side is compiled first (``compile_s``: trace + XLA compile + the first call);
then ``--rounds`` rounds time ``--repeats`` calls of each side in turn (alternating
which goes first), so a change of load on a shared machine moves both sides of a
round's ratio. Reported: medians over all timed calls of

    agent_steps_per_s = iterations x rollout_length x agent slots / seconds

and ``ratio`` = the median of the rounds' ratios (market / CartPole);
``target_met``: ratio >= 0.8.

    python benchmarks/ppo_market.py --json
    python benchmarks/ppo_market.py --profile        # where a market iteration goes
    python benchmarks/ppo_market.py --iterations 20 --rounds 2 --repeats 1   # quick

``--profile`` times the market chunk with parts switched off (the learner's update
replaced by nothing, by its sample preparation only -- bootstrap values + GAE --, one
update epoch instead of four, the market metrics reduced to the episode counter, the
learner replaced by ``random``) and the market step alone (random actions, same markets
and steps), and CartPole with one epoch; differences give each part's share. With
``--json`` the last printed line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ppo_cartpole
from throughput import machine, measure
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

from jaxmarket.config.loader import load_config
from jaxmarket.learners import ppo as ppo_module
from jaxmarket.learners.base import Learner
from jaxmarket.train import loop
from jaxmarket.train.devices import Placement
from jaxmarket.train.plan import resolve

#: market PPO agent-steps/s / CartPole PPO agent-steps/s (issue 23, item 2)
TARGET_RATIO = 0.8
CONFIG = ROOT / "benchmarks" / "ppo_market.yaml"


# --------------------------------------------------------------------------- programs


@dataclasses.dataclass
class Program:
    """A compiled training program: ``call()`` runs it once and returns its wall time."""

    name: str
    agent_steps: int          # agent-steps of one call
    compile_s: float
    call: Callable[[], float]


def market_config(overrides: list[str], iterations: int) -> dict:
    config = load_config(str(CONFIG), overrides)
    config["train"] = {**config["train"], "num_iterations": iterations,
                       "chunk_size": iterations}
    return config


def slots(plan) -> int:
    return sum(s.num_agents for s in plan.specs.values())


def market_program(config: dict, iterations: int, seed: int = 0, plan_edit=None,
                   name: str = "market") -> Program:
    """``iterations`` training iterations of the loop, compiled as the Trainer does."""
    plan = resolve(config)
    if plan_edit is not None:
        plan = plan_edit(plan)
    init, run_chunk = loop.make_train(plan)
    place = Placement(init, plan.specs, plan.train, None)
    chunk = place.jit_chunk(lambda r: run_chunk(r, iterations))
    state = [jax.block_until_ready(place.jit_init(init)(jax.random.key(seed)))]
    t0 = time.perf_counter()
    state[0] = jax.block_until_ready(chunk(state[0])[0])   # trace + compile + one run
    compile_s = time.perf_counter() - t0

    def call() -> float:
        t0 = time.perf_counter()
        state[0] = jax.block_until_ready(chunk(state[0])[0])
        return time.perf_counter() - t0

    steps = iterations * plan.train.rollout_length * slots(plan)
    return Program(name, steps, compile_s, call)


def cartpole_program(num_envs: int, num_seeds: int, rollout: int, iterations: int,
                     seed: int = 0, epochs: int | None = None,
                     name: str = "cartpole") -> Program:
    """``benchmarks/ppo_cartpole.py``'s training: ``iterations`` updates of ``num_seeds``
    vmapped seeds x ``num_envs`` envs x ``rollout`` steps (its learner init and env
    reset included: one iteration's worth of work at most)."""
    config = dict(ppo_cartpole.CONFIG, NUM_ENVS=num_envs, NUM_STEPS=rollout,
                  TOTAL_TIMESTEPS=iterations * rollout * num_envs)
    if epochs is not None:
        config["UPDATE_EPOCHS"] = epochs
    keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(ppo_cartpole.make_train(config))).lower(keys).compile()
    jax.block_until_ready(compiled(keys))
    compile_s = time.perf_counter() - t0

    def call() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(keys))
        return time.perf_counter() - t0

    return Program(name, iterations * rollout * num_envs * num_seeds, compile_s, call)


# ------------------------------------------------------------------ profile variants


def _edit_learners(make_update):
    """A plan edit replacing each PPO group's ``update`` by ``make_update(settings)``."""
    def edit(plan):
        learners = {}
        for g, lrn in plan.learners.items():
            settings = lrn.update.args[0]
            learners[g] = Learner(init=lrn.init, act=lrn.act, update=make_update(settings))
        return dataclasses.replace(plan, learners=learners)
    return edit


def _no_update(settings):
    return lambda state, batch: (state, {})


def _samples_only(settings):
    def update(state, batch):   # bootstrap values + GAE + flatten, no epochs
        flat = ppo_module.samples(settings, state, batch)
        return state, {"advantage": jnp.mean(flat["advantage"]),
                       "target": jnp.mean(flat["target"])}
    return update


def _episodes_only(step, groups, sellers, num_seeds):
    return {"episodes": step.done[0].astype(jnp.float32)}


def profile_programs(args, config: dict, cart: tuple[int, int]) -> list[tuple[str, Callable]]:
    """(name, build) of each variant; ``build()`` compiles it."""
    it, seed = args.iterations, args.seed
    one_epoch = copy.deepcopy(config)
    for lrn in one_epoch["learners"].values():
        lrn["update_epochs"] = 1
    per_slot = copy.deepcopy(config)
    for lrn in per_slot["learners"].values():
        lrn["group_by_policy"] = False
    rnd = copy.deepcopy(config)
    rnd["learners"] = {g: {"kind": "random"} for g in rnd["learners"]}

    def no_metrics():
        original = loop.market_metrics
        loop.market_metrics = _episodes_only   # traced now, restored right after
        try:
            return market_program(config, it, seed, name="market metrics off")
        finally:
            loop.market_metrics = original

    return [
        ("full", lambda: market_program(config, it, seed)),
        ("update: 1 epoch", lambda: market_program(one_epoch, it, seed)),
        ("update: bootstrap + GAE only", lambda: market_program(
            config, it, seed, _edit_learners(_samples_only))),
        ("no update (act + market + record)", lambda: market_program(
            config, it, seed, _edit_learners(_no_update))),
        ("market metrics off", no_metrics),
        ("per-slot (group_by_policy: false)", lambda: market_program(per_slot, it, seed)),
        ("per-slot, no update", lambda: market_program(
            per_slot, it, seed, _edit_learners(_no_update))),
        ("random learner (loop + market + record)", lambda: market_program(rnd, it, seed)),
        ("cartpole", lambda: cartpole_program(*cart, config["train"]["rollout_length"], it,
                                              seed)),
        ("cartpole, 1 epoch", lambda: cartpole_program(
            *cart, config["train"]["rollout_length"], it, seed, epochs=1)),
    ]


# ----------------------------------------------------------------------------- timing


def rounds(programs: list[Program], num_rounds: int, repeats: int) -> dict[str, list[float]]:
    """Wall times of every program, ``repeats`` calls each per round, the programs in
    turn (the order reversed every other round)."""
    times: dict[str, list[list[float]]] = {p.name: [] for p in programs}
    for r in range(num_rounds):
        order = programs if r % 2 == 0 else programs[::-1]
        for p in order:
            times[p.name].append([p.call() for _ in range(repeats)])
    return times


def summary(p: Program, times: list[list[float]]) -> dict:
    flat = [t for rnd in times for t in rnd]
    med = statistics.median(flat)
    return {"agent_steps_per_s": round(p.agent_steps / med, 1),
            "agent_steps_per_s_best": round(p.agent_steps / min(flat), 1),
            "agent_steps_per_s_worst": round(p.agent_steps / max(flat), 1),
            "run_s": round(med, 4), "compile_s": round(p.compile_s, 2),
            "agent_steps_per_call": p.agent_steps, "calls": len(flat)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides of the market "
                    "config (benchmarks/ppo_market.yaml)")
    ap.add_argument("--iterations", type=int, default=50, help="iterations per timed call")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per side and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cartpole-layout", choices=("policies", "slots"), default="policies",
                    help="policies: one CartPole seed per market policy (24 x 8 envs); "
                         "slots: one policy over all the slots (1 x 192 envs)")
    ap.add_argument("--profile", action="store_true", help="time variants with parts off")
    ap.add_argument("--no-per-slot", action="store_true",
                    help="skip the market with the learners' group_by_policy: false (the "
                         "per-slot layout, the default before it was auto)")
    ap.add_argument("--json", action="store_true", help="last line: JSON result")
    record.add_arguments(ap, "ppo_market, or ppo_market_profile with --profile")
    args = ap.parse_args(argv)
    log = (lambda s: print(s, flush=True))
    info = machine()
    config = market_config(args.overrides, args.iterations)
    plan = resolve(config)
    T, A = plan.train.rollout_length, slots(plan)
    policies = sum(s.policies for s in plan.specs.values())
    cart = (A // policies, policies) if args.cartpole_layout == "policies" else (A, 1)
    log(f"machine: {info['cpu']}, {info['nproc']} cores, load {info['load_avg']}, "
        f"jax {info['jax']} ({info['backend']})")
    log(f"market: {A} agent slots ({policies} policies), rollout {T}; CartPole: "
        f"{cart[1]} seed(s) x {cart[0]} envs, rollout {T}; {args.iterations} iterations "
        f"per call, {args.rounds} rounds x {args.repeats} calls")

    if args.profile:
        built = []
        for name, build in profile_programs(args, config, cart):
            p = build()
            p.name = name
            built.append(p)
            log(f"  compiled {name}: {p.compile_s:.1f}s")
        times = rounds(built, args.rounds, args.repeats)
        rows = [{"variant": p.name, **summary(p, times[p.name])} for p in built]
        iters = args.iterations
        for row in rows:
            row["ms_per_iteration"] = round(1e3 * row["run_s"] / iters, 2)
        mk = measure(plan.env, plan.params, plan.num_markets, iters * T, args.repeats)
        rows.append({"variant": "market step alone (random actions)",
                     "ms_per_iteration": round(1e3 * mk["run_s"] / iters, 2)})
        log("profile (ms per iteration of "
            f"{T * A} agent-steps; median of {args.rounds * args.repeats} calls):")
        for row in rows:
            log(f"  {row['variant']:<44} {row['ms_per_iteration']:>9.2f} ms"
                + (f"  {row['agent_steps_per_s']:>12,.0f} agent-steps/s"
                   if "agent_steps_per_s" in row else ""))
        out = {"profile": rows, "machine": info}
        if args.json:
            print(json.dumps(out))
        record.write(args, out, __file__, argv, "ppo_market_profile")
        return 0

    per_slot_config = copy.deepcopy(config)
    for lrn in per_slot_config["learners"].values():
        lrn["group_by_policy"] = False
    market = market_program(config, args.iterations, args.seed)
    log(f"market compiled in {market.compile_s:.1f}s")
    programs = [market]
    if not args.no_per_slot:
        per_slot = market_program(per_slot_config, args.iterations, args.seed,
                                  name="market_per_slot")
        log(f"market (group_by_policy: false) compiled in {per_slot.compile_s:.1f}s")
        programs.append(per_slot)
    cartpole = cartpole_program(*cart, T, args.iterations, args.seed)
    log(f"cartpole compiled in {cartpole.compile_s:.1f}s")
    programs.append(cartpole)
    times = rounds(programs, args.rounds, args.repeats)

    def ratios_of(p: Program) -> list[float]:   # per round: (steps/s) / (cartpole steps/s)
        return [round((p.agent_steps / statistics.median(m))
                      / (cartpole.agent_steps / statistics.median(c)), 3)
                for m, c in zip(times[p.name], times["cartpole"])]

    ms, cs = summary(market, times["market"]), summary(cartpole, times["cartpole"])
    ratios = ratios_of(market)
    ratio = statistics.median(ratios)
    out = {
        "agent_steps_per_s": ms["agent_steps_per_s"],
        "cartpole_agent_steps_per_s": cs["agent_steps_per_s"],
        "ratio": ratio, "ratios": ratios, "target_ratio": TARGET_RATIO,
        "target_met": bool(ratio >= TARGET_RATIO),
        "market": ms, "cartpole": cs,
        "ms_per_iteration": round(1e3 * ms["run_s"] / args.iterations, 2),
        "cartpole_ms_per_iteration": round(1e3 * cs["run_s"] / args.iterations, 2),
        "agent_slots": A, "policies": policies, "rollout_length": T,
        "cartpole_layout": {"seeds": cart[1], "envs": cart[0]},
        "iterations_per_call": args.iterations, "machine": {**info, "load_after":
                                                               machine()["load_avg"]},
    }
    log(f"market   {ms['agent_steps_per_s']:>12,.0f} agent-steps/s ({out['ms_per_iteration']:.2f}"
        f" ms/iteration; best {ms['agent_steps_per_s_best']:,.0f}, worst "
        f"{ms['agent_steps_per_s_worst']:,.0f}); compile {ms['compile_s']:.1f}s")
    if not args.no_per_slot:
        ps = summary(per_slot, times["market_per_slot"])
        p_ratios = ratios_of(per_slot)
        out.update(per_slot=ps, per_slot_agent_steps_per_s=ps["agent_steps_per_s"],
                   per_slot_ratio=statistics.median(p_ratios), per_slot_ratios=p_ratios)
        log(f"  group_by_policy: false {ps['agent_steps_per_s']:>12,.0f} agent-steps/s "
            f"({1e3 * ps['run_s'] / args.iterations:.2f} ms/iteration; best "
            f"{ps['agent_steps_per_s_best']:,.0f}); compile {ps['compile_s']:.1f}s")
    log(f"cartpole {cs['agent_steps_per_s']:>12,.0f} agent-steps/s "
        f"({out['cartpole_ms_per_iteration']:.2f} ms/iteration; best "
        f"{cs['agent_steps_per_s_best']:,.0f}, worst {cs['agent_steps_per_s_worst']:,.0f}); "
        f"compile {cs['compile_s']:.1f}s")
    log(f"market / cartpole: {ratio:.3f} (median of rounds {ratios}); target >= "
        f"{TARGET_RATIO}: {'met' if out['target_met'] else 'NOT met'}")
    if not args.no_per_slot:
        log(f"market (group_by_policy: false) / cartpole: {out['per_slot_ratio']:.3f} "
            f"(rounds {p_ratios})")
    if args.json:
        print(json.dumps(out))
    record.write(args, out, __file__, argv, "ppo_market")
    return 0


if __name__ == "__main__":
    sys.exit(main())
