"""Demand processes against their formulas."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.market.demand import DEMANDS


def run(kind, params, steps, base=None, key=0):
    d = DEMANDS[kind]
    params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    base = jnp.ones((2, 3)) * 10.0 if base is None else base
    state = d.init(params, base.shape)
    out = []
    for t, k in enumerate(jax.random.split(jax.random.key(key), steps)):
        q, state = d.step(k, jnp.int32(t), state, params, base)
        out.append(np.asarray(q))
    return np.stack(out)


def test_constant_returns_base():
    np.testing.assert_allclose(run("constant", {}, 3), 10.0)


def test_noisy_is_unbiased_nonnegative_and_has_sigma_spread():
    base = jnp.full((200, 50), 10.0)
    q = run("noisy", {"sigma": 0.2}, 1, base=base)[0]
    assert q.min() >= 0
    assert abs(q.mean() - 10.0) < 4 * 10.0 * 0.2 / np.sqrt(q.size)
    np.testing.assert_allclose(q.std(), 10.0 * 0.2, rtol=0.05)
    q_big = run("noisy", {"sigma": 5.0}, 1, base=base)[0]
    assert q_big.min() == 0.0  # floored at zero


def test_cyclic_holds_each_level_for_a_period():
    q = run("cyclic", {"period": 2, "levels": [1.0, 3.0, 0.5]}, 7)[:, 0, 0]
    np.testing.assert_allclose(q, 10.0 * np.array([1, 1, 3, 3, 0.5, 0.5, 1]))


def test_regime_switches_at_scheduled_steps():
    q = run("regime", {"steps": [2, 5], "levels": [1.0, 2.0, 0.0]}, 7)[:, 1, 2]
    np.testing.assert_allclose(q, 10.0 * np.array([1, 1, 2, 2, 2, 0, 0]))


def test_shocks_follow_the_recursion():
    rate, size, rho = 1.0, 0.5, 0.8  # a shock every step: m' = 1 + rho (m - 1) + size
    q = run("shocks", {"rate": rate, "size": size, "persistence": rho}, 4)[:, 0, 0]
    m, expected = 1.0, []
    for _ in range(4):
        m = 1 + rho * (m - 1) + size
        expected.append(10.0 * m)
    np.testing.assert_allclose(q, expected, rtol=1e-6)
    np.testing.assert_allclose(run("shocks", {"rate": 0.0, "size": 9.0, "persistence": 0.5}, 3),
                               10.0)
