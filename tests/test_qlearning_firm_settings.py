"""Per-firm q_learning settings: ``learning_rate`` (alpha), ``exploration_decay`` (beta),
``discount`` (delta) and ``q_init`` given as one value per firm (firm ``i`` is agent
``i`` of its market), played as data by the session engine's backends and the training
loop's learner, and used by the diagnostics and impulse responses."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.analysis.impulse import Strategies, _discount
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.base import Transition
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.learners.qlearning import make, slot_epsilon
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.diagnostics import profile_values, true_q
from jaxmarket.sessions.engine import Settings
from jaxmarket.sessions.game import kernel_reason, make_game
from jaxmarket.sessions.run import session_plan
from jaxmarket.train.slots import tile_spec

SMALL = ("learners.sellers.grid_size=5", "learners.sellers.convergence_window=50")
RUN = {"sessions": 4, "periods": 300, "chunk": 100, "window": 50, "stop": "periods"}


@functools.cache
def game(*items: str):
    return make_game(session_plan(load_config("configs/calvano.yaml", list(SMALL + items))))


def run(g, backend: str = "xla", seed: int = 0):
    return eng.run(g, Settings(**RUN, backend=backend), jax.random.key(seed), compact=False)


@pytest.mark.slow
def test_a_firm_with_a_negligible_learning_rate_keeps_its_initial_q():
    # alpha_2 = 1e-30: every increment alpha (target - Q) is below half an ulp of Q
    # (|target - Q| < 1e3, Q ~ 1..10), so firm 2's float32 table stays exactly Q0 while
    # firm 1 (alpha 0.3) learns. Bug caught: one alpha for every firm (firm 0's, or the
    # mean), or alpha read by the wrong slot.
    g = game("learners.sellers.learning_rate=[0.3, 1e-30]")
    q0 = np.asarray(g.learner.init(jax.random.key(0), g.spec).rows)            # [2, Z, m+1]
    rows = np.asarray(run(g).sessions.learner.rows)                            # [S, 2, Z, m+1]
    for s in range(rows.shape[0]):
        np.testing.assert_array_equal(rows[s, 1], q0[1])
        assert np.sum(rows[s, 0] != q0[0]) > 20


def test_each_firm_explores_with_its_own_decay():
    # eps_i,t = exp(-beta_i t): with beta = (0.01, 0.001) at t = 100, firm 1 explores
    # with exp(-1) = 0.368, firm 2 with exp(-0.1) = 0.905. Bug caught: one beta for all.
    betas = np.array([0.01, 0.001], np.float32)
    g = game("learners.sellers.exploration_decay=[0.01, 0.001]")
    state = g.learner.init(jax.random.key(0), g.spec)
    for t in (0, 100, 1000):
        eps = np.asarray(slot_epsilon(g.settings, state.replace(step=jnp.int32(t))))
        np.testing.assert_allclose(eps, np.exp(-betas.astype(np.float64) * t), rtol=1e-6)
    # and exploration as played: at t = 100, firm 2 (eps 0.905) leaves its greedy price
    # far more often than firm 1 (eps 0.368): a random price differs from the greedy
    # one with probability (m - 1)/m
    state = state.replace(step=jnp.int32(100))
    obs = g.obs[jnp.zeros((), jnp.int32)]
    keys = jax.random.split(jax.random.key(1), 4000)
    acts = np.asarray(jax.vmap(lambda k: g.learner.act(state, obs, k)[1]["action_index"])(keys))
    greedy = np.asarray(state.greedy[jnp.arange(2), 0])
    off = (acts != greedy).mean(0)
    expect = np.exp(-betas.astype(np.float64) * 100) * 4 / 5
    np.testing.assert_allclose(off, expect, atol=0.03)


def test_one_update_discounts_each_firm_with_its_own_delta():
    # q_init constant 10, one period: Q_i[s, a_i] = (1 - alpha) 10 + alpha (r_i + delta_i 10)
    # (every entry of Q0 is 10, so max_a' Q0[s', a'] = 10). Bug caught: firm 0's delta
    # for both, or the deltas swapped.
    g = game("learners.sellers.discount=[0.9, 0.2]", "learners.sellers.learning_rate=0.5",
             "learners.sellers.q_init={kind: constant, value: 10.0}")
    state = g.learner.init(jax.random.key(0), g.spec)
    a = jnp.array([[1, 3]], jnp.int32)
    r = jnp.array([[0.3, 0.4]], jnp.float32)
    batch = Transition(obs=g.obs[0][None], action=g.grid.profile_price(a[0])[None, :, None],
                       reward=r, next_obs=g.obs[7][None], done=jnp.zeros((1, 2), bool),
                       aux={"action_index": a})
    new, _ = g.learner.update(state, batch)
    q = np.asarray(new.q)
    got = np.array([q[0, 0, 1], q[1, 0, 3]])
    np.testing.assert_allclose(got, 0.5 * 10 + 0.5 * (np.array([0.3, 0.4])
                                                     + np.array([0.9, 0.2]) * 10), rtol=1e-6)
    assert kernel_reason(g) is None   # the kernel's general loop plays per-firm deltas


def test_random_rival_q0_divides_each_firm_by_its_own_one_minus_delta():
    # Q0_i = E[pi_i] / (1 - delta_i): the per-firm run's row i times (1 - delta_i)
    # equals the one-delta run's row i times (1 - delta).
    per_firm = np.asarray(game("learners.sellers.discount=[0.9, 0.5]").learner.init(
        jax.random.key(0), game("learners.sellers.discount=[0.9, 0.5]").spec).q)
    one = np.asarray(game().learner.init(jax.random.key(0), game().spec).q)     # delta 0.95
    for i, d in enumerate((0.9, 0.5)):
        np.testing.assert_allclose(per_firm[i] * (1 - d), one[i] * (1 - 0.95), rtol=1e-5)


def test_per_firm_q_init_kinds():
    g = game("learners.sellers.q_init=[zero, {kind: constant, value: 3.0}]")
    q = np.asarray(g.learner.init(jax.random.key(0), g.spec).q)
    assert np.all(q[0] == 0.0) and np.all(q[1] == 3.0)


def test_kernel_plays_per_firm_alpha_and_beta_as_xla_bit_for_bit():
    # Bug caught: a kernel that reads one alpha/beta for all sellers (its alpha [S, n]
    # and beta_row [S, n] come from the learner state's per-policy hyper).
    g = game("learners.sellers.learning_rate=[0.3, 0.1]",
             "learners.sellers.exploration_decay=[0.02, 0.005]",
             "learners.sellers.discount=0.5")
    assert kernel_reason(g) is None
    xla, kernel = run(g, "xla", 3), run(g, "kernel", 3)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")
    for a, b in ((xla.sessions.learner.rows, kernel.sessions.learner.rows),
                 (xla.sessions.index, kernel.sessions.index),
                 (xla.sessions.tail, kernel.sessions.tail)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the per-firm values changed the play: not the run of firm 0's values for both
    same = run(game("learners.sellers.learning_rate=0.3",
                    "learners.sellers.exploration_decay=0.02",
                    "learners.sellers.discount=0.5"), "xla", 3)
    assert not np.array_equal(np.asarray(same.sessions.learner.rows),
                              np.asarray(xla.sessions.learner.rows))


def test_kernel_plays_per_firm_discounts_as_xla_bit_for_bit_and_auto_takes_it():
    # Bug caught: a kernel that plays one delta for every seller (firm 0's, or the plain
    # loop's scalar), or auto still sending per-firm discounts to xla.
    g = game("learners.sellers.discount=[0.9, 0.3]", "learners.sellers.learning_rate=0.3",
             "learners.sellers.exploration_decay=0.02")
    assert eng.choose_backend(g, "auto") == ("kernel", None)
    assert eng.choose_backend(g, "kernel") == ("kernel", None)
    xla, kernel = run(g, "xla", 3), run(g, "kernel", 3)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")
    for a, b in ((xla.sessions.learner.rows, kernel.sessions.learner.rows),
                 (xla.sessions.index, kernel.sessions.index),
                 (xla.sessions.tail, kernel.sessions.tail)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the second firm's delta matters: not the run of firm 0's delta for both
    same = run(game("learners.sellers.discount=0.9", "learners.sellers.learning_rate=0.3",
                    "learners.sellers.exploration_decay=0.02"), "xla", 3)
    assert not np.array_equal(np.asarray(same.sessions.learner.rows)[:, 1],
                              np.asarray(xla.sessions.learner.rows)[:, 1])


def test_equal_lists_play_exactly_as_the_scalar():
    items = ("learners.sellers.learning_rate=0.2", "learners.sellers.exploration_decay=0.01",
             "learners.sellers.discount=0.9", "learners.sellers.q_init=zero")
    lists = ("learners.sellers.learning_rate=[0.2, 0.2]",
             "learners.sellers.exploration_decay=[0.01, 0.01]",
             "learners.sellers.discount=[0.9, 0.9]", "learners.sellers.q_init=[zero, zero]")
    a, b = run(game(*items)), run(game(*lists))
    for x, y in ((a.sessions.learner.rows, b.sessions.learner.rows),
                 (a.sessions.index, b.sessions.index), (a.cycle_reward, b.cycle_reward)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_loop_learner_holds_each_slots_firm_values():
    # the training loop's spec: 3 envs x 2 seeds x 2 firms = 12 slots
    cfg = load_config("configs/calvano.yaml", list(SMALL) + [
        "learners.sellers.learning_rate=[0.3, 0.1]",
        "learners.sellers.exploration_decay=[1e-5, 2e-5]"])
    plan = session_plan(cfg)
    spec = tile_spec(group_learner_spec(plan.env, plan.params, "sellers"), num_envs=3,
                     num_seeds=2)
    learner = make({k: v for k, v in cfg["learners"]["sellers"].items() if k != "kind"}, spec)
    state = learner.init(jax.random.key(0), spec)
    firm = np.arange(12) % 2
    alpha = np.asarray(state.hyper["learning_rate"])[np.asarray(state.policy_index)]
    beta = np.asarray(state.hyper["exploration_decay"])[np.asarray(state.policy_index)]
    np.testing.assert_array_equal(alpha, np.float32([0.3, 0.1])[firm])
    np.testing.assert_array_equal(beta, np.float32([1e-5, 2e-5])[firm])


@pytest.mark.parametrize("item, field, says", [
    ("learners.sellers.learning_rate=[0.1, 0.2, 0.3]", "learners.sellers.learning_rate",
     "a list of 2 numbers"),
    ("learners.sellers.discount=[0.9]", "learners.sellers.discount", "a list of 2 numbers"),
    ("learners.sellers.exploration_decay=[1e-5, -1.0]", "learners.sellers.exploration_decay",
     ">= 0"),
    ("learners.sellers.q_init=[zero, zero, zero]", "learners.sellers.q_init", "a list of 2"),
    ("learners.sellers.q_init=[zero, {kind: uniform, low: 0, high: 1}]",
     "learners.sellers.q_init", "where one is uniform"),
    ("learners.sellers.exploration_decay=[1e-5, 2e-5]", "learners.sellers.exploration_decay",
     "epsilon.decay"),
])
def test_bad_per_firm_settings_are_config_errors_naming_the_field(item, field, says):
    extra = ("learners.sellers.epsilon={start: 1.0, decay: 1e-5}",) if says == \
        "epsilon.decay" else ()
    with pytest.raises(ConfigError) as err:
        game(item, *extra)
    # the field itself, or its entry (learners.sellers.exploration_decay[1])
    assert err.value.field.split("[")[0] == field and says in err.value.allowed, err.value


def test_diagnostics_and_impulse_use_each_firms_own_delta():
    rng = np.random.default_rng(0)
    reward = rng.uniform(0, 1, (9, 2))                      # m = 3, n = 2: J = 9
    nxt = rng.integers(0, 9, (4, 9))
    both = profile_values(reward, nxt, np.array([0.9, 0.3]))
    for i, d in enumerate((0.9, 0.3)):
        np.testing.assert_allclose(both[..., i], profile_values(reward, nxt, d)[..., i],
                                   rtol=1e-12)
    actions = rng.integers(0, 3, (4, 9, 2))
    q = true_q(reward, actions, both, 3, np.array([0.9, 0.3]))
    for i, d in enumerate((0.9, 0.3)):
        one = true_q(reward, actions, profile_values(reward, nxt, d), 3, d)
        np.testing.assert_allclose(q[:, :, i], one[:, :, i], rtol=1e-12)
    s = Strategies(greedy=np.zeros((1, 2, 1), np.int64), last=np.zeros((1, 0), np.int64),
                   grid=np.linspace(1, 2, 3), memory=0, discount=(0.9, 0.3))
    assert (_discount(None, s, 0), _discount(None, s, 1)) == (0.9, 0.3)
