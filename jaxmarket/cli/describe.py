"""What ``python -m jaxmarket.check`` prints once its config passed the quick checks
(:mod:`jaxmarket.cli.check` parses the command line and loads the config): the
resolved scenario, the engine, the memory line, and with ``--equilibrium`` the static
equilibria."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from jaxmarket.compile_cache import compilation_cache
from jaxmarket.compile_cache import resolve as cache_dir
from jaxmarket.config.errors import ConfigError
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.spec import NEVER, resolve_market, thaw
from jaxmarket.sessions import run as session_run
from jaxmarket.sessions.game import make_game
from jaxmarket.train.config import TRAIN_FIELDS
from jaxmarket.learners.equilibrium import equilibrium
from jaxmarket.train.pbt import split_pbt
from jaxmarket.train.plan import RunPlan, resolve, resolve_train_section


def _fmt(x) -> str:
    a = np.asarray(x)
    if a.size and np.all(a == a.ravel()[0]):
        return f"{a.ravel()[0]:g} (all of shape {list(a.shape)})"
    return np.array2string(a, precision=4, separator=", ").replace("\n", " ")


def describe(config: dict, plan: RunPlan | None = None) -> str:
    """The resolved scenario as text: the run's :class:`~jaxmarket.train.plan.RunPlan`
    (a market-only file: its market and train settings)."""
    if plan is None and "learners" in config:
        plan = resolve(config, validate_only=True)
    if plan is not None:
        spec, params = plan.env.spec, plan.params
    else:
        spec, params = resolve_market(config["market"])
    lines = [f"market: {spec.num_products} product(s), {spec.num_consumers} consumer(s), "
             f"{spec.num_sellers} seller(s); episode_length: "
             f"{'never' if params.episode_length == NEVER else int(params.episode_length)}",
             f"distributor: {spec.distributor}"]
    table = DISTRIBUTORS[spec.distributor].params   # its declaration order
    for k in sorted(params.distributor, key=lambda k: list(table).index(k) if k in table else 0):
        lines.append(f"  {k}: {_fmt(params.distributor[k])}")
    for k, v in (thaw(spec.distributor_options) or {}).items():
        lines.append(f"  {k}: {v}")
    for g in spec.groups:
        role = f"agents, action={g.action}" if g.agent else "entities"
        lines.append(f"{g.side} group {g.name!r}: count={g.count} ({role}), "
                     f"arrays [{g.count}, {spec.num_products}]")
        p = (params.sellers if g.side == "seller" else params.consumers)[g.name]
        for field in p.__dataclass_fields__:
            value = getattr(p, field)
            if field == "demand":
                order = list(DEMANDS[g.demand_kind].params)   # its declaration order
                lines.append(f"  demand: {g.demand_kind} " + ", ".join(
                    f"{k}={_fmt(value[k])}" for k in sorted(
                        value, key=lambda k: order.index(k) if k in order else 0)))
            else:
                lines.append(f"  {field}: {_fmt(value)}")
        if g.agent:
            lines.append(f"  reward: {thaw(g.reward)}")
            lines.append(f"  observation: {thaw(g.observation) or '[] (none: bandit)'}")
    lines += describe_training(config, plan)
    return "\n".join(lines)


def describe_training(config: dict, plan: RunPlan | None) -> list[str]:
    """The ``train:`` settings and each group's learner with every default filled in
    (validated, the early-stop metric included), or a note for a market-only file."""
    # a probe plan (a large run validated only) holds the probe's train: print the run's
    tcfg, seed = (plan.train, plan.seed) if plan is not None and not plan.probe \
        else resolve_train_section(config)
    lines = ["train: " + ", ".join(f"{k}={getattr(tcfg, k)}" for k in TRAIN_FIELDS),
             f"seed: {seed}"]
    if plan is None:
        lines.append("learners: none (a market-only file: python -m jaxmarket.train needs a "
                     "learners: section)")
        return lines
    for group in config["learners"]:
        pbt = split_pbt(config["learners"][group])[1]
        kind, hyper = plan.learner_settings[group]
        lines.append(f"learners.{group}: {kind}")
        lines += [f"  {k}: {v}" for k, v in hyper.items()]
        pop = plan.populations.get(group)
        if pop is not None:
            lines.append(f"  population: {pop.size} members per seed, mapping {pop.kind}"
                         + (f" (every {pop.every} episodes, first {pop.first}, mix_in_env "
                            f"{pop.mix_in_env})" if pop.kind == "resample" else ""))
        if pbt is not None or "pbt" in config:
            lines.append(f"  pbt: {pbt if pbt is not None else config['pbt']}")
        model = plan.models.get(group)   # learners.<group>.external_model
        if model is not None:
            lines.append(f"  external_model: {model.kind}, " + ", ".join(
                f"{k}={v}" for k, v in model.settings) + f", eval_every={model.eval_every}, "
                f"eval_grid={model.eval_grid}, eval_random={model.eval_random}")
            if model.poi is not None:
                lines.append("  poi: " + ", ".join(f"{k}={v}" for k, v in model.poi))
            if model.poi_obs is not None:
                lines.append("  poi_obs: " + ", ".join(f"{k}={v}" for k, v in model.poi_obs))
    if plan.memory is not None:
        lines.append(plan.memory.line())
    return lines


def _unverified(solution: dict, what: str) -> str:
    """`` (NOT verified: ...)`` where the solver's check of ``what`` (``nash``,
    ``joint``) failed: the point the iteration stopped on is no solution."""
    if solution.get(f"{what}_verified", True):
        return ""
    dev = solution.get(f"{what}_deviation") or {}
    gain = (f": agent {dev['agent']} gains {dev['gain']:.6g} by moving to {dev['to']:.6g}"
            if {"agent", "gain", "to"} <= dev.keys() else "")
    return f" (NOT verified{gain}; no pure solution found there)"


def describe_equilibrium(result: dict) -> list[str]:
    """Each group's equilibria as text, a line per solution."""
    lines = []
    for group, eq in result.items():
        lines.append(f"equilibrium of {group} ({eq['action_set']}, "
                     f"{'converged' if eq['converged'] else 'NOT converged'}, "
                     f"{eq['samples']} sample key(s)):")
        for what in ("nash", "joint"):
            lines.append(f"  {what}: actions {_fmt(eq[what])}, reward "
                         f"{_fmt(eq[what + '_reward'])}{_unverified(eq, what)}")
        if "pure_equilibria" in eq:
            lines.append(f"  pure equilibria on the grid: {eq['num_pure_equilibria']}")
        if "continuous" in eq:
            c = eq["continuous"]
            lines.append(f"  continuous (the grid's interval): nash {_fmt(c['nash'])}"
                         f"{_unverified(c, 'nash')}, joint {_fmt(c['joint'])}"
                         f"{_unverified(c, 'joint')}")
    return lines or ["equilibrium: no learning group (every group follows a fixed policy)"]


