"""Reward and observation combinators against direct computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.combinators.observations import build_observation
from jaxmarket.combinators.rewards import build_reward
from jaxmarket.combinators.view import GroupView
from jaxmarket.config.errors import ConfigError

RNG = np.random.default_rng(0)
S, P, C = 5, 3, 4


def make_view(n=3, offset=1, **kw):
    prices = RNG.uniform(0.5, 2.0, (S, P)).astype(np.float32)
    base = dict(
        action=prices[offset:offset + n], price=prices[offset:offset + n],
        traffic=RNG.uniform(0, 5, (n, P)).astype(np.float32),
        fees=RNG.uniform(0, 5, (n, P)).astype(np.float32),
        cost=np.full((n, P), 0.3, np.float32), value=np.full((n, P), 1.2, np.float32),
        sent=RNG.uniform(1, 5, (n, P)).astype(np.float32),
        budget=RNG.uniform(1, 2, (n, P)).astype(np.float32),
        all_prices=prices, self_index=np.arange(offset, offset + n),
        budgets=RNG.uniform(0, 2, (C, P)).astype(np.float32),
        time=np.int32(7), episode_length=np.int32(20),
        price_history=RNG.uniform(0, 1, (2, S, P)).astype(np.float32),
        last_reward=np.array([1.0, -2.0, 3.0][:n], np.float32))
    base.update(kw)
    return GroupView(**{k: jnp.asarray(v) for k, v in base.items()})


def test_profit_revenue_traffic_surplus_terms():
    v = make_view()
    fees, traffic = np.asarray(v.fees), np.asarray(v.traffic)
    np.testing.assert_allclose(build_reward([{"kind": "revenue"}], 3, "r", "seller")(v), fees.sum(-1), rtol=1e-6)
    np.testing.assert_allclose(build_reward([{"kind": "profit"}], 3, "r", "seller")(v),
                               (fees - 0.3 * traffic).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(build_reward([{"kind": "traffic"}], 3, "r", "seller")(v), traffic.sum(-1), rtol=1e-6)
    np.testing.assert_allclose(build_reward([{"kind": "surplus"}], 3, "r", "seller")(v),
                               (1.2 * traffic - fees).sum(-1), rtol=1e-5)


def test_team_averages_within_teams_then_scale_and_clip_in_order():
    v = make_view()
    profit = (np.asarray(v.fees) - 0.3 * np.asarray(v.traffic)).sum(-1)
    chain = [{"kind": "profit"}, {"kind": "team", "teams": [4, 9, 4]},
             {"kind": "scale", "factor": 2.0}, {"kind": "clip", "low": -1.0, "high": 10.0}]
    got = build_reward(chain, 3, "r", "seller")(v)
    team = np.array([(profit[0] + profit[2]) / 2, profit[1], (profit[0] + profit[2]) / 2])
    np.testing.assert_allclose(got, np.clip(2 * team, -1, 10), rtol=1e-5)


def test_sum_is_weighted_sum_of_sub_chains():
    v = make_view()
    got = build_reward([{"kind": "sum", "terms": [{"kind": "revenue"}, {"kind": "traffic"}],
                         "weights": [1.0, -0.5]}], 3, "r", "seller")(v)
    np.testing.assert_allclose(got, np.asarray(v.fees).sum(-1) - 0.5 * np.asarray(v.traffic).sum(-1),
                               rtol=1e-5)


def test_regret_ratio_is_spend_over_budget_times_queries():
    v = make_view()
    got = build_reward([{"kind": "regret_ratio"}], 3, "r", "consumer")(v)
    want = np.asarray(v.fees).sum(-1) / (np.asarray(v.budget) * np.asarray(v.sent)).sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_clip_bounds_checked():
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "clip", "low": 2.0, "high": 1.0}], 3, "g.reward", "seller")
    assert info.value.field == "g.reward[0].low"


def test_competitor_summaries_exclude_self():
    v = make_view()
    prices, me = np.asarray(v.all_prices), np.asarray(v.self_index)
    obs = build_observation([{"kind": "competitor_prices", "summary": ["min", "mean", "max"]}], "o")(v)
    for row, i in enumerate(me):
        others = np.delete(prices, i, axis=0)
        np.testing.assert_allclose(obs[row], np.concatenate(
            [others.min(0), others.mean(0), others.max(0)]), rtol=1e-6)
    full = build_observation([{"kind": "competitor_prices", "summary": "all"}], "o")(v)
    for row, i in enumerate(me):
        np.testing.assert_allclose(full[row], np.delete(prices, i, axis=0).ravel())


def test_competitor_min_with_tied_prices():
    prices = np.ones((S, P), np.float32)
    v = make_view(all_prices=prices)
    obs = build_observation([{"kind": "competitor_prices", "summary": ["min"]}], "o")(v)
    np.testing.assert_allclose(obs, 1.0)


def test_concatenation_order_and_other_components():
    v = make_view()
    cfg = [{"kind": "own_price"}, {"kind": "own_reward"}, {"kind": "time", "period": 4.0},
           {"kind": "budgets"}, {"kind": "history", "k": 2}, {"kind": "own_traffic"}]
    obs = np.asarray(build_observation(cfg, "o")(v))
    n = 3
    hist = np.asarray(v.price_history).ravel()
    want = np.concatenate([
        np.asarray(v.action), np.asarray(v.last_reward)[:, None],
        np.tile([7 / 20, np.sin(2 * np.pi * 7 / 4), np.cos(2 * np.pi * 7 / 4)], (n, 1)),
        np.tile(np.asarray(v.budgets).mean(0), (n, 1)), np.tile(hist, (n, 1)),
        np.asarray(v.traffic)], axis=1)
    np.testing.assert_allclose(obs, want, rtol=1e-5, atol=1e-6)
    assert build_observation([], "o")(v).shape == (3, 0)
    assert build_observation([{"kind": "empty"}], "o")(v).shape == (3, 0)


def test_observation_summary_validated():
    with pytest.raises(ConfigError) as info:
        build_observation([{"kind": "competitor_prices", "summary": ["median"]}], "g.observation")
    assert info.value.field == "g.observation[0].summary"


def test_jit_of_chain():
    v = make_view()
    fn = build_reward([{"kind": "profit"}, {"kind": "team"}], 3, "r", "seller")
    np.testing.assert_allclose(jax.jit(fn)(v), np.full(3, np.mean(
        (np.asarray(v.fees) - 0.3 * np.asarray(v.traffic)).sum(-1))), rtol=1e-5)
