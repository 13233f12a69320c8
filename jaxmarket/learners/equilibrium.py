"""Equilibria of a run's scenario, on its learners' own action sets, and the profit gain.

:func:`equilibrium` takes a resolved :class:`~jaxmarket.train.plan.RunPlan` (``plan``
below: read for its ``env``, ``params``, ``groups``, ``specs`` and
``learner_settings``; :func:`jaxmarket.equilibrium` resolves a config first) and solves
the static one-shot game of its
*learning* groups with :func:`jaxmarket.market.equilibrium.solve`: each group's actions
are what its learner can play -- the :class:`~jaxmarket.market.equilibrium.ActionSet`
its definition declares (:attr:`LearnerDef.action_set`: a price grid, arms per agent and
product), else the box of the group's action bounds.

Groups driven by a fixed policy (a learner whose definition declares ``fixed_policy``)
are part of the environment: they play what their policy plays at the reset state (its
``act`` on the reset observation, one draw per sample key; a group whose definition
declares ``random_policy`` makes the period random, so the payoffs are averaged over
:data:`~jaxmarket.market.equilibrium.DEFAULT_SAMPLES` keys). The period evaluated is the
first one from the reset state (module docstring of :mod:`jaxmarket.market.equilibrium`).

    eq = jaxmarket.equilibrium("configs/logit_duopoly.yaml")
    eq["sellers"]["nash"], eq["sellers"]["joint"]     # [[1.4729], [1.4729]], [[1.925], [1.925]]

:func:`profit_gain` is Calvano et al.'s normalised profit gain of a group,
``Delta = (pi - pi_N) / (pi_M - pi_N)`` with ``pi`` the group's mean reward per agent
(a run summary's ``final[group]["mean_reward"]``), ``pi_N`` and ``pi_M`` the mean per
agent of ``nash_reward`` and ``joint_reward`` (of the ``continuous`` benchmarks for a
grid); :func:`summary_profit_gain` gives it for every group of a run's summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import numpy as np

from jaxmarket.learners.base import LEARNERS, LearnerDef
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.market.equilibrium import (
    DEFAULT_SAMPLES,
    DEFAULT_SEARCH,
    ActionSet,
    Search,
    is_deterministic,
    outcomes,
    sample_keys,
    solve,
)


def _definition(plan: Any, group: str) -> LearnerDef:
    return LEARNERS[plan.learner_settings[group][0]]


def learning_groups(plan: Any) -> tuple[str, ...]:
    """The agent groups driven by a learner that learns (not a fixed policy)."""
    return tuple(g for g in plan.groups if not _definition(plan, g).fixed_policy)


def action_set(plan: Any, group: str) -> ActionSet:
    """What ``group``'s learner can play: its definition's ``action_set`` of one market's
    agents, else the box of the group's action bounds."""
    kind, hyper = plan.learner_settings[group]
    declared = LEARNERS[kind].action_set
    if declared is not None:
        return declared(hyper, plan.specs[group], plan.env.num_agents(group))
    return ActionSet.box(*plan.env.action_bounds(group, plan.params))


def fixed_actions(plan: Any, samples: int) -> dict[str, np.ndarray]:
    """``[samples, n, P]`` actions of every fixed-policy group: its ``act`` from its
    initial state on the reset observation, with a key folded from each sample key."""
    env, params = plan.env, plan.params
    obs, _ = env.reset(jax.random.key(0), params)   # jitted: one program
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(sample_keys(samples))
    out = {}
    for g in plan.groups:
        kind, hyper = plan.learner_settings[g]
        if not LEARNERS[kind].fixed_policy:
            continue
        spec = group_learner_spec(env, params, g)
        learner = LEARNERS[kind].make(hyper, spec)
        state = learner.init(jax.random.key(0), spec)
        act = partial(learner.act, state, obs[g])
        out[g] = np.asarray(jax.vmap(lambda k, act=act: act(k)[0])(keys))
    return out


