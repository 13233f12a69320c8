"""SingleAgentEnv(normalize_actions=True): the [-1, 1] action view for continuous-control
code, and the PureJaxRL-style PPO example (docs/examples/continuous_ppo_monopoly.py).

Expected prices are computed here from the bounds written in the configs / overrides and
the documented formula ``low + (clip(a, -1, 1) + 1) / 2 * (high - low)``, and read back
from real market steps.
"""

import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONFIGS, ROOT
from gymnax.wrappers.purerl import LogWrapper
from scipy.optimize import brentq

import jaxmarket
from jaxmarket.market.economics import logit_profits
from jaxmarket.adapters.single_agent import SingleAgentEnv

# Three products, a posted-price seller group and a budget-setting buyer group, with
# distinct bounds per agent and product, so that a view reading the wrong agent's row or
# the wrong product's bound gives a different price / budget.
POSTED_LOW = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]]
POSTED_HIGH = [[1.0, 2.0, 3.0], [1.5, 2.5, 3.5], [2.0, 2.2, 2.4]]
BUDGET_LOW = [[0.1, 0.2, 0.3], [0.3, 0.4, 0.5]]
BUDGET_HIGH = [[2.0, 1.0, 3.0], [1.2, 1.8, 2.6]]
MULTI = {"market": {
    "num_products": 3,
    "consumers": [
        {"name": "consumer", "count": 1, "budget": 5.0, "queries": 1.0},
        {"name": "buyers", "count": 2, "agent": True, "budget": 1.0, "queries": 1.0,
         "budget_low": BUDGET_LOW, "budget_high": BUDGET_HIGH,
         "reward": [{"kind": "regret_ratio"}]}],
    "sellers": [{"name": "posted", "count": 3, "action": "price", "low": POSTED_LOW,
                 "high": POSTED_HIGH, "cost": 0.1, "reward": [{"kind": "profit"}]}],
    "distributor": {"kind": "logit", "temperature": 0.5, "outside_option": True}}}


def rescale(a, low, high):
    a = np.clip(np.asarray(a, np.float64), -1.0, 1.0)
    return np.asarray(low) + (a + 1.0) / 2.0 * (np.asarray(high) - np.asarray(low))


def market_value(group, agent, state, info):
    """The price (sellers, from info["prices"]) or budget (buyers, from the state) that
    the market applied for one agent after a step."""
    if group == "buyers":
        return np.asarray(state.market.budgets[group][agent])
    return np.asarray(info["prices"][group][agent])


@pytest.fixture(scope="module")
def multi():
    return jaxmarket.make(MULTI)


def test_normalized_action_space_is_unit_box_of_the_agents_shape(multi):
    env, params = multi
    for group in ("posted", "buyers"):
        view = SingleAgentEnv(env, group, agent=1, params=params, normalize_actions=True)
        box = view.action_space(params)
        assert box.shape == (3,)
        np.testing.assert_array_equal(np.broadcast_to(box.low, box.shape), -1.0)
        np.testing.assert_array_equal(np.broadcast_to(box.high, box.shape), 1.0)
        sample = np.asarray(box.sample(jax.random.key(0)))
        assert sample.shape == (3,) and np.all(np.abs(sample) <= 1.0)
    # the default keeps the agent's own bounds (market units)
    raw = SingleAgentEnv(env, "posted", agent=1, params=params).action_space(params)
    np.testing.assert_allclose(raw.low, POSTED_LOW[1], rtol=1e-6)
    np.testing.assert_allclose(raw.high, POSTED_HIGH[1], rtol=1e-6)


@pytest.mark.parametrize("group,agent,low,high", [
    ("posted", 1, POSTED_LOW[1], POSTED_HIGH[1]),
    ("posted", 2, POSTED_LOW[2], POSTED_HIGH[2]),
    ("buyers", 1, BUDGET_LOW[1], BUDGET_HIGH[1]),
])
def test_minus_one_zero_plus_one_give_low_midpoint_high_after_a_step(multi, group, agent,
                                                                     low, high):
    env, params = multi
    view = SingleAgentEnv(env, group, agent=agent, params=params, normalize_actions=True)
    _, state = view.reset(jax.random.key(0), params)
    low, high = np.asarray(low), np.asarray(high)
    cases = {-1.0: low, 0.0: (low + high) / 2.0, 1.0: high}
    for a, expected in cases.items():
        _, new, *_, info = view.step(jax.random.key(1), state, jnp.full((3,), a), params)
        np.testing.assert_allclose(market_value(group, agent, new, info), expected,
                                   rtol=1e-6, err_msg=f"action {a}")
    # mixed per product, interior values
    a = np.array([-0.5, 0.25, 0.9])
    _, new, *_, info = view.step(jax.random.key(1), state, jnp.asarray(a), params)
    np.testing.assert_allclose(market_value(group, agent, new, info), rescale(a, low, high),
                               rtol=1e-6)


def test_out_of_range_actions_are_clipped_to_the_unit_box(multi):
    env, params = multi
    view = SingleAgentEnv(env, "posted", agent=1, params=params, normalize_actions=True)
    _, state = view.reset(jax.random.key(0), params)
    low, high = np.asarray(POSTED_LOW[1]), np.asarray(POSTED_HIGH[1])
    a = jnp.array([-7.0, 3.0, 1.5])
    expected = np.array([low[0], high[1], high[2]])
    _, new, *_, info = view.step(jax.random.key(1), state, a, params)
    np.testing.assert_allclose(info["prices"]["posted"][1], expected, rtol=1e-6)
    # the market clips to its bounds too, so also check what the view itself sends
    np.testing.assert_allclose(view.market_action(a, params), expected, rtol=1e-6)


