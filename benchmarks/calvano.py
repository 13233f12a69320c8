"""Reproduce Calvano et al. (AER 2020): independent Q-learners collude in a logit oligopoly.

``n`` sellers (``--firms``, default 2) in the baseline logit economy (a = 2, c = 1,
a_0 = 0, mu = 0.25), prices on the m = 15 grid of :func:`jaxmarket.economics.calvano_grid`
for ``n`` sellers (xi = 0.1), memory k = 1 (the state is last period's prices of all
``n`` sellers: m^n states), alpha = 0.15 (``--alpha``), delta = 0.95,
eps_t = exp(-beta t) with beta = 4e-6 (``--beta``), Q initialised to the discounted
payoff against uniformly random rivals, random initial state, convergence once every
seller's greedy strategy has been unchanged for 100,000 consecutive periods. Published
for n = 2 (1000 sessions): average profit gain 0.849 (sd 0.112), nearly all sessions
converge.

Every session runs the ``q_learning`` learner's own ``init``/``act``/``update``
(``jaxmarket.learners.qlearning``), vmapped over sessions, one-period transitions
(T = 1), many periods per jitted ``lax.scan`` chunk. The per-period profits come from a
precomputed ``[m^n, n]`` payoff table built with :func:`jaxmarket.economics.logit_profits`
(the same numbers the market's logit distributor would produce for these prices; the
table keeps this benchmark independent of the market simulator). The Nash and
joint-monopoly prices and profits of ``n`` sellers come from :mod:`jaxmarket.economics`.

The periods run in one of three ways (``--step``), the same sessions bit for bit:
``kernel`` (the default where numba is installed, ``pip install -e '.[bench]'``; in
``calvano_kernel.py``) plays each session's periods of a chunk in one compiled loop on
every core; ``fast`` (the default without numba) restates them for XLA:CPU
(:func:`make_fast_chunk`); ``learner`` runs the learner's ``act``/``update``.

Sessions that have converged stop learning (the learner's own rule) and, with the XLA
steps, once a quarter of the batch has converged, are compacted out of the running batch
(a session's randomness depends only on its key and the period, so compaction changes
no session).
A session stops after ``--max-periods`` (default 1e7, not the published 1e9: at
beta = 4e-6, eps is below 1e-17 after 1e7 periods, and the cap keeps a session that
never settles from holding the whole run).

Once every session has converged (or hit the cap), each session plays its greedy
strategies from its final state: after a burn-in of m^n periods the play is on its
limit cycle; profits are averaged over exactly one cycle, and
``Delta = (pi - pi_N) / (pi_M - pi_N)`` with ``pi`` the mean profit of the ``n`` sellers
and ``pi_N``, ``pi_M`` from :mod:`jaxmarket.economics`.

Grid mode (``--grid-alpha A1,A2,.. --grid-beta B1,B2,..``): a coarse version of the
paper's alpha x beta heat map of the profit gain: every (alpha, beta) cell is a run of
``--sessions`` sessions (default 32 in grid mode), one after the other; a table (and
with ``--json`` a JSON summary with one row per cell) is printed.

    python benchmarks/calvano.py                       # 1000 sessions, n = 2, beta = 4e-6
    python benchmarks/calvano.py --sessions 64 --beta 2e-4 --window 10000 --json
    python benchmarks/calvano.py --firms 3 --sessions 100
    python benchmarks/calvano.py --grid-alpha 0.05,0.1,0.15,0.2 --grid-beta 4e-6,1e-5,2e-5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

if __name__ == "__main__" and "jax" not in sys.modules:
    # One XLA CPU device per core, so that the sessions run on every core (below). Set
    # before JAX starts; an explicit device count in XLA_FLAGS wins.
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = (f"{_flags} --xla_force_host_platform_device_count="
                                   f"{os.cpu_count() or 1}").strip()

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_timer import CompileTimer

from jaxmarket import economics
from jaxmarket.learners import qlearning  # noqa: F401  (registers "q_learning")
from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec, Transition
from jaxmarket.learners.qlearning import max_and_argmax

#: Published average profit gain of the baseline (n = 2, alpha = 0.15, beta = 4e-6).
PUBLISHED_PROFIT_GAIN = 0.849
_INT32_MAX = np.iinfo(np.int32).max
ECONOMY = {"quality": 2.0, "cost": 1.0, "outside_quality": 0.0, "mu": 0.25}
BASELINE = {"firms": 2, "alpha": 0.15, "beta": 4e-6}


@dataclass(frozen=True)
class CalvanoSetup:
    learner: Learner
    spec: LearnerSpec
    hyper: dict                # the learner's settings (what ``make`` was given)
    grid: np.ndarray           # [m] float64 prices
    profit_table: jax.Array    # [m^n, n] float32: profits of every seller per price profile
    radix: tuple[int, ...]     # m^(n-1-j): price profile (grid indices) -> table row
    p_nash: float
    p_monopoly: float
    pi_nash: float
    pi_monopoly: float

    @property
    def firms(self) -> int:
        return len(self.radix)


def make_setup(beta: float = 4e-6, window: int = 100_000, m: int = 15, xi: float = 0.1,
               alpha: float = 0.15, delta: float = 0.95, firms: int = 2) -> CalvanoSetup:
    """The economy of ``firms`` sellers, the price grid, the payoff table and the
    ``q_learning`` learner."""
    n = firms
    if n < 2:
        raise ValueError(f"--firms: got {n}; Calvano's experiment needs at least 2 firms")
    grid = economics.calvano_grid(n=n, m=m, xi=xi, **ECONOMY)
    # every price profile, row-major (the first seller's index is the most significant
    # digit), exactly the learner's mixed-radix state numbering
    joint = np.indices((m,) * n).reshape(n, -1).T                      # [m^n, n]
    profit_table = jnp.asarray(economics.logit_profits(grid[joint], **ECONOMY),
                               dtype=jnp.float32)                      # [m^n, n]
    radix = tuple(m ** (n - 1 - j) for j in range(n))
    p_nash = economics.nash_price(n, **ECONOMY)
    p_monopoly = economics.joint_monopoly_price(n, **ECONOMY)
    pi_nash = float(economics.logit_profits([p_nash] * n, **ECONOMY)[0])
    pi_monopoly = float(economics.logit_profits([p_monopoly] * n, **ECONOMY)[0])
    low, spacing = float(grid[0]), float(grid[1] - grid[0])
    weights = jnp.asarray(radix, jnp.int32)

    def payoff(prices: jax.Array) -> jax.Array:
        """One-shot profits of a price profile ``[n, 1]`` (snapped to the grid) -> ``[n]``."""
        index = jnp.clip(jnp.round((prices[:, 0] - low) / spacing), 0, m - 1).astype(jnp.int32)
        return profit_table[jnp.sum(index * weights)]

    spec = LearnerSpec(num_agents=n, obs_dim=n, num_products=1,
                       action_low=np.full((n, 1), grid[0], np.float32),
                       action_high=np.full((n, 1), grid[-1], np.float32), payoff=payoff)
    hyper = {"grid_low": float(grid[0]), "grid_high": float(grid[-1]), "grid_size": m,
             "memory": 1, "learning_rate": alpha, "discount": delta,
             "exploration_decay": beta, "convergence_window": window,
             "q_init": "random_rival"}
    learner = LEARNERS["q_learning"].make(hyper, spec)
    return CalvanoSetup(learner, spec, hyper, grid, profit_table, radix, p_nash, p_monopoly,
                        pi_nash, pi_monopoly)


def _observe(prices: jax.Array) -> jax.Array:
    """Every seller observes last period's prices of all sellers: ``[n, 1]`` -> obs
    ``[n, n]``."""
    n = prices.shape[0]
    return jnp.broadcast_to(prices[:, 0][None, :], (n, n))


def _profits(setup: CalvanoSetup, action_index: jax.Array) -> jax.Array:
    """Profits ``[n]`` of the price profile with grid indices ``action_index [n]``."""
    return setup.profit_table[jnp.sum(action_index * jnp.asarray(setup.radix, jnp.int32))]


def make_chunk(setup: CalvanoSetup, length: int, devices: int = 1):
    """Jitted ``(carry, first_period) -> carry`` running ``length`` periods of every
    session; ``carry = (learner_state, obs, session_key)``, vmapped over sessions.

    With ``devices > 1`` the sessions are split into that many equal blocks, one per
    device (``jax.shard_map`` over the first ``devices`` of ``jax.devices()``): with
    ``--xla_force_host_platform_device_count`` set to the number of cores, each core runs
    its own block in its own thread. Sessions are independent, so no result changes."""
    learner, n = setup.learner, setup.firms

    def period(carry, t):
        state, obs, session_key = carry
        key = jax.random.fold_in(session_key, t)
        prices, aux = learner.act(state, obs, key)
        a = aux["action_index"]
        reward = _profits(setup, a)
        next_obs = _observe(prices)
        batch = Transition(obs=obs[None], action=prices[None], reward=reward[None],
                           next_obs=next_obs[None], done=jnp.zeros((1, n), bool),
                           aux={"action_index": a[None]})
        state, _ = learner.update(state, batch)
        return (state, next_obs, session_key), None

    def one_session(carry, first_period):
        periods = first_period + jnp.arange(length, dtype=jnp.uint32)
        carry, _ = jax.lax.scan(period, carry, periods)
        return carry

    chunk = jax.vmap(one_session, in_axes=(0, None))
    return _compile_chunk(chunk, devices)


def _compile_chunk(chunk, devices: int):
    """``chunk(sessions_state, first_period)`` jitted with the sessions donated; with
    several devices the sessions are split over them (``shard_map``)."""
    if devices > 1:
        mesh = Mesh(np.asarray(jax.devices()[:devices]), ("sessions",))
        chunk = jax.shard_map(chunk, mesh=mesh, in_specs=(PartitionSpec("sessions"),
                                                          PartitionSpec()),
                              out_specs=PartitionSpec("sessions"))
    return jax.jit(chunk, donate_argnums=0)


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array):
    """The Threefry-2x32 hash of JAX's default PRNG (20 rounds), unrolled: bit for bit
    what ``jax.random`` computes (``jax.extend.random.threefry_2x32``), but as one
    elementwise expression, where XLA:CPU lowers JAX's own as a loop of small kernels."""
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


