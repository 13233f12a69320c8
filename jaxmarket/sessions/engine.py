"""The session engine: many independent sessions of a tabular pricing game, played
against the market's outcome tables (:mod:`jaxmarket.sessions.game`).

A period of one session: the sellers observe ``obs[j_t]`` of the profile in force and
act with the group's own ``q_learning`` ``act``; under ``market.move_order:
alternating`` only seller ``t mod n`` changes its price; the new profile's rewards and
observations come from the tables; the learner's own ``update`` learns from that
one-period transition. Sessions are ``vmap``ped, periods are a ``lax.scan`` in chunks,
and a session's randomness is ``fold_in(session_key, t)``: neither the chunk length
nor which other sessions share a batch changes a session.

Memory ``k > 1`` (the observation ``[{kind: history, k: k}]``): a session's state is its
last ``k`` profiles, ``index`` (the one in force) and ``past`` (the ``k - 1`` before it,
most recent first); the sellers observe the history (``SessionGame.history_obs``), and
each period shifts it: ``past <- (index, past[:-1])``, ``index <-`` the new profile.

Keys, in this order: ``init_key, start_key, run_key = split(key, 3)``; the first profile
of every session is ``randint(start_key, (S, n), 0, m)`` (memory ``k``: the first history
is ``randint(start_key, (S, k, n), 0, m)``, ``index`` its row 0 and ``past`` the rest: a
random initial state, as Calvano et al.'s ``initState`` draws ``DepthState`` profiles),
session ``s`` runs on
``split(run_key, S)[s]`` (period ``t``: ``key_t = fold_in(session_key, t)``), and a
random initial Q (``q_init: uniform``) draws one ``init`` per session from
``split(init_key, S)``.

Random periods with finitely many outcomes (a Cournot demand shock: the game's tables
hold one table per outcome, ``probs``): period ``t``'s outcome is drawn from
``fold_in(key_t, 1)`` (inverse CDF of one uniform), its rewards and the observation the
sellers see next period come from that outcome's tables; the first period's observation
is of an outcome drawn from ``split(fold_in(start_key, 1), S)``. The engine runs under
``jax.threefry_partitionable(False)`` (the hash the kernel backend writes out).

A rule on last period's prices (``game.lagged``): a period's reward is the tables' row
of the pair (profile before the move, profile after it), :meth:`SessionGame.pay_row`,
on both backends and in the greedy limit cycle.

Stopping (``stop``): ``converged`` ends the run once every session has met its
learner's convergence rule (a converged session stops learning and plays greedily, as
in Calvano et al.), or after ``periods``; ``periods`` runs every session for exactly
``periods`` periods. ``window``: the last periods before ``periods`` whose played
rewards are averaged into ``tail_reward`` (defined where every session played them:
``tail_complete``; with ``converged``, where no session converged, or the game's
sellers alternate, whose sessions are never compacted: the same on both backends and
at any number of sessions).

Backends (``backend``): ``xla`` runs the learner's ``act``/``update`` (any device:
CPU, GPU, TPU); ``kernel`` (:mod:`jaxmarket.sessions.kernel`, numba) plays each
session's periods of a chunk in one compiled loop per thread, the same sessions bit for
bit; ``auto`` takes the kernel where numba is installed, the platform is a CPU and the
game is one the kernel plays (:func:`~jaxmarket.sessions.game.kernel_reason`), else
``xla``. With ``xla`` and ``stop: converged``, the running batch is compacted to the
sessions still learning (padded with converged ones, batch sizes on a fixed ladder, a
function of the count alone), so converged sessions stop costing time.

The result of a session (:func:`greedy_cycle`): from its final state, the greedy
strategies are played for a burn-in of ``m^n`` turn cycles (the play is then on its
limit cycle; the state it reaches is found by cycle detection, not played out) and each
seller's reward is averaged over exactly one cycle: Calvano et al.'s measure of the
converged play. Under memory ``k > 1`` the play's state is the
history (``m^(kn)`` of them): Brent's cycle detection on the turn-cycle map finds the
cycle (in a number of turn cycles of the order of ``mu + lambda``, ``mu`` those before
the cycle, ``lambda`` its length; no burn-in of ``m^(kn)``), and the averages are over
exactly one cycle from the point it found.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jaxmarket.learners.base import Transition
from jaxmarket.sessions.calibration import kept_rounding
from jaxmarket.sessions.game import SessionGame, kernel_reason, make_game

BACKENDS = ("auto", "xla", "kernel")
STOPS = ("converged", "periods")
#: the smallest step of the compaction ladder (sessions)
GRANULARITY = 64


class Sessions(NamedTuple):
    """The state of every session (a pytree, leading axis: session)."""

    learner: Any          # the learner's state, one per session
    index: jax.Array      # [S, n] int32 the grid-index profile in force
    tail: jax.Array       # [S, n] float32 rewards summed over the tail window
    key: jax.Array        # [S] the sessions' keys
    outcome: jax.Array    # [S] int32 the period outcome in force (0: a deterministic game)
    # memory k > 1: [S, k - 1, n] int32 the profiles before ``index``, most recent first
    # (None under memory 1)
    past: jax.Array | None = None


@dataclass(frozen=True)
class Settings:
    """How a run of sessions goes (``train.*`` of a sessions run)."""

    sessions: int
    periods: int                 # the cap (stop: converged) or every session's length
    chunk: int = 20_000
    stop: str = "converged"
    window: int = 1000
    backend: str = "auto"
    devices: int = 1

    def __post_init__(self):
        if self.sessions < 1 or self.periods < 1 or self.chunk < 1:
            raise ValueError(f"sessions ({self.sessions}), periods ({self.periods}) and chunk "
                             f"({self.chunk}) must be >= 1")
        if self.stop not in STOPS:
            raise ValueError(f"stop: got {self.stop!r}; allowed: {', '.join(STOPS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: got {self.backend!r}; allowed: {', '.join(BACKENDS)}")


@dataclass(frozen=True)
class SessionResult:
    """What :func:`run` returns (numpy arrays, leading axis: session)."""

    game: SessionGame
    cycle_reward: np.ndarray    # [S, n] reward averaged over the greedy limit cycle
    cycle_fees: np.ndarray      # [S, n] fees averaged over the greedy limit cycle
    cycle_price: np.ndarray     # [S, n] price averaged over the greedy limit cycle
    cycle_length: np.ndarray    # [S] periods of the greedy limit cycle (0: random periods,
                                # the long-run mean of :func:`expected_play`)
    greedy_index: np.ndarray    # [S, n] greedy grid indices at the final profile
    greedy_price: np.ndarray    # [S, n]
    greedy_reward: np.ndarray   # [S, n] one-shot reward of the greedy profile
    greedy_fees: np.ndarray     # [S, n] fees of the greedy profile (auctions: payments)
    tail_reward: np.ndarray     # [S, n] mean played reward over the last ``window`` periods
    tail_complete: bool         # every session played the whole window (else no tail)
    converged: np.ndarray       # [S] bool, the learner's convergence rule
    stable_periods: np.ndarray  # [S] periods since a seller's greedy strategy last changed
    step: np.ndarray            # [S] periods learnt from (the period of convergence)
    periods: int                # periods the run played
    window: int
    session_periods: int        # slot-periods stepped (padding included)
    backend: str
    wall_s: float
    sessions: Sessions = dataclasses.field(repr=False, default=None)


def choose_backend(game: SessionGame, backend: str = "auto") -> tuple[str, str | None]:
    """``(backend, note)``: the backend a run uses and, where ``auto`` fell back to
    ``xla``, why. ``kernel`` where the kernel cannot run is a ``ValueError``."""
    reason = kernel_reason(game)
    if reason is None and importlib.util.find_spec("numba") is None:
        reason = "numba is not installed (pip install numba)"
    if backend == "kernel":
        if reason is not None:
            raise ValueError(f"backend kernel: {reason}; use backend xla")
        return "kernel", None
    if backend == "xla":
        return "xla", None
    if reason is None and jax.default_backend() != "cpu":
        reason = f"the platform is {jax.default_backend()} (the kernel runs on CPU threads)"
    return ("xla", f"session backend xla: {reason}") if reason else ("kernel", None)


def _uses_init_key(game: SessionGame) -> bool:
    """Whether the learner's initial state is random (``q_init: uniform``)."""
    return game.settings.q_init == "uniform"


