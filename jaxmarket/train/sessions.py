"""Many independent sessions of a tabular pricing game, as one compiled program.

The experiments of the algorithmic-pricing literature (Calvano et al. 2020, Klein 2021,
Asker et al. 2022, Banchio & Skrzypacz 2022) run hundreds of independent sessions of
a few Q-learning sellers for 10^5 - 10^7 periods each. Stepping the general market for
every period of every session costs far more than the learning does, so this runner
first asks the market for its one-shot outcome of *every* joint grid action (``m^n``
profiles, ``vmap``ped over :meth:`MarketEnv.step_env` from the reset state) and then
plays all sessions against those tables::

    reward[j] [n], obs[j] [n, D], fees[j] [n]    for every profile j = sum_i a_i m^(n-1-i)

A period of one session: the sellers observe ``obs[j_t]`` of the profile in force,
act with the group's own ``q_learning`` ``act``; under ``market.move_order:
alternating`` only seller ``t mod n`` changes its price; the new profile's rewards and
observations come from the tables; the learner's own ``update`` learns from that
one-period transition. Sessions are ``vmap``ped, periods are a ``lax.scan`` in chunks,
and a session's randomness is ``fold_in(session_key, t)``: the chunk length changes no
result.

This is exact for markets whose period outcome depends only on the prices in force:
one agent group (a seller group, the only one), constant demand, a deterministic
distributor and observations of the current profile (``empty``, ``own_price``,
``competitor_prices``, ``market_price``, ``history`` with ``k: 1``). Anything else is
refused with the reason; train it with ``python -m jaxmarket.train`` instead.

    plan = resolve("configs/klein2021.yaml")
    result = run_sessions(plan, sessions=100, periods=500_000, key=jax.random.key(0))
    result.tail_reward.mean()      # profit per firm and period, last 1,000 periods
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec, Transition
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.learners.qlearning import PriceGrid, grid_of, qlearning_settings
from jaxmarket.market.env import MarketEnv
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
    grid: PriceGrid
    radix: tuple[int, ...]     # m^(n-1-i): profile (grid indices) -> table row
    reward: jax.Array          # [m^n, n] float32
    obs: jax.Array             # [m^n, n, D] float32
    fees: jax.Array            # [m^n, n] float32 money each seller received
    turns: tuple[int, int] | None

    @property
    def sellers(self) -> int:
        return len(self.radix)

    def row(self, index: jax.Array) -> jax.Array:
        """Table row of grid-index profiles ``[..., n]``."""
        return jnp.sum(index * jnp.asarray(self.radix, jnp.int32), axis=-1)


@dataclass(frozen=True)
class SessionResult:
    """What :func:`run_sessions` returns (numpy arrays, leading axis: session)."""

    game: SessionGame
    tail_reward: np.ndarray     # [S, n] mean reward over the last ``window`` periods
    greedy_index: np.ndarray    # [S, n] each seller's greedy grid index in the final state
    greedy_price: np.ndarray    # [S, n]
    greedy_reward: np.ndarray   # [S, n] one-shot reward of the greedy profile
    greedy_fees: np.ndarray     # [S, n] fees of the greedy profile (auctions: payments)
    final_index: np.ndarray     # [S, n] the profile in force after the last period
    converged: np.ndarray       # [S] bool, the learner's convergence rule
    stable_periods: np.ndarray  # [S] periods since a seller's greedy strategy last changed
    step: np.ndarray            # [S] periods learnt from (the period of convergence)
    periods: int
    window: int
    wall_s: float


def check_game(plan: RunPlan) -> str:
    """The one agent group of a plan the tables can represent exactly (its name), or a
    ``ValueError`` saying why not."""
    env = plan.env
    groups = env.spec.agent_groups
    if len(groups) != 1 or groups[0].side != "seller":
        raise ValueError("run_sessions: needs exactly one agent group, a seller group; got "
                         + ", ".join(f"{g.name} ({g.side})" for g in groups))
    g = groups[0]
    kind = plan.learner_settings[g.name][0]
    if kind != "q_learning":
        raise ValueError(f"run_sessions: plays q_learning sellers; learners.{g.name} is "
                         f"{kind!r}")
    if plan.models.get(g.name) is not None:
        raise ValueError(f"run_sessions: learners.{g.name}.external_model changes rewards "
                         f"period by period; use python -m jaxmarket.train")
    moving = [c.name for c in env.spec.consumers if c.demand_kind != "constant"]
    if moving:
        raise ValueError(f"run_sessions: consumer demand must be constant; {moving} change")
    for part in thaw(g.observation) or []:
        obs_kind = part.get("kind") if isinstance(part, Mapping) else part
        if obs_kind not in PROFILE_OBSERVATIONS or (obs_kind == "history"
                                                    and part.get("k", 1) != 1):
            raise ValueError(f"run_sessions: observation {part!r} is not a function of the "
                             f"current prices (allowed: {', '.join(PROFILE_OBSERVATIONS)}, "
                             f"history with k: 1)")
    return g.name


def simultaneous(env: MarketEnv) -> MarketEnv:
    """The same market with every seller moving every period (for one-shot outcomes)."""
    if getattr(env.spec, "move_order", "simultaneous") == "simultaneous":
        return env
    return MarketEnv(dataclasses.replace(env.spec, move_order="simultaneous"))


def outcome_tables(env: MarketEnv, params: Any, group: str, prices: jax.Array):
    """``(reward [J, n], obs [J, n, D], fees [J, n])`` of one step from the reset state
    for each price profile ``prices [J, n]`` of ``group`` (the market's own step)."""
    env = simultaneous(env)

    def one(profile: jax.Array):
        key = jax.random.key(0)
        _, state = env.reset_env(key, params)
        actions = current_actions(env.spec, state)
        actions[group] = profile[:, None]
        obs, _, rewards, _, info = env.step_env(key, state, actions, params)
        return rewards[group], obs[group], info["fees"][group].sum(axis=-1)

    return jax.jit(jax.vmap(one))(prices)


def make_game(plan: RunPlan) -> SessionGame:
    """The tables of ``plan``'s market on its learner's grid, and that learner (one
    session, payoffs read from the table)."""
    group = check_game(plan)
    hyper = plan.learner_settings[group][1]
    env_spec = group_learner_spec(plan.env, plan.params, group)
    grid = grid_of(qlearning_settings(hyper, env_spec))
    n, m = env_spec.num_agents, grid.size
    if m ** n > MAX_PROFILES:
        raise ValueError(f"run_sessions: {m}^{n} joint prices are too many for the tables "
                         f"(at most {MAX_PROFILES})")
    profiles = np.indices((m,) * n).reshape(n, -1).T                     # [J, n]
    reward, obs, fees = outcome_tables(plan.env, plan.params, group,
                                       grid.prices[jnp.asarray(profiles)])
    radix = tuple(m ** (n - 1 - i) for i in range(n))
    weights = jnp.asarray(radix, jnp.int32)

    def payoff(prices: jax.Array) -> jax.Array:
        """One-shot payoffs of a profile ``[n, 1]`` (snapped to the grid) -> ``[n]``."""
        return reward[jnp.sum(grid.nearest_index(prices[:, 0]) * weights)]

    spec = dataclasses.replace(env_spec, payoff=payoff)
    learner = LEARNERS["q_learning"].make(hyper, spec)
    return SessionGame(group, learner, spec, grid, radix, reward.astype(jnp.float32),
                       obs.astype(jnp.float32), fees.astype(jnp.float32), spec.turns)


def _chunk(game: SessionGame, length: int, periods: int, window: int):
    """Jitted ``(carry, first_period) -> carry`` of ``length`` periods of every session;
    ``carry = (learner_state, profile [n], tail reward sum [n], session key)``."""
    learner, n = game.learner, game.sellers
    prices = game.grid.prices
    if game.turns is None:
        seat = None
    else:
        num_turns, first = game.turns
        seat = jnp.asarray((first + np.arange(n)) % num_turns, jnp.uint32)
    tail_start = periods - window

    def period(carry, t):
        state, index, tail, session_key = carry
        obs = game.obs[game.row(index)]
        _, aux = learner.act(state, obs, jax.random.fold_in(session_key, t))
        chosen = aux["action_index"]
        index = chosen if seat is None else jnp.where(t % num_turns == seat, chosen, index)
        row = game.row(index)
        reward = game.reward[row]
        batch = Transition(obs=obs[None], action=prices[index][None, :, None],
                           reward=reward[None], next_obs=game.obs[row][None],
                           done=jnp.zeros((1, n), bool), aux={"action_index": chosen[None]})
        state, _ = learner.update(state, batch)
        tail = tail + jnp.where(t >= tail_start, reward, 0.0)
        return (state, index, tail, session_key), None

    def one_session(carry, first_period):
        carry, _ = jax.lax.scan(period, carry, first_period + jnp.arange(length, dtype=jnp.uint32))
        return carry

    return jax.jit(jax.vmap(one_session, in_axes=(0, None)), donate_argnums=0)


def _greedy(game: SessionGame, state, index):
    """Each session's greedy grid indices ``[S, n]`` at the observation of ``index``."""

    def one(state, index):
        greedy = state.replace(converged=jnp.ones_like(state.converged))
        _, aux = game.learner.act(greedy, game.obs[game.row(index)], jax.random.key(0))
        return aux["action_index"]

    return jax.jit(jax.vmap(one))(state, index)


def run_sessions(plan: RunPlan, sessions: int, periods: int, key: jax.Array,
                 window: int = 1000, chunk: int = 10_000,
                 game: SessionGame | None = None) -> SessionResult:
    """Run ``sessions`` independent sessions of ``plan``'s market for ``periods`` periods
    each (all in one compiled chunk, repeated); the first profile of each session is
    drawn uniformly from the grid. ``window``: the periods at the end whose rewards are
    averaged into ``tail_reward``."""
    if sessions < 1 or periods < 1:
        raise ValueError(f"run_sessions: sessions ({sessions}) and periods ({periods}) "
                         f"must be >= 1")
    start = time.perf_counter()
    game = make_game(plan) if game is None else game
    window = min(window, periods)
    init_key, start_key, run_key = jax.random.split(key, 3)
    if _uses_init_key(plan, game):   # a random initial Q: one draw per session
        states = jax.vmap(lambda k: game.learner.init(k, game.spec))(
            jax.random.split(init_key, sessions))
    else:                            # the same initial Q in every session
        one = game.learner.init(init_key, game.spec)
        states = jax.tree.map(lambda x: jnp.array(jnp.broadcast_to(x, (sessions,) + x.shape)),
                              one)
    index = jax.random.randint(start_key, (sessions, game.sellers), 0, game.grid.size)
    tail = jnp.zeros((sessions, game.sellers), jnp.float32)
    carry = (states, index.astype(jnp.int32), tail, jax.random.split(run_key, sessions))
    length = min(chunk, periods)
    step = _chunk(game, length, periods, window)
    done = 0
    while done + length <= periods:
        carry = step(carry, jnp.uint32(done))
        done += length
    if done < periods:   # the remainder, as one shorter chunk
        carry = _chunk(game, periods - done, periods, window)(carry, jnp.uint32(done))
    states, index, tail, _ = carry
    greedy = _greedy(game, states, index)
    row = game.row(greedy)
    return SessionResult(
        game=game, tail_reward=np.asarray(tail / window, np.float64),
        greedy_index=np.asarray(greedy), greedy_price=np.asarray(game.grid.prices[greedy]),
        greedy_reward=np.asarray(game.reward[row], np.float64),
        greedy_fees=np.asarray(game.fees[row], np.float64), final_index=np.asarray(index),
        converged=np.asarray(states.converged),
        stable_periods=np.asarray(states.stable_periods), step=np.asarray(states.step),
        periods=periods, window=window, wall_s=time.perf_counter() - start)


def _uses_init_key(plan: RunPlan, game: SessionGame) -> bool:
    """Whether the learner's initial state is random (``q_init: uniform``): then every
    session draws its own."""
    q_init = plan.learner_settings[game.group][1].get("q_init")
    kind = q_init.get("kind") if isinstance(q_init, Mapping) else q_init
    return kind == "uniform"


def pure_nash(game: SessionGame) -> np.ndarray:
    """``[K, n]`` grid-index profiles of the one-shot game's pure Nash equilibria: no
    seller gains by a unilateral change of its grid price (from the reward table)."""
    m, n = game.grid.size, game.sellers
    reward = np.asarray(game.reward, np.float64).reshape((m,) * n + (n,))
    stable = np.ones((m,) * n, bool)
    for i in range(n):   # n is a handful of sellers, not a batch axis
        own = np.take(reward, i, axis=-1)
        best = own.max(axis=i, keepdims=True)
        stable &= own >= best - 1e-9 * np.maximum(1.0, np.abs(best))
    return np.argwhere(stable)


__all__ = ["SessionGame", "SessionResult", "check_game", "make_game", "outcome_tables",
           "pure_nash", "run_sessions"]
