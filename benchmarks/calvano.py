"""Reproduce Calvano et al. (AER 2020): independent Q-learners collude in a logit duopoly.

Two sellers in the baseline logit economy (a = 2, c = 1, a_0 = 0, mu = 0.25), prices on
the m = 15 grid of :func:`jaxmarket.economics.calvano_grid` (xi = 0.1), memory k = 1
(the state is last period's price pair), alpha = 0.15, delta = 0.95,
eps_t = exp(-beta t) with beta = 4e-6, Q initialised to the discounted payoff against a
uniformly random rival, random initial state, convergence once both sellers' greedy
strategies have been unchanged for 100,000 consecutive periods. Published (1000
sessions): average profit gain 0.849 (sd 0.112), nearly all sessions converge.

Every session runs the ``q_learning`` learner's own ``init``/``act``/``update``
(``jaxmarket.learners.qlearning``), vmapped over sessions, one-period transitions
(T = 1), many periods per jitted ``lax.scan`` chunk. The per-period profits come from a
precomputed ``m x m`` payoff table built with :func:`jaxmarket.economics.logit_profits`
(the same numbers the market's logit distributor would produce for these prices; the
table keeps this benchmark independent of the market simulator).

Sessions that have converged stop learning (the learner's own rule) and, once a quarter
of the batch has converged, are compacted out of the running batch (a session's
randomness depends only on its key and the period, so compaction changes no result).
A session stops after ``--max-periods`` (default 1e7, not the published 1e9: at
beta = 4e-6, eps is below 1e-17 after 1e7 periods, and the cap keeps a session that
never settles from holding the whole run).

Once every session has converged (or hit the cap), each session plays its greedy
strategies from its final state: after a burn-in of m^2 periods the play is on its
limit cycle; profits are averaged over exactly one cycle, and
``Delta = (pi - pi_N) / (pi_M - pi_N)`` with ``pi`` the mean profit of the two sellers
and ``pi_N``, ``pi_M`` from :mod:`jaxmarket.economics`.

    python benchmarks/calvano.py                       # 1000 sessions, beta = 4e-6
    python benchmarks/calvano.py --sessions 64 --beta 2e-4 --window 10000 --json
"""

from __future__ import annotations

import argparse
import json
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

from jaxmarket import economics
from jaxmarket.learners import qlearning  # noqa: F401  (registers "q_learning")
from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec, Transition

PUBLISHED_PROFIT_GAIN = 0.849
ECONOMY = {"quality": 2.0, "cost": 1.0, "outside_quality": 0.0, "mu": 0.25}


@dataclass(frozen=True)
class CalvanoSetup:
    learner: Learner
    spec: LearnerSpec
    grid: np.ndarray           # [m] float64 prices
    profit_table: jax.Array    # [m, m, 2] float32: profits of both sellers per price pair
    pi_nash: float
    pi_monopoly: float


def make_setup(beta: float = 4e-6, window: int = 100_000, m: int = 15, xi: float = 0.1,
               alpha: float = 0.15, delta: float = 0.95) -> CalvanoSetup:
    """The economy, the price grid, the payoff table and the ``q_learning`` learner."""
    grid = economics.calvano_grid(n=2, m=m, xi=xi, **ECONOMY)
    pair = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1)  # [m, m, 2]
    profit_table = jnp.asarray(economics.logit_profits(pair, **ECONOMY), dtype=jnp.float32)
    p_nash = economics.nash_price(2, **ECONOMY)
    p_monopoly = economics.joint_monopoly_price(2, **ECONOMY)
    pi_nash = float(economics.logit_profits([p_nash, p_nash], **ECONOMY)[0])
    pi_monopoly = float(economics.logit_profits([p_monopoly, p_monopoly], **ECONOMY)[0])
    low, spacing = float(grid[0]), float(grid[1] - grid[0])

    def payoff(prices: jax.Array) -> jax.Array:
        """One-shot profits of a price pair ``[2, 1]`` (snapped to the grid) -> ``[2]``."""
        index = jnp.clip(jnp.round((prices[:, 0] - low) / spacing), 0, m - 1).astype(jnp.int32)
        return profit_table[index[0], index[1]]

    spec = LearnerSpec(num_agents=2, obs_dim=2, num_products=1,
                       action_low=np.full((2, 1), grid[0], np.float32),
                       action_high=np.full((2, 1), grid[-1], np.float32), payoff=payoff)
    hyper = {"grid_low": float(grid[0]), "grid_high": float(grid[-1]), "grid_size": m,
             "memory": 1, "learning_rate": alpha, "discount": delta,
             "exploration_decay": beta, "convergence_window": window,
             "q_init": "random_rival"}
    learner = LEARNERS["q_learning"].make(hyper, spec)
    return CalvanoSetup(learner, spec, grid, profit_table, pi_nash, pi_monopoly)


def _observe(prices: jax.Array) -> jax.Array:
    """Both sellers observe last period's price pair: ``[2, 1]`` -> obs ``[2, 2]``."""
    return jnp.broadcast_to(prices[:, 0][None, :], (2, 2))