@functools.partial(jax.jit, static_argnums=1)
def _copies(tree: Any, sessions: int) -> Any:
    """``sessions`` copies of every leaf of ``tree``, stacked on a new leading axis."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (sessions,) + x.shape), tree)


def init_sessions(game: SessionGame, sessions: int, key: jax.Array) -> Sessions:
    """Initial learner states, first profiles and session keys (module docstring)."""
    with jax.threefry_partitionable(False):
        init_key, start_key, run_key = jax.random.split(key, 3)
        if _uses_init_key(game):
            states = jax.vmap(lambda k: game.learner.init(k, game.spec))(
                jax.random.split(init_key, sessions))
        else:
            # the same initial Q in every session: one computed op by op, copied (one
            # program for every leaf: a fresh machine compiles one, not two per leaf)
            one = game.learner.init(init_key, game.spec)
            states = _copies(one, sessions)
        past = None
        if game.memory == 1:
            index = jax.random.randint(start_key, (sessions, game.sellers), 0, game.grid.size)
        else:   # the first history: k profiles drawn at once (row 0 the one in force)
            first = jax.random.randint(start_key, (sessions, game.memory, game.sellers), 0,
                                       game.grid.size).astype(jnp.int32)
            index, past = first[:, 0], first[:, 1:]
        keys = jax.random.split(run_key, sessions)
        if game.probs is None:
            outcome = jnp.zeros((sessions,), jnp.int32)
        else:
            outcome = draw_outcome(game, jax.vmap(lambda k: jax.random.fold_in(k, 1))(
                jax.random.split(jax.random.fold_in(start_key, 1), sessions)))
    tail = jnp.zeros((sessions, game.sellers), jnp.float32)
    return Sessions(states, index.astype(jnp.int32), tail, keys, outcome, past)


def observe_history(game: SessionGame, index: jax.Array, past: jax.Array) -> jax.Array:
    """The observation ``[n, k D1]`` of one session's history: ``index [n]`` in force,
    ``past [k - 1, n]`` before it (memory ``k > 1``)."""
    rows = jnp.concatenate([game.row(index)[None], game.row(past)])
    return game.history_obs(rows)


def shift_history(index: jax.Array, past: jax.Array) -> jax.Array:
    """``past`` after a period: the profile that was in force, then ``past[:-1]``."""
    return jnp.concatenate([index[None], past[:-1]])


def draw_outcome(game: SessionGame, key: jax.Array) -> jax.Array:
    """The period outcome ``k`` with probability ``probs[k]`` (inverse CDF of one
    uniform per key), int32 of the keys' shape."""
    cum = jnp.asarray(np.cumsum(np.asarray(game.probs, np.float64))[:-1], jnp.float32)
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(key.reshape(-1))
    return jnp.sum(u[:, None] >= cum[None, :], axis=1).astype(jnp.int32).reshape(key.shape)