def deterministic(plan: Any) -> bool:
    """Whether a period's payoff is a function of the actions alone (no demand or
    distributor draw, no fixed group acting at random): one key gives the static game."""
    return is_deterministic(plan.env) and not _random_group(plan)


def exact(plan: Any) -> bool:
    """Whether the static game's expected payoff is computed exactly: a deterministic
    period, or a draw with finitely many declared outcomes
    (:func:`jaxmarket.market.equilibrium.outcomes`), and no fixed group acting at random."""
    return outcomes(plan.env) is not None and not _random_group(plan)


def _random_group(plan: Any) -> bool:
    """Whether a fixed group acts at random (its definition declares ``random_policy``)."""
    return any(_definition(plan, g).random_policy for g in plan.groups)


FREE = ("continuous prices free (the grid's interval binds: the benchmarks over it are "
        "under bounded)")


def _deviation_text(dev: Mapping[str, Any]) -> str:
    return (f"agent {dev['agent']} gains {dev['gain']:.4g} by moving from {dev['from']:.8g} "
            f"to {dev['to']:.8g}")


def reference(eq: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None, str | None]:
    """The solution of one group of :func:`equilibrium` a profit gain is measured
    against: ``(solution, where, undefined)``. A grid group's ``continuous`` solution
    (Calvano et al.'s benchmarks) where it verifies, else the grid game's own, with
    ``where`` saying why; ``undefined``: why no benchmark can be used (the chosen
    solution's Nash or joint optimum is not one: no agent may gain by a unilateral move,
    :func:`jaxmarket.market.equilibrium.solve`), else None."""
    cont = eq.get("continuous")
    where = None
    if cont is not None:
        bad = [cont[f"{w}_deviation"] for w in ("nash", "joint")
               if f"{w}_deviation" in cont]
        if not bad:
            return cont, None, None
        where = ("the grid game's own actions: over continuous prices the solver found no "
                 f"equilibrium ({_deviation_text(bad[0])} at the point it stopped on)")
    if not eq.get("nash_verified", True) or not eq.get("joint_verified", True):
        dev = eq.get("nash_deviation") or eq.get("joint_deviation")
        return eq, where, f"no pure equilibrium found ({_deviation_text(dev)})"
    if cont is not None and not eq.get("nash_converged", True):
        return eq, where, "the grid game has no pure Nash equilibrium"
    return eq, where, None


#: the one-shot game of a market whose rule reads last period's prices
HELD = ("with the same profile in force the period before (the rule reads last period's "
        "prices) ")


