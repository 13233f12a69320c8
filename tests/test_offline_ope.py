"""Bandit off-policy estimators on a synthetic bandit whose values are known analytically."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import BanditOPE, make_algo, make_dataset, ope_estimates

MU = np.array([0.5, 0.3, 0.2])           # behaviour propensities
PI = np.array([0.1, 0.2, 0.7])           # target policy
MEAN = np.array([0.2, 0.5, 0.9])         # Bernoulli reward means
TRUE = float(PI @ MEAN)                  # 0.75
N, SEEDS = 500, 400


def logs(key):
    k_a, k_r = jax.random.split(key)
    a = jax.random.choice(k_a, 3, (N,), p=jnp.asarray(MU))
    r = (jax.random.uniform(k_r, (N,)) < jnp.asarray(MEAN)[a]).astype(jnp.float32)
    return a, r


def estimates(key, table):
    a, r = logs(key)
    probs = jnp.broadcast_to(jnp.asarray(PI, jnp.float32), (N, 3))
    tab = jnp.broadcast_to(jnp.asarray(table, jnp.float32), (N, 3))
    return ope_estimates(r, jnp.asarray(MU, jnp.float32)[a], probs, a, tab)


def run(table):
    keys = jax.random.split(jax.random.key(0), SEEDS)
    return {k: np.asarray(v, np.float64) for k, v in jax.jit(jax.vmap(
        lambda k: estimates(k, table)))(keys).items()}


def test_ips_is_unbiased_with_its_analytic_variance():
    est = run(np.full(3, 0.5))
    # Var(w r) = E[w^2 r^2] - V^2 = sum_a pi_a^2 / mu_a * m_a - V^2   (r in {0, 1})
    var = float((PI ** 2 / MU * MEAN).sum() - TRUE ** 2)
    se = np.sqrt(var / N / SEEDS)
    assert abs(est["ips"].mean() - TRUE) < 4 * se
    assert est["ips"].var() == pytest.approx(var / N, rel=0.25)


def test_dr_is_unbiased_with_a_wrong_model_and_dm_is_not():
    wrong = np.array([0.6, 0.1, 0.4])          # every arm's model value is off
    est = run(wrong)
    se = est["dr"].std() / np.sqrt(SEEDS)
    assert abs(est["dr"].mean() - TRUE) < 4 * se
    # DM is exactly sum_a pi_a * model_a, whatever the data
    np.testing.assert_allclose(est["dm"], PI @ wrong, rtol=1e-6)
    assert abs(PI @ wrong - TRUE) > 0.3
    # with the true means as the model, DR = DM = the true value exactly... up to noise
    # term sum w (r - m_a) / n, whose variance is below IPS's
    exact = run(MEAN)
    np.testing.assert_allclose(exact["dm"], TRUE, rtol=1e-6)
    assert exact["dr"].var() < est["ips"].var()


def test_snips_and_ess_formulas():
    r = jnp.array([1.0, 0.0, 2.0, 1.0])
    mu = jnp.array([0.5, 0.5, 0.25, 0.25])
    probs = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    a = jnp.array([0, 0, 1, 1])
    out = ope_estimates(r, mu, probs, a)
    w = np.array([2.0, 0.0, 0.0, 2.0])   # pi(a_i | x_i) / mu_i
    assert float(out["ips"]) == pytest.approx((w * np.array([1, 0, 2, 1])).mean())
    assert float(out["snips"]) == pytest.approx(4.0 / 4.0)
    assert float(out["ess"]) == pytest.approx(16.0 / 8.0)


def test_bandit_ope_evaluator_and_dr_learner_on_logged_prices():
    # a context-free pricing bandit: 3 prices, expected profit 0.2 / 0.5 / 0.9
    rng = np.random.default_rng(0)
    a = rng.choice(3, 3000, p=MU)
    r = (rng.random(3000) < MEAN[a]).astype(np.float32)
    values = [[1.0], [1.5], [2.0]]
    ds = make_dataset(np.zeros((3000, 1)), np.asarray(values)[a], r, log_probs=np.log(MU[a]),
                      action_index=a, meta={"discrete": True, "action_values": values,
                                            "action_low": [1.0], "action_high": [2.0]})
    algo = make_algo("dr", ds, hidden=[16], learning_rate=0.01)
    from jaxmarket.offline import fit
    result = fit(algo, ds, stop=600, chunk=600, batch_size=256)
    # the learner prefers the best price
    np.testing.assert_allclose(algo.policy(result.state, np.zeros((1, 1))), [[2.0]])
    # DM and DR with the learner's own reward model (BanditOPE fits a dm model otherwise)
    table = algo.extras["reward_table"]
    ope = BanditOPE(ds, reward_table=lambda obs: table(result.state, obs))(algo, result.state)
    best = MEAN[2]
    for name in ("ips", "snips", "dm", "dr"):
        # the greedy-ish learned policy's value is close to 0.9; IPS's standard error on
        # 3000 rows with mu = 0.2 on that arm is sqrt(0.9 / 0.2 / 3000) ~ 0.04
        assert abs(ope[name] - best) < 0.15, (name, ope)
    assert 400 < ope["ess"] < 800    # about n * mu(best) = 600 for a near-deterministic pi
    # the default: BanditOPE fits its own dm reward model on the logs
    own = BanditOPE(ds, model_steps=300, model={"learning_rate": 0.03, "hidden": [8]})
    assert abs(own(algo, result.state)["dm"] - best) < 0.15
    with pytest.raises(ConfigError, match="discrete dataset"):
        BanditOPE(make_dataset(np.zeros((5, 1)), np.zeros((5, 1)), np.zeros(5)))