def _seats(game: SessionGame):
    if game.turns is None:
        return None, 1
    num_turns, first = game.turns
    return jnp.asarray((first + np.arange(game.sellers)) % num_turns, jnp.uint32), num_turns


def xla_chunk(game: SessionGame, length: int, tail_start: int, devices: int = 1):
    """Jitted ``(sessions, first_period) -> sessions`` of ``length`` periods of every
    session (the learner's ``act``/``update``; module docstring)."""
    learner, n = game.learner, game.sellers
    seat, num_turns = _seats(game)

    random = game.probs is not None

    def period(carry, t):
        state, index, tail, session_key, outcome, past = carry
        key_t = jax.random.fold_in(session_key, t)
        if past is not None:   # memory k > 1: the history's observation
            obs = observe_history(game, index, past)
        else:
            obs = game.obs[outcome, game.row(index)] if random else game.obs[game.row(index)]
        _, aux = learner.act(state, obs, key_t)
        chosen = aux["action_index"]
        before = index
        index = chosen if seat is None else jnp.where(t % num_turns == seat, chosen, index)
        row = game.row(index)
        if random:   # this period's outcome, from its own stream of the period's key
            outcome = draw_outcome(game, jax.random.fold_in(key_t, 1)[None])[0]
            reward, next_obs = game.reward[outcome, row], game.obs[outcome, row]
        else:   # a lagged game's reward: of the pair (profile before, profile now)
            pay = game.pay_row(game.row(before), row) if game.lagged else row
            reward, next_obs = game.reward[pay], game.obs[row]
        if past is not None:
            past = shift_history(before, past)
            next_obs = observe_history(game, index, past)
        batch = Transition(obs=obs[None], action=game.grid.profile_price(index)[None, :, None],
                           reward=reward[None], next_obs=next_obs[None],
                           done=jnp.zeros((1, n), bool), aux={"action_index": chosen[None]})
        state, _ = learner.update(state, batch)
        tail = tail + jnp.where(t >= tail_start, reward, 0.0)
        return (state, index, tail, session_key, outcome, past), None

    def one_session(carry, first_period):
        periods = first_period + jnp.arange(length, dtype=jnp.uint32)
        carry, _ = jax.lax.scan(period, tuple(carry), periods)
        return Sessions(*carry)

    chunk = jax.vmap(one_session, in_axes=(0, None))
    if devices > 1:
        mesh = Mesh(np.asarray(jax.devices()[:devices]), ("sessions",))
        chunk = jax.shard_map(chunk, mesh=mesh, in_specs=(PartitionSpec("sessions"),
                                                          PartitionSpec()),
                              out_specs=PartitionSpec("sessions"))
    return jax.jit(chunk, donate_argnums=0)


