"""The tables of a session design: a tabular pricing game as outcome tables.

The experiments of the algorithmic-pricing literature (Calvano et al. 2020, Klein 2021,
Asker et al. 2022, Banchio & Skrzypacz 2022) run hundreds of independent sessions of
a few Q-learning sellers for 10^5 - 10^7 periods each. Stepping the general market for
every period of every session costs far more than the learning does, so the session
engine first asks the market for its one-shot outcome of *every* joint grid action
(``m^n`` profiles, ``vmap``ped over :meth:`MarketEnv.step_env` from the reset state) and
then plays all sessions against those tables (:mod:`jaxmarket.sessions.engine`)::

    reward[j] [n], obs[j] [n, D], fees[j] [n]    for every profile j = sum_i a_i m^(n-1-i)

with seller ``i`` at price ``grid_i[a_i]``: the learner's one grid, or each seller's own
(per-firm grids, :class:`~jaxmarket.learners.qlearning.FirmGrids`).

This is exact for markets whose period outcome depends only on the prices in force:
one agent group (a seller group, the only one), constant demand, a deterministic
distributor and observations of the current profile (``empty``, ``own_price``,
``competitor_prices``, ``market_price``, ``history`` with ``k: 1``), or of the last ``k``
profiles (``memory: k`` with the observation ``[{kind: history, k: k}]`` alone, a
deterministic period). Anything else is refused with the reason (:func:`check_game`);
``train.engine: auto`` then trains it with the general loop.

A rule on last period's prices (a distributor that reads them, ``MarketEnv.lagged``:
``steering: lowest_price_dynamic``): a period's outcome depends on the profile in force
before it ``p`` and the new one ``j``, so ``reward`` and ``fees`` hold one row per pair,
``p J + j`` (``J^2`` rows, each the market's step from the state with ``p`` in force,
:meth:`MarketEnv.held`), read at :meth:`SessionGame.pay_row`; ``obs`` (of the prices in
force) keeps one row per profile. Under memory 1 the learners' state is ``p``, so the game
stays Markov for them. A profile's one-shot figures (:meth:`SessionGame.expected`) are of
it held, row ``j J + j``. Refused with random period outcomes, memory ``k > 1`` and
``feedback: full``.

Memory ``k``: the state of a session is the history of the last ``k`` profiles, most
recent first, ``(j_0, j_1, ..., j_{k-1})``, numbered ``h = sum_l j_l J^(k-1-l)`` (``J =
m^n``; ``k = 1``: ``h = j_0``). ``obs`` then holds the observation of one profile (the
first ``D / k`` features of the history, the profile's prices), and a history's
observation is ``concat_l obs[j_l]`` (:meth:`SessionGame.history_obs`): the history
observation of the general loop, whose learner numbers it ``s = sum_d digit_d
m^(kn-1-d)`` = ``h`` on the action grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.rewards import is_random
from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.learners.qlearning import (FirmGrids, PriceGrid, QLearningSettings, grid_of,
                                          obs_grid_of, qlearning_settings)
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.equilibrium import outcomes
from jaxmarket.market.spec import thaw
from jaxmarket.market.state import current_actions
from jaxmarket.train.plan import RunPlan

#: observation kinds that are a function of the current price profile
PROFILE_OBSERVATIONS = ("empty", "own_price", "competitor_prices", "market_price", "history")
#: most joint profiles the tables may hold
MAX_PROFILES = 1 << 22


@dataclass(frozen=True)
class SessionGame:
    """The tables of one market and the learner that plays it (one session)."""

    group: str
    learner: Learner
    spec: LearnerSpec
    grid: PriceGrid | FirmGrids   # one grid, or each seller's own (FirmGrids)
    radix: tuple[int, ...]     # m^(n-1-i): profile (grid indices) -> table row
    reward: jax.Array          # [m^n, n] float32 ([K, m^n, n] with K outcomes)
    obs: jax.Array             # [m^n, n, D] float32 ([K, m^n, n, D])
    fees: jax.Array            # [m^n, n] float32 money each seller received ([K, m^n, n])
    turns: tuple[int, int] | None
    settings: QLearningSettings  # the learner's resolved settings
    # a random period of K > 1 outcomes: their probabilities (the tables gain a leading
    # outcome axis); None for a deterministic period
    probs: tuple[float, ...] | None = None
    memory: int = 1            # k: the profiles in a session's state (module docstring)
    # a rule on last period's prices (``MarketEnv.lagged``): ``reward`` and ``fees`` hold
    # one row per (previous, current) profile pair, row ``p J + j`` (module docstring)
    lagged: bool = False

    @property
    def num_outcomes(self) -> int:
        return 1 if self.probs is None else len(self.probs)

    def expected(self, table: jax.Array) -> jax.Array:
        """``[m^n, ...]`` a table (``reward``, ``fees``) in expectation over the outcomes;
        of a lagged game, each profile's row held (previous = current, ``j J + j``)."""
        if self.lagged:
            return table[held_rows(self.profiles)]
        if self.probs is None:
            return table
        return jnp.tensordot(jnp.asarray(self.probs, jnp.float32), table, axes=1)

    @property
    def expected_reward(self) -> jax.Array:
        """``[m^n, n]`` the reward of each profile, in expectation over the outcomes."""
        return self.expected(self.reward)

    def observe(self, outcome: jax.Array, row: jax.Array) -> jax.Array:
        """The observations ``[n, D]`` of table row ``row`` under ``outcome``."""
        return self.obs[row] if self.probs is None else self.obs[outcome, row]

    @property
    def sellers(self) -> int:
        return len(self.radix)

    def row(self, index: jax.Array) -> jax.Array:
        """Table row of grid-index profiles ``[..., n]``."""
        return jnp.sum(index * jnp.asarray(self.radix, jnp.int32), axis=-1)

    def pay_row(self, before: jax.Array, row: jax.Array) -> jax.Array:
        """The ``reward``/``fees`` row of profile row ``row`` played after profile row
        ``before``: ``before J + row`` in a lagged game, else ``row``."""
        return before * self.profiles + row if self.lagged else row

    @property
    def profiles(self) -> int:
        """``J = m^n``, the joint profiles (rows of ``obs``; ``reward``'s but for a
        lagged game's ``J^2`` pairs)."""
        return int(self.obs.shape[-3])

    @property
    def histories(self) -> int:
        """``J^k``: the states of a session (its last ``k`` profiles)."""
        return self.profiles ** self.memory

    def history_obs(self, rows: jax.Array) -> jax.Array:
        """The observation ``[..., n, k D1]`` of histories of table rows ``[..., k]`` (most
        recent first): each profile's observation, concatenated (deterministic games)."""
        parts = [self.obs[rows[..., lag]] for lag in range(self.memory)]
        return jnp.concatenate(parts, axis=-1)

    def history_rows(self) -> np.ndarray:
        """``[J^k, k]`` int32: the profile rows of every history number ``h`` (most recent
        first: ``j_l = (h // J^(k-1-l)) mod J``)."""
        J, k = self.profiles, self.memory
        h = np.arange(J ** k, dtype=np.int64)[:, None]
        return ((h // J ** np.arange(k - 1, -1, -1)) % J).astype(np.int32)


def held_rows(profiles: int) -> np.ndarray:
    """``[J]`` a lagged game's table row of each profile held two periods, ``j J + j``."""
    return np.arange(profiles) * (profiles + 1)


def check_game(plan: RunPlan) -> str:
    """The one agent group of a plan the tables can represent exactly (its name), or a
    ``ValueError`` saying why not."""
    env = plan.env
    groups = env.spec.agent_groups
    if len(groups) != 1 or groups[0].side != "seller":
        raise ValueError("session engine: needs exactly one agent group, a seller group; got "
                         + ", ".join(f"{g.name} ({g.side})" for g in groups))
    g = groups[0]
    kind = plan.learner_settings[g.name][0]
    if kind != "q_learning":
        raise ValueError(f"session engine: plays q_learning sellers; learners.{g.name} is "
                         f"{kind!r}")
    if plan.models.get(g.name) is not None:
        raise ValueError(f"session engine: learners.{g.name}.external_model changes rewards "
                         f"period by period; use python -m jaxmarket.train")
    if plan.populations.get(g.name) is not None or plan.pbt:
        raise ValueError(f"session engine: plays one Q table per seller and session; "
                         f"learners.{g.name} has a population or population-based training")
    if is_random(thaw(g.reward)):
        raise ValueError(f"session engine: {g.name}.reward draws noise each period (a noise "
                         f"term); the tables hold one reward per profile")
    moving = [c.name for c in env.spec.consumers if c.demand_kind != "constant"]
    if moving:
        raise ValueError(f"session engine: consumer demand must be constant; {moving} change")
    found = outcomes(env)
    if found is None:
        raise ValueError(f"session engine: the distributor {env.spec.distributor!r}"
                         f"{_with_options(env)} draws at random each period without a finite "
                         f"set of outcomes; the tables hold one outcome per profile and period "
                         f"draw")
    if len(found) > 1 and getattr(env.spec, "move_order", "simultaneous") != "simultaneous":
        raise ValueError("session engine: random period outcomes with alternating moves")
    parts = thaw(g.observation) or []
    if env.lagged:
        _check_lagged(g.name, parts, len(found), env)
    if observed_memory(parts) > 1:
        _check_memory(g.name, parts, len(found))
        return g.name
    for part in parts:
        obs_kind = part.get("kind") if isinstance(part, Mapping) else part
        if obs_kind not in PROFILE_OBSERVATIONS:
            raise ValueError(f"session engine: observation {part!r} is not a function of the "
                             f"current prices (allowed: {', '.join(PROFILE_OBSERVATIONS)}, "
                             f"history with k >= 1)")
    return g.name


def observed_memory(parts) -> int:
    """``k`` of the group's ``history`` observation (1 without one)."""
    ks = [int(p.get("k", 1)) for p in parts if isinstance(p, Mapping)
          and p.get("kind") == "history"]
    return max(ks, default=1)


def _check_memory(group: str, parts, outcomes_found: int) -> None:
    """A history of ``k > 1`` profiles: only as the whole observation, of a
    deterministic period (a ``ValueError`` naming the field otherwise)."""
    k = observed_memory(parts)
    kinds = [p.get("kind") if isinstance(p, Mapping) else p for p in parts]
    if [x for x in kinds if x != "empty"] != ["history"]:
        raise ValueError(f"session engine: {group}.observation {parts!r} mixes a history of "
                         f"k={k} profiles with other components; allowed with k > 1: "
                         f"[{{kind: history, k: {k}}}] alone (the state is the last k "
                         f"profiles)")
    if outcomes_found > 1:
        raise ValueError(f"session engine: {group}.observation history k={k} with random "
                         f"period outcomes; allowed: k: 1 where the period is random (the "
                         f"state would hold past outcomes)")


def _check_lagged(group: str, parts, outcomes_found: int, env: MarketEnv) -> None:
    """A rule on last period's prices: only with memory 1 and a deterministic period (a
    ``ValueError`` naming the fields otherwise)."""
    options = dict(thaw(env.spec.distributor_options) or {})
    rule = (f"market.distributor {env.spec.distributor!r} ("
            + ", ".join(f"{k}: {v!r}" for k, v in options.items()) + ")")
    if outcomes_found > 1:
        raise ValueError(f"session engine: {rule} reads last period's prices, with random "
                         f"period outcomes; allowed: one of the two (the tables would hold "
                         f"one row per outcome and pair of profiles)")
    if observed_memory(parts) > 1:
        raise ValueError(f"session engine: {rule} reads last period's prices, with "
                         f"{group}.observation history k={observed_memory(parts)}; allowed "
                         f"with it: k: 1")


def _with_options(env: MarketEnv) -> str:
    """`` with market.distributor.<option>: value, ...`` where the distributor's options
    decide whether its period is random (a refusal then names the settings to change),
    else ``""``."""
    definition = DISTRIBUTORS[env.spec.distributor]
    options = dict(thaw(env.spec.distributor_options) or {})
    if not callable(definition.deterministic) or not options:
        return ""
    return " with " + ", ".join(f"market.distributor.{k}: {v!r}" for k, v in options.items())


def simultaneous(env: MarketEnv) -> MarketEnv:
    """The same market with every seller moving every period (for one-shot outcomes)."""
    if getattr(env.spec, "move_order", "simultaneous") == "simultaneous":
        return env
    return MarketEnv(dataclasses.replace(env.spec, move_order="simultaneous"))


def outcome_tables(env: MarketEnv, params: Any, group: str, prices: jax.Array,
                   previous: jax.Array | None = None):
    """``(reward [J, n], obs [J, n, D], fees [J, n])`` of one step from the reset state
    for each price profile ``prices [J, n]`` of ``group`` (the market's own step); with
    ``previous [J, n]``, from the reset state with those prices in force
    (:meth:`MarketEnv.held`: a lagged market's last period)."""
    env = simultaneous(env)

    def one(profile: jax.Array, before: jax.Array | None):
        key = jax.random.key(0)
        _, state = env.reset_env(key, params)
        actions = current_actions(env.spec, state)
        if before is not None:
            actions[group] = before[:, None]
            state = env.held(state, dict(actions), params)
        actions[group] = profile[:, None]
        obs, _, rewards, _, info = env.step_env(key, state, actions, params)
        return rewards[group], obs[group], info["fees"][group].sum(axis=-1)

    return jax.jit(jax.vmap(one))(prices, previous)


def make_game(plan: RunPlan) -> SessionGame:
    """The tables of ``plan``'s market on its learner's grid, and that learner (one
    session, payoffs read from the table)."""
    group = check_game(plan)
    hyper = plan.learner_settings[group][1]
    env_spec = group_learner_spec(plan.env, plan.params, group)
    settings = qlearning_settings(hyper, env_spec)
    grid = grid_of(settings)
    n, m = env_spec.num_agents, grid.size
    if m ** n > MAX_PROFILES:
        raise ValueError(f"session engine: {m}^{n} joint prices are too many for the tables "
                         f"(at most {MAX_PROFILES})")
    # profile j's prices: seller i's own grid price a_i (grid.profile_price)
    profiles = grid.profile_price(jnp.asarray(np.indices((m,) * n).reshape(n, -1).T))  # [J, n]
    found = outcomes(plan.env)
    lagged = plan.env.lagged
    if lagged and settings.feedback == "full":
        raise ValueError(f"session engine: learners.{group}.feedback: full with a rule on last "
                         f"period's prices (market.distributor); the counterfactual payoffs "
                         f"are of the profile in force; allowed with it: feedback: taken")
    if lagged and (m ** n) ** 2 > MAX_PROFILES:
        raise ValueError(f"session engine: ({m}^{n})^2 pairs of joint prices (a rule on last "
                         f"period's prices) are too many for the tables (at most "
                         f"{MAX_PROFILES})")
    if lagged:   # one row per (previous p, current j) pair, row p J + j
        J = m ** n
        tables = [outcome_tables(found[0][1], plan.params, group, jnp.tile(profiles, (J, 1)),
                                 jnp.repeat(profiles, J, axis=0))]
        obs_rows = tables[0][1][:J]   # the observation is of the prices in force (pair 0, j)
        tables = [(tables[0][0], obs_rows, tables[0][2])]
    else:
        tables = [outcome_tables(env, plan.params, group, profiles) for _, env in found]
    probs = None if len(found) == 1 else tuple(p for p, _ in found)
    if probs is None:
        reward, obs, fees = tables[0]
        expected = reward
    else:
        reward, obs, fees = (jnp.stack(t) for t in zip(*tables))
        expected = jnp.tensordot(jnp.asarray(probs, jnp.float32), reward, axes=1)
    radix = tuple(m ** (n - 1 - i) for i in range(n))
    weights = jnp.asarray(radix, jnp.int32)

    if lagged:   # a profile's one-shot payoffs: the profile held (row j J + j)
        expected = expected[held_rows(m ** n)]

    @jax.jit   # one program where it runs op by op (the initial Q's table), not one per op
    def payoff(prices: jax.Array) -> jax.Array:
        """One-shot (expected) payoffs of a profile ``[n, 1]`` (snapped to the grid)."""
        return expected[jnp.sum(grid.profile_index(prices[:, 0]) * weights)]

    spec = dataclasses.replace(env_spec, payoff=payoff)
    learner = LEARNERS["q_learning"].make(hyper, spec)
    memory = observed_memory(thaw(plan.env.spec.group(group).observation) or [])
    if memory > 1:   # one profile's observation: the most recent of the history
        obs = obs[..., :obs.shape[-1] // memory]
    return SessionGame(group, learner, spec, grid, radix, reward.astype(jnp.float32),
                       obs.astype(jnp.float32), fees.astype(jnp.float32), spec.turns,
                       settings, probs, memory, lagged)


def pure_nash(game: SessionGame) -> np.ndarray:
    """``[K, n]`` grid-index profiles of the one-shot game's pure Nash equilibria: no
    seller gains by a unilateral change of its grid price (from the reward table)."""
    m, n = game.grid.size, game.sellers
    reward = np.asarray(game.expected_reward, np.float64).reshape((m,) * n + (n,))
    stable = np.ones((m,) * n, bool)
    for i in range(n):   # n is a handful of sellers, not a batch axis
        own = np.take(reward, i, axis=-1)
        best = own.max(axis=i, keepdims=True)
        stable &= own >= best - 1e-9 * np.maximum(1.0, np.abs(best))
    return np.argwhere(stable)


def kernel_reason(game: SessionGame) -> str | None:
    """Why the per-thread kernel (:mod:`jaxmarket.sessions.kernel`) cannot play ``game``
    (None: it can). The kernel plays the ``q_learning`` learner of every session design
    whose sellers each own their Q table: epsilon-greedy (any ``epsilon.start``) or
    Boltzmann exploration, the update on the price taken or on every price
    (``feedback: full``), Calvano's or Klein's sequential target, simultaneous or
    alternating moves, deterministic or random period outcomes, any state that is a
    function of the profile in force (and the outcome) or of the last ``k`` profiles
    (memory ``k``), each seller's own ``alpha``, ``beta`` (from the learner state) and
    ``delta`` (one for every seller or one per firm). Boltzmann exploration's Gumbel
    noise is read from a table of ``mode="low"`` values
    (:func:`jaxmarket.sessions.kernel.gumbel_table`), so not under jax's
    ``jax_high_dynamic_range_gumbel``."""
    s = game.settings
    if game.histories > np.iinfo(np.int32).max:
        return (f"memory {game.memory}: {game.profiles}^{game.memory} histories do not fit "
                f"the kernel's int32 state numbers")
    if not s.exclusive_policies or tuple(s.policy_index) != tuple(range(game.sellers)):
        return "sellers sharing a Q table"
    if s.boltzmann is not None and jax.config.jax_high_dynamic_range_gumbel:
        return ("Boltzmann exploration under jax_high_dynamic_range_gumbel (the kernel's "
                "Gumbel table is of mode low)")
    return None


__all__ = ["SessionGame", "check_game", "held_rows", "kernel_reason", "make_game",
           "outcome_tables", "pure_nash"]
