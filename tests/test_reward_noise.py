"""The ``noise`` reward term: r_i += eps_i drawn from the step's key; the static game (the
benchmarks) takes its expectation; the session engine refuses it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmarket
from jaxmarket.combinators.rewards import expected_reward, is_random
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions.run import choose_engine
from jaxmarket.market.state import current_actions

SCALE = 0.05
NOISY = ["market.sellers.0.reward=[{kind: profit}, {kind: noise, scale: %g}]" % SCALE]
NORMAL = ["market.sellers.0.reward=[{kind: profit}, {kind: noise, dist: normal, scale: %g}]"
          % SCALE]


def _rewards(overrides, keys, quantities=(0.25, 1 / 3)):
    """``[K, 2]`` the firms' rewards of one Cournot step at ``quantities``, one row per key."""
    env, params = jaxmarket.make("configs/cournot.yaml", overrides)

    def one(key):
        _, state = env.reset_env(jax.random.key(0), params)
        acts = current_actions(env.spec, state)
        acts["firms"] = jnp.asarray(quantities, jnp.float32)[:, None]
        return env.step_env(key, state, acts, params)[2]["firms"]

    return np.asarray(jax.vmap(one)(keys), np.float64)


def test_noise_is_the_profit_plus_a_uniform_draw_per_firm_and_period():
    keys = jax.random.split(jax.random.key(3), 4000)
    plain = _rewards([], keys[:1])[0]
    # the clearing price 1 - (1/4 + 1/3) and each firm's profit P q_i, from the formula
    price = 1.0 - (0.25 + 1 / 3)
    np.testing.assert_allclose(plain, [price * 0.25, price / 3], rtol=1e-6)
    eps = _rewards(NOISY, keys) - plain
    assert np.all(np.abs(eps) <= SCALE * (1 + 1e-5))
    # U[-w, w]: mean 0, variance w^2 / 3; the two firms' draws independent
    assert abs(eps.mean()) < 4 * SCALE / np.sqrt(3 * eps.size)
    np.testing.assert_allclose(eps.var(axis=0), SCALE ** 2 / 3, rtol=0.1)
    assert abs(np.corrcoef(eps[:, 0], eps[:, 1])[0, 1]) < 0.06
    # same key, same draw; another key, another draw
    again = _rewards(NOISY, keys[:2]) - plain
    np.testing.assert_array_equal(again, eps[:2])
    assert eps[0, 0] != eps[1, 0]


def test_normal_noise_has_the_scale_as_its_standard_deviation():
    keys = jax.random.split(jax.random.key(5), 4000)
    eps = _rewards(NORMAL, keys) - _rewards([], keys[:1])[0]
    np.testing.assert_allclose(eps.std(axis=0), SCALE, rtol=0.06)
    assert np.abs(eps).max() > SCALE * 2       # unbounded, unlike the uniform


def test_the_noise_leaves_the_other_streams_of_the_step_alone():
    # a random distributor (Cournot's demand shock) draws the same shocks with the noise
    shock = ["market.distributor.shock_values=[0.8, 1.2]",
             "market.distributor.shock_probs=[0.5, 0.5]"]
    keys = jax.random.split(jax.random.key(9), 64)
    plain = _rewards(shock, keys)
    noisy = _rewards(shock + NOISY, keys)
    assert np.all(np.abs(noisy - plain) <= SCALE * (1 + 1e-5))
    assert len(np.unique(np.round(plain[:, 0], 6))) == 2      # both shocks occur


def test_expected_reward_drops_the_random_terms_and_their_weights():
    chain = [{"kind": "profit"}, {"kind": "noise", "scale": 1.0},
             {"kind": "sum", "terms": [{"kind": "noise", "scale": 2.0}, {"kind": "revenue"}],
              "weights": [3.0, 0.5]},
             {"kind": "sum", "terms": [{"kind": "noise", "scale": 2.0}]}]
    assert is_random(chain) and not is_random(chain[:1])
    assert expected_reward(chain) == [
        {"kind": "profit"},
        {"kind": "sum", "terms": [{"kind": "revenue"}], "weights": [0.5]}]
    plain = chain[:1]
    assert expected_reward(plain) is plain


def test_the_benchmarks_are_those_of_the_noiseless_market():
    plain = jaxmarket.equilibrium("configs/cournot.yaml")["firms"]
    noisy = jaxmarket.equilibrium("configs/cournot.yaml", NOISY)["firms"]
    for k in ("nash", "joint", "nash_reward", "joint_reward"):
        np.testing.assert_array_equal(np.asarray(noisy[k]), np.asarray(plain[k]))
    # and those are Cournot's closed forms: q_N = 1/3, q_M = 1/4 on the grid
    np.testing.assert_allclose(np.asarray(plain["nash"]).ravel(), 1 / 3, atol=1e-6)


def test_the_session_engine_refuses_a_noisy_reward():
    config = load_config("configs/cournot.yaml", NOISY)
    engine, reason, _ = choose_engine(config)
    assert engine == "loop" and "noise" in reason
    with pytest.raises(ConfigError, match="train.engine"):
        choose_engine(load_config("configs/cournot.yaml", NOISY + ["train.engine=sessions"]))


def test_a_bad_scale_names_the_field():
    with pytest.raises(ConfigError, match=r"reward\[1\]\.scale"):
        jaxmarket.make("configs/cournot.yaml", ["market.sellers.0.reward=[{kind: profit}, "
                                   "{kind: noise, scale: -1}]"])