def greedy_cycle(game: SessionGame, sessions: Sessions, first_period: int):
    """``(reward [S, n], fees [S, n], price [S, n], length [S])``: greedy play from each
    session's state and profile, from period ``first_period`` on: a burn-in of ``m^n``
    turn cycles, then the averages over exactly one limit cycle and its length in
    periods (module docstring; memory ``k > 1``: :func:`history_cycle`).

    The burn-in is not played turn cycle by turn cycle: with ``f`` the turn-cycle map
    and ``x_t = f^t(x_0)``, Brent's algorithm (:func:`history_cycle`) gives the cycle's
    length ``lambda``; ``mu``, the first ``t`` with ``x_t = x_(t + lambda)``, follows by
    stepping ``x_t`` and ``x_(t + lambda)`` together; and the state after the burn-in
    is ``x_(m^n) = f^((m^n - mu) mod lambda)(x_mu)`` (``mu + lambda <= m^n``, the
    states at a turn-cycle boundary). Of the order of ``mu + lambda`` turn cycles
    instead of ``2 m^n``; the cycle's ``lambda`` sums are laid into the ``m^n + 1``
    slots the played-out scan filled and averaged by the same masked sum, so the
    figures are the same to the bit."""
    if game.memory > 1:
        return history_cycle(game, sessions, first_period)
    seat, num_turns = _seats(game)
    horizon = game.grid.size ** game.sellers   # states at a turn-cycle boundary

    def one(state, index):
        greedy = state.replace(converged=jnp.ones_like(state.converged))

        def period(index, t):
            before = game.row(index)
            _, aux = game.learner.act(greedy, game.obs[before], jax.random.key(0))
            chosen = aux["action_index"]
            index = chosen if seat is None else jnp.where(t % num_turns == seat, chosen, index)
            pay = game.pay_row(before, game.row(index))
            return index, jnp.stack([game.reward[pay], game.fees[pay],
                                     game.grid.profile_price(index)])

        def turn_cycle(index):
            t = jnp.uint32(first_period) + jnp.arange(num_turns, dtype=jnp.uint32)
            index, out = jax.lax.scan(period, index, t)
            return index, out.sum(axis=0)

        def f(index):
            return turn_cycle(index)[0]

        def differ(c):
            return jnp.any(c[0] != c[1])

        def brent(c):
            tortoise, hare, power, lam = c
            reset = power == lam
            tortoise = jnp.where(reset, hare, tortoise)
            power, lam = jnp.where(reset, 2 * power, power), jnp.where(reset, 0, lam)
            return tortoise, f(hare), power, lam + 1

        _, _, _, lam = jax.lax.while_loop(differ, brent,
                                          (index, f(index), jnp.int32(1), jnp.int32(1)))
        ahead = jax.lax.fori_loop(0, lam, lambda _, x: f(x), index)      # x_lambda
        first, _, mu = jax.lax.while_loop(   # x_mu: the first state on the cycle
            differ, lambda c: (f(c[0]), f(c[1]), c[2] + 1), (index, ahead, jnp.int32(0)))
        start = jax.lax.fori_loop(0, (horizon - mu) % lam, lambda _, x: f(x), first)

        def lay(c):   # slot k: the sums of turn cycle k of the cycle from x_(m^n)
            x, k, sums = c
            x, out = turn_cycle(x)
            return x, k + 1, sums.at[k].set(out)

        empty = jnp.zeros((horizon + 1, 3, game.sellers), jnp.float32)
        _, _, sums = jax.lax.while_loop(lambda c: c[1] < lam, lay,
                                        (start, jnp.int32(0), empty))
        on = (jnp.arange(horizon + 1) < lam)[:, None, None]
        mean = jnp.sum(jnp.where(on, sums, 0.0), axis=0) / (lam * num_turns)
        return mean[0], mean[1], mean[2], lam * num_turns

    # the cycle starts where the last turn cycle ended: the profile after period
    # ``first_period - 1`` is the one from which ``first_period``'s seat moves
    return jax.jit(jax.vmap(one))(sessions.learner, sessions.index)