#: Sessions per block of :func:`make_fast_chunk` (measured: 256 sessions per core ran
#: fastest, against 64, 128, 512 and 1024; docs/benchmarks.md).
BLOCK = 256


def make_fast_chunk(setup: CalvanoSetup, length: int, devices: int = 1,
                    draws_per_pass: int = 500, block: int = BLOCK):
    """:func:`make_chunk`, restated for XLA:CPU: the same sessions bit for bit (the same
    random streams, the same float32 arithmetic; ``tests/test_qlearning.py`` compares
    the two), several times faster.

    What differs is only how the work is laid out:

    * the exploration draws (two Threefry hashes per session and period, ``eps_t``, the
      explore test and the random price) do not depend on the Q tables, so they are
      computed ``draws_per_pass`` periods at a time in one vectorised pass before the
      sequential loop (JAX's hash is a loop of small kernels on XLA:CPU; this one is
      unrolled: :func:`threefry2x32`), and a period only reads its ``[S, n]`` draws;
    * the state is tracked as the state index (not as observed prices that are snapped
      back to the grid every period);
    * the tables are laid out ``[S * m^n, n * (m + 1)]`` during the chunk (every
      seller's row of a state side by side: one contiguous 128-byte read per session
      and state for the duopoly) and a period writes back only the two entries per seller
      that change (``Q[s, a]`` and the cached greedy index);
    * ``block > 0`` runs the sessions of each device in blocks of at most ``block``
      sessions (as equal as divide them), one block after the other, each for the whole
      chunk, so that a block's tables stay in cache.

    A converged session acts greedily and stops learning, as in the learner. Each
    session's step counter advances by one per learning period, so the draws of a pass
    use ``t = step + k`` for its ``k``-th period (a session that converges during the
    pass ignores the rest of its draws)."""
    n, m = setup.firms, setup.grid.shape[0]
    states, width = m ** n, m + 1
    hyper = setup.hyper
    discount = np.float32(hyper["discount"])
    window = hyper["convergence_window"]
    radix = jnp.asarray(setup.radix, jnp.int32)
    table = setup.profit_table
    prices = jnp.asarray(setup.grid, jnp.float32)
    low, spacing = float(setup.grid[0]), float(setup.grid[1] - setup.grid[0])
    # jax.random.bits(key, (n,)) (threefry, not partitionable): counts 0 .. n - 1,
    # padded to even, hashed as two halves, concatenated
    half = (n + 1) // 2
    counts = np.arange(2 * half, dtype=np.uint32)
    counts[n:] = 0
    c0, c1 = jnp.asarray(counts[:half]), jnp.asarray(counts[half:])
    column = jnp.arange(m, dtype=jnp.int32)
    offset = jnp.arange(n, dtype=jnp.int32) * width       # seller j's row in a state's
    per_pass = math.gcd(length, max(1, draws_per_pass))

    def draws(k0, k1, neg_beta, step, first):
        """``[per_pass, S, n]`` int32: each seller's exploration price in each period of
        the pass, -1 where it plays greedily (the learner's ``act``, given its step)."""
        k = jnp.arange(per_pass, dtype=jnp.uint32)[:, None, None]
        t0, t1 = threefry2x32(k0[None], k1[None], jnp.uint32(0), first + k)  # fold_in
        y0, y1 = threefry2x32(t0, t1, c0, c1)                              # bits
        bits = jnp.concatenate([y0, y1], axis=-1)[..., :n]
        u = bits.astype(jnp.float32) * 2.0**-32
        t = (step[None, :] + jnp.arange(per_pass, dtype=jnp.int32)[:, None]).astype(jnp.float32)
        eps = jnp.exp(neg_beta[None] * t[..., None])
        random_action = jnp.minimum((u / jnp.maximum(eps, 1e-30) * m).astype(jnp.int32), m - 1)
        return jnp.where(u < eps, random_action, -1)

    def run_block(state, obs, key, first_period):
        sessions = obs.shape[0]
        key_data = jax.random.key_data(key)                              # [S, 2]
        k0, k1 = key_data[:, 0:1], key_data[:, 1:2]
        digits = jnp.clip(jnp.round((obs[:, 0] - low) / spacing), 0, m - 1).astype(jnp.int32)
        s0 = jnp.sum(digits * radix, axis=-1)                             # [S]
        flat = jnp.swapaxes(state.rows, 1, 2).reshape(sessions * states, n * width)
        neg_beta = -jnp.take_along_axis(state.hyper["exploration_decay"],
                                        state.policy_index, axis=1)       # [S, n]
        alpha = jnp.take_along_axis(state.hyper["learning_rate"], state.policy_index, axis=1)
        base = jnp.arange(sessions, dtype=jnp.int32) * states

        def period(carry, explore):
            flat, s, step, stable, converged = carry
            learning = ~converged
            here = base + s
            rows = flat[here].reshape(sessions, n, width)
            old_greedy = rows[:, :, m].astype(jnp.int32)
            q = rows[:, :, :m]
            a = jnp.where(learning[:, None] & (explore >= 0), explore, old_greedy)
            s_next = jnp.sum(a * radix, axis=-1)
            reward = table[s_next]
            next_value = jnp.max(flat[base + s_next].reshape(sessions, n, width)[:, :, :m],
                                 axis=-1)
            target = reward + discount * next_value
            q_sa = jnp.take_along_axis(q, a[:, :, None], axis=-1)[:, :, 0]
            increment = jnp.where(learning[:, None], alpha * (target - q_sa), 0.0)
            # The learner rounds alpha * (target - q) before adding q. XLA:CPU contracts a
            # multiply and an add inside one fused kernel into an FMA (one rounding), and
            # whether both land in one kernel depends on the program around them: the
            # increment passes a conditional (which nothing fuses through; its predicate
            # always holds) so that it is rounded on its own, as in the learner.
            increment = jax.lax.cond(s[0] >= 0, lambda v: v, lambda v: -v, increment)
            new_q = q_sa + increment
            _, new_greedy = max_and_argmax(jnp.where(column == a[:, :, None],
                                                     new_q[:, :, None], q))
            cols = jnp.concatenate([offset + a, jnp.broadcast_to(offset + m, (sessions, n))], 1)
            values = jnp.concatenate([new_q, new_greedy.astype(jnp.float32)], axis=1)
            flat = flat.at[jnp.broadcast_to(here[:, None], cols.shape), cols].set(
                values, unique_indices=True, mode="promise_in_bounds")
            changed = jnp.any((new_greedy != old_greedy) & learning[:, None], axis=1)
            new_stable = jnp.where(learning, jnp.where(changed, 0, stable + 1), stable)
            step = jnp.where(learning & (step < _INT32_MAX), step + 1, step)
            converged = converged | (new_stable >= window)
            return (flat, s_next, step, new_stable, converged), None

        def one_pass(carry, first):
            carry, _ = jax.lax.scan(period, carry, draws(k0, k1, neg_beta, carry[2], first))
            return carry, None

        firsts = first_period + jnp.arange(0, length, per_pass, dtype=jnp.uint32)
        carry = (flat, s0, state.step, state.stable_periods, state.converged)
        (flat, s, step, stable, converged), _ = jax.lax.scan(one_pass, carry, firsts)
        rows = jnp.swapaxes(flat.reshape(sessions, states, n, width), 1, 2)
        last = prices[(s[:, None] // radix) % m]                          # [S, n]
        state = state.replace(rows=rows, step=step, stable_periods=stable, converged=converged)
        return state, jnp.broadcast_to(last[:, None, :], (sessions, n, n)), key

    def chunk(carry, first_period):
        sessions = carry[1].shape[0]
        blocks = -(-sessions // block) if block > 0 else 1
        if blocks == 1 or sessions % blocks:
            return run_block(*carry, first_period)
        split = jax.tree.map(lambda x: x.reshape((blocks, sessions // blocks) + x.shape[1:]),
                             carry)
        out = jax.lax.map(lambda c: run_block(*c, first_period), split)
        return jax.tree.map(lambda x: x.reshape((sessions,) + x.shape[2:]), out)

    return _compile_chunk(chunk, devices)


def init_sessions(setup: CalvanoSetup, key: jax.Array, sessions: int):
    """Initial learner states, random initial price profiles and per-session keys."""
    m, n = setup.grid.shape[0], setup.firms
    init_key, start_key, run_key = jax.random.split(key, 3)
    # The initial Q is deterministic (random-rival values, the same in every session): one
    # session's state, computed op by op as before (jitting it changes float32 roundings,
    # and with them the sessions of the recorded runs), copied to every session.
    one = setup.learner.init(init_key, setup.spec)
    state = jax.tree.map(lambda x: jnp.array(jnp.broadcast_to(x, (sessions,) + x.shape)), one)
    start = jax.random.randint(start_key, (sessions, n), 0, m)
    prices = jnp.asarray(setup.grid, jnp.float32)[start][..., None]  # [S, n, 1]
    obs = jax.vmap(_observe)(prices)
    return state, obs, jax.random.split(run_key, sessions)


def greedy_cycle_profits(setup: CalvanoSetup, state, obs) -> jax.Array:
    """``[S, n]`` each seller's profit averaged over one limit cycle of greedy play from
    the final state (burn-in of m^n periods, then exactly one cycle)."""
    learner = setup.learner
    m = setup.grid.shape[0]
    horizon = m ** setup.firms  # a deterministic play over m^n states enters its cycle
                                # within m^n periods, and its cycle is at most m^n long

    def one_session(state, obs):
        greedy = state.replace(converged=jnp.ones((), bool))  # act greedily
        dummy_key = jax.random.key(0)

        def play(obs, _):
            prices, aux = learner.act(greedy, obs, dummy_key)
            a = aux["action_index"]
            return _observe(prices), (a, _profits(setup, a))

        obs, _ = jax.lax.scan(play, obs, None, length=horizon)
        _, (actions, profits) = jax.lax.scan(play, obs, None, length=horizon + 1)
        same = jnp.all(actions[1:] == actions[0], axis=-1)         # [horizon]
        cycle = jnp.argmax(same) + 1                                # first return
        on_cycle = (jnp.arange(horizon + 1) < cycle)[:, None]
        return jnp.sum(jnp.where(on_cycle, profits, 0.0), axis=0) / cycle

    return jax.jit(jax.vmap(one_session))(state, obs)


def _take(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


def _put(tree, index, values):
    return jax.tree.map(lambda x, v: x.at[index].set(v), tree, values)


def _bucket(active: int, sessions: int, granularity: int = 64) -> int:
    return min(sessions, -(-active // granularity) * granularity)


def q_table_bytes(firms: int, sessions: int, m: int = 15) -> int:
    """Bytes of the packed Q tables of ``sessions`` sessions of ``firms`` sellers
    (``firms`` tables of ``m^firms`` rows of ``m + 1`` float32 each per session)."""
    return sessions * firms * m ** firms * (m + 1) * 4


def check_arguments(firms: int, alpha: float, beta: float, sessions: int = 1,
                    m: int = 15) -> None:
    """``ValueError`` (one line, naming the flag) for settings outside the experiment:
    fewer than 2 firms, alpha outside (0, 1], beta <= 0, fewer than 1 session, or Q
    tables that cannot fit in this machine's memory."""
    if firms < 2:
        raise ValueError(f"--firms: got {firms}; Calvano's experiment needs at least 2 firms")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"--alpha: got {alpha:g}; the learning rate must be in (0, 1]")
    if not beta > 0.0:
        raise ValueError(f"--beta: got {beta:g}; the exploration decay must be > 0")
    if sessions < 1:
        raise ValueError(f"--sessions: got {sessions}; need at least 1")
    need = 3 * q_table_bytes(firms, sessions, m)  # the batch, its copy and the carry
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        have = None
    if have is not None and need > have:
        raise ValueError(f"--firms {firms} --sessions {sessions}: the Q tables need about "
                         f"{need / 2**30:.1f} GiB, more than this machine's "
                         f"{have / 2**30:.1f} GiB; use fewer sessions")


#: The ways of running the periods (``--step``): the same sessions, bit for bit.
STEPS = ("kernel", "fast", "learner")


def default_step() -> str:
    """``kernel`` where numba is installed (``pip install -e '.[bench]'``), else ``fast``."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return "fast"
    return "kernel"


def chunk_maker(step: str):
    """``make(setup, length, devices) -> chunk`` of a ``--step`` value; a ``ValueError``
    naming the flag for anything else, or for ``kernel`` without numba."""
    if step == "learner":
        return make_chunk
    if step == "fast":
        return make_fast_chunk
    if step == "kernel":
        try:
            from calvano_kernel import make_kernel_chunk
        except ImportError as error:
            raise ValueError(f"--step kernel needs numba ({error}); install it with "
                             f"pip install -e '.[bench]', or use --step fast") from None
        return make_kernel_chunk
    raise ValueError(f"--step: got {step!r}; allowed: {', '.join(STEPS)}")


def run(sessions: int = 1000, beta: float = 4e-6, window: int = 100_000,
        max_periods: int = 10_000_000, chunk: int = 20_000, seed: int = 0,
        progress: bool = True, compact: bool | None = None, devices: int | None = None,
        firms: int = 2, alpha: float = 0.15, step: str | None = None) -> dict:
    """Run every session until all have converged or ``max_periods``; return a summary.

    Sessions run in lockstep in a batch; once at most 3/4 of the batch is still learning,
    the batch is compacted to the learning sessions (padded to a multiple of 64 with a
    converged session, which no longer learns), so converged sessions stop costing
    time. A session's randomness depends only on its own key and the period number, so
    compaction does not change any session's trajectory. ``devices`` (default: all of
    ``jax.devices()``) splits the batch across devices (see :func:`make_chunk`).
    ``step="kernel"`` (the default where numba is installed) runs the periods with
    ``calvano_kernel.make_kernel_chunk``, ``"fast"`` (the default without numba) with
    :func:`make_fast_chunk`, ``"learner"`` with the learner's own ``act``/``update``
    (:func:`make_chunk`): the same sessions, bit for bit. ``compact`` (default: for every
    step but the kernel) compacts the batch as above.
    """
    step = default_step() if step is None else step
    make = chunk_maker(step)
    # the kernel plays a converged session's periods for a few ns (greedy, no draws):
    # compacting the batch (new gathers to compile for every batch size) costs it more
    compact = step != "kernel" if compact is None else compact
    start = time.perf_counter()
    check_arguments(firms, alpha, beta, sessions)
    # The non-partitionable threefry draws two 32-bit words per hash instead of one: half
    # the hashing for the sellers' exploration draws (streams differ, not statistics).
    with jax.threefry_partitionable(False), CompileTimer() as compiled:
        setup = make_setup(beta=beta, window=window, alpha=alpha, firms=firms)
        available = len(jax.devices())
        devices = available if devices is None else devices
        if not 1 <= devices <= available:
            raise ValueError(f"--devices: got {devices}; allowed: 1 .. {available} (the XLA "
                             f"devices of this process)")
        full_state, full_obs, keys = init_sessions(setup, jax.random.key(seed), sessions)
        chunks: dict[int, object] = {}
        kernel_compile_s = [0.0]          # numba's, which CompileTimer does not see

        def run_chunk(carry, first_period):
            """One chunk on as many devices as divide the batch."""
            size = int(carry[2].shape[0])
            use = max(d for d in range(1, devices + 1) if size % d == 0)
            if use not in chunks:
                chunks[use] = make(setup, chunk, use)
                kernel_compile_s[0] += getattr(chunks[use], "compile_s", 0.0)
            return chunks[use](carry, first_period)

        batch = np.arange(sessions)        # sessions in the running batch (padding last)
        real = sessions                    # how many of them are not padding
        carry = (_take(full_state, batch), _take(full_obs, batch), keys[batch])
        periods, session_periods, last_report = 0, 0, start
        while periods < max_periods:
            carry = run_chunk(carry, jnp.uint32(periods))
            periods += chunk
            session_periods += chunk * len(batch)
            converged = np.asarray(carry[0].converged)[:real]
            learning = int((~converged).sum())
            now = time.perf_counter()
            if progress and (now - last_report > 30.0 or learning == 0):
                last_report = now
                print(f"  period {periods:>11,d}  converged {1 - learning / sessions:6.1%}  "
                      f"batch {len(batch):5d}  eps {np.exp(-beta * periods):.1e}  "
                      f"{now - start:7.1f} s", flush=True)
            if learning == 0:
                break
            size = _bucket(learning, sessions)
            if compact and learning <= 0.75 * len(batch) and size < len(batch):
                index = jnp.asarray(batch[:real])
                full_state = _put(full_state, index, _take(carry[0], slice(0, real)))
                full_obs = _put(full_obs, index, carry[1][:real])
                still = batch[:real][~converged]
                pad = np.full(size - learning, batch[:real][converged][0])
                batch, real = np.concatenate([still, pad]), learning
                carry = (_take(full_state, batch), _take(full_obs, batch), keys[batch])
        index = jnp.asarray(batch[:real])
        full_state = _put(full_state, index, _take(carry[0], slice(0, real)))
        full_obs = _put(full_obs, index, carry[1][:real])
        del carry
        profits = np.asarray(greedy_cycle_profits(setup, full_state, full_obs), np.float64)
    wall = time.perf_counter() - start
    compile_s = compiled.seconds + kernel_compile_s[0]
    gain = economics.profit_gain(profits.mean(axis=1), setup.pi_nash, setup.pi_monopoly)
    converged = np.asarray(full_state.converged)
    steps = np.asarray(full_state.step, dtype=np.float64)
    return {
        "profit_gain": float(gain.mean()),
        "profit_gain_sd": float(gain.std()),
        "converged_share": float(converged.mean()),
        "mean_convergence_period": float(steps[converged].mean()) if converged.any() else None,
        "max_convergence_period": float(steps[converged].max()) if converged.any() else None,
        "periods_simulated": periods,
        "session_periods": session_periods,
        "sessions": sessions,
        "devices": devices,
        "beta": setup.hyper["exploration_decay"],
        "convergence_window": setup.hyper["convergence_window"],
        "wall_s": wall,
        "compile_s": compile_s,
        # added with --firms / --alpha (the keys above are unchanged)
        "firms": setup.firms,
        "alpha": setup.hyper["learning_rate"],
        "delta": setup.hyper["discount"],
        "grid_size": setup.hyper["grid_size"],
        "states": int(setup.grid.shape[0]) ** setup.firms,
        "grid_low": float(setup.grid[0]),
        "grid_high": float(setup.grid[-1]),
        "p_nash": setup.p_nash,
        "p_monopoly": setup.p_monopoly,
        "pi_nash": setup.pi_nash,
        "pi_monopoly": setup.pi_monopoly,
        # added with benchmarks/reproduce.py: each session's Delta and convergence flag
        "profit_gains": [float(x) for x in gain],
        "converged": [bool(x) for x in converged],
        # added with --step: the run's time without compilation per session-period
        # (every slot of the running batch, padding included, each period), and the
        # target of 1000 sessions within 60 s
        "step": step,
        "ns_per_session_period": 1e9 * (wall - compile_s) / max(session_periods, 1),
        "target_met": bool(sessions >= 1000 and wall <= 60.0),
    }


def run_grid(alphas: list[float], betas: list[float], sessions: int = 32,
             progress: bool = True, **kwargs) -> dict:
    """The coarse alpha x beta heat map: :func:`run` for every cell (``sessions`` each,
    the other settings in ``kwargs`` shared), one cell after the other. Returns
    ``{"cells": [run summary per cell, alpha-major], "alphas", "betas", ...}``; each
    cell's ``alpha`` and ``beta`` are those its learner was made with."""
    for alpha in alphas:
        for beta in betas:
            check_arguments(kwargs.get("firms", 2), alpha, beta, sessions)
    start = time.perf_counter()
    cells = []
    for alpha in alphas:
        for beta in betas:
            cell = run(sessions=sessions, beta=beta, alpha=alpha, progress=False, **kwargs)
            cells.append(cell)
            if progress:
                period = cell["mean_convergence_period"]
                print(f"  alpha {alpha:<6g} beta {beta:<8.2g} Delta {cell['profit_gain']:.3f} "
                      f"(sd {cell['profit_gain_sd']:.3f})  converged "
                      f"{cell['converged_share']:6.1%}  mean convergence "
                      f"{'n/a' if period is None else f'{period:,.0f}'}  "
                      f"{cell['wall_s']:6.1f} s", flush=True)
    return {"grid": True, "firms": cells[0]["firms"], "sessions": sessions,
            "alphas": list(alphas), "betas": list(betas), "cells": cells,
            "wall_s": time.perf_counter() - start}


def grid_table(result: dict) -> str:
    """The heat map as text: one row per alpha, one column per beta, Delta (converged
    share) per cell."""
    betas = result["betas"]
    cells = {(c["alpha"], c["beta"]): c for c in result["cells"]}
    lines = ["alpha \\ beta " + "".join(f"{b:>16.2g}" for b in betas)]
    for alpha in result["alphas"]:
        row = "".join(f"{cells[alpha, b]['profit_gain']:>9.3f} "
                      f"({cells[alpha, b]['converged_share']:4.0%})" for b in betas)
        lines.append(f"{alpha:<13g}" + row)
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Bad flags: one line on stderr, exit status 2 (argparse's status)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def main(argv: list[str] | None = None) -> dict:
    parser = _Parser(prog="calvano.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--firms", type=int, default=2, help="number of sellers n (>= 2)")
    parser.add_argument("--alpha", type=float, default=0.15, help="learning rate, in (0, 1]")
    parser.add_argument("--beta", type=float, default=4e-6, help="exploration decay, > 0")
    parser.add_argument("--sessions", type=int, default=None,
                        help="sessions (default 1000; per cell in grid mode: 32)")
    parser.add_argument("--window", type=int, default=100_000, help="convergence window")
    parser.add_argument("--max-periods", type=int, default=10_000_000,
                        help="stop every session after this many periods (published: 1e9; "
                             "1e7 keeps a stuck session from eating the time budget)")
    parser.add_argument("--chunk", type=int, default=20_000, help="periods per jitted chunk")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=None,
                        help="split the sessions over this many devices (default: all; the "
                             "script makes one XLA CPU device per core)")
    parser.add_argument("--grid-alpha", type=_float_list, default=None, metavar="A1,A2,..",
                        help="grid mode: these learning rates (default: --alpha)")
    parser.add_argument("--grid-beta", type=_float_list, default=None, metavar="B1,B2,..",
                        help="grid mode: these exploration decays (default: --beta)")
    parser.add_argument("--step", choices=STEPS, default=None,
                        help="kernel: each session's periods in one compiled loop (numba; "
                             "the default where numba is installed); fast: the periods "
                             "restated for XLA:CPU (the default without numba); learner: "
                             "the q_learning learner's act/update (the same sessions)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    parser.add_argument("--save-strategies", metavar="DIR", default=None,
                        help="save every session's final Q table, greedy strategy and last "
                             "prices to DIR/strategies.npz (with the grid and the profit "
                             "table) for jaxmarket.analysis.impulse_response(DIR, ...)")
    args = parser.parse_args(argv)
    grid_mode = args.grid_alpha is not None or args.grid_beta is not None
    sessions = args.sessions if args.sessions is not None else (32 if grid_mode else 1000)
    alphas = args.grid_alpha or [args.alpha]
    betas = args.grid_beta or [args.beta]
    try:
        for alpha in alphas:
            for beta in betas:
                check_arguments(args.firms, alpha, beta, sessions)
        if args.window < 1 or args.chunk < 1 or args.max_periods < 1:
            raise ValueError("--window, --chunk and --max-periods must be >= 1")
        if args.devices is not None and not 1 <= args.devices <= len(jax.devices()):
            raise ValueError(f"--devices: got {args.devices}; allowed: 1 .. "
                             f"{len(jax.devices())} (the XLA devices of this process)")
        chunk_maker(args.step or default_step())
        if args.save_strategies is not None and grid_mode:
            raise ValueError("--save-strategies: one run only, not grid mode")
    except ValueError as error:
        parser.error(str(error))
    final = _capture_final_state() if args.save_strategies is not None else None
    shared = {"window": args.window, "max_periods": args.max_periods, "chunk": args.chunk,
              "seed": args.seed, "devices": args.devices, "firms": args.firms,
              "step": args.step}
    print(f"Calvano et al. (2020) reproduction: {args.firms} firms, {sessions} sessions"
          f"{' per cell' if grid_mode else ''}, alpha={','.join(f'{a:g}' for a in alphas)}, "
          f"beta={','.join(f'{b:g}' for b in betas)}, window={args.window:,d}, "
          f"backend={jax.default_backend()}", flush=True)
    if grid_mode:
        result = run_grid(alphas, betas, sessions, **shared)
        print(grid_table(result))
        print(f"wall time          {result['wall_s']:.1f} s")
    else:
        result = run(sessions, args.beta, progress=True, alpha=args.alpha, **shared)
        baseline = (args.firms, args.alpha, args.beta) == tuple(BASELINE.values())
        published = f"; published {PUBLISHED_PROFIT_GAIN}" if baseline else ""
        print(f"economics          p_N {result['p_nash']:.4f}  p_M {result['p_monopoly']:.4f}  "
              f"pi_N {result['pi_nash']:.4f}  pi_M {result['pi_monopoly']:.4f}")
        print(f"profit gain        {result['profit_gain']:.4f} (sd "
              f"{result['profit_gain_sd']:.3f}{published})")
        print(f"converged share    {result['converged_share']:.3f}")
        mean_period = result["mean_convergence_period"]
        print(f"mean convergence   {mean_period:,.0f} periods" if mean_period is not None
              else "mean convergence   n/a")
        print(f"periods simulated  {result['periods_simulated']:,d}")
        print(f"wall time          {result['wall_s']:.1f} s  "
              f"({result['ns_per_session_period']:.1f} ns per session-period after compile"
              f"; target 1000 sessions in 60 s: "
              f"{'met' if result['target_met'] else 'not met'})")
    if final is not None:
        print(f"strategies         {save_strategies(args.save_strategies, *final)}")
    if args.json:
        print(json.dumps(result))
    return result


# ---------------------------------------------------------------- --save-strategies

def _capture_final_state() -> list:
    """``[setup, state, obs]`` of the run's final sessions, filled when ``run`` scores
    them with :func:`greedy_cycle_profits` (wrapped here, so ``run`` is unchanged)."""
    final: list = []
    scored = globals()["greedy_cycle_profits"]

    def capture(setup, state, obs):
        final[:] = [setup, state, obs]
        return scored(setup, state, obs)

    globals()["greedy_cycle_profits"] = capture
    return final


def save_strategies(directory: str, setup: CalvanoSetup, state, obs) -> str:
    """``DIR/strategies.npz``: per session ``q [S, n, m^n, m]``, ``greedy [S, n, m^n]``
    (the greedy price index of each state), ``last [S, n]`` (the last period's price
    indices: the state play continues from) and ``converged [S]``; the game: ``grid
    [m]``, ``profit_table [m^n, n]`` (row: the mixed-radix price profile), ``memory``,
    ``p_nash``, ``p_monopoly``, ``pi_nash``, ``pi_monopoly``. The file
    ``jaxmarket.analysis.impulse_response`` reads."""
    os.makedirs(directory, exist_ok=True)
    grid = np.asarray(setup.grid, np.float64)
    spacing = float(grid[1] - grid[0])
    last_prices = np.asarray(obs, np.float64)[:, 0, :]                    # [S, n]
    last = np.clip(np.round((last_prices - grid[0]) / spacing), 0, len(grid) - 1)
    path = os.path.join(directory, "strategies.npz")
    np.savez_compressed(
        path, q=np.asarray(state.q, np.float32), greedy=np.asarray(state.greedy, np.int32),
        last=last.astype(np.int32), converged=np.asarray(state.converged, bool), grid=grid,
        profit_table=np.asarray(setup.profit_table, np.float64), memory=1,
        p_nash=setup.p_nash, p_monopoly=setup.p_monopoly, pi_nash=setup.pi_nash,
        pi_monopoly=setup.pi_monopoly)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