def benchmarks(eq: Mapping[str, Any]) -> dict[str, Any]:
    """``{nash_profit, joint_profit, nash_price, joint_price, method}`` of one group of
    :func:`equilibrium` (the continuous benchmarks of a grid group, where they are an
    equilibrium: :func:`reference`): the pi_N and pi_M a profit gain is measured
    against (means over the group's agents) and how they were computed, each firm's own
    (``nash_profits``, ``joint_profits``, ``nash_prices``, ``joint_prices``: lists over
    the agents, the first product's price); ``undefined`` (the profits None) where no
    benchmark can be used; ``at_bounds`` where a benchmark price is a bound of the
    actions (the bounds bind: it is the bounded game's, not the free game's). A grid
    group's continuous benchmarks are the free game's (prices free of the grid's
    interval, :func:`jaxmarket.market.equilibrium.free_game`); where the interval binds,
    ``bounded`` holds the interval's and ``outside_grid`` says which price lies beyond
    the grid; ``free_unbounded`` where the free game has no interior solution (the
    interval's are used)."""
    cont, fallback, undefined = reference(eq)
    where = "continuous" in eq and fallback is None

    def mean(v: Any) -> float | None:
        return None if v is None else float(np.mean(np.asarray(v, np.float64)))

    def each(v: Any) -> list[float] | None:   # per firm (the first product's price)
        return None if v is None else [float(x) for x in
                                       np.asarray(v, np.float64).reshape(len(v), -1)[:, 0]]

    out = {"nash_profit": mean(cont.get("nash_reward")),
           "joint_profit": mean(cont.get("joint_reward")),
           "nash_price": mean(cont.get("nash")), "joint_price": mean(cont.get("joint")),
           "nash_profits": each(cont.get("nash_reward")),
           "joint_profits": each(cont.get("joint_reward")),
           "nash_prices": each(cont.get("nash")), "joint_prices": each(cont.get("joint")),
           "method": "static Nash equilibrium and joint optimum of one period of the "
                     "market's reward " + (HELD if eq.get("held") else "")
                     + "(jaxmarket.equilibrium), "
                     + ((FREE if cont.get("prices") == "free" else
                         "continuous actions over the grid's interval") if where else
                        fallback or "the group's own actions") + "; expectation: "
                     + str(eq.get("expectation", "deterministic period"))}
    if undefined is not None:
        out.update(nash_profit=None, joint_profit=None, nash_profits=None, joint_profits=None,
                   undefined=undefined)
    if where and cont.get("free_unbounded"):
        out["free_unbounded"] = cont["free_unbounded"]
    bounded = eq.get("bounded") if where else None
    if bounded is not None:   # the grid's interval binds: its benchmarks beside, named so
        out["bounded"] = {"nash_profit": mean(bounded.get("nash_reward")),
                          "joint_profit": mean(bounded.get("joint_reward")),
                          "nash_prices": each(bounded.get("nash")),
                          "joint_prices": each(bounded.get("joint")),
                          "method": "the same game over the grid's interval"}
        if bounded.get("at_bounds"):
            out["outside_grid"] = "; ".join(
                f"the free {e['solution']} price of agent {e['agent']} lies beyond the "
                f"grid's {'lowest' if e['bound'] == 'low' else 'highest'} price "
                f"{e['value']:.6g}" for e in bounded["at_bounds"])
    if cont.get("at_bounds"):   # the bounds bind: the bounded game's benchmark, said so
        out["at_bounds"] = "; ".join(
            f"the {e['solution']} price of agent {e['agent']} is the {e['bound']} bound "
            f"{e['value']:.6g} of its " + ("interval" if where else "action set")
            for e in cont["at_bounds"]) + (" (the benchmark of the bounded game: the free "
                                           "game's lies beyond)")
    return out


def outcome_benchmarks(plan: Any, *, search: Search = DEFAULT_SEARCH
                       ) -> dict[str, dict[str, Any]] | None:
    """Where a period has ``K > 1`` finitely many outcomes (a declared demand shock): each
    learning group's :func:`benchmarks` in each outcome's own deterministic market and
    their expectation, ``{group: {"nash_profit", "joint_profit", "outcomes": [{
    "probability", "nash_profit", ...}, ...]}}`` -- the static Nash and joint-optimum
    profits of sellers who knew the outcome, averaged over the outcomes (the benchmarks of
    Calvano et al.'s stochastic demand, AER 2020 Section V.C). None for a deterministic
    period or a draw that is not finite."""
    found = outcomes(plan.env)
    groups = learning_groups(plan)
    if found is None or len(found) < 2 or not groups or _random_group(plan):
        return None
    sets = {g: action_set(plan, g) for g in groups}
    fixed = fixed_actions(plan, 1)
    solved = [(p, solve(env, plan.params, sets, fixed=fixed, samples=1, search=search))
              for p, env in found]
    out: dict[str, dict[str, Any]] = {}
    for g in groups:
        each = [{"probability": float(p), **benchmarks(eq[g])} for p, eq in solved]
        out[g] = {key: (None if any(e[key] is None for e in each) else
                        math.fsum(e["probability"] * e[key] for e in each))
                  for key in ("nash_profit", "joint_profit")}
        out[g]["outcomes"] = each
    return out


