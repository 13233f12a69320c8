"""Q-learning's options for the pricing literature: stateless learners (``memory: 0``),
explicit grids, the epsilon and Boltzmann exploration schedules, constant and uniform
initial Q, full-feedback ("synchronous") updates and Klein (2021)'s sequential target.
Every expected value is computed here by hand from the update formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.learners.base import LearnerSpec, Transition
from jaxmarket.learners.qlearning import make, make_grid, qlearning_settings

ALPHA, DELTA = 0.3, 0.9
GRID3 = [0.1, 0.2, 0.3]
# a 2 x 3 game: PAYOFF[i][a0, a1] is player i's payoff when player 0 plays grid price
# a0 and player 1 plays a1 (any numbers; asymmetric on purpose)
PAYOFF = np.array([[[1.0, 0.2, 0.5], [0.0, 2.0, 0.7], [0.4, 0.9, 1.5]],
                   [[0.3, 1.1, 0.6], [1.7, 0.1, 0.8], [0.9, 0.5, 1.2]]], np.float32)


def game_payoff(prices):
    """prices [2, 1] on GRID3 -> the two players' payoffs [2]."""
    index = jnp.round(prices[:, 0] * 10.0 - 1.0).astype(jnp.int32)
    table = jnp.asarray(PAYOFF)
    return table[:, index[0], index[1]]


def spec(num_agents=2, obs_dim=0, payoff=game_payoff, **kw):
    return LearnerSpec(num_agents=num_agents, obs_dim=obs_dim, num_products=1,
                       action_low=np.zeros((num_agents, 1), np.float32),
                       action_high=np.ones((num_agents, 1), np.float32), payoff=payoff, **kw)


def one_period(actions, rewards, obs_dim=0, obs=None, next_obs=None):
    """A one-period batch of two agents playing grid indices ``actions``."""
    n = len(actions)
    obs = np.zeros((n, obs_dim), np.float32) if obs is None else np.asarray(obs, np.float32)
    next_obs = obs if next_obs is None else np.asarray(next_obs, np.float32)
    a = np.asarray(actions, np.int32)
    return Transition(obs=jnp.asarray(obs)[None],
                      action=jnp.asarray(np.asarray(GRID3, np.float32)[a])[None, :, None],
                      reward=jnp.asarray(rewards, jnp.float32)[None],
                      next_obs=jnp.asarray(next_obs)[None], done=jnp.zeros((1, n), bool),
                      aux={"action_index": jnp.asarray(a)[None]})


def stateless(**hyper):
    hyper = {"grid": GRID3, "memory": 0, "learning_rate": ALPHA, "discount": DELTA,
             "q_init": {"kind": "constant", "value": 2.0}, **hyper}
    learner = make(hyper, spec())
    return learner, learner.init(jax.random.key(0), spec())


def test_full_feedback_updates_every_action_with_its_counterfactual_payoff():
    learner, state = stateless(feedback="full")
    q = np.full((2, 3), 2.0)
    for a0, a1 in [(1, 2), (0, 0), (2, 1)]:
        r = PAYOFF[:, a0, a1]
        state, _ = learner.update(state, one_period([a0, a1], r))
        # by hand: player 0's action a earns PAYOFF[0][a, a1], player 1's PAYOFF[1][a0, a];
        # both bootstrap from the max of their row before the update
        cf = np.stack([PAYOFF[0][:, a1], PAYOFF[1][a0, :]])
        q = q + ALPHA * (cf + DELTA * q.max(axis=1, keepdims=True) - q)
        np.testing.assert_allclose(np.asarray(state.q[:, 0]), q, rtol=1e-6)
        assert np.array_equal(np.asarray(state.greedy[:, 0]), q.argmax(axis=1))


def test_learning_from_the_action_taken_changes_one_entry():
    learner, state = stateless()
    state, _ = learner.update(state, one_period([1, 2], PAYOFF[:, 1, 2]))
    q = np.full((2, 3), 2.0)
    q[0, 1] += ALPHA * (PAYOFF[0, 1, 2] + DELTA * 2.0 - 2.0)
    q[1, 2] += ALPHA * (PAYOFF[1, 1, 2] + DELTA * 2.0 - 2.0)
    np.testing.assert_allclose(np.asarray(state.q[:, 0]), q, rtol=1e-6)


def test_stateless_learner_has_one_state_whatever_it_observes():
    learner = make({"grid": GRID3, "memory": 0, "q_init": "zero"}, spec(obs_dim=3))
    state = learner.init(jax.random.key(0), spec(obs_dim=3))
    assert state.q.shape == (2, 1, 3)
    obs = jnp.asarray([[0.1, 0.3, 0.2], [9.0, -4.0, 0.0]])
    batch = Transition(obs=obs[None], action=jnp.full((1, 2, 1), 0.2), reward=jnp.ones((1, 2)),
                       next_obs=obs[::-1][None], done=jnp.zeros((1, 2), bool), aux={})
    state, _ = learner.update(state, batch)
    assert float(state.q[0, 0, 1]) == pytest.approx(0.15)   # default alpha 0.15, r = 1


