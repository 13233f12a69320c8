"""The ``linear`` distributor (linear differentiated demand, docs/distributors.md) against
its formula worked out here in numpy, and the static equilibria the solver finds on it
against the closed forms of jaxmarket.market.economics."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmarket
from jaxmarket.config.errors import ConfigError
from jaxmarket.market import economics
from jaxmarket.market.distributors import DISTRIBUTORS, Quotes

A, B, G = 0.48, 0.9, 0.6          # p_N = 0.48 / (1.8 - 0.6) = 0.4, p_M = (0.48 / 0.3) / 2 = 0.8
# float32 profits locate a smooth optimum only to a flat top: a seller's profit is
# pi* - b (p - p*)^2 near it, and float32 resolves pi* ~ 0.14-0.19 to ~1e-8 absolute, so
# prices within sqrt(1e-8 / 0.9) ~ 1e-4 of p* tie; twice that (as tests/test_equilibrium.py)
PRICE_TOL = 2e-4

CONFIG = {
    "market": {
        "num_products": 1,
        "consumers": [{"name": "buyers", "count": 1, "queries": 1.0}],
        "sellers": [{"name": "firms", "count": 2, "action": "price", "low": 0.0,
                     # high 1.0, not far above p_M: see test_a_seller_priced_out_...
                     "high": 1.0, "initial": 0.6, "cost": 0.0,
                     "reward": [{"kind": "profit"}]}],
        "distributor": {"kind": "linear", "intercept": A, "own_slope": B, "cross_slope": G},
    },
    "learners": {"firms": {"kind": "ppo_bandit"}},
}


def quotes(price, queries, *, is_multiplier=None, base_price=1.0) -> Quotes:
    price = np.asarray(price, np.float32)
    queries = np.asarray(queries, np.float32)
    (S, P), C = price.shape, queries.shape[0]
    mult = np.zeros(S, bool) if is_multiplier is None else np.asarray(is_multiplier, bool)
    return Quotes(price=price, is_multiplier=mult, budget=np.zeros((C, P), np.float32),
                  queries=queries, base_price=np.full((C, P), base_price, np.float32),
                  quality=np.zeros((S, P), np.float32), reliability=np.ones((S, P), np.float32),
                  latency=np.zeros((S, P), np.float32), freshness=np.zeros((S, P), np.float32),
                  stake=np.ones((S, P), np.float32))


def allocate(q: Quotes, a=A, b=B, g=G):
    params = {"intercept": np.float32(a), "own_slope": np.float32(b),
              "cross_slope": np.float32(g)}
    return DISTRIBUTORS["linear"].allocate(jax.random.PRNGKey(0), q, params, {})


def expected_quantity(prices: np.ndarray, a: float, b: float, g: float) -> np.ndarray:
    """q_s = max(a - b p_s + g sum_{j != s} p_j, 0), seller by seller (float64)."""
    out = np.zeros_like(prices, np.float64)
    for s in range(prices.shape[0]):
        rivals = sum(prices[j] for j in range(prices.shape[0]) if j != s)
        out[s] = np.maximum(a - b * prices[s] + g * rivals, 0.0)
    return out


def test_three_sellers_get_the_formula_with_one_clipped_at_zero():
    # seller 1 is a multiplier seller: it quotes m x base 0.4 (1.25 -> 0.5, 1.5 -> 0.6).
    # product 0: seller 2 priced high enough that its demand is negative, clipped to 0:
    #   q_0 = 0.48 - 0.9*0.2 + 0.6*(0.5 + 2.0) = 1.80, q_1 = 0.48 - 0.45 + 0.6*2.2 = 1.35,
    #   q_2 = 0.48 - 0.9*2.0 + 0.6*0.7 = -0.90 -> 0
    price = np.array([[0.2, 0.3], [1.25, 1.5], [2.0, 0.1]])
    is_mult = np.array([False, True, False])
    q = quotes(price, [[1.0, 0.0], [3.0, 0.0]], is_multiplier=is_mult, base_price=0.4)
    alloc = allocate(q)
    quoted = np.where(is_mult[:, None], price * 0.4, price)
    qty = expected_quantity(quoted, A, B, G)
    assert qty[2, 0] == 0.0 and A - B * 2.0 + G * 0.7 < 0     # the clip binds
    np.testing.assert_allclose(qty[:, 0], [1.80, 1.35, 0.0], atol=1e-12)
    np.testing.assert_allclose(alloc.traffic, qty, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(alloc.fees, quoted * qty, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(alloc.unserved, 0.0)
    # product 0: queries 1 : 3 split what is sold; product 1: nobody sends, equal halves
    w = np.array([[0.25, 0.5], [0.75, 0.5]])
    np.testing.assert_allclose(alloc.sent, w * qty.sum(0), rtol=1e-6)
    np.testing.assert_allclose(alloc.spend, w * (quoted * qty).sum(0), rtol=1e-6)


def test_queries_are_conserved_and_everything_stays_finite():
    rng = np.random.default_rng(0)
    for _ in range(20):
        price = rng.choice([0.0, 1e-3, 0.5, 2.0, 1e30, np.inf, np.nan], size=(4, 3))
        queries = rng.choice([0.0, 1.0, 7.0, 1e30], size=(3, 3))
        alloc = allocate(quotes(price, queries), a=1.0, b=rng.choice([1e-3, 1.0, 1e30]),
                         g=rng.choice([0.0, 0.5, 1e30]))
        for name in ("traffic", "fees", "unserved", "spend", "sent"):
            x = np.asarray(getattr(alloc, name), np.float64)
            assert np.all(np.isfinite(x)) and np.all(x >= 0), name
        traffic = np.asarray(alloc.traffic, np.float64).sum(0)
        np.testing.assert_allclose(traffic + np.asarray(alloc.unserved, np.float64).sum(0),
                                   np.asarray(alloc.sent, np.float64).sum(0), rtol=1e-5)


def test_params_vmap_and_the_rule_is_deterministic():
    q = quotes([[0.3], [0.6]], [[1.0]])
    d = DISTRIBUTORS["linear"]
    assert d.is_deterministic({}) and not d.dense and d.actions == ("price", "multiplier")
    slopes = jnp.asarray([0.5, 0.9, 1.2], jnp.float32)
    traffic = jax.vmap(lambda b: d.allocate(None, q, {"own_slope": b}, {}).traffic)(slopes)
    for i, b in enumerate([0.5, 0.9, 1.2]):    # defaults: a = 1, g = 0.5
        np.testing.assert_allclose(traffic[i, :, 0], expected_quantity(
            np.array([0.3, 0.6]), 1.0, b, 0.5), rtol=1e-6)


def test_closed_forms():
    assert economics.linear_nash_price(2, A, B, G, 0.0) == pytest.approx(0.4)
    assert economics.linear_monopoly_price(2, A, B, G, 0.0) == pytest.approx(0.8)
    # the first-order conditions, with a cost and three firms
    n, a, b, g, c = 3, 1.0, 1.0, 0.3, 0.2
    p = economics.linear_nash_price(n, a, b, g, c)
    assert a - 2 * b * p + b * c + g * (n - 1) * p == pytest.approx(0.0, abs=1e-12)
    m = economics.linear_monopoly_price(n, a, b, g, c)
    big_b = b - g * (n - 1)
    assert a - 2 * big_b * m + big_b * c == pytest.approx(0.0, abs=1e-12)
    assert economics.linear_nash_profit(n, a, b, g, c) == pytest.approx(b * (p - c) ** 2)
    assert economics.linear_monopoly_profit(n, a, b, g, c) == pytest.approx(
        (a - big_b * c) ** 2 / (4 * big_b))
    assert economics.linear_monopoly_profit(n, a, b, g, c) > economics.linear_nash_profit(
        n, a, b, g, c)


@pytest.fixture(scope="module")
def solved():
    return jaxmarket.equilibrium(CONFIG)["firms"]


def test_the_solver_finds_the_closed_form_nash_and_joint_monopoly(solved):
    p_n = economics.linear_nash_price(2, A, B, G, 0.0)
    p_m = economics.linear_monopoly_price(2, A, B, G, 0.0)
    assert solved["converged"] and solved["action_set"] == "box"
    np.testing.assert_allclose(solved["nash"], p_n, atol=PRICE_TOL)
    np.testing.assert_allclose(solved["joint"], p_m, atol=PRICE_TOL)
    # rewards: b (p_N - c)^2 = 0.144 and (a - B c)^2 / (4 B) = 0.192 each
    np.testing.assert_allclose(solved["nash_reward"],
                               economics.linear_nash_profit(2, A, B, G, 0.0), rtol=1e-4)
    np.testing.assert_allclose(solved["joint_reward"],
                               economics.linear_monopoly_profit(2, A, B, G, 0.0), rtol=1e-4)


def test_the_symmetric_optimum_is_the_global_one_within_the_bounds():
    """With prices in [0, 1] no profile beats the common price p_M (brute force of the
    formula on a grid, float64): the solver's joint answer is the global optimum."""
    grid = np.linspace(0.0, 1.0, 401)
    p0, p1 = np.meshgrid(grid, grid, indexing="ij")
    q0 = np.maximum(A - B * p0 + G * p1, 0.0)
    q1 = np.maximum(A - B * p1 + G * p0, 0.0)
    best = (p0 * q0 + p1 * q1).max()
    assert best <= 2 * economics.linear_monopoly_profit(2, A, B, G, 0.0) + 1e-12