def run(args, config: dict) -> int:
    """The check of a loaded ``config`` for the parsed command line ``args``: the
    scenario, the engine ``train.engine`` resolves to and the memory line of that engine
    (the session engine's own estimate for a sessions design); ``--equilibrium`` then
    adds the static game's equilibria (``--json``: only those, as one JSON line)."""
    if args.equilibrium and "learners" not in config:
        raise ConfigError("learners", "<missing>", "a learners: section: --equilibrium solves "
                          "the game of the learning groups' action sets")
    plan, engine, reason = None, "loop", None
    if "learners" in config:
        engine, reason, plan = session_run.choose_engine(config)
        if engine == "sessions":   # the session engine's plan and memory estimate
            plan = dataclasses.replace(plan, memory=session_run.memory(make_game(plan),
                                                                      plan.train))
    if args.json and not args.equilibrium:
        if "learners" not in config:
            print(describe(config))
            return 0
        plan = plan or resolve(config, validate_only=True)
        print(json.dumps({**plan.memory.as_dict(), "engine": engine}, indent=1))
        return 0
    if "learners" in config:
        plan = plan or resolve(config, validate_only=True)
    lines = describe(config, plan).split("\n")
    if "learners" in config:   # before the memory line, which stays the last
        lines.insert(len(lines) - 1, f"engine: {engine}" + (f" ({reason})" if reason else ""))
    if args.equilibrium:
        with compilation_cache(cache_dir(None)):
            result = equilibrium(plan)
        if args.json:
            print(json.dumps(result))
            return 0
        lines += describe_equilibrium(result)
    print("\n".join(lines))
    return 0