def make_chunk(setup: CalvanoSetup, length: int, devices: int = 1):
    """Jitted ``(carry, first_period) -> carry`` running ``length`` periods of every
    session; ``carry = (learner_state, obs, session_key)``, vmapped over sessions.

    With ``devices > 1`` the sessions are split into that many equal blocks, one per
    device (``jax.shard_map`` over the first ``devices`` of ``jax.devices()``): with
    ``--xla_force_host_platform_device_count`` set to the number of cores, each core runs
    its own block in its own thread. Sessions are independent, so no result changes."""
    learner, table = setup.learner, setup.profit_table

    def period(carry, t):
        state, obs, session_key = carry
        key = jax.random.fold_in(session_key, t)
        prices, aux = learner.act(state, obs, key)
        a = aux["action_index"]
        reward = table[a[0], a[1]]
        next_obs = _observe(prices)
        batch = Transition(obs=obs[None], action=prices[None], reward=reward[None],
                           next_obs=next_obs[None], done=jnp.zeros((1, 2), bool),
                           aux={"action_index": a[None]})
        state, _ = learner.update(state, batch)
        return (state, next_obs, session_key), None

    def one_session(carry, first_period):
        periods = first_period + jnp.arange(length, dtype=jnp.uint32)
        carry, _ = jax.lax.scan(period, carry, periods)
        return carry

    chunk = jax.vmap(one_session, in_axes=(0, None))
    if devices > 1:
        mesh = Mesh(np.asarray(jax.devices()[:devices]), ("sessions",))
        chunk = jax.shard_map(chunk, mesh=mesh, in_specs=(PartitionSpec("sessions"),
                                                          PartitionSpec()),
                              out_specs=PartitionSpec("sessions"))
    return jax.jit(chunk, donate_argnums=0)


def init_sessions(setup: CalvanoSetup, key: jax.Array, sessions: int):
    """Initial learner states, random initial price pairs and per-session keys."""
    m = setup.grid.shape[0]
    init_key, start_key, run_key = jax.random.split(key, 3)
    state = jax.vmap(lambda k: setup.learner.init(k, setup.spec))(
        jax.random.split(init_key, sessions))
    start = jax.random.randint(start_key, (sessions, 2), 0, m)
    prices = jnp.asarray(setup.grid, jnp.float32)[start][..., None]  # [S, 2, 1]
    obs = jax.vmap(_observe)(prices)
    return state, obs, jax.random.split(run_key, sessions)


def greedy_cycle_profits(setup: CalvanoSetup, state, obs) -> jax.Array:
    """``[S, 2]`` each seller's profit averaged over one limit cycle of greedy play from
    the final state (burn-in of m^2 periods, then exactly one cycle)."""
    learner, table = setup.learner, setup.profit_table
    m = setup.grid.shape[0]
    horizon = m * m  # a deterministic play over m^2 states enters its cycle within m^2

    def one_session(state, obs):
        greedy = state.replace(converged=jnp.ones((), bool))  # act greedily
        dummy_key = jax.random.key(0)

        def play(obs, _):
            prices, aux = learner.act(greedy, obs, dummy_key)
            a = aux["action_index"]
            return _observe(prices), (a, table[a[0], a[1]])

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


def run(sessions: int = 1000, beta: float = 4e-6, window: int = 100_000,
        max_periods: int = 10_000_000, chunk: int = 20_000, seed: int = 0,
        progress: bool = True, compact: bool = True, devices: int | None = None) -> dict:
    """Run every session until all have converged or ``max_periods``; return a summary.

    Sessions run in lockstep in a batch; once at most 3/4 of the batch is still learning,
    the batch is compacted to the learning sessions (padded to a multiple of 64 with a
    converged session, which no longer learns), so converged sessions stop costing
    time. A session's randomness depends only on its own key and the period number, so
    compaction does not change any session's trajectory. ``devices`` (default: all of
    ``jax.devices()``) splits the batch across devices (see :func:`make_chunk`).
    """
    start = time.perf_counter()
    # The non-partitionable threefry draws two 32-bit words per hash instead of one: half
    # the hashing for the two sellers' exploration draws (streams differ, not statistics).
    with jax.threefry_partitionable(False):
        setup = make_setup(beta=beta, window=window)
        full_state, full_obs, keys = init_sessions(setup, jax.random.key(seed), sessions)
        available = len(jax.devices())
        devices = available if devices is None else devices
        if not 1 <= devices <= available:
            raise ValueError(f"--devices: got {devices}; allowed: 1 .. {available} (the XLA "
                             f"devices of this process)")
        chunks: dict[int, object] = {}

        def run_chunk(carry, first_period):
            """One chunk on as many devices as divide the batch."""
            size = int(carry[2].shape[0])
            use = max(d for d in range(1, devices + 1) if size % d == 0)
            if use not in chunks:
                chunks[use] = make_chunk(setup, chunk, use)
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
        profits = np.asarray(greedy_cycle_profits(setup, full_state, full_obs), np.float64)
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
        "beta": beta,
        "convergence_window": window,
        "wall_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--beta", type=float, default=4e-6, help="exploration decay")
    parser.add_argument("--window", type=int, default=100_000, help="convergence window")
    parser.add_argument("--max-periods", type=int, default=10_000_000,
                        help="stop every session after this many periods (published: 1e9; "
                             "1e7 keeps a stuck session from eating the time budget)")
    parser.add_argument("--chunk", type=int, default=20_000, help="periods per jitted chunk")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=None,
                        help="split the sessions over this many devices (default: all; the "
                             "script makes one XLA CPU device per core)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    print(f"Calvano et al. (2020) reproduction: {args.sessions} sessions, beta={args.beta:g}, "
          f"window={args.window:,d}, backend={jax.default_backend()}", flush=True)
    result = run(args.sessions, args.beta, args.window, args.max_periods, args.chunk, args.seed,
                 devices=args.devices)
    print(f"profit gain        {result['profit_gain']:.4f} (sd {result['profit_gain_sd']:.3f}; "
          f"published {PUBLISHED_PROFIT_GAIN})")
    print(f"converged share    {result['converged_share']:.3f}")
    mean_period = result["mean_convergence_period"]
    print(f"mean convergence   {mean_period:,.0f} periods" if mean_period is not None
          else "mean convergence   n/a")
    print(f"periods simulated  {result['periods_simulated']:,d}")
    print(f"wall time          {result['wall_s']:.1f} s")
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
