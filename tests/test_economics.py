"""Closed forms of ``jaxmarket.market.economics`` checked against independent numerics.

Each test derives its reference here (finite differences, brute-force grids), not from
the module under test. Tolerances:
  * prices: the published 4-decimal values (docs/ground_truths.md) within 5e-5
    (half a unit in the last place);
  * first-order conditions: central differences with h = 1e-5, |d profit/dp| < 1e-8;
  * grid searches: the optimum lies within one grid step (1e-5) of the closed form, and
    no grid point beats it by more than 1e-12.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxmarket.market import economics as econ

A, C, A0, MU = 2.0, 1.0, 0.0, 0.25  # Calvano's baseline economy


def own_profit(p_own: np.ndarray, p_others: np.ndarray) -> np.ndarray:
    """Seller 0's logit profit, written out independently of the module."""
    p_own = np.asarray(p_own, dtype=np.float64)
    others = np.sum(np.exp((A - np.asarray(p_others, dtype=np.float64)) / MU))
    own = np.exp((A - p_own) / MU)
    return (p_own - C) * own / (own + others + math.exp(A0 / MU))


def test_logit_shares_match_the_formula():
    prices = np.array([1.5, 1.7, 2.1])
    quality = np.array([2.0, 2.2, 1.9])
    weights = np.exp((quality - prices) / MU)
    expected = weights / (weights.sum() + math.exp(A0 / MU))
    np.testing.assert_allclose(econ.logit_shares(prices, quality, A0, MU), expected, rtol=1e-12)
    assert econ.logit_shares(prices, quality, A0, MU).sum() < 1.0  # outside good


def test_logit_shares_survive_extreme_prices():
    shares = econ.logit_shares(np.array([-500.0, 1.0]), 2.0, 0.0, 0.25)
    assert np.all(np.isfinite(shares))
    np.testing.assert_allclose(shares[0], 1.0)


def test_logit_profits_broadcast_over_leading_axes():
    grid = np.linspace(1.0, 2.5, 7)
    pairs = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1)
    profits = econ.logit_profits(pairs, A, C, A0, MU)
    assert profits.shape == (7, 7, 2)
    for i, j in [(0, 0), (2, 5), (6, 1)]:
        assert profits[i, j, 0] == pytest.approx(own_profit(grid[i], [grid[j]]), rel=1e-12)
        assert profits[i, j, 1] == pytest.approx(own_profit(grid[j], [grid[i]]), rel=1e-12)


def test_monopoly_price_satisfies_first_order_condition():
    p = econ.monopoly_price(A, C, A0, MU)
    h = 1e-5
    slope = (own_profit(p + h, []) - own_profit(p - h, [])) / (2 * h)
    curvature = (own_profit(p + h, []) - 2 * own_profit(p, []) + own_profit(p - h, [])) / h**2
    assert abs(slope) < 1e-8
    assert curvature < 0
    assert p == pytest.approx(1.8020, abs=5e-5)


def test_monopoly_price_maximises_profit_on_a_fine_grid():
    p = econ.monopoly_price(A, C, A0, MU)
    grid = np.arange(1.0, 3.0, 1e-5)
    profits = own_profit(grid, [])
    assert abs(grid[np.argmax(profits)] - p) <= 1e-5
    assert profits.max() <= own_profit(p, []) + 1e-12


@pytest.mark.parametrize("quality,cost,mu", [(1.0, 0.5, 0.1), (3.0, 1.0, 1.0), (40.0, 1.0, 0.05)])
def test_monopoly_price_first_order_condition_elsewhere(quality, cost, mu):
    p = econ.monopoly_price(quality, cost, 0.0, mu)
    share = econ.logit_shares(np.array([p]), quality, 0.0, mu)[0]
    assert p - cost == pytest.approx(mu / (1.0 - share), rel=1e-9)


def test_nash_price_admits_no_profitable_unilateral_deviation():
    p_nash = econ.nash_price(2, A, C, A0, MU)
    deviations = np.arange(1.0, 3.0, 1e-5)
    deviation_profit = own_profit(deviations, [p_nash])
    at_nash = own_profit(p_nash, [p_nash])
    assert deviation_profit.max() <= at_nash + 1e-12
    assert abs(deviations[np.argmax(deviation_profit)] - p_nash) <= 1e-5
    assert p_nash == pytest.approx(1.4729, abs=5e-5)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nash_price_is_a_best_response_for_other_market_sizes(n):
    p_nash = econ.nash_price(n, A, C, A0, MU)
    grid = np.arange(C, 3.0, 1e-5)
    best = grid[np.argmax(own_profit(grid, [p_nash] * (n - 1)))]
    assert abs(best - p_nash) <= 1e-5


