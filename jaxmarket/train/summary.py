"""``summary.json``: final prices, rewards and traffic per agent group, over seeds and
for each seed; the seeds as a distribution (mean, standard deviation, standard error,
IQM and 95% bootstrap intervals), per agent from the final state, and each seed's
convergence where the learner has a rule.

Cheap for long runs: ``metrics.csv`` and the per-seed rows are read from their end
(only the last 10% of the rows are parsed; the whole ``metrics.csv`` only for a run with
external models, whose error curves need it). Sections are separate functions that
:func:`write_summary` merges, so a new one is one more line there."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import bootstrap, trim_mean

from jaxmarket.learners.base import CONVERGENCE_KEYS, LEARNERS
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.state import current_actions
from jaxmarket.models.metrics import asymptotic, auc
from jaxmarket.train.components.auction import auction_summary
from jaxmarket.train.devices import to_host
from jaxmarket.learners.equilibrium import (benchmarks, equilibrium, exact, profit_gain,
                                         summary_profit_gain)
from jaxmarket.train.publish import Publication
from jaxmarket.train.tracking import count_rows, read_last_rows, read_metrics, read_seed_rows

# the 95% percentile-bootstrap intervals over seeds: resamples and the generator's seed
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 10_000, 0
# resampled values held at once (8 bytes each): 10,000 resamples of 8192 seeds would be
# 650 MB per column without batches
BOOTSTRAP_BATCH = 2**22


def _final(header: list[str], tail: np.ndarray, group: str, num_products: int) -> dict:
    col = {name: i for i, name in enumerate(header)}
    return {
        "mean_price": [float(tail[:, col[f"price/{group}/p{j}"]].mean())
                       for j in range(num_products)],
        "mean_reward": float(tail[:, col[f"reward/{group}"]].mean()),
        "mean_traffic": [float(tail[:, col[f"traffic/{group}/p{j}"]].mean())
                         for j in range(num_products)],
    }


def _members(header: list[str], tail: np.ndarray, group: str, num_products: int) -> dict:
    """A population's members over the last window: ``mean_reward [K]``, ``mean_price
    [K][P]`` and, where the group has several agents per market, the cross-play matrix
    ``crossplay[i][j]`` (member i's mean reward against member j; ``None`` where they
    never met)."""
    col = {name: i for i, name in enumerate(header)}
    K = sum(1 for h in header if h.startswith(f"reward/{group}/m"))
    if not K:
        return {}
    out = {"mean_reward": [float(tail[:, col[f"reward/{group}/m{k}"]].mean()) for k in range(K)],
           "mean_price": [[float(tail[:, col[f"price/{group}/m{k}/p{j}"]].mean())
                           for j in range(num_products)] for k in range(K)]}
    if f"crossplay/{group}/m0/m0" in col:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN: never met
            matrix = [[np.nanmean(tail[:, col[f"crossplay/{group}/m{i}/m{j}"]])
                       for j in range(K)] for i in range(K)]
        out["crossplay"] = [[None if np.isnan(v) else float(v) for v in row] for row in matrix]
    return out


def _models(header: list[str], data: np.ndarray) -> dict:
    """External models (``model/<g>/<error>`` columns, means over seeds): per error its
    ``final`` value, ``auc`` (the mean over the run, jaxmarket.models.metrics.auc) and
    ``asymptotic`` (the mean over the last 20% of the iterations); docs/poi.md."""
    out: dict = {}
    it = data[:, header.index("iteration")]
    for i, name in enumerate(header):
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "model" and parts[2].endswith("_error"):
            e = data[:, i]
            out.setdefault(parts[1], {})[parts[2]] = {
                "final": float(e[-1]), "auc": auc(it, e), "asymptotic": asymptotic(e)}
    return out


# ------------------------------------------------------------------ seeds as a distribution

def _json(x: np.ndarray) -> Any:
    """An array as nested lists of floats, ``None`` where not finite."""
    x = np.asarray(x, np.float64)
    if x.ndim == 0:
        return float(x) if math.isfinite(x) else None
    return [_json(v) for v in x]


def seed_stats(values: Any) -> dict:
    """Statistics over seeds of ``values [S, ...]`` (axis 0: the seeds), each of the
    trailing shape: ``mean``, ``std`` (sample standard deviation, ddof 1), ``se``
    (``std / sqrt(S)``), ``iqm`` (the interquartile mean: scipy's ``trim_mean(x, 0.25)``,
    the mean of the middle 50%), and the 95% percentile-bootstrap interval of the mean
    ``ci95_low``/``ci95_high`` (scipy.stats.bootstrap, :data:`BOOTSTRAP_RESAMPLES`
    resamples of the seeds, a fixed generator: the same run gives the same interval).
    One seed: ``std``, ``se`` and the interval are ``None``; values equal across seeds:
    the interval is that value. Non-finite entries come out as ``None``."""
    x = np.asarray(values, np.float64)
    S = x.shape[0]
    out = {"mean": x.mean(0), "iqm": trim_mean(x, 0.25, axis=0)}
    if S < 2:
        none = np.full(x.shape[1:], np.nan)
        out.update(std=none, se=none, ci95_low=none, ci95_high=none)
    else:
        std = x.std(0, ddof=1)
        flat = x.reshape(S, -1)
        low, high = np.array(flat.mean(0)), np.array(flat.mean(0))
        varies = np.isfinite(flat).all(0) & (flat.max(0) > flat.min(0))
        if varies.any():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = bootstrap((flat[:, varies],), np.mean, axis=0, vectorized=True,
                                n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=0.95,
                                method="percentile", batch=max(1, BOOTSTRAP_BATCH
                                                               // (S * int(varies.sum()))),
                                rng=np.random.default_rng(BOOTSTRAP_SEED))
            low[varies] = res.confidence_interval.low
            high[varies] = res.confidence_interval.high
        bad = ~np.isfinite(flat).all(0)
        low[bad] = high[bad] = np.nan
        out.update(std=std, se=std / np.sqrt(S), ci95_low=low.reshape(x.shape[1:]),
                   ci95_high=high.reshape(x.shape[1:]))
    order = ("mean", "std", "se", "iqm", "ci95_low", "ci95_high")
    return {k: _json(out[k]) for k in order}


def over_seeds(per_seed: dict) -> dict:
    """``over_seeds[group][name]``: :func:`seed_stats` of ``per_seed[group][name]`` (the
    per-seed window means of ``mean_price [P]``, ``mean_reward``, ``mean_traffic [P]``),
    with ``num_seeds``."""
    out = {}
    for g, stats in per_seed.items():
        out[g] = {"num_seeds": len(stats["mean_reward"])}
        out[g].update({name: seed_stats(np.asarray(v, np.float64)) for name, v in stats.items()})
    return out


def final_state(plan: Any, runner: Any) -> dict:
    """What the summary takes from the final training state (host arrays, gathered on
    every process of a distributed run): per group and seed, each agent's action in
    force (price, multiplier, budget or quantity), last reward and traffic, averaged over
    the seed's markets (``[S, A, P]``, ``[S, A]``, ``[S, A, P]``); and the learners'
    convergence state where their definition declares a report
    (:attr:`LearnerDef.convergence`: ``converged``, ``stable_periods``, ``step``, ``[S]``
    each)."""
    env, S = plan.env, plan.train.num_seeds
    state, actions = runner.env_state, current_actions(plan.env.spec, runner.env_state)
    sellers = {g.name for g in env.spec.sellers}

    def per_seed(x: Any) -> np.ndarray:   # markets are seed-major: [S * E, ...] -> [S, ...]
        x = np.asarray(to_host(x), np.float64)
        return x.reshape((S, -1) + x.shape[1:]).mean(1)

    agents, convergence = {}, {}
    for spec in env.spec.agent_groups:
        g = spec.name
        served = state.traffic[g] if g in sellers else state.queries[g] - state.unserved[g]
        agents[g] = {"action": spec.action, "value": per_seed(actions[g]),
                     "reward": per_seed(state.last_reward[g]), "traffic": per_seed(served)}
        readout = LEARNERS[plan.learner_settings[g][0]].readout
        if readout is not None and plan.populations.get(g) is None:
            # slots are seed-major, (s * E + e) * A + a (train/slots.py): [S * E, A, P]
            found = readout(plan.learner_settings[g][1], plan.specs[g], runner.learners[g])
            agents[g]["readout"] = {
                k: per_seed(np.asarray(to_host(v)).reshape(actions[g].shape))
                for k, v in found.items()}
        report = LEARNERS[plan.learner_settings[g][0]].convergence
        if report is not None:
            c = report(runner.learners[g])
            convergence[g] = {k: np.broadcast_to(np.asarray(to_host(c[k])), (S,))
                              for k in CONVERGENCE_KEYS}
    return {"agents": agents, "convergence": convergence}


def _agents(final: dict) -> dict:
    """``agents[group]``: per agent (and product) the final state's ``final_<action>``
    (``final_price`` for price setters), ``final_reward``, ``final_traffic``, and the
    learner's readouts ``<name>_<action>`` (:attr:`LearnerDef.readout`: a discrete bandit
    with ``recent_window`` K reports ``recent_median_price``, the median price of each
    agent's last K periods): each its ``per_seed`` values and :func:`seed_stats` over
    seeds."""
    out = {}
    for g, a in final["agents"].items():
        out[g] = {"action": a["action"], "source": "final state (the last period, mean over "
                  "each seed's markets)"}
        for name, values in ((f"final_{a['action']}", a["value"]), ("final_reward", a["reward"]),
                             ("final_traffic", a["traffic"])):
            out[g][name] = {"per_seed": _json(values), **seed_stats(values)}
        for name, values in (a.get("readout") or {}).items():   # the learner's readout
            out[g][f"{name}_{a['action']}"] = {"per_seed": _json(values), **seed_stats(values)}
    return out


def _convergence(final: dict) -> dict:
    """``convergence[group]`` (learners with a convergence rule): per seed ``converged``,
    ``stable_periods`` (the counter), ``converged_at`` (the period of convergence, a
    converged session's step; ``None`` if not converged) and ``share_converged``."""
    out = {}
    for g, c in final["convergence"].items():
        conv = [bool(v) for v in c["converged"]]
        out[g] = {"converged": conv, "stable_periods": [int(v) for v in c["stable_periods"]],
                  "converged_at": [int(s) if k else None for s, k in zip(c["step"], conv)],
                  "share_converged": float(np.mean(conv))}
    return out


# ------------------------------------------------------------------ the file

def _profit_gains(plan: Any, summary: dict) -> dict:
    """``profit_gain`` (and each seed's, in ``per_seed``) of every group with both a static
    Nash and a joint optimum; ``profit_gain_undefined[group]``: why a group has none
    where its benchmarks are no equilibrium."""
    eq = equilibrium(plan)
    gains = summary_profit_gain(plan, summary, eq)
    for g, seeds in (summary.get("per_seed") or {}).items():
        if g in gains:
            seeds["profit_gain"] = profit_gain(seeds, eq[g])
    # a group whose benchmark is no equilibrium: said, not measured against it
    undefined = {g: why for g in eq if g not in gains
                 and (why := benchmarks(eq[g]).get("undefined")) is not None}
    out = {"profit_gain_undefined": undefined} if undefined else {}
    if not gains:
        return out
    return {"profit_gain": gains, "benchmarks": {g: benchmarks(eq[g]) for g in gains}, **out}


def nonfinite_summary(run_dir: Path) -> dict:
    """``nonfinite_actions[group]`` (only in a run where some group sent NaN or +-inf
    actions: the trainer's ``nonfinite_actions.csv`` exists): ``entries`` (the non-finite
    action entries over the run), ``iterations`` (how many iterations had any) and
    ``first_iteration``; empty for a run without any, so its summary is unchanged."""
    path = run_dir / "nonfinite_actions.csv"
    if not path.exists() or count_rows(path) < 1:
        return {}
    header, data = read_metrics(path)
    it = data[:, header.index("iteration")]
    out = {}
    for i, g in enumerate(header):
        hit = data[:, i] > 0 if g != "iteration" else np.zeros(len(it), bool)
        if hit.any():
            out[g] = {"entries": int(data[hit, i].sum()), "iterations": int(hit.sum()),
                      "first_iteration": int(it[hit].min())}
    return {"nonfinite_actions": out} if out else {}


def write_summary(run_dir: Path, env: MarketEnv, stopped: str | None, iterations: int,
                  final: dict | None = None, log_every: int = 1,
                  seeds_format: str = "csv", plan: Any = None) -> dict:
    """``final[group]`` = ``mean_price`` (list, one per product), ``mean_reward`` and
    ``mean_traffic`` (list per product), averaged over seeds, agents (already in the
    metrics) and the last 10% of the rows recorded, ``ceil(0.1 * rows)``
    (``averaged_over_last_rows``; ``averaged_over_last_iterations``: the iterations they
    span, the same number with ``log_every: 1``).
    ``per_seed[group]`` holds the same three for each seed (from the per-seed rows), as
    lists indexed by seed, and ``over_seeds[group]`` their :func:`seed_stats`.
    ``members[group]`` (groups with a population) holds each member's
    ``mean_reward``, ``mean_price`` and the cross-play matrix over the same window.
    ``models[group]`` (groups with an external model) holds the final, mean (AUC) and
    asymptotic values of its ground-truth errors. With ``final`` (:func:`final_state`):
    ``agents[group]`` (per agent, from the final state) and ``convergence[group]``.
    With ``plan`` (``train.profit_gain``: auto = where a period's expectation is exact:
    deterministic, or a draw of finitely many declared outcomes; else
    ``profit_gain_skipped`` says why): ``profit_gain[group]`` = ``(pi - pi_N) /
    (pi_M - pi_N)`` of the window's mean reward against the market's static Nash and
    joint optimum (jaxmarket.learners.equilibrium), ``benchmarks[group]`` (the pi_N, pi_M
    used and how they were computed) and ``per_seed[group]["profit_gain"]``, where both
    exist. ``nonfinite_actions``: :func:`nonfinite_summary`, only where the run saw any.
    ``engine``: ``"loop"``. Published with the row files it was computed from
    (:mod:`jaxmarket.train.publish`)."""
    path = run_dir / "metrics.csv"
    rows = count_rows(path)
    n_tail = max(1, int(np.ceil(0.1 * rows)))
    header, tail = read_last_rows(path, n_tail)
    P = env.spec.num_products
    first, last = tail[0, 0], tail[-1, 0]
    summary = {"engine": "loop",
               "final": {g: _final(header, tail, g, P) for g in env.agent_groups},
               "iterations": iterations, "stopped": stopped,
               "averaged_over_last_iterations": int(last - first + 1)}
    members = {g: _members(header, tail, g, P) for g in env.agent_groups}
    if any(members.values()):
        summary["members"] = {g: m for g, m in members.items() if m}
    if any(h.startswith("model/") for h in header):
        models = _models(*read_metrics(path))
        if models:
            summary["models"] = models
    seeds = read_seed_rows(run_dir, seeds_format, first)
    if seeds is not None:
        s_header, s_data = seeds
        seed_col = s_data[:, s_header.index("seed")]
        ids = np.unique(seed_col).astype(int)
        per_seed = {g: [_final(s_header, s_data[seed_col == s], g, P) for s in ids]
                    for g in env.agent_groups}
        summary["per_seed"] = {g: {k: [r[k] for r in rows] for k in rows[0]}
                               for g, rows in per_seed.items()}
        summary["over_seeds"] = over_seeds(summary["per_seed"])
    summary.update(averaged_over_last_rows=n_tail, log_every=log_every)
    summary.update(auction_summary(header, tail, seeds))   # auction runs: components/auction.py
    if final is not None:
        summary["agents"] = _agents(final)
        if final["convergence"]:
            summary["convergence"] = _convergence(final)
    if plan is not None and plan.train.profit_gain is not False:
        if plan.train.profit_gain is True or exact(plan):
            summary.update(_profit_gains(plan, summary))
        else:
            summary["profit_gain_skipped"] = ("random periods (the static game averages 256 "
                                              "keys per profile): set train.profit_gain: true")
    summary.update(nonfinite_summary(run_dir))
    out = Publication(run_dir, "loop", iterations)
    out.text("summary.json", json.dumps(summary, indent=2))
    out.log(*published_logs(run_dir))
    out.publish()
    return summary


def published_logs(run_dir: Path) -> list[str]:
    """The row files a loop result is computed from (``published.json`` logs): every
    ``*.csv`` of the run directory (``metrics.csv``, ``seeds.csv``, the components'
    rows) and the parts of ``seeds.parquet/``."""
    run_dir = Path(run_dir)
    names = sorted(p.name for p in run_dir.glob("*.csv"))
    return names + sorted(str(p.relative_to(run_dir))
                          for p in (run_dir / "seeds.parquet").glob("part-*.parquet"))
