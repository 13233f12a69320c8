"""Analysis of trained runs: the impulse response of learned pricing strategies to a
one-period deviation (Calvano et al., AER 2020, section V), as
``jaxmarket.analysis.impulse_response`` and ``python -m jaxmarket.impulse``.

A session (one seed's market: seeds x markets in all) plays the greedy strategies of its
final learner state (Q-learning: ``argmax_a Q[s, a]``; PPO with a discrete head: the
most likely grid price of its policy, :func:`jaxmarket.learners.ppo.greedy_index`; the
state being the last ``memory`` price profiles). From the session's last state, greedy play runs onto its
limit cycle (a deterministic play over ``Z`` states enters a cycle within ``Z``
periods); then, from *each* point of the cycle in turn, one agent is forced for one
period (period 0) to the deviation price, after which everyone follows their strategies
again, for ``periods`` periods. The counterfactual is the same play without the
deviation (the cycle itself). Everything is averaged over the cycle's points, then over
the sessions::

    price[t, i]            the mean price of agent i in period t (0: the deviation)
    counterfactual[t, i]   the same without the deviation
    punishes (a session)   the rivals' price in period 1 is below the counterfactual's
                           (mean over rivals and cycle points, by more than 1e-9)
    punishment_length      periods from period 1 on while the rivals stay below it
    return_periods         periods after the deviation until the state (the last
                           ``memory`` price profiles) is back on the limit cycle

Deviations: ``"best_response"`` (the static best response to the rivals' prices of
period 0, from the one-shot profit table), ``"best_response_lowest"`` (the static best
response to the rivals' greedy prices in the state numbered by the cycle position:
position 0 is the state of the lowest prices, position ``k`` state ``k``; this is what
the published replication code of Calvano et al. computes for their Figure 4, whose
``ComputeStaticBestResponse`` receives the cycle position as the state number),
``"nash"`` (the deviator's price in the pure Nash equilibrium of the one-shot grid game
that best-response dynamics reach from the lowest prices) or a price (the nearest grid
price).

Every price (:func:`impulse_response_all`, ``python -m jaxmarket.impulse RUN --deviation
all``): the response to a deviation to each of the grid's ``m`` prices ``a`` in turn,
all replayed at once (a row per session, cycle point and price). With ``z`` a point of
the cycle, ``sigma(z)`` the profile the strategies play there, ``p_a`` the same profile
with the deviator's price replaced by ``a``, ``pi_i`` the deviator's one-shot profit (the
profit table), ``next(z, p)`` the state after ``p`` is played in ``z`` and ``delta`` the
learners' discount factor::

    one_period_gain(z, a) = pi_i(p_a) - pi_i(sigma(z))
    V_i(y)                = sum_{t>=0} delta^t pi_i(sigma(y_t)),  y_0 = y,
                            y_{t+1} = next(y_t, sigma(y_t))
    discounted_gain(z, a) = sum_{t>=0} delta^t (pi_i(response_t) - pi_i(cycle_t))
                          = one_period_gain(z, a)
                            + delta (V_i(next(z, p_a)) - V_i(next(z, sigma(z))))

exact over the infinite horizon (the play from any state ends in a cycle; ``V`` is summed
by doubling, :func:`jaxmarket.sessions.diagnostics.profile_values`); it is ``Q_i(z, a) -
Q_i(z, sigma_i(z))`` of the true Q of :mod:`jaxmarket.sessions.diagnostics`. The
deviation to ``a`` **pays** in a session when ``discounted_gain(z, a) > TOL max(|Q_i(z,
sigma_i(z))|, 1)`` at some point ``z`` of its cycle; by the one-shot deviation principle
the deviator best-replies all along its cycle (the diagnostics' ``br_path`` is 1) exactly
when no price pays, and with an equilibrium on path ``discounted_gain <= 0`` for every
price. Each session's figures are means over its cycle's points (``pays``: any point),
then the result's are the means over sessions, with a 95% bootstrap interval
(:func:`jaxmarket.sessions.engine.bootstrap_ci`).

Sources: a run directory of a ``q_learning`` group, or of a ``ppo`` group with
``action_head: discrete`` (its grid: ``num_actions`` prices spanning the market's
low..high), whose observation is its market's price history
(``[{kind: history, k: memory}]``; its last checkpoint is restored), a
:func:`jaxmarket.load_run` result, a session-engine run directory
(``strategies.npz``, :mod:`jaxmarket.sessions.run`) or :class:`Strategies` made by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.analysis.strategies import expects_strategies, read_strategies, strategies_path
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.learners.ppo import greedy_index, network_for
from jaxmarket.learners.qlearning import make_grid
from jaxmarket.sessions.engine import bootstrap_ci
from jaxmarket.train.plan import RunPlan, resolve
from jaxmarket.sessions.diagnostics import TOL, profile_values
from jaxmarket.sessions.run import session_plan
from jaxmarket.train.rundir import STRATEGIES_FILE, read_run_config
from jaxmarket.train.trainer import Trainer

TOLERANCE = 1e-9
#: the named deviations (besides a price)
DEVIATIONS = ("best_response", "best_response_lowest", "nash")


@dataclass(frozen=True)
class Strategies:
    """Deterministic strategies of ``N`` sessions of ``n`` agents on a price grid.

    ``greedy [N, n, Z]``: each agent's grid index in each state; a state is the mixed-
    radix number of its ``memory * n`` digits (the last ``memory`` price profiles' grid
    indices, the most recent first, agent order; digit ``j`` weighs ``m^(D-1-j)``), so
    ``Z = m^(memory n)``. ``last [N, memory n]``: the digits play continues from.
    ``grid``: the prices ``[m]``, or ``[n, m]`` each agent's own (per-firm grids: agent
    ``i``'s index ``a`` is the price ``grid[i, a]``).
    ``profit_table [m^n, n]`` (optional: needed for ``best_response``, ``nash`` and the
    profits): every agent's one-shot profit of each price profile, row = its mixed-radix
    number. ``discount`` (optional: the default of :func:`impulse_response_all`): the
    learners' discount factor, from the run's config where the strategies come from a
    run (a tuple: each agent's own, agent ``i``'s ``delta_i``). ``lagged``: the profits
    depend on last period's profile too (a platform rule on last period's prices):
    ``profit_table [(m^n)^2, n]``, row ``p m^n + j`` the profit of profile ``j`` played
    after ``p`` (memory 1, whose state is ``p``); a one-shot profit (``nash``) is of a
    profile held, row ``j m^n + j``."""

    greedy: np.ndarray
    last: np.ndarray
    grid: np.ndarray
    memory: int
    profit_table: np.ndarray | None = None
    converged: np.ndarray | None = None
    source: str = "strategies"
    discount: float | tuple[float, ...] | None = None
    lagged: bool = False

    @property
    def sessions(self) -> int:
        return int(self.greedy.shape[0])

    @property
    def agents(self) -> int:
        return int(self.greedy.shape[1])


@dataclass(frozen=True)
class ImpulseResponse:
    """:func:`impulse_response`'s result; ``[N]`` arrays are per session, ``[T, n]`` the
    means over sessions (of each session's mean over its cycle's points)."""

    agent: int
    deviation: str | float
    deviation_index: np.ndarray      # [N] mean grid index the deviator played at t = 0
    price: np.ndarray                # [T, n]
    counterfactual: np.ndarray       # [T, n]
    pre_deviation: np.ndarray        # [n] the cycle's mean prices
    session_price: np.ndarray        # [N, T, n]
    punishes: np.ndarray             # [N] bool
    punishment_length: np.ndarray    # [N] mean over the cycle's points
    return_periods: np.ndarray       # [N] mean over the points that return (nan: none)
    returned: np.ndarray             # [N] share of the cycle's points that return
    cycle_length: np.ndarray         # [N]
    profit: np.ndarray | None = None             # [T, n]
    counterfactual_profit: np.ndarray | None = None
    converged: np.ndarray | None = None          # [N] where the source says
    session_pre_deviation: np.ndarray | None = None   # [N, n] each cycle's mean prices
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def share_punish(self) -> float:
        return float(np.mean(self.punishes))

    @property
    def mean_punishment_length(self) -> float:
        return float(np.mean(self.punishment_length))

    def as_dict(self) -> dict:
        """JSON-ready: the means, the per-session lists and the headline figures."""
        def j(x):
            return None if x is None else np.where(np.isfinite(x), x, np.nan).tolist()
        out = {"agent": self.agent, "deviation": self.deviation, "source": self.source,
               "sessions": int(self.punishes.shape[0]), "periods": int(self.price.shape[0]),
               "share_punish": self.share_punish,
               "mean_punishment_length": self.mean_punishment_length,
               "mean_return_periods": _nanmean(self.return_periods),
               "share_returned": float(np.mean(self.returned)),
               "price": j(self.price), "counterfactual": j(self.counterfactual),
               "pre_deviation": j(self.pre_deviation), "profit": j(self.profit),
               "counterfactual_profit": j(self.counterfactual_profit),
               "punishes": self.punishes.tolist(),
               "punishment_length": j(self.punishment_length),
               "return_periods": [None if np.isnan(v) else float(v)
                                  for v in self.return_periods],
               "cycle_length": self.cycle_length.tolist()}
        if self.converged is not None:
            out["converged"] = self.converged.tolist()
        return out


#: the per-session figures of :class:`AllPricesResponse` given a 95% bootstrap interval
CI_FIGURES = ("one_period_gain", "discounted_gain", "pays", "punishes", "punishment_length")


@dataclass(frozen=True)
class AllPricesResponse:
    """:func:`impulse_response_all`'s result. Axis ``m`` is the deviation price (the grid,
    ``grid[k]``); ``[N, m]`` arrays are per session (each the mean over its cycle's
    points; ``pays``: at any point), ``price`` and ``profit`` ``[m, T, n]`` the means over
    sessions, ``ci95`` maps each of :data:`CI_FIGURES` to its ``[m, 2]`` 95% bootstrap
    interval over sessions of the mean (of the share, for ``pays`` and ``punishes``)."""

    agent: int
    grid: np.ndarray                 # [m] the deviation prices (the deviator's grid)
    discount: float
    price: np.ndarray                # [m, T, n]
    counterfactual: np.ndarray       # [T, n]
    pre_deviation: np.ndarray        # [n] the cycle's mean prices
    profit: np.ndarray               # [m, T, n]
    counterfactual_profit: np.ndarray  # [T, n]
    one_period_gain: np.ndarray      # [N, m]
    discounted_gain: np.ndarray      # [N, m]
    pays: np.ndarray                 # [N, m] bool
    punishes: np.ndarray             # [N, m] bool
    punishment_length: np.ndarray    # [N, m]
    return_periods: np.ndarray       # [N, m] nan: no point returns
    returned: np.ndarray             # [N, m] share of the cycle's points that return
    cycle_length: np.ndarray         # [N]
    ci95: dict
    converged: np.ndarray | None = None
    source: str = ""

    def mean(self, figure: str) -> np.ndarray:
        """``[m]`` the mean over sessions of a per-session figure (``return_periods``: over
        the sessions where some point returns, nan where none does)."""
        x = np.asarray(getattr(self, figure), np.float64)
        if figure == "return_periods":
            counted = np.isfinite(x).sum(0)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(counted > 0, np.nansum(x, 0) / counted, np.nan)
        return x.mean(0)

    def as_dict(self) -> dict:
        """JSON-ready: per deviation price the means and intervals, the mean paths and
        the per-session ``[N][m]`` gains and punishments."""
        def j(x):
            if x is None:
                return None
            x = np.asarray(x, np.float64)
            return np.where(np.isfinite(x), x, np.nan).tolist()

        def nan_none(values):
            return [None if np.isnan(v) else float(v) for v in values]

        figures = ("one_period_gain", "discounted_gain", "punishment_length", "returned")
        out = {"agent": self.agent, "deviation": "all", "source": self.source,
               "discount": self.discount, "sessions": int(self.cycle_length.shape[0]),
               "periods": int(self.price.shape[1]), "grid": j(self.grid),
               **{f"mean_{f}": j(self.mean(f)) for f in figures},
               "share_pays": j(self.mean("pays")), "share_punish": j(self.mean("punishes")),
               "mean_return_periods": nan_none(self.mean("return_periods")),
               "ci95": {k: j(v) for k, v in self.ci95.items()},
               "price": j(self.price), "counterfactual": j(self.counterfactual),
               "pre_deviation": j(self.pre_deviation), "profit": j(self.profit),
               "counterfactual_profit": j(self.counterfactual_profit),
               "one_period_gain": j(self.one_period_gain),
               "discounted_gain": j(self.discounted_gain), "pays": self.pays.tolist(),
               "punishes": self.punishes.tolist(),
               "punishment_length": j(self.punishment_length),
               "cycle_length": self.cycle_length.tolist()}
        if self.converged is not None:
            out["converged"] = self.converged.tolist()
        return out


def _nanmean(x: np.ndarray) -> float | None:
    x = np.asarray(x, np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else None


# ------------------------------------------------------------------ sources

#: why strategies may have no one-shot profit table
NO_TABLE = ("(random period outcomes, or a rule on last period's prices whose strategies "
            "are not of last period's profile alone, make a period's profits more than a "
            "function of the prices the replay knows)")


def strategies_from_npz(directory: str | Path) -> Strategies:
    """``DIR/strategies.npz`` of a session-engine run (:mod:`jaxmarket.sessions.run`),
    read and checked by :func:`jaxmarket.analysis.strategies.read_strategies` (a
    RunDirError, one line, on a damaged file or one that is not the run's). A ConfigError
    where its strategies are not over the last ``memory`` price profiles (the run's
    observation is not the price history). With one outcome table per random period
    outcome there is no one-shot profit table: deviate to a price. A rule on last
    period's prices (``lagged``: one row per pair of profiles) is replayed with its
    pairs where the state is last period's profile (memory 1)."""
    path = strategies_path(directory)
    d = read_strategies(path)
    n, m, memory = d["greedy"].shape[1], d["grid"].shape[-1], int(d["memory"])
    states = d["greedy"].shape[2]
    if states != m ** (memory * n):
        raise ConfigError("market.sellers[0].observation", f"{path}: {states} states",
                          f"the price history, [{{kind: history, k: {max(memory, 1)}}}] "
                          f"on the action grid (impulse_response replays strategies whose "
                          f"state is the last {max(memory, 1)} price profile(s); these are "
                          f"over {states} states, not {m}^{memory * n})")
    table = d["profit_table"]
    lagged = bool(d.get("lagged", False))
    # a lagged table's previous profile is the state's: memory 1 only
    usable = table.ndim == 2 and (not lagged or memory == 1)
    return Strategies(greedy=d["greedy"].astype(np.int64), last=d["last"].astype(np.int64),
                      grid=d["grid"].astype(np.float64), memory=memory,
                      profit_table=table.astype(np.float64) if usable else None,
                      converged=d["converged"] if "converged" in d else None,
                      source=str(path), discount=_npz_discount(path), lagged=lagged)


def _discount_of(kind: str, hyper: dict) -> float | tuple[float, ...]:
    """A replayable group's discount factor: q_learning's ``discount`` (a tuple of each
    firm's own where the config gives a list), ppo's ``gamma``."""
    value = hyper["gamma"] if kind == "ppo" else hyper["discount"]
    if isinstance(value, (list, tuple)):
        return tuple(float(v) for v in value)
    return float(value)


def _npz_discount(path: Path) -> float | tuple[float, ...] | None:
    """The discount of the run whose ``strategies.npz`` ``path`` is (its ``config.yaml``
    beside it); None for a file on its own."""
    run = path.parent
    if path.name != STRATEGIES_FILE or not (run / "config.yaml").is_file():
        return None
    plan = session_plan(read_run_config(run))
    g = _group(plan, None)
    return _discount_of(plan.learner_settings[g][0], plan.learner_settings[g][1])


def _group(plan: RunPlan, group: str | None) -> str:
    groups = plan.groups
    if group is None:
        qgroups = [g for g in groups if plan.learner_settings[g][0] in REPLAYABLE]
        if len(qgroups) != 1:
            raise ConfigError("group", None, "the q_learning or ppo group to analyse, one "
                              "of " + ", ".join(qgroups or groups))
        group = qgroups[0]
    if group not in groups:
        raise ConfigError("group", group, "an agent group of the run: " + ", ".join(groups))
    return group


#: the learner kinds whose greedy strategies impulse_response replays
REPLAYABLE = ("q_learning", "ppo")


def _check_replayable(plan: RunPlan, g: str) -> dict:
    """The group's settings (with ``memory``: the states' price profiles), if its greedy
    strategies alone replay its market (else a ConfigError naming what does not fit)."""
    kind, hyper = plan.learner_settings[g]
    where = f"learners.{g}"
    if kind not in REPLAYABLE:
        raise ConfigError(f"{where}.kind", kind, "q_learning or ppo (impulse_response replays "
                          "greedy strategies on a price grid)")
    if kind == "ppo":
        if hyper["action_head"] != "discrete":
            raise ConfigError(f"{where}.action_head", hyper["action_head"], "discrete (a "
                              "greedy PPO strategy is a price of its grid in every state)")
        obs = [dict(c) for c in plan.env.spec.group(g).observation or []]
        ks = [int(c.get("k", 1)) for c in obs if c.get("kind") == "history"]
        if len(obs) != 1 or len(ks) != 1:
            raise ConfigError("market.sellers[0].observation", obs, "[{kind: history, k: K}] "
                              "(the state is the last K price profiles)")
        hyper = {**hyper, "memory": ks[0]}
    if plan.populations.get(g) is not None:
        raise ConfigError(f"{where}.population", plan.populations[g].size,
                          "no population (one strategy per agent and session)")
    spec = plan.env.spec
    others = [x for x in plan.groups if x != g]
    if others or [s.name for s in spec.sellers] != [g] or spec.num_products != 1:
        raise ConfigError("market", f"agent groups {list(plan.groups)}",
                          f"one product and {g} the market's only agent group (its agents' "
                          "prices are the whole state)")
    group = spec.group(g)
    memory = hyper["memory"]
    obs = [dict(c) for c in group.observation] if group.observation else []
    if memory and obs != [{"kind": "history", "k": memory}]:
        raise ConfigError("market.sellers[0].observation", obs,
                          f"[{{kind: history, k: {memory}}}] (the state is the last "
                          f"memory={memory} price profiles)")
    if kind == "q_learning" and hyper.get("target", "simultaneous") != "simultaneous":
        raise ConfigError(f"{where}.target", hyper["target"], "simultaneous")
    return hyper


def prices_of(grid: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The prices of grid-index profiles ``index [..., n]``: ``grid[index]`` of one grid
    ``[m]``, ``grid[i, index_i]`` of per-agent grids ``[n, m]``."""
    grid = np.asarray(grid)
    return grid[index] if grid.ndim == 1 else grid[np.arange(grid.shape[0]), index]


def agent_grid(grid: np.ndarray, agent: int) -> np.ndarray:
    """``[m]`` the prices of ``agent``'s grid."""
    grid = np.asarray(grid)
    return grid if grid.ndim == 1 else grid[agent]


def _profit_table(payoff: Any, grid: np.ndarray, n: int) -> np.ndarray:
    """``[m^n, n]``: ``payoff(prices [n, 1]) -> [n]`` on every grid profile."""
    m = np.shape(grid)[-1]
    joint = np.indices((m,) * n).reshape(n, -1).T
    prices = prices_of(np.asarray(grid, np.float32), joint)[..., None]
    return np.asarray(jax.jit(jax.vmap(payoff))(prices), np.float64)


def strategies_from_runner(plan: RunPlan, runner: Any, group: str | None = None) -> Strategies:
    """The greedy strategies of a q_learning group in a restored Runner: session =
    (seed, market), its agents the seed's policies, its state the market's last
    observation."""
    g = _group(plan, group)
    hyper = _check_replayable(plan, g)
    base = group_learner_spec(plan.env, plan.params, g)
    n, S, E = base.num_agents, plan.train.num_seeds, plan.train.num_envs
    state = runner.learners[g]
    if plan.learner_settings[g][0] == "ppo":
        grid, greedy = _ppo_greedy(plan.learner_settings[g][1], base, state, hyper["memory"],
                                   S, E)
        converged = None
    else:
        grid = np.asarray(make_grid(hyper, base).prices, np.float64)  # [m], per-firm [n, m]
        greedy = np.asarray(state.greedy, np.int64)                    # [S n, Z]
        converged = np.repeat(np.broadcast_to(np.asarray(state.converged), (S,)), E)
    Z = greedy.shape[-1]
    greedy = np.broadcast_to(greedy.reshape(S, 1, n, Z), (S, E, n, Z)).reshape(S * E, n, Z)
    obs = np.asarray(runner.obs[g], np.float64)[:, 0, :]               # [S E, D]
    if hyper["memory"] == 0:
        last = np.zeros((S * E, 0), np.int64)
    else:
        # digit d: the price of agent d mod n, on its own grid
        rows = grid if grid.ndim == 1 else grid[np.arange(obs.shape[-1]) % n]
        last = np.argmin(np.abs(obs[..., None] - rows), axis=-1)
    return Strategies(greedy=greedy, last=last, grid=grid, memory=int(hyper["memory"]),
                      profit_table=(None if plan.env.lagged   # profits of pairs
                                    else _profit_table(base.payoff, grid, n)),
                      converged=converged,
                      source=f"group {g}",
                      discount=_discount_of(plan.learner_settings[g][0], hyper))


def _ppo_greedy(hyper: dict, base: Any, state: Any, memory: int, S: int,
                E: int) -> tuple[np.ndarray, np.ndarray]:
    """``(grid [m], greedy [S n, Z])`` of a discrete-head ppo group: each seed's agent
    ``i`` is the policy of its slot ``i`` in the seed's first market (every market of a
    seed plays the seed's policies), evaluated at the prices of every state."""
    low, high = np.asarray(base.action_low, np.float64), np.asarray(base.action_high,
                                                                      np.float64)
    if np.ptp(low) > 0 or np.ptp(high) > 0:
        raise ConfigError("market.sellers[0].low/high", [low.ravel().tolist(),
                                                        high.ravel().tolist()],
                          "the same bounds for every agent (one price grid)")
    m, n = int(hyper["num_actions"]), base.num_agents
    grid = np.linspace(float(low.ravel()[0]), float(high.ravel()[0]), m)
    D = memory * n
    digits = np.indices((m,) * D).reshape(D, -1).T                     # [Z, D] state order
    prices = jnp.asarray(grid[digits], jnp.float32)                    # the observations
    policy = np.asarray(state.policy_index).reshape(S, E, n)[:, 0, :].reshape(-1)  # [S n]
    params = jax.tree.map(lambda p: p[policy], state.params)
    network = network_for(hyper, base)

    def one(p):
        return greedy_index(network, p, prices)[:, 0]

    greedy = np.asarray(jax.jit(jax.vmap(one))(params), np.int64)      # [S n, Z]
    return grid, greedy


def strategies_from_run(run: Any, group: str | None = None) -> Strategies:
    """A run directory (its last checkpoint restored) or a :func:`jaxmarket.load_run`
    result (anything with ``.path``; its restored runner is reused)."""
    if hasattr(run, "runner") and hasattr(run, "path"):
        plan = resolve(load_config(Path(run.path) / "config.yaml"))
        return strategies_from_runner(plan, run.runner(), group)
    path = Path(run)
    if not (path / "config.yaml").is_file():
        raise ConfigError("run", str(path), "a run directory (config.yaml) or a directory "
                          f"holding {STRATEGIES_FILE} (a session-engine run)")
    trainer = Trainer(resolve(load_config(path / "config.yaml")), path)
    runner, _ = trainer.restore(report=lambda line: None)
    out = strategies_from_runner(trainer.plan, runner, group)
    return Strategies(**{**out.__dict__, "source": f"{path} ({out.source})"})


def load_strategies(run: Any, group: str | None = None) -> Strategies:
    if isinstance(run, Strategies):
        return run
    if isinstance(run, (str, Path)) and expects_strategies(run):
        return strategies_from_npz(run)
    return strategies_from_run(run, group)


# ------------------------------------------------------------------ replay

class _Game:
    """Greedy play of ``Strategies``, vectorised over a batch of (session, digits)."""

    def __init__(self, s: Strategies):
        self.s, self.n, self.m = s, s.agents, np.shape(s.grid)[-1]
        D = s.memory * self.n
        self.radix = np.asarray([self.m ** (D - 1 - j) for j in range(D)], np.int64)
        self.profile_radix = np.asarray([self.m ** (self.n - 1 - j) for j in range(self.n)],
                                        np.int64)

    def state(self, digits: np.ndarray) -> np.ndarray:
        return digits @ self.radix if digits.shape[1] else np.zeros(len(digits), np.int64)

    def act(self, session: np.ndarray, digits: np.ndarray) -> np.ndarray:
        """``[B, n]`` grid indices."""
        return self.s.greedy[session[:, None], np.arange(self.n)[None, :],
                             self.state(digits)[:, None]]

    def digits_of(self, state: np.ndarray) -> np.ndarray:
        """``[B, D]`` the digits of state numbers ``[B]`` (inverse of :meth:`state`)."""
        state = np.asarray(state, np.int64)
        return (state[:, None] // self.radix[None, :]) % self.m

    def advance(self, digits: np.ndarray, actions: np.ndarray) -> np.ndarray:
        if not digits.shape[1]:
            return digits
        return np.concatenate([actions, digits[:, :-self.n]], axis=1)

    def _rows(self, actions: np.ndarray, before: np.ndarray | None) -> np.ndarray:
        """The profit table's rows of ``actions [..., n]`` played after ``before`` (the
        same shape; a lagged table's pairs) or held (``before`` None)."""
        j = actions @ self.profile_radix
        if not self.s.lagged:
            return j
        J = self.m ** self.n
        return (j if before is None else before @ self.profile_radix) * J + j

    def profits(self, actions: np.ndarray, before: np.ndarray | None = None) -> np.ndarray:
        """``[..., n]`` the profits of ``actions [..., n]`` (a lagged table: played after
        ``before``, a profile held where None)."""
        return self.s.profit_table[self._rows(actions, before)]

    def path_profits(self, actions: np.ndarray, digits: np.ndarray) -> np.ndarray:
        """``[B, T, n]`` the profits of play ``actions [B, T, n]`` from the states
        ``digits [B, D]`` (a lagged table: each period after the one before it, the first
        after the state's profile)."""
        if not self.s.lagged:
            return self.profits(actions)
        before = np.concatenate([digits[:, None, :self.n], actions[:, :-1]], axis=1)
        return self.profits(actions, before)

    def best_response(self, agent: int, actions: np.ndarray,
                      before: np.ndarray | None = None) -> np.ndarray:
        """``[B]`` the agent's first profit-maximising index against ``actions``' rivals
        (a lagged table: played after ``before [B, n]``, a profile held where None)."""
        cand = np.repeat(actions[:, None, :], self.m, axis=1)              # [B, m, n]
        cand[:, :, agent] = np.arange(self.m)[None, :]
        prev = None if before is None else np.repeat(before[:, None, :], self.m, axis=1)
        return np.argmax(self.profits(cand, prev)[..., agent], axis=1)

    def nash(self, rounds: int = 1000) -> np.ndarray:
        """``[n]`` a pure Nash profile of the one-shot grid game (best-response dynamics,
        one agent at a time, from the lowest prices)."""
        a = np.zeros((1, self.n), np.int64)
        for _ in range(rounds):
            before = a.copy()
            for i in range(self.n):   # static: the agents of the one-shot game, not a step
                a[0, i] = self.best_response(i, a)[0]
            if np.array_equal(a, before):
                return a[0]
        raise ValueError("nash: best-response dynamics on the one-shot grid game did not "
                         f"settle in {rounds} rounds; deviate to a price instead")


def limit_cycles(game: _Game) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each session's cycle of greedy play from its last state: ``(length [N], [digits
    [N, D] at each cycle position])`` (positions past a session's length repeat)."""
    s = game.s
    N, Z = s.sessions, s.greedy.shape[-1]
    sessions = np.arange(N)
    digits = np.asarray(s.last, np.int64)
    for _ in range(Z):   # burn-in: onto the cycle
        digits = game.advance(digits, game.act(sessions, digits))
    start = game.state(digits)
    path, length = [digits], np.zeros(N, np.int64)
    for t in range(1, Z + 1):
        digits = game.advance(digits, game.act(sessions, digits))
        back = (length == 0) & (game.state(digits) == start)
        length[back] = t
        if (length > 0).all():
            break
        path.append(digits)
    return length, path


def impulse_response(run: Any, agent: int = 0, deviation: str | float = "best_response",
                     periods: int = 15, group: str | None = None) -> ImpulseResponse:
    """The impulse response of ``agent`` deviating for one period (see the module
    docstring); ``run``: a run directory, a loaded run, a session-engine run's
    directory or :class:`Strategies`; ``group``: the q_learning group (default: the
    run's only one)."""
    s = load_strategies(run, group)
    game = _Game(s)
    N, n = s.sessions, s.agents
    if not 0 <= agent < n:
        raise ConfigError("agent", agent, f"an agent index in 0 .. {n - 1}")
    if not isinstance(periods, int) or periods < 2:
        raise ConfigError("periods", periods, "an integer >= 2 (the deviation and after)")
    if deviation in ("best_response", "nash") and s.profit_table is None:
        raise ConfigError("deviation", deviation, "a price: these strategies have no "
                          f"profit table {NO_TABLE}")
    if deviation == "best_response_lowest" and s.profit_table is None:
        raise ConfigError("deviation", deviation, "a price: these strategies have no "
                          f"profit table {NO_TABLE}")
    if isinstance(deviation, str) and deviation not in DEVIATIONS:
        raise ConfigError("deviation", deviation, ", ".join(DEVIATIONS) + " or a price "
                          "(every price: impulse_response_all)")
    session, position, digits, length, on_cycle = _cycle_points(game)
    reference = None
    if deviation == "best_response_lowest":
        # the rivals' greedy prices in the state numbered by the cycle position
        reference = game.act(session, game.digits_of(np.minimum(position,
                                                                s.greedy.shape[-1] - 1)))
    if deviation == "nash":
        forced = np.full(len(session), int(game.nash()[agent]))
    elif not isinstance(deviation, str):
        forced = np.full(len(session), int(np.argmin(np.abs(agent_grid(s.grid, agent)
                                                             - float(deviation)))))
    else:   # a lagged table: the best response after the state's profile
        forced = game.best_response(agent, game.act(session, digits) if reference is None
                                    else reference,
                                    digits[:, :n] if s.lagged else None)
    a_dev, a_cf, back = _replay(game, session, digits, agent, forced, periods, on_cycle)
    p_dev, p_cf = prices_of(s.grid, a_dev), prices_of(s.grid, a_cf)
    drop, run_len = _punishment(p_dev, p_cf, agent)

    def per_session(x: np.ndarray) -> np.ndarray:   # mean over each session's points
        return _per_session(x, session, length)

    return_periods, returned = _return(back, session, length)
    session_price = per_session(p_dev)
    session_pre = per_session(p_cf[:, 0])
    profit = cf_profit = None
    if s.profit_table is not None:
        profit = per_session(game.path_profits(a_dev, digits)).mean(0)
        cf_profit = per_session(game.path_profits(a_cf, digits)).mean(0)
    return ImpulseResponse(
        agent=agent, deviation=deviation if isinstance(deviation, str) else float(deviation),
        deviation_index=per_session(a_dev[:, 0, agent].astype(np.float64)),
        price=session_price.mean(0), counterfactual=per_session(p_cf).mean(0),
        pre_deviation=session_pre.mean(0), session_price=session_price,
        punishes=per_session(drop[:, 1]) < -TOLERANCE, punishment_length=per_session(run_len),
        return_periods=return_periods, returned=returned, cycle_length=length,
        profit=profit, counterfactual_profit=cf_profit, converged=s.converged,
        session_pre_deviation=session_pre, source=s.source)


def _cycle_points(game: _Game) -> tuple[np.ndarray, ...]:
    """Every (session, cycle position) pair, session-major: ``(session [B], position
    [B], digits [B, D] (the state at that point), length [N], on_cycle [N, Z])``."""
    s = game.s
    length, path = limit_cycles(game)
    session = np.repeat(np.arange(s.sessions), length)
    position = np.arange(len(session)) - np.repeat(np.cumsum(length) - length, length)
    stacked = np.stack(path)                                               # [L, N, D]
    digits = stacked[np.minimum(position, len(path) - 1), session]
    on_cycle = np.zeros((s.sessions, s.greedy.shape[-1]), bool)
    on_cycle[session, game.state(digits)] = True
    return session, position, digits, length, on_cycle


def _replay(game: _Game, session: np.ndarray, digits: np.ndarray, agent: int,
            forced: np.ndarray, periods: int,
            on_cycle: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(a_dev, a_cf [B, T, n], back [B])``: greedy play from each pair's state
    ``digits`` with ``agent`` forced to the grid index ``forced [B]`` in period 0, and
    without (the counterfactual); ``back``: the first period after which the state is on
    the session's cycle again (nan: not within ``periods``)."""
    dev, cf = digits.copy(), digits.copy()
    B, n = len(session), game.n
    a_dev = np.zeros((B, periods, n), np.int64)
    a_cf = np.zeros((B, periods, n), np.int64)
    back = np.full(B, np.nan)
    for t in range(periods):   # periods: a loop over time, vectorised over the pairs
        a = game.act(session, dev)
        if t == 0:
            a[:, agent] = forced
        a_dev[:, t], a_cf[:, t] = a, game.act(session, cf)
        dev, cf = game.advance(dev, a), game.advance(cf, a_cf[:, t])
        home = np.isnan(back) & on_cycle[session, game.state(dev)]
        back[home] = t
    return a_dev, a_cf, back


def _punishment(p_dev: np.ndarray, p_cf: np.ndarray,
                agent: int) -> tuple[np.ndarray, np.ndarray]:
    """``(drop [B, T], run [B])``: the rivals' mean price minus the counterfactual's in
    each period, and the periods from period 1 on while it stays below ``-TOLERANCE``."""
    rivals = [i for i in range(p_dev.shape[-1]) if i != agent]
    drop = (p_dev[..., rivals] - p_cf[..., rivals]).mean(-1)
    below = drop < -TOLERANCE
    return drop, np.cumprod(below[:, 1:], axis=1).sum(1).astype(np.float64)


def _per_session(x: np.ndarray, session: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``[N, ...]``: the mean of ``x [B, ...]`` over each session's cycle points."""
    N = len(length)
    total = np.zeros((N,) + x.shape[1:])
    np.add.at(total, session, x)
    return total / length.reshape((N,) + (1,) * (x.ndim - 1))


def _return(back: np.ndarray, session: np.ndarray,
            length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(return_periods, returned)`` per session (and whatever axes ``back [B, ...]``
    has after its first): the mean of ``back`` over the points that return (nan: none)
    and the share of the points that return."""
    returned = ~np.isnan(back)
    count = _per_session(returned.astype(np.float64), session, length)
    total = _per_session(np.where(returned, back, 0.0), session, length)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan), count


#: most entries of the ``[sessions, Z, n]`` value table held at once (float64)
MAX_ENTRIES = 1 << 22


def state_values(game: _Game, delta: float) -> np.ndarray:
    """``V [N, Z, n]``: each agent's discounted profit following the strategies from
    every state, ``V_i(y) = sum_{t>=0} delta^t pi_i(sigma(y_t))`` (module docstring).
    The profile played in ``y_t`` is the first ``n`` digits of ``y_{t+1}``, so this is
    :func:`jaxmarket.sessions.diagnostics.profile_values` of the state transition
    ``next(y) = (sigma(y) . radix) m^(D-n) + y // m^n`` and the per-state reward
    ``R[y] = profit_table[y // m^(D-n)]`` (memory 0: one state; every ``V`` is 0 here, as
    a deviation cannot change the future). Sessions go in blocks of at most
    :data:`MAX_ENTRIES` entries, each vectorised."""
    s = game.s
    N, n, Z = s.greedy.shape
    D = s.memory * n
    if D == 0:
        return np.zeros((N, Z, n))
    lead = game.m ** (D - n)
    y = np.arange(Z)
    reward = s.profit_table[y // lead]                                    # [Z, n]
    offset = 0
    if s.lagged:   # memory 1: the state is the profile before, R[y J + sigma(y)]
        reward, offset = s.profit_table, y * Z
    block = max(1, MAX_ENTRIES // (Z * n))
    parts = []
    for b in range(0, N, block):   # blocks of sessions (memory), each vectorised
        played = np.einsum("snz,n->sz", s.greedy[b:b + block], game.profile_radix)
        parts.append(profile_values(reward, played * lead + y // game.m ** n, delta, offset))
    return np.concatenate(parts)


def _discount(delta: float | None, s: Strategies, agent: int = 0) -> float:
    """The ``delta`` of ``agent``'s discounted gain: ``delta`` given, else the run's
    learners' (each agent's own where they differ: agent ``i``'s ``delta_i``)."""
    delta = s.discount if delta is None else delta
    if isinstance(delta, tuple) and len(delta) == s.agents:
        delta = delta[agent]
    if delta is None:
        raise ConfigError("discount", None, "the learners' discount factor (these "
                          "strategies come without a run config): pass discount=")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or \
            not 0.0 <= float(delta) < 1.0:
        raise ConfigError("discount", delta, "a number in [0, 1) (the discounted gain of a "
                          "deviation is a sum over an infinite horizon)")
    return float(delta)


def impulse_response_all(run: Any, agent: int = 0, periods: int = 15,
                         group: str | None = None, discount: float | None = None,
                         resamples: int = 2000) -> AllPricesResponse:
    """The impulse response of ``agent`` deviating for one period to every grid price
    (the module docstring gives each figure's formula); ``run`` as for
    :func:`impulse_response`; ``discount``: the ``delta`` of the discounted gain (default:
    the run's learners'); ``resamples``: of the bootstrap intervals. Vectorised over
    sessions, cycle points and prices (the loops are over time and over the ``m``
    prices' intervals)."""
    s = load_strategies(run, group)
    game = _Game(s)
    n, m = s.agents, game.m
    if not 0 <= agent < n:
        raise ConfigError("agent", agent, f"an agent index in 0 .. {n - 1}")
    if not isinstance(periods, int) or periods < 2:
        raise ConfigError("periods", periods, "an integer >= 2 (the deviation and after)")
    if s.profit_table is None:
        raise ConfigError("deviation", "all", "a price: these strategies have no profit "
                          f"table {NO_TABLE} and the gains of the deviations need one")
    delta = _discount(discount, s, agent)
    session, _, digits, length, on_cycle = _cycle_points(game)
    P = len(session)
    # one row per (cycle point, price), price fastest
    rows = np.repeat(session, m)
    forced = np.tile(np.arange(m), P)
    a_dev, a_cf, back = _replay(game, rows, np.repeat(digits, m, axis=0), agent, forced,
                                periods, on_cycle)
    p_dev, p_cf = prices_of(s.grid, a_dev), prices_of(s.grid, a_cf)
    drop, run_len = _punishment(p_dev, p_cf, agent)
    values = state_values(game, delta)[..., agent]                      # [N, Z]
    start = np.repeat(digits, m, axis=0)
    before = start[:, :n] if s.lagged else None   # a lagged table: after the state's
    pi_dev = game.profits(a_dev[:, 0], before)[:, agent]
    pi_cf = game.profits(a_cf[:, 0], before)[:, agent]
    v_dev = values[rows, game.state(game.advance(start, a_dev[:, 0]))]
    v_cf = values[rows, game.state(game.advance(start, a_cf[:, 0]))]
    one = pi_dev - pi_cf
    gain = one + delta * (v_dev - v_cf)
    stay = pi_cf + delta * v_cf                                          # Q_i(z, sigma_i(z))
    pays_here = gain > TOL * np.maximum(np.abs(stay), 1.0)

    def per_session(x: np.ndarray) -> np.ndarray:   # [P m, ...] -> [N, m, ...]
        return _per_session(x.reshape((P, m) + x.shape[1:]), session, length)

    return_periods, returned = _return(back.reshape(P, m), session, length)
    cf_price = _per_session(p_cf.reshape((P, m) + p_cf.shape[1:])[:, 0], session, length)
    cf_profit = game.path_profits(a_cf.reshape(P, m, periods, n)[:, 0], digits)
    figures = {"one_period_gain": per_session(one), "discounted_gain": per_session(gain),
               "pays": per_session(pays_here.astype(np.float64)) > 0,
               "punishes": per_session(drop[:, 1]) < -TOLERANCE,
               "punishment_length": per_session(run_len)}
    ci95 = {name: np.array([bootstrap_ci(np.asarray(x[:, k], np.float64),
                                         resamples=resamples)
                            for k in range(m)])            # the m prices
            for name, x in figures.items()}
    return AllPricesResponse(
        agent=agent, grid=np.asarray(agent_grid(s.grid, agent), np.float64), discount=delta,
        price=per_session(p_dev).mean(0), counterfactual=cf_price.mean(0),
        pre_deviation=cf_price[:, 0].mean(0),
        profit=per_session(game.path_profits(a_dev, start)).mean(0),
        counterfactual_profit=_per_session(cf_profit, session, length).mean(0),
        **figures, return_periods=return_periods, returned=returned, cycle_length=length,
        ci95=ci95, converged=s.converged, source=s.source)


__all__ = ["AllPricesResponse", "CI_FIGURES", "DEVIATIONS", "ImpulseResponse", "Strategies",
           "impulse_response", "impulse_response_all", "limit_cycles", "load_strategies",
           "state_values", "strategies_from_npz", "strategies_from_run",
           "strategies_from_runner"]