def history_cycle(game: SessionGame, sessions: Sessions, first_period: int):
    """:func:`greedy_cycle` of memory ``k > 1``: the state of greedy play is the history
    ``x = (index, past)``; ``f`` plays one turn cycle from ``x``. Brent's algorithm finds
    the cycle length ``lambda`` (in turn cycles) and a history ``x*`` on the cycle::

        power = lambda = 1, tortoise = x, hare = f(x)
        while tortoise != hare:
            if power == lambda: tortoise = hare, power = 2 power, lambda = 0
            hare = f(hare), lambda = lambda + 1

    then the rewards, fees and prices are averaged over the ``lambda`` turn cycles from
    ``x* = hare``; ``length = lambda num_turns`` periods."""
    seat, num_turns = _seats(game)

    def one(state, index, past):
        greedy = state.replace(converged=jnp.ones_like(state.converged))

        def period(x, t):
            index, past = x
            _, aux = game.learner.act(greedy, observe_history(game, index, past),
                                      jax.random.key(0))
            chosen = aux["action_index"]
            new = chosen if seat is None else jnp.where(t % num_turns == seat, chosen, index)
            row = game.row(new)
            out = jnp.stack([game.reward[row], game.fees[row], game.grid.profile_price(new)])
            return (new, shift_history(index, past)), out

        def turn_cycle(x):
            t = jnp.uint32(first_period) + jnp.arange(num_turns, dtype=jnp.uint32)
            x, out = jax.lax.scan(period, x, t)
            return x, out.sum(axis=0)

        def differ(a, b):
            return jnp.any(a[0] != b[0]) | jnp.any(a[1] != b[1])

        def brent(c):
            tortoise, hare, power, lam = c
            reset = power == lam
            tortoise = jax.tree.map(lambda h, x: jnp.where(reset, h, x), hare, tortoise)
            power, lam = jnp.where(reset, 2 * power, power), jnp.where(reset, 0, lam)
            return tortoise, turn_cycle(hare)[0], power, lam + 1

        x = (index, past)
        _, hare, _, lam = jax.lax.while_loop(lambda c: differ(c[0], c[1]), brent,
                                             (x, turn_cycle(x)[0], jnp.int32(1),
                                              jnp.int32(1)))

        def add(c):
            x, i, total = c
            x, out = turn_cycle(x)
            return x, i + 1, total + out

        zero = jnp.zeros((3, game.sellers), jnp.float32)
        _, _, total = jax.lax.while_loop(lambda c: c[1] < lam, add, (hare, jnp.int32(0), zero))
        mean = total / (lam * num_turns).astype(jnp.float32)
        return mean[0], mean[1], mean[2], lam * num_turns

    return jax.jit(jax.vmap(one))(sessions.learner, sessions.index, sessions.past)