def test_explicit_grid_snaps_to_the_nearest_listed_price():
    grid = make_grid({"grid": [0.0, 0.1, 0.5, 1.0], "memory": 1, "grid_size": 15},
                     spec(obs_dim=2))
    prices = jnp.asarray([-1.0, 0.04, 0.06, 0.29, 0.31, 0.74, 0.76, 5.0])
    # midpoints 0.05, 0.3, 0.75
    assert np.asarray(grid.nearest_index(prices)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    np.testing.assert_array_equal(np.asarray(grid.prices), np.float32([0.0, 0.1, 0.5, 1.0]))


def test_linspace_grid_has_exact_endpoints():
    grid = make_grid({"grid_low": 0.01, "grid_high": 10.0, "grid_size": 100, "memory": 0},
                     spec())
    assert float(grid.prices[0]) == np.float32(0.01)
    assert float(grid.prices[-1]) == np.float32(10.0)
    assert grid.size == 100


def test_epsilon_schedule_with_a_start_value():
    """eps_t = eps0 exp(-beta t): the share of exploring agents among many matches it."""
    eps0, beta, t = 0.4, 1e-3, 700
    learner = make({"grid": GRID3, "memory": 0, "q_init": "zero",
                    "epsilon": {"start": eps0, "decay": beta}}, spec(num_agents=4000))
    state = learner.init(jax.random.key(0), spec(num_agents=4000))
    q = np.zeros((4000, 1, 3), np.float32)
    q[:, 0, 1] = 1.0                                 # greedy: index 1
    state = state.with_q(q).replace(step=jnp.asarray(t, jnp.int32))
    _, aux = learner.act(state, jnp.zeros((4000, 0)), jax.random.key(3))
    off_greedy = float(np.mean(np.asarray(aux["action_index"]) != 1))
    # exploring picks one of the 3 prices uniformly: 2/3 of explorations leave the greedy
    expected = eps0 * np.exp(-beta * t) * 2 / 3
    assert abs(off_greedy - expected) < 4 * np.sqrt(expected * (1 - expected) / 4000)


def test_zero_start_is_always_greedy():
    learner = make({"grid": GRID3, "memory": 0, "q_init": "zero",
                    "epsilon": {"start": 0.0, "decay": 0.0}}, spec(num_agents=500))
    state = learner.init(jax.random.key(0), spec(num_agents=500))
    q = np.zeros((500, 1, 3), np.float32)
    q[:, 0, 2] = 1.0
    _, aux = learner.act(state.with_q(q), jnp.zeros((500, 0)), jax.random.key(1))
    assert np.all(np.asarray(aux["action_index"]) == 2)


def test_boltzmann_frequencies_follow_the_softmax_at_the_decayed_temperature():
    t0, rho, t, n = 2.0, 0.99, 50, 20000
    learner = make({"grid": GRID3, "memory": 0, "q_init": "zero",
                    "boltzmann": {"temperature": t0, "decay": rho}}, spec(num_agents=n))
    state = learner.init(jax.random.key(0), spec(num_agents=n))
    values = np.float32([0.0, 0.5, 1.0])
    state = state.with_q(np.broadcast_to(values, (n, 1, 3))).replace(
        step=jnp.asarray(t, jnp.int32))
    _, aux = learner.act(state, jnp.zeros((n, 0)), jax.random.key(7))
    counts = np.bincount(np.asarray(aux["action_index"]), minlength=3) / n
    temperature = t0 * rho ** t
    expected = np.exp(values / temperature) / np.exp(values / temperature).sum()
    np.testing.assert_allclose(counts, expected, atol=4 * np.sqrt(0.25 / n))
    batch = Transition(obs=jnp.zeros((1, n, 0)), action=jnp.full((1, n, 1), 0.1),
                       reward=jnp.zeros((1, n)), next_obs=jnp.zeros((1, n, 0)),
                       done=jnp.zeros((1, n), bool), aux={})
    _, metrics = learner.update(state, batch)
    assert float(metrics["temperature"]) == pytest.approx(t0 * rho ** (t + 1), rel=1e-5)


def test_constant_and_uniform_initial_q():
    _, state = stateless(q_init={"kind": "constant", "value": 7.5})
    assert np.all(np.asarray(state.q) == 7.5)
    learner = make({"grid": GRID3, "memory": 1, "q_init": {"kind": "uniform", "low": 10,
                                                            "high": 20}}, spec(obs_dim=2))
    q = np.asarray(learner.init(jax.random.key(0), spec(obs_dim=2)).q)     # [2, 9, 3]
    assert q.shape == (2, 9, 3) and q.min() >= 10 and q.max() < 20
    assert len(np.unique(q)) == q.size                    # independent draws
    assert abs(q.mean() - 15) < 4 * 10 / np.sqrt(12 * q.size)
    assert np.array_equal(np.asarray(state.greedy[:, 0]), [0, 0])
    other = np.asarray(learner.init(jax.random.key(1), spec(obs_dim=2)).q)
    assert not np.array_equal(q, other)                   # the key matters


def test_sequential_target_is_kleins_update():
    """Two alternating sellers (seller 0 moves at even t, seller 1 at odd t), each
    observing the rival's price. Seller 0's update at t = 2 is
    Q(s_0, a_0) <- (1 - alpha) Q + alpha (pi_0 + delta pi_1 + delta^2 max Q(s_2, .))."""
    sp = spec(obs_dim=1, turns=(2, 0))
    learner = make({"grid": GRID3, "memory": 1, "learning_rate": ALPHA, "discount": DELTA,
                    "q_init": "zero", "target": "sequential"}, sp)
    state = learner.init(jax.random.key(0), sp)
    q0 = np.arange(18, dtype=np.float32).reshape(2, 3, 3) / 10   # distinct values
    state = state.with_q(q0)
    # periods t = 0, 1, 2, 3: (obs of seller 0, obs of seller 1) = rival prices,
    # actions (grid indices; only the mover's counts), profits
    obs = [(0.1, 0.2), (0.3, 0.2), (0.3, 0.1), (0.2, 0.1)]
    acts = [(2, 0), (2, 1), (0, 1), (0, 0)]
    profits = [(0.5, 0.25), (0.125, 1.0), (2.0, 0.75), (0.0625, 0.5)]
    q = q0.copy()
    for t in range(4):
        batch = one_period(acts[t], profits[t], obs_dim=1, obs=np.asarray(obs[t])[:, None])
        state, _ = learner.update(state, batch)
        # by hand: the mover updates its previous turn's (state, action)
        i = t % 2
        if t >= 2:
            s_prev = round(obs[t - 2][i] * 10) - 1
            a_prev = acts[t - 2][i]
            s_now = round(obs[t][i] * 10) - 1
            g = profits[t - 2][i] + DELTA * profits[t - 1][i] + DELTA ** 2 * q[i, s_now].max()
            q[i, s_prev, a_prev] = (1 - ALPHA) * q[i, s_prev, a_prev] + ALPHA * g
        np.testing.assert_allclose(np.asarray(state.q), q, rtol=1e-6, err_msg=f"t={t}")
    assert not np.array_equal(q, q0)   # both sellers have updated by t = 3


@pytest.mark.parametrize("hyper,field,needle", [
    ({"feedback": "full", "memory": 1}, "feedback", "memory: 0"),
    ({"grid_size": 50000}, "grid_size", "int32"),
    ({"grid": [0.3, 0.2]}, "grid", "increasing"),
    ({"grid": [0.5, 1.5]}, "grid", "action bounds"),
    ({"q_init": "constant"}, "q_init", "value"),
    ({"q_init": {"kind": "uniform", "low": 2, "high": 1}}, "q_init.high", "above low"),
    ({"q_init": {"kind": "normal"}}, "q_init", "uniform"),
    ({"epsilon": {"start": 1.5}}, "epsilon.start", "<= 1"),
    ({"epsilon": {"start": 0.5}, "boltzmann": {"temperature": 1}}, "boltzmann", "one exploration"),
    ({"boltzmann": {"temperature": 0}}, "boltzmann.temperature", "> 0"),
])
def test_bad_options_are_config_errors_naming_the_field(hyper, field, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        qlearning_settings({"memory": 1, **hyper}, spec(obs_dim=2))
    assert err.value.field == f"learners.q_learning.{field}"


def test_full_feedback_needs_an_exact_counterfactual_payoff():
    caveat = "consumer demand changes over time: c (noisy)"
    with pytest.raises(ConfigError, match="noisy") as err:
        qlearning_settings({"memory": 0, "feedback": "full"}, spec(payoff_caveat=caveat))
    assert err.value.field == "learners.q_learning.feedback"


def test_alternating_moves_need_the_sequential_target():
    with pytest.raises(ConfigError, match="sequential") as err:
        qlearning_settings({"memory": 1}, spec(obs_dim=2, turns=(2, 0)))
    assert err.value.field == "learners.q_learning.target"