def test_a_seller_priced_out_still_raises_its_rivals_demand():
    """The rule's clip at 0 leaves the cross term on: a seller priced at 1.2 sells nothing
    (0.48 - 1.08 + 0.6 p < 0 for p < 1) but adds 0.72 to its rival's demand, whose best
    price is then 1.2 / 1.8 = 2/3 with profit 0.4 > 2 x 0.192 -- so bounds well above
    p_M admit asymmetric profiles beating the symmetric joint monopoly (why CONFIG's
    bound is 1.0)."""
    alloc = allocate(quotes([[2 / 3], [1.2]], [[1.0]]))
    np.testing.assert_allclose(alloc.traffic[:, 0], [0.6, 0.0], atol=1e-6)
    assert float(alloc.fees.sum()) == pytest.approx(0.4, rel=1e-5)
    assert 0.4 > 2 * economics.linear_monopoly_profit(2, A, B, G, 0.0)


@pytest.mark.parametrize("name, value", [("own_slope", 0.0), ("cross_slope", -0.1),
                                         ("intercept", -1.0)])
def test_a_bad_param_is_a_config_error_naming_the_field(name, value):
    config = copy.deepcopy(CONFIG)
    config["market"]["distributor"][name] = value
    with pytest.raises(ConfigError) as err:
        jaxmarket.make(config)
    assert err.value.field == f"market.distributor.{name}"
    assert name in str(err.value)


def test_quantity_sellers_are_refused():
    config = copy.deepcopy(CONFIG)
    config["market"]["sellers"][0]["action"] = "quantity"
    with pytest.raises(ConfigError, match=r"market\.sellers\[0\]\.action"):
        jaxmarket.make(config)