def row_figures(game: SessionGame) -> jax.Array:
    """``[K, J, 3, n]``: each (outcome, profile) row's reward, fees and prices (the
    figures :func:`expected_play` averages over the chain's distribution)."""
    K, J, m, n = game.num_outcomes, game.profiles, game.grid.size, game.sellers
    rows = jnp.arange(J, dtype=jnp.int32)
    digits = (rows[:, None] // jnp.asarray(game.radix, jnp.int32)) % m
    return jnp.stack([game.reward, game.fees,
                      jnp.broadcast_to(game.grid.profile_price(digits), (K, J, n))], axis=-2)


def expected_play(game: SessionGame, sessions: Sessions):
    """:func:`greedy_cycle` of a game with random period outcomes: the greedy strategies
    played on the Markov chain of (outcome, profile) (the profile follows the greedy
    response to what was observed, the next outcome is drawn with ``probs``), its
    distribution propagated exactly from the session's state: after a burn-in of
    ``K m^n`` periods, the expected reward, fees and prices averaged over the next
    ``16 K m^n`` periods (the long-run mean of the greedy play). ``length`` is 0."""
    K, J, n = game.num_outcomes, game.profiles, game.sellers
    probs = jnp.asarray(game.probs, jnp.float32)
    per_row = row_figures(game)

    def chain(state):   # the profile after each (outcome, profile) [K J]
        greedy = state.replace(converged=jnp.ones_like(state.converged))
        obs = game.obs.reshape((K * J,) + game.obs.shape[2:])
        _, aux = jax.vmap(lambda o: game.learner.act(greedy, o, jax.random.key(0)))(obs)
        return game.row(aux["action_index"])                       # [K J]

    def first(index, outcome):
        return jnp.zeros((K, J), jnp.float32).at[outcome, game.row(index)].set(1.0)

    def step(nxt, dist):   # one period of one session's chain
        mass = jnp.zeros((J,), jnp.float32).at[nxt].add(dist.reshape(-1))
        return probs[:, None] * mass[None, :]

    def stat(dist):
        return jnp.einsum("kj,kjsn->sn", dist, per_row)

    def fixed(new, dist):   # every session's distribution the same, bit for bit
        return jnp.all(jax.lax.bitcast_convert_type(new, jnp.int32)
                       == jax.lax.bitcast_convert_type(dist, jnp.int32))

    def run(states, index, outcome):
        # every session at once, each op the one of a session vmapped. Once no session's
        # distribution changes in a burn-in period it is a fixed point of every later
        # period (the same ops on the same bits): the periods measured then repeat the
        # numbers of the first one
        nxt = jax.vmap(chain)(states)                              # [S, K J]
        advance = jax.vmap(step)

        def burn(c):
            t, dist, _ = c
            new = advance(nxt, dist)
            return t + 1, new, fixed(new, dist)

        def measure(c):
            t, dist, stats = c
            dist = advance(nxt, dist)
            return t + 1, dist, jax.lax.dynamic_update_index_in_dim(
                stats, jax.vmap(stat)(dist), t, 0)

        burn_in, periods = K * J, 16 * K * J
        _, dist, settled = jax.lax.while_loop(lambda c: (c[0] < burn_in) & ~c[2], burn,
                                              (0, jax.vmap(first)(index, outcome), False))
        stats = jnp.zeros((periods, index.shape[0], 3, n), jnp.float32)
        played = jnp.where(settled, 1, periods)
        _, _, stats = jax.lax.while_loop(lambda c: c[0] < played, measure, (0, dist, stats))
        stats = jnp.where(jnp.arange(periods)[:, None, None, None] < played, stats, stats[0])
        mean = stats.mean(axis=0)                                  # [S, 3, n]
        return mean[:, 0], mean[:, 1], mean[:, 2], jnp.zeros(index.shape[:1], jnp.int32)

    return jax.jit(run)(sessions.learner, sessions.index, sessions.outcome)


def _greedy_now(game: SessionGame, sessions: Sessions) -> jax.Array:
    """Each session's greedy grid indices ``[S, n]`` at the observation of its profile."""

    def one(state, index, outcome, past):
        greedy = state.replace(converged=jnp.ones_like(state.converged))
        if past is None:
            obs = game.observe(outcome, game.row(index))
        else:
            obs = observe_history(game, index, past)
        _, aux = game.learner.act(greedy, obs, jax.random.key(0))
        return aux["action_index"]

    return jax.jit(jax.vmap(one))(sessions.learner, sessions.index, sessions.outcome,
                                  sessions.past)


class _KernelMismatch(Exception):
    """The kernel cannot reproduce XLA's rounding of this game's update."""


def ladder(sessions: int, granularity: int = GRANULARITY) -> list[int]:
    """The batch sizes compaction uses, largest first: ``sessions``, then each 3/4 of
    the one before rounded down to a multiple of ``granularity``, down to
    ``granularity`` (strictly decreasing: a handful of sizes, one compile each)."""
    sizes = [sessions]
    while sizes[-1] > granularity:
        sizes.append(max(granularity, int(sizes[-1] * 0.75) // granularity * granularity))
    return sizes


def batch_size(learning: int, sessions: int) -> int:
    """The smallest size of :func:`ladder` that holds ``learning`` sessions."""
    return min(s for s in ladder(sessions) if s >= learning)


class Runner:
    """Chunk by chunk: ``advance(sessions, done) -> (sessions, done)``; the caller
    checkpoints between chunks. ``finished(sessions, done)`` says when to stop."""

    def __init__(self, game: SessionGame, settings: Settings, compact: bool | None = None,
                 rounding: tuple[bool, ...] | None = None):
        self.game, self.settings = game, settings
        # a block of a larger run plays the rounding calibrated at the run's own size
        self._fixed_rounding = rounding
        self.backend, self.note = choose_backend(game, settings.backend)
        available = len(jax.devices())
        if not 1 <= settings.devices <= available:
            raise ValueError(f"devices: got {settings.devices}; allowed: 1 .. {available}")
        self.tail_start = settings.periods - min(settings.window, settings.periods)
        # with stop: converged, a converged session's played tail is part of the result
        # only where the sessions are never compacted (alternating moves): elsewhere the
        # xla backend skips converged sessions once enough have converged, so neither
        # backend reports it (the same columns at any session count, on both backends)
        self.keeps_converged_tail = settings.stop != "converged" or game.turns is not None
        default = self.backend == "xla" and not self.keeps_converged_tail
        self.compact = default if compact is None else compact
        self.session_periods = 0
        self._chunks: dict[tuple[int, int], Callable] = {}
        self._rounding: dict[int, tuple[bool, ...]] = {}
        if self.backend == "kernel":   # before the run's sessions exist (its memory peak)
            try:
                self.rounding(settings.sessions)
            except _KernelMismatch:
                self.backend = "xla"
                self.note = ("session backend xla: no rounding of the kernel reproduces XLA's "
                             "program of this game bit for bit")

    def _chunk(self, length: int, size: int):
        key = (length, size)
        if key not in self._chunks:
            if self.backend == "kernel":
                from jaxmarket.sessions.kernel import make_kernel_chunk
                self._chunks[key] = make_kernel_chunk(self.game, length, self.tail_start,
                                                      self.rounding(size))
            else:
                use = max(d for d in range(1, self.settings.devices + 1) if size % d == 0)
                self._chunks[key] = xla_chunk(self.game, length, self.tail_start, use)
        return self._chunks[key]

    def rounding(self, size: int) -> tuple[bool, ...]:
        """The kernel's rounding of the update (:func:`jaxmarket.sessions.kernel.calibrate`)
        for batches of ``size`` sessions: asked of XLA's program on fresh sessions
        (``key(0)``) of the run's own batch size (XLA's choice depends on it: both
        multiply-adds fused at 512 sessions of the 15-price duopoly, neither at 4096), so
        a resumed run finds the same. Where no rounding reproduces it, the run goes to
        the xla backend (``note`` says so). The answer is kept beside JAX's
        compilation cache (:mod:`jaxmarket.sessions.calibration`). A runner given
        ``rounding`` (one block of a run spread over a cluster:
        :mod:`jaxmarket.cluster.blocks`) plays that one."""
        if self._fixed_rounding is not None:
            return self._fixed_rounding
        if size not in self._rounding:
            found = kept_rounding(self.game, size, self.tail_start,
                                  lambda: self._calibrate(size))
            if found is None:
                raise _KernelMismatch
            self._rounding[size] = found
        return self._rounding[size]

    def _calibrate(self, size: int) -> tuple[bool, ...] | None:
        from jaxmarket.sessions.kernel import calibrate, calibration_periods
        probe = init_sessions(self.game, size, jax.random.key(0))
        with jax.threefry_partitionable(False):
            return calibrate(self.game, probe, 0, self.tail_start, xla_chunk,
                             calibration_periods(self.game))

    def learning(self, sessions: Sessions) -> np.ndarray:
        return ~np.asarray(sessions.learner.converged, bool)

    def finished(self, sessions: Sessions, done: int) -> bool:
        if done >= self.settings.periods:
            return True
        return self.settings.stop == "converged" and not self.learning(sessions).any()

    def advance(self, sessions: Sessions, done: int) -> tuple[Sessions, int]:
        """One chunk (the last one may be shorter) of the sessions still running."""
        length = min(self.settings.chunk, self.settings.periods - done)
        total = int(sessions.index.shape[0])
        with jax.threefry_partitionable(False):
            if not self.compact:
                self.session_periods += length * total
                return self._chunk(length, total)(sessions, jnp.uint32(done)), done + length
            learning = self.learning(sessions)
            size = batch_size(int(learning.sum()), total)
            if size == total:
                self.session_periods += length * total
                return self._chunk(length, total)(sessions, jnp.uint32(done)), done + length
            still = np.flatnonzero(learning)
            pad = np.flatnonzero(~learning)[:size - still.size]
            batch = jnp.asarray(np.concatenate([still, pad]))
            part = jax.tree.map(lambda x: x[batch], sessions)
            part = self._chunk(length, size)(part, jnp.uint32(done))
            self.session_periods += length * size
            keep = jnp.asarray(still)
            n = still.size
            # a kernel chunk's sessions are numpy arrays (jaxmarket.sessions.kernel)
            sessions = jax.tree.map(lambda x, v: jnp.asarray(x).at[keep].set(v[:n]),
                                    sessions, part)
            return sessions, done + length

    def result(self, sessions: Sessions, done: int, wall_s: float) -> SessionResult:
        game = self.game
        with jax.threefry_partitionable(False):
            if game.probs is None:
                reward, fees, price, length = greedy_cycle(game, sessions, done)
            else:
                reward, fees, price, length = expected_play(game, sessions)
            greedy = _greedy_now(game, sessions)
        row = np.asarray(game.row(greedy))   # the tables read with numpy: nothing to compile
        window = min(self.settings.window, done)
        state = sessions.learner
        return SessionResult(
            game=game, cycle_reward=np.asarray(reward, np.float64),
            cycle_fees=np.asarray(fees, np.float64), cycle_price=np.asarray(price, np.float64),
            cycle_length=np.asarray(length), greedy_index=np.asarray(greedy),
            greedy_price=np.asarray(game.grid.profile_price(greedy)),
            greedy_reward=np.asarray(game.expected_reward, np.float64)[row],
            greedy_fees=np.asarray(game.expected(game.fees), np.float64)[row],
            tail_reward=np.asarray(sessions.tail, np.float64) / max(window, 1),
            tail_complete=bool(done >= self.settings.periods and (
                not np.any(state.converged)
                or (self.keeps_converged_tail and not self.compact))),
            converged=np.asarray(state.converged), stable_periods=np.asarray(state.stable_periods),
            step=np.asarray(state.step), periods=done, window=window,
            session_periods=self.session_periods, backend=self.backend, wall_s=wall_s,
            sessions=sessions)


def run(game: SessionGame, settings: Settings, key: jax.Array,
        on_chunk: Callable[[Sessions, int], None] | None = None,
        compact: bool | None = None) -> SessionResult:
    """Every session from its start until :meth:`Runner.finished`; ``on_chunk(sessions,
    done)`` after each chunk (progress lines, checkpoints)."""
    start = time.perf_counter()
    runner = Runner(game, settings, compact)
    sessions, done = init_sessions(game, settings.sessions, key), 0
    while not runner.finished(sessions, done):
        sessions, done = runner.advance(sessions, done)
        if on_chunk is not None:
            on_chunk(sessions, done)
    return runner.result(sessions, done, time.perf_counter() - start)


def run_sessions(plan: Any, sessions: int, periods: int, key: jax.Array,
                 window: int = 1000, chunk: int = 10_000, game: SessionGame | None = None,
                 stop: str = "periods", backend: str = "auto") -> SessionResult:
    """``sessions`` sessions of ``plan``'s market (a resolved :class:`RunPlan`) for
    ``periods`` periods each (``stop``: module docstring)."""
    game = make_game(plan) if game is None else game
    return run(game, Settings(sessions, periods, chunk, stop, window, backend), key)


def profit_gain(reward: np.ndarray, nash: float, joint: float) -> np.ndarray:
    """``Delta = (pi - pi_N) / (pi_M - pi_N)`` per session, ``pi`` the mean over sellers
    of ``reward [S, n]``."""
    return (np.asarray(reward, np.float64).mean(axis=-1) - nash) / (joint - nash)


def firm_profit_gains(reward: np.ndarray, nash: list[float], joint: list[float]
                      ) -> tuple[np.ndarray, list[str | None]]:
    """Each firm's own ``Delta_i = (pi_i - pi_i^N) / (pi_i^M - pi_i^N)`` per session
    ``[S, n]`` (``reward [S, n]``, the firms' benchmark profits ``nash``, ``joint``), NaN
    where ``pi_i^M`` does not exceed ``pi_i^N`` (to 1e-6 relative), with the reason per
    firm (None where defined). The industry Delta (:func:`profit_gain`: means over firms
    first) differs from the mean of the ``Delta_i`` when the firms differ."""
    pi_n, pi_m = np.asarray(nash, np.float64), np.asarray(joint, np.float64)
    ok = pi_m - pi_n > 1e-6 * np.maximum(1.0, np.maximum(np.abs(pi_n), np.abs(pi_m)))
    gains = (np.asarray(reward, np.float64) - pi_n) / np.where(ok, pi_m - pi_n, 1.0)
    why = [None if good else f"firm {i}: pi_M ({m:.6g}) does not exceed pi_N ({n:.6g})"
           for i, (good, n, m) in enumerate(zip(ok, pi_n, pi_m))]
    return np.where(ok, gains, np.nan), why


def bootstrap_ci(values: np.ndarray, statistic: str = "mean", resamples: int = 2000,
                 seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of the mean or median of ``values``
    (``scipy.stats.bootstrap``); one value gives ``[v, v]``."""
    from scipy.stats import bootstrap
    values = np.asarray(values, np.float64)
    if values.size < 2 or np.ptp(values) == 0:
        v = float(np.median(values) if statistic == "median" else values.mean())
        return [v, v]
    fn = np.median if statistic == "median" else np.mean
    res = bootstrap((values,), fn, n_resamples=resamples, confidence_level=0.95,
                    method="percentile", random_state=np.random.default_rng(seed))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


__all__ = ["BACKENDS", "STOPS", "Runner", "SessionResult", "Sessions", "Settings",
           "bootstrap_ci", "choose_backend", "firm_profit_gains", "greedy_cycle",
           "history_cycle", "init_sessions", "ladder", "observe_history", "shift_history",
           "profit_gain", "row_figures", "run", "run_sessions", "xla_chunk"]
