"""Tabular Q-learning (``kind: q_learning``): the update rule by hand, exploration,
greedy play, Calvano's convergence rule (per session), the random-rival initial Q (per
market), sessions folded into the slot axis as the training loop does, and a reduced
reproduction of Calvano et al. (2020)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.market import economics
from jaxmarket.config.errors import ConfigError
from jaxmarket.learners.base import LEARNERS, LearnerSpec, Transition
from jaxmarket.learners import qlearning
from jaxmarket.learners.qlearning import make, make_grid
from jaxmarket.train.slots import tile_spec

M = 5                      # grid 0.0, 0.1, ..., 0.4
GRID = np.linspace(0.0, 0.4, M)
ALPHA, DELTA = 0.15, 0.95


def toy_payoff(prices):
    """An asymmetric duopoly payoff, prices [2, 1] -> rewards [2]."""
    p0, p1 = prices[0, 0], prices[1, 0]
    return jnp.stack([p0 * (1.0 - p0 + 0.5 * p1), p1 * (2.0 - p1 - 0.3 * p0)])


def toy_payoff_np(p0, p1):
    return np.array([p0 * (1.0 - p0 + 0.5 * p1), p1 * (2.0 - p1 - 0.3 * p0)])


def make_spec(num_agents=2, obs_dim=2, num_products=1, payoff=toy_payoff, **kwargs):
    return LearnerSpec(num_agents=num_agents, obs_dim=obs_dim, num_products=num_products,
                       action_low=np.zeros((num_agents, num_products), np.float32),
                       action_high=np.full((num_agents, num_products), 0.4, np.float32),
                       payoff=payoff, **kwargs)


def make_learner(spec=None, **hyper):
    spec = make_spec() if spec is None else spec
    hyper = {"grid_low": 0.0, "grid_high": 0.4, "grid_size": M, "learning_rate": ALPHA,
             "discount": DELTA, **hyper}
    learner = make(hyper, spec)
    return learner, learner.init(jax.random.key(0), spec)


def with_q(state, q):
    """The learner state holding ``q`` (its cached greedy column recomputed)."""
    return state.with_q(q)


def state_of(prices):
    """Mixed-radix state of a price profile on GRID (first seller most significant)."""
    index = 0
    for p in prices:
        index = index * M + round(p / 0.1)
    return index


def transition(obs_prices, actions, rewards, next_prices, num_agents=2):
    """One-period batch: every agent observes the same price profile."""
    obs = np.tile(np.asarray(obs_prices, np.float32), (num_agents, 1))
    next_obs = np.tile(np.asarray(next_prices, np.float32), (num_agents, 1))
    actions = np.asarray(actions, np.int32)
    return Transition(obs=jnp.asarray(obs)[None], action=jnp.asarray(GRID[actions],
                      jnp.float32)[None, :, None],
                      reward=jnp.asarray(rewards, jnp.float32)[None],
                      next_obs=jnp.asarray(next_obs)[None],
                      done=jnp.zeros((1, num_agents), bool),
                      aux={"action_index": jnp.asarray(actions)[None]})


def stack(*batches):
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *batches)


# -- the update rule -------------------------------------------------------------------

def test_settings_are_static_values():
    """``make`` binds the module-level init/act/update to frozen, hashable settings;
    ``init`` without a spec builds the same state as with the make-time spec."""
    spec = make_spec()
    (one, state), (two, _) = make_learner(spec), make_learner(spec)
    settings = one.update.args[0]
    assert (one.init.func, one.act.func, one.update.func) == (
        qlearning.init, qlearning.act, qlearning.update)
    assert settings == two.update.args[0] and hash(settings) == hash(two.update.args[0])
    again = one.init(jax.random.key(0))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("action_index_in_aux", [True, False])
def test_single_update_matches_the_q_learning_formula(action_index_in_aux):
    learner, state = make_learner(q_init="zero")
    q = np.random.default_rng(1).normal(size=state.q.shape).astype(np.float32)
    state = with_q(state, q)
    batch = transition([0.1, 0.3], [2, 4], [0.5, -0.2], [0.2, 0.4])
    if not action_index_in_aux:  # then the played prices are snapped to the grid
        batch = batch.replace(aux={})
    new_state, _ = jax.jit(learner.update)(state, batch)

    s, s_next = state_of([0.1, 0.3]), state_of([0.2, 0.4])
    expected = q.copy()
    for agent, (a, r) in enumerate([(2, 0.5), (4, -0.2)]):
        target = r + DELTA * q[agent, s_next].max()
        expected[agent, s, a] = (1 - ALPHA) * q[agent, s, a] + ALPHA * target
    np.testing.assert_allclose(np.asarray(new_state.q), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(new_state.greedy, expected.argmax(-1))
    np.testing.assert_allclose(new_state.value, expected.max(-1), rtol=1e-6)
    assert int(new_state.step) == 1


def test_batch_is_learnt_in_time_order():
    learner, state = make_learner(q_init="zero")
    q = np.random.default_rng(2).normal(size=state.q.shape).astype(np.float32)
    state = with_q(state, q)
    loop = transition([0.1, 0.1], [1, 1], [1.0, 2.0], [0.1, 0.1])  # s' = s, a = 1
    new_state, _ = learner.update(state, stack(loop, loop))

    s = state_of([0.1, 0.1])
    expected = q.copy()
    for _ in range(2):  # the second period bootstraps from the first one's result
        for agent, r in enumerate([1.0, 2.0]):
            target = r + DELTA * expected[agent, s].max()
            expected[agent, s, 1] = (1 - ALPHA) * expected[agent, s, 1] + ALPHA * target
    np.testing.assert_allclose(np.asarray(new_state.q), expected, rtol=1e-6, atol=1e-6)
    assert int(new_state.step) == 2


def test_agents_sharing_a_policy_add_their_increments():
    spec = make_spec(num_policies=1, policy_index=(0, 0))
    learner, state = make_learner(spec, q_init="zero")
    q = np.random.default_rng(3).normal(size=state.q.shape).astype(np.float32)
    assert q.shape == (1, M * M, M)
    state = with_q(state, q)
    new_state, _ = learner.update(state, transition([0.0, 0.2], [3, 3], [1.0, -1.0],
                                                    [0.3, 0.3]))
    s, s_next = state_of([0.0, 0.2]), state_of([0.3, 0.3])
    expected = q.copy()
    expected[0, s, 3] += sum(ALPHA * (r + DELTA * q[0, s_next].max() - q[0, s, 3])
                             for r in (1.0, -1.0))
    np.testing.assert_allclose(np.asarray(new_state.q), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(new_state.greedy, expected.argmax(-1))


def test_terminal_transitions_do_not_bootstrap():
    learner, state = make_learner(q_init="zero")
    q = np.random.default_rng(4).normal(size=state.q.shape).astype(np.float32)
    state = with_q(state, q)
    batch = transition([0.1, 0.3], [2, 4], [0.5, -0.2], [0.2, 0.4])
    batch = batch.replace(done=jnp.ones_like(batch.done))
    new_state, _ = learner.update(state, batch)
    s = state_of([0.1, 0.3])
    assert float(new_state.q[0, s, 2]) == pytest.approx((1 - ALPHA) * q[0, s, 2] + ALPHA * 0.5,
                                                        rel=1e-6)


# -- acting ----------------------------------------------------------------------------

def test_greedy_act_plays_the_argmax_of_the_observed_state():
    learner, state = make_learner(q_init="zero", exploration_decay=1.0)
    q = np.random.default_rng(5).normal(size=state.q.shape).astype(np.float32)
    state = with_q(state, q).replace(step=jnp.asarray(10_000, jnp.int32))  # eps = e^-10000
    obs = jnp.asarray([[0.3, 0.1], [0.3, 0.1]], jnp.float32)
    prices, aux = jax.jit(learner.act)(state, obs, jax.random.key(3))
    s = state_of([0.3, 0.1])
    np.testing.assert_array_equal(aux["action_index"], q[:, s].argmax(-1))
    np.testing.assert_allclose(prices[:, 0], GRID[q[:, s].argmax(-1)], rtol=1e-6)
    assert prices.shape == (2, 1)


def test_observed_prices_snap_to_the_nearest_grid_price():
    learner, state = make_learner(q_init="zero", exploration_decay=1.0)
    q = np.random.default_rng(6).normal(size=state.q.shape).astype(np.float32)
    state = with_q(state, q).replace(converged=jnp.asarray(True))
    exact = jnp.asarray([[0.2, 0.4]] * 2, jnp.float32)
    noisy = exact + jnp.asarray([[0.04, -0.03]] * 2, jnp.float32)
    _, aux_exact = learner.act(state, exact, jax.random.key(0))
    _, aux_noisy = learner.act(state, noisy, jax.random.key(0))
    np.testing.assert_array_equal(aux_exact["action_index"], aux_noisy["action_index"])


def test_exploration_follows_the_epsilon_schedule():
    beta, t = 1e-3, 1204  # eps = exp(-1.204) ~= 0.3
    learner, state = make_learner(q_init="zero", exploration_decay=beta)
    q = np.zeros(state.q.shape, np.float32)
    q[..., 2] = 1.0  # the greedy price is index 2 everywhere
    state = with_q(state, q).replace(step=jnp.asarray(t, jnp.int32))
    obs = jnp.asarray([[0.1, 0.1]] * 2, jnp.float32)
    draws = 40_000
    keys = jax.random.split(jax.random.key(7), draws)
    _, aux = jax.jit(jax.vmap(learner.act, in_axes=(None, None, 0)))(state, obs, keys)
    actions = np.asarray(aux["action_index"])  # [draws, 2]
    eps = math.exp(-beta * t)
    counts = np.stack([(actions == a).mean(axis=0) for a in range(M)])  # [M, 2]
    for a in range(M):
        p = eps / M + (1 - eps if a == 2 else 0.0)
        sigma = math.sqrt(p * (1 - p) / draws)
        np.testing.assert_allclose(counts[a], p, atol=5 * sigma)
    # the two sellers explore independently
    explored = actions != 2
    joint = (explored[:, 0] & explored[:, 1]).mean()
    p_one = eps * (M - 1) / M
    assert joint == pytest.approx(p_one**2, abs=5 * math.sqrt(p_one**2 / draws))


def test_epsilon_is_one_at_the_start_and_vanishes():
    learner, state = make_learner(q_init="zero", exploration_decay=4e-6)
    q = np.zeros(state.q.shape, np.float32)
    q[..., 0] = 1.0
    state = with_q(state, q)
    obs = jnp.asarray([[0.1, 0.1]] * 2, jnp.float32)
    keys = jax.random.split(jax.random.key(8), 5000)
    batched = jax.jit(jax.vmap(learner.act, in_axes=(None, None, 0)))
    _, aux = batched(state, obs, keys)  # t = 0: every price uniformly likely
    assert (np.asarray(aux["action_index"]) == 0).mean() == pytest.approx(1 / M, abs=0.03)
    late = state.replace(step=jnp.asarray(5_000_000, jnp.int32))  # eps = e^-20
    _, aux = batched(late, obs, keys)
    assert (np.asarray(aux["action_index"]) == 0).all()


# -- convergence -----------------------------------------------------------------------

def confident_state(learner, state):
    q = np.zeros(state.q.shape, np.float32)
    q[..., 0] = 10.0  # price 0 is greedy everywhere, by a wide margin
    return with_q(state, q)


def test_convergence_counter_counts_periods_without_greedy_changes():
    learner, state = make_learner(q_init="zero", convergence_window=3)
    state = confident_state(learner, state)
    quiet = transition([0.1, 0.1], [1, 1], [0.1, 0.1], [0.1, 0.1])
    for expected in (1, 2):
        state, metrics = learner.update(state, quiet)
        assert int(state.stable_periods) == expected
        assert not bool(state.converged)
    # seller 1's greedy price flips (alpha * 1000 = 150 > 10): the counter restarts
    flip = transition([0.1, 0.1], [1, 1], [0.0, 1000.0], [0.1, 0.1])
    state, metrics = learner.update(state, flip)
    assert int(state.stable_periods) == 0
    assert int(metrics["greedy_changes"]) == 1
    assert int(state.greedy[1, state_of([0.1, 0.1])]) == 1


def test_converged_learner_stops_learning_and_acts_greedily():
    learner, state = make_learner(q_init="zero", convergence_window=3,
                                  exploration_decay=0.0)  # eps = 1 while learning
    state = confident_state(learner, state)
    quiet = transition([0.1, 0.1], [1, 1], [0.1, 0.1], [0.1, 0.1])
    for _ in range(3):
        state, _ = learner.update(state, quiet)
    assert bool(state.converged)
    assert int(state.step) == 3
    frozen = state
    state, metrics = learner.update(state, transition([0.1, 0.1], [1, 1], [1e3, 1e3],
                                                      [0.1, 0.1]))
    np.testing.assert_array_equal(state.q, frozen.q)
    assert int(state.step) == 3 and int(state.stable_periods) == 3
    assert int(metrics["greedy_changes"]) == 0
    obs = jnp.asarray([[0.1, 0.1]] * 2, jnp.float32)
    keys = jax.random.split(jax.random.key(9), 200)
    _, aux = jax.vmap(learner.act, in_axes=(None, None, 0))(state, obs, keys)
    assert (np.asarray(aux["action_index"]) == 0).all()  # no exploration once converged


# -- initial Q -------------------------------------------------------------------------

def test_random_rival_initial_q_is_the_discounted_mean_payoff():
    _, state = make_learner(q_init="random_rival")
    expected = np.zeros((2, M))
    for a in range(M):
        for b in range(M):
            expected[0, a] += toy_payoff_np(GRID[a], GRID[b])[0] / M
            expected[1, a] += toy_payoff_np(GRID[b], GRID[a])[1] / M
    expected /= 1 - DELTA
    assert state.q.shape == (2, M * M, M)
    np.testing.assert_allclose(np.asarray(state.q),
                               np.broadcast_to(expected[:, None, :], (2, M * M, M)), rtol=1e-5)
    np.testing.assert_array_equal(state.greedy, np.asarray(state.q).argmax(-1))


def test_zero_initial_q():
    _, state = make_learner(q_init="zero")
    assert not np.asarray(state.q).any()
    assert int(state.step) == 0 and not bool(state.converged)


def test_random_rival_initial_q_is_per_market_and_tiled_over_markets():
    """2 sessions x 2 markets x 2 sellers: the joint grid is one market's (payoff [2, 1]
    -> [2]), and slot i gets the row of seller i % 2 (policies: 2 per session)."""
    spec = tile_spec(make_spec(), num_envs=2, num_seeds=2)
    assert (spec.num_agents, spec.policies, spec.agents_per_market) == (8, 4, 2)
    _, state = make_learner(spec, q_init="random_rival")
    _, single = make_learner(q_init="random_rival")
    per_seller = np.asarray(single.q)[:, 0]  # [2, M], checked by hand above
    assert state.q.shape == (4, M * M, M)
    np.testing.assert_allclose(np.asarray(state.q)[:, 0], per_seller[[0, 1, 0, 1]], rtol=1e-6)
    np.testing.assert_array_equal(state.policy_index, [0, 1, 0, 1, 2, 3, 2, 3])


# -- sessions --------------------------------------------------------------------------

def slots_transition(obs, actions, rewards, next_obs):
    """One-period batch with a price profile per slot: obs/next_obs [A, D]."""
    actions = np.asarray(actions, np.int32)
    return Transition(obs=jnp.asarray(obs, jnp.float32)[None],
                      action=jnp.asarray(GRID[actions], jnp.float32)[None, :, None],
                      reward=jnp.asarray(rewards, jnp.float32)[None],
                      next_obs=jnp.asarray(next_obs, jnp.float32)[None],
                      done=jnp.zeros((1, len(actions)), bool),
                      aux={"action_index": jnp.asarray(actions)[None]})


def two_sessions(**hyper):
    """Two sessions of the toy duopoly, one market each: slots/policies 0, 1 are session
    0's, 2, 3 session 1's (the training loop's layout)."""
    spec = tile_spec(make_spec(), num_envs=1, num_seeds=2)
    assert (spec.num_sessions, spec.num_markets, spec.num_agents) == (2, 2, 4)
    return make_learner(spec, **{"q_init": "zero", **hyper})


def test_per_session_state_has_one_entry_per_session():
    learner, state = two_sessions()
    assert state.q.shape == (4, M * M, M)
    assert state.step.shape == state.stable_periods.shape == state.converged.shape == (2,)
    batch = slots_transition([[0.1, 0.1]] * 4, [1, 1, 1, 1], [0.1] * 4, [[0.1, 0.1]] * 4)
    state, metrics = jax.jit(learner.update)(state, batch)
    assert state.step.shape == state.stable_periods.shape == state.converged.shape == (2,)
    assert metrics["converged"].shape == metrics["epsilon"].shape == (2,)
    prices, aux = jax.jit(learner.act)(state, jnp.zeros((4, 2)), jax.random.key(0))
    assert prices.shape == (4, 1) and aux["action_index"].shape == (4,)


def test_sessions_learn_exactly_as_separate_learners():
    """Folding two sessions into one state changes nothing: each session's tables and
    counters evolve as a one-session learner's on that session's data."""
    rng = np.random.default_rng(11)
    learner, state = two_sessions(convergence_window=3)
    single, single_state = make_learner(q_init="zero", convergence_window=3)
    q = rng.normal(size=state.q.shape).astype(np.float32)
    state = with_q(state, q)
    separate = [with_q(single_state, q[2 * s:2 * s + 2]) for s in range(2)]
    for _ in range(4):
        obs = GRID[rng.integers(0, M, (4, 2))]
        nxt = GRID[rng.integers(0, M, (4, 2))]
        actions = rng.integers(0, M, 4)
        rewards = rng.normal(size=4)
        batch = slots_transition(obs, actions, rewards, nxt)
        state, _ = learner.update(state, batch)
        for s in range(2):
            part = jax.tree.map(lambda x, s=s: x[:, 2 * s:2 * s + 2], batch)
            separate[s], _ = single.update(separate[s], part)
    for s in range(2):
        np.testing.assert_allclose(np.asarray(state.q)[2 * s:2 * s + 2], separate[s].q,
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(state.greedy)[2 * s:2 * s + 2],
                                      separate[s].greedy)
        assert int(state.step[s]) == int(separate[s].step)
        assert int(state.stable_periods[s]) == int(separate[s].stable_periods)
        assert bool(state.converged[s]) == bool(separate[s].converged)


def test_convergence_counter_is_per_session():
    learner, state = two_sessions(convergence_window=3)
    state = confident_state(learner, state)
    same = [[0.1, 0.1]] * 4
    quiet = slots_transition(same, [1, 1, 1, 1], [0.1] * 4, same)
    state, _ = learner.update(state, quiet)
    np.testing.assert_array_equal(state.stable_periods, [1, 1])
    # session 1's second seller flips its greedy price: only session 1's counter restarts
    flip = slots_transition(same, [1, 1, 1, 1], [0.1, 0.1, 0.1, 1000.0], same)
    state, metrics = learner.update(state, flip)
    np.testing.assert_array_equal(state.stable_periods, [2, 0])
    assert int(metrics["greedy_changes"]) == 1
    state, _ = learner.update(state, quiet)  # session 0 reaches the window alone
    np.testing.assert_array_equal(state.stable_periods, [3, 1])
    np.testing.assert_array_equal(state.converged, [True, False])
    np.testing.assert_array_equal(state.step, [3, 3])


def test_a_converged_session_stops_while_the_other_learns():
    """Built by hand: session 0 converged (at period 7), session 1 still learning. A
    period with large rewards everywhere leaves session 0's tables, step and counter
    untouched and updates session 1's; session 0 then acts greedily while session 1
    (eps = 1) explores."""
    learner, state = two_sessions(convergence_window=5, exploration_decay=0.0)
    state = confident_state(learner, state).replace(
        converged=jnp.asarray([True, False]), step=jnp.asarray([7, 7], jnp.int32),
        stable_periods=jnp.asarray([5, 2], jnp.int32))
    before = np.asarray(state.q).copy()
    same = [[0.1, 0.1]] * 4
    s = state_of([0.1, 0.1])
    new_state, metrics = jax.jit(learner.update)(
        state, slots_transition(same, [1, 1, 1, 1], [1000.0] * 4, same))

    q = np.asarray(new_state.q)
    np.testing.assert_array_equal(q[:2], before[:2])                  # session 0 frozen
    np.testing.assert_array_equal(new_state.greedy[:2], state.greedy[:2])
    expected = (1 - ALPHA) * 0.0 + ALPHA * (1000.0 + DELTA * 10.0)    # session 1 learns
    np.testing.assert_allclose(q[2:, s, 1], expected, rtol=1e-6)
    np.testing.assert_array_equal(new_state.greedy[2:, s], [1, 1])    # and flips greedy
    np.testing.assert_array_equal(new_state.step, [7, 8])
    np.testing.assert_array_equal(new_state.stable_periods, [5, 0])
    np.testing.assert_array_equal(new_state.converged, [True, False])
    assert int(metrics["greedy_changes"]) == 2
    assert float(metrics["epsilon"][0]) == 0.0 and float(metrics["epsilon"][1]) == 1.0

    keys = jax.random.split(jax.random.key(12), 300)
    _, aux = jax.vmap(learner.act, in_axes=(None, None, 0))(
        new_state, jnp.asarray(same, jnp.float32), keys)
    actions = np.asarray(aux["action_index"])  # [300, 4]
    assert (actions[:, :2] == 0).all()          # session 0: greedy, no exploration
    for slot in (2, 3):                         # session 1: uniformly random prices
        assert len(np.unique(actions[:, slot])) == M


def test_sessions_must_not_share_policies():
    spec = make_spec(num_agents=4, num_policies=2, policy_index=(0, 0, 1, 1),
                     num_markets=2, num_sessions=2)
    make_learner(spec, q_init="zero")  # each session drives its own policy: fine
    bad = make_spec(num_agents=4, num_policies=2, policy_index=(0, 1, 0, 1),
                    num_markets=2, num_sessions=2)
    with pytest.raises(ValueError, match="sessions must not share"):
        make_learner(bad, q_init="zero")


# -- observations and validation -------------------------------------------------------

def test_state_index_is_the_mixed_radix_number_of_the_memory():
    spec = make_spec(obs_dim=4)
    grid = make_grid({"grid_low": 0.0, "grid_high": 0.4, "grid_size": M, "memory": 2}, spec)
    obs = jnp.asarray([[0.4, 0.0, 0.1, 0.3], [0.0, 0.0, 0.0, 0.1]], jnp.float32)
    expected = [4 * M**3 + 0 * M**2 + 1 * M + 3, 1]
    np.testing.assert_array_equal(grid.state_index(obs), expected)
    _, state = make_learner(spec, memory=2, q_init="zero")
    assert state.q.shape == (2, M**4, M)


def test_largest_state_index_fits_in_int32():
    spec = make_spec(obs_dim=7)  # 21^7 = 1.8e9 states
    grid = make_grid({"grid_low": 0.0, "grid_high": 0.4, "grid_size": 21, "memory": 1}, spec)
    top = grid.state_index(jnp.full((1, 7), 0.4, jnp.float32))
    assert int(top[0]) == 21**7 - 1


def test_rejects_more_than_one_product():
    with pytest.raises(ValueError, match="one product"):
        make_learner(make_spec(num_products=2))


def test_rejects_too_many_states():
    with pytest.raises(ValueError, match="int32"):
        make_learner(make_spec(obs_dim=8), grid_size=15)


def test_rejects_observations_that_are_not_price_memories():
    with pytest.raises(ValueError, match="memory"):
        make_learner(make_spec(obs_dim=3), memory=2)


def test_random_rival_needs_a_payoff():
    with pytest.raises(ValueError, match="payoff"):
        make_learner(make_spec(payoff=None), q_init="random_rival")


def test_unknown_setting_names_the_field():
    with pytest.raises(ConfigError, match="learners.q_learning.temperature"):
        make_learner(temperature=1.0)


def test_registered_with_documented_defaults():
    definition = LEARNERS["q_learning"]
    defaults = {name: f.default for name, f in definition.hyper_fields.items()}
    assert defaults["grid_size"] == 15 and defaults["memory"] == 1
    assert defaults["learning_rate"] == 0.15 and defaults["discount"] == 0.95
    assert defaults["exploration_decay"] == 4e-6
    assert defaults["convergence_window"] == 100_000
    assert defaults["q_init"] == "random_rival"


def test_grid_defaults_to_the_action_bounds():
    learner, state = make_learner(grid_low=None, grid_high=None, q_init="zero")
    state = state.replace(converged=jnp.asarray(True))
    q = np.zeros(state.q.shape, np.float32)
    q[..., M - 1] = 1.0
    prices, _ = learner.act(with_q(state, q).replace(converged=jnp.asarray(True)),
                            jnp.zeros((2, 2), jnp.float32), jax.random.key(0))
    np.testing.assert_allclose(prices[:, 0], 0.4)


# -- Calvano et al. (2020), reduced -----------------------------------------------------

def load_calvano_benchmark():
    """``benchmarks/calvano.py``: the timing wrapper of ``configs/calvano.yaml`` on the
    session engine (``jaxmarket.sessions.run.start``)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "calvano.py"
    spec = importlib.util.spec_from_file_location("calvano_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_reduced_calvano_is_supra_competitive():
    """64 sessions of the Calvano duopoly with fast exploration decay (beta = 2e-4, 50x
    the published one) and a 10,000-period convergence window, as ``benchmarks/calvano.py
    --sessions 64 --beta 2e-4 --window 10000`` runs them (the shipped config on the
    session engine).

    Threshold, derived here: static Nash play scores Delta = 0 and pricing uniformly at
    random on the grid scores Delta ~= 0.50, so an average above 0.6 is supra-competitive
    beyond both, i.e. learnt tacit coordination. (This reduced run measures ~0.70; the
    full run, with 50x more exploration, ~0.85.)"""
    calvano = load_calvano_benchmark()
    result = calvano.run(sessions=64, beta=2e-4, window=10_000, max_periods=400_000,
                         chunk=5_000, seed=0, progress=False)

    grid = economics.calvano_grid()
    pairs = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1)
    p_n, p_m = economics.nash_price(2), economics.joint_monopoly_price(2)
    pi_n = economics.logit_profits([p_n, p_n])[0]
    pi_m = economics.logit_profits([p_m, p_m])[0]
    random_play = economics.profit_gain(economics.logit_profits(pairs)[..., 0].mean(), pi_n, pi_m)
    assert 0.45 < random_play < 0.55

    assert result["converged_share"] == 1.0
    # every session stopped at its convergence, before the cap, and the run with them
    assert result["periods_simulated"] < 400_000
    assert result["periods_simulated"] >= result["max_convergence_period"]
    assert result["profit_gain"] > max(0.6, random_play + 0.1)
    assert result["profit_gain"] < 1.0


def test_calvano_sessions_are_the_same_on_one_or_two_devices(tmp_path):
    """The engine splits the sessions over devices (``Settings.devices``: ``jax.shard_map``
    of the XLA backend's chunk); sessions are independent, so no session may depend on
    the split. Run in a subprocess with two forced host devices (set before JAX starts)."""
    script = tmp_path / "devices.py"
    script.write_text(
        "import jax, numpy as np\n"
        "from jaxmarket.config.loader import load_config\n"
        "from jaxmarket.sessions import engine as eng\n"
        "from jaxmarket.sessions.game import make_game\n"
        "from jaxmarket.sessions.run import session_plan\n"
        "assert len(jax.devices()) == 2\n"
        "game = make_game(session_plan(load_config('configs/calvano.yaml', [\n"
        "    'learners.sellers.exploration_decay=2.0e-2',\n"
        "    'learners.sellers.convergence_window=30', 'learners.sellers.discount=0.5',\n"
        "    'learners.sellers.learning_rate=0.3'])))\n"
        "out = {}\n"
        "for d in (1, 2):\n"
        "    r = eng.run(game, eng.Settings(8, 600, 150, backend='xla', devices=d),\n"
        "                jax.random.key(7), compact=False)\n"
        "    s = r.sessions\n"
        "    assert len(s.learner.rows.sharding.device_set) == d   # the split did happen\n"
        "    out.update({f'{k}{d}': np.asarray(v) for k, v in (\n"
        "        ('rows', s.learner.rows), ('step', s.learner.step), ('index', s.index),\n"
        "        ('converged', s.learner.converged), ('tail', s.tail),\n"
        "        ('cycle', r.cycle_reward))})\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, **out)\n")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    subprocess.run([sys.executable, str(script)], cwd=Path(__file__).resolve().parents[1],
                   env=env, check=True, capture_output=True, text=True)
    with np.load(tmp_path / "out.npz") as out:
        for name in ("rows", "step", "index", "converged", "tail", "cycle"):
            np.testing.assert_array_equal(out[f"{name}1"], out[f"{name}2"], err_msg=name)
        assert out["converged1"].any()   # the sessions did learn something to compare