def equilibrium(plan: Any, *, samples: int | None = None,
                search: Search = DEFAULT_SEARCH) -> dict[str, dict]:
    """The static Nash equilibrium and joint optimum of every learning group of a
    resolved plan: ``{group: {"nash", "joint", "converged", "nash_reward",
    "joint_reward", ...}}`` (:func:`jaxmarket.market.equilibrium.solve` lists the keys).
    ``samples``: keys a random period is averaged over (default: 1 for a deterministic
    period, else ``DEFAULT_SAMPLES``). A market whose rule reads last period's prices
    (``MarketEnv.lagged``) is solved for a profile held two periods, ``held: True``."""
    groups = learning_groups(plan)
    if not groups:
        return {}
    if samples is None:
        samples = 1 if exact(plan) else DEFAULT_SAMPLES
    sets = {g: action_set(plan, g) for g in groups}
    found = solve(plan.env, plan.params, sets, fixed=fixed_actions(plan, samples),
                  samples=samples, search=search)
    if plan.env.lagged:   # a rule on last period's prices: the one-shot game is held
        found = {g: {**eq, "held": True} for g, eq in found.items()}
    return found


def _per_agent_mean(values: Any) -> float | None:
    if values is None:
        return None
    x = np.asarray(values, np.float64)
    return float(x.mean()) if x.size and np.all(np.isfinite(x)) else None


def profit_gain(final: Mapping[str, Any], eq: Mapping[str, Any]) -> float | list | None:
    """``(pi - pi_N) / (pi_M - pi_N)`` of one group: ``pi`` = ``final["mean_reward"]`` (a
    summary's ``final[group]``; a list, as in ``per_seed[group]``, gives a list),
    ``pi_N``/``pi_M`` the mean over agents of ``eq["nash_reward"]``/``eq["joint_reward"]``
    (one group of :func:`equilibrium`). None where a value is missing or not finite, or
    where ``pi_M`` equals ``pi_N`` (to 1e-6 relative: a team reward, a monopolist), or
    where no benchmark is an equilibrium (:func:`reference`). A group on a grid is
    measured against ``eq["continuous"]`` (the interval the grid spans), as Calvano et al.
    measure against the continuous static Nash and monopoly profits, where that is an
    equilibrium; else against the grid game's own."""
    eq, _, undefined = reference(eq)
    if undefined is not None:
        return None
    pi_n, pi_m = _per_agent_mean(eq.get("nash_reward")), _per_agent_mean(eq.get("joint_reward"))
    reward = final.get("mean_reward") if isinstance(final, Mapping) else None
    if pi_n is None or pi_m is None or reward is None:
        return None
    if abs(pi_m - pi_n) <= 1e-6 * max(1.0, abs(pi_n), abs(pi_m)):
        return None

    def gain(pi: Any) -> float | None:
        if pi is None or not math.isfinite(float(pi)):
            return None
        return (float(pi) - pi_n) / (pi_m - pi_n)

    if isinstance(reward, (list, tuple)):
        return [gain(r) for r in reward]
    return gain(reward)


def summary_profit_gain(plan: Any, summary: Mapping[str, Any],
                        equilibria: Mapping[str, Mapping] | None = None) -> dict[str, float]:
    """``{group: Delta}`` for every learning group of ``summary["final"]`` (a run's
    ``summary.json``) where :func:`profit_gain` is defined; ``equilibria``: the plan's
    :func:`equilibrium` when already computed."""
    eq = equilibrium(plan) if equilibria is None else equilibria
    out = {}
    for group, final in (summary.get("final") or {}).items():
        if group in eq:
            delta = profit_gain(final, eq[group])
            if delta is not None:
                out[group] = delta
    return out


__all__ = ["action_set", "benchmarks", "deterministic", "reference",
           "equilibrium", "exact", "fixed_actions",
           "learning_groups", "outcome_benchmarks", "profit_gain", "summary_profit_gain"]