def test_normalized_reward_equals_unnormalized_reward_at_rescaled_price():
    """Duopoly, agent 1 acting against a constant rival at 1.5, through LogWrapper under
    jit(vmap) over actions: the normalised view at a earns exactly what the raw view earns
    at the rescaled price (same keys), which is the closed-form logit profit."""
    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml", ["market.episode_length=1"])
    others = {"sellers": {"kind": "constant", "value": 1.5}}
    norm = LogWrapper(SingleAgentEnv(env, "sellers", agent=1, others=others, params=params,
                                     normalize_actions=True))
    raw = LogWrapper(SingleAgentEnv(env, "sellers", agent=1, others=others, params=params))
    actions = np.array([-1.0, -0.37, 0.0, 0.0693, 0.6, 1.0, 2.5])
    prices = rescale(actions, 1.0, 2.5)            # configs/logit_duopoly.yaml bounds

    def one(view, action, key):
        _, state = view.reset(key, params)
        _, _, reward, _, _, info = view.step(key, state, action, params)
        return reward, info["returned_episode_returns"], info["prices"]["sellers"][:, 0]

    keys = jax.random.split(jax.random.key(3), len(actions))
    r_norm, ret_norm, p_norm = jax.jit(jax.vmap(lambda a, k: one(norm, a, k)))(
        jnp.asarray(actions[:, None], jnp.float32), keys)
    r_raw, _, p_raw = jax.jit(jax.vmap(lambda a, k: one(raw, a, k)))(
        jnp.asarray(prices[:, None], jnp.float32), keys)
    np.testing.assert_allclose(p_norm[:, 1], prices, rtol=1e-6)
    np.testing.assert_allclose(p_norm[:, 0], 1.5, rtol=1e-6)   # the rival is untouched
    np.testing.assert_allclose(r_norm, r_raw, rtol=1e-6)
    np.testing.assert_allclose(ret_norm, r_norm, rtol=1e-6)    # one-step episodes
    closed = logit_profits(np.stack([np.full_like(prices, 1.5), prices], -1))[:, 1]
    np.testing.assert_allclose(r_norm, closed, rtol=1e-5, atol=1e-7)


def test_default_view_passes_market_units_through():
    env, params = jaxmarket.make(CONFIGS / "logit_monopoly.yaml")
    view = SingleAgentEnv(env, "seller", params=params)
    assert view.normalize_actions is False
    _, state = view.reset(jax.random.key(0), params)
    _, _, reward, *_, info = view.step(jax.random.key(1), state, jnp.array([1.8]), params)
    np.testing.assert_allclose(info["prices"]["seller"][0], 1.8, rtol=1e-6)
    np.testing.assert_allclose(reward, logit_profits(np.array([1.8]))[0], rtol=1e-5)


# ----------------------------------------------------------------- the PPO example

@pytest.fixture(scope="module")
def example():
    path = ROOT / "docs" / "examples" / "continuous_ppo_monopoly.py"
    spec = importlib.util.spec_from_file_location("continuous_ppo_monopoly", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # flax dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def monopoly_foc_price(a=2.0, c=1.0, a0=0.0, mu=0.25) -> float:
    """Root of the logit monopoly first-order condition ``p - c = mu / (1 - share(p))``,
    ``share(p) = e^((a-p)/mu) / (e^((a-p)/mu) + e^(a0/mu))`` (configs/logit_monopoly.yaml:
    a = 2, c = 1, a0 = 0, mu = 0.25)."""
    def gap(p):
        share = 1.0 / (1.0 + np.exp((a0 - a + p) / mu))
        return (p - c) - mu / (1.0 - share)
    return brentq(gap, c, c + 10.0, xtol=1e-12)


def test_example_ppo_learns_the_monopoly_price_from_far_away(example):
    """The seller's upper bound is raised to 4 (p* is unchanged), so the untrained policy
    (mean action 0) starts at the midpoint 2.5, 0.70 above p* = 1.8020.

    Tolerance 0.01 (0.55 % of p*, 1.4 % of the way from the start): over seeds 0-5 this
    budget (100k steps, 390 updates) ended 0.0007-0.0013 from p*, and the std floor biases
    the optimum of the smoothed profit by ~std^2 ~ 1e-4. A learner that stopped short
    (e.g. 20k steps ended 0.007-0.012 off) or a view that did not reach [1, 4] fails it.
    """
    out = example.run(100_000, seed=0, overrides=["market.sellers[0].high=4.0"])
    p_star = monopoly_foc_price()
    assert abs(p_star - 1.8020) < 1e-4
    assert abs(out["price"] - p_star) < 0.01, (out["price"], p_star)
    assert out["reward"][-1] > 0.99 * logit_profits(np.array([p_star]))[0]


def test_example_ppo_without_normalize_actions_earns_nothing(example):
    """Motivation: the same code without the flag posts clip(a, -1, 1), which the market
    clips up to low = 1 = cost; every step earns exactly 0 and the price stays at 1."""
    out = example.run(10_000, seed=0, normalize_actions=False)
    assert out["price"] == 1.0
    np.testing.assert_array_equal(out["reward"], 0.0)