def test_joint_monopoly_price_maximises_team_profit():
    p_m = econ.joint_monopoly_price(2, A, C, A0, MU)
    grid = np.arange(1.0, 3.0, 1e-5)
    team = 2 * np.array([own_profit(p, [p]) for p in grid[::100]])  # coarse pass
    coarse = grid[::100][np.argmax(team)]
    fine = np.arange(coarse - 1e-3, coarse + 1e-3, 1e-6)
    team_fine = 2 * np.array([own_profit(p, [p]) for p in fine])
    assert abs(fine[np.argmax(team_fine)] - p_m) <= 1e-6
    assert p_m == pytest.approx(1.9250, abs=5e-5)


def test_single_seller_joint_monopoly_is_the_monopoly_price():
    assert econ.joint_monopoly_price(1, A, C, A0, MU) == pytest.approx(
        econ.monopoly_price(A, C, A0, MU), rel=1e-12)


def test_benchmark_profits_match_the_published_numbers():
    p_n = econ.nash_price(2, A, C, A0, MU)
    p_m = econ.joint_monopoly_price(2, A, C, A0, MU)
    assert p_n == pytest.approx(1.47293, abs=5e-6)
    assert p_m == pytest.approx(1.92498, abs=5e-6)
    assert own_profit(p_n, [p_n]) == pytest.approx(0.22293, abs=5e-6)
    assert own_profit(p_m, [p_m]) == pytest.approx(0.33749, abs=5e-6)


def test_profit_gain_is_zero_at_nash_and_one_at_monopoly():
    assert econ.profit_gain(0.22293, 0.22293, 0.33749) == 0.0
    assert econ.profit_gain(0.33749, 0.22293, 0.33749) == pytest.approx(1.0)
    np.testing.assert_allclose(econ.profit_gain(np.array([0.25, 0.3]), 0.2, 0.3), [0.5, 1.0])


def test_calvano_grid_spans_nash_and_monopoly_with_margin():
    grid = econ.calvano_grid(n=2, m=15, xi=0.1)
    p_n = econ.nash_price(2)
    p_m = econ.joint_monopoly_price(2)
    assert grid.shape == (15,)
    assert grid[0] == pytest.approx(p_n - 0.1 * (p_m - p_n), abs=1e-12)
    assert grid[-1] == pytest.approx(p_m + 0.1 * (p_m - p_n), abs=1e-12)
    np.testing.assert_allclose(np.diff(grid), (grid[-1] - grid[0]) / 14, rtol=1e-9)


def isa_objective(fee: np.ndarray, budget: float, weight: float) -> np.ndarray:
    s = (math.sqrt(5.0) - 1.0) / 2.0
    utility = 1.0 / (fee / budget + s) - s
    return fee * np.maximum(utility, 0.0) ** weight


@pytest.mark.parametrize("weight", [0.5, 0.6, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("budget", [0.5, 2.0])
def test_isa_optimal_fee_maximises_fee_times_utility(budget, weight):
    fee = econ.isa_optimal_fee(budget, weight)
    fees = np.linspace(0.0, budget, 400_001)  # step budget / 4e5
    values = isa_objective(fees, budget, weight)
    assert 0.0 < fee < budget
    assert abs(fees[np.argmax(values)] - fee) <= budget / 4e5
    assert values.max() <= isa_objective(np.array(fee), budget, weight) + 1e-12


def test_isa_optimal_fee_special_cases():
    s = (math.sqrt(5.0) - 1.0) / 2.0
    assert econ.isa_optimal_fee(1.0, 1.0) == pytest.approx(1.0 - s, abs=1e-12)
    assert econ.isa_optimal_fee(1.0, 0.0) == pytest.approx(1.0, abs=1e-12)
    assert econ.isa_utility(1.0) == pytest.approx(0.0, abs=1e-12)
    assert econ.isa_utility(0.0) == pytest.approx(1.0, abs=1e-12)
