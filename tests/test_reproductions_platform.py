"""Johnson, Rhodes & Wildenbeest (2023): the platform's demand steering in Calvano's
economy (configs/johnson2023.yaml, designs johnson2023_baseline and johnson2023_pdp).
The market's outcome tables against the closed form of price-directed prominence, the
static Nash of the steered grid game, and a reduced run of the comparison with and
without the rule (docs/reproductions.md)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from jaxmarket.sessions.engine import run_sessions
from jaxmarket.sessions.game import make_game, pure_nash
from jaxmarket.sessions.reproduce import find_design, per_session
from jaxmarket.train.plan import resolve

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "johnson2023.yaml")
# Calvano et al.'s grid: 15 prices on [p_N - 0.1 (p_M - p_N), p_M + 0.1 (p_M - p_N)]
GRID = np.linspace(1.427725, 1.970185, 15)
A, COST, MU = 2.0, 1.0, 0.25


def alone(p):
    """A seller shown alone: logit against the outside option (a_0 = 0)."""
    e = np.exp((A - p) / MU)
    return e / (e + 1.0)


def pdp_profit(own, rival):
    """Price-directed prominence: the cheaper seller is shown alone, a tie shows each
    seller with probability 1/2; the dearer one sells nothing."""
    share = np.where(own < rival, 1.0, np.where(own == rival, 0.5, 0.0))
    return (own - COST) * alone(own) * share


def test_steered_tables_are_the_closed_form():
    game = make_game(resolve(CONFIG))
    reward = np.asarray(game.reward, np.float64).reshape(15, 15, 2)
    own, rival = GRID[:, None], GRID[None, :]
    np.testing.assert_allclose(reward[..., 0], pdp_profit(own, rival), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reward[..., 1], pdp_profit(rival, own), rtol=1e-5, atol=1e-6)
    # without the rule: Calvano's logit between the two sellers and the outside good
    plain = make_game(resolve(CONFIG, ["market.distributor.steering=none"]))
    e = np.exp((A - GRID) / MU)
    share = e[:, None] / (e[:, None] + e[None, :] + 1.0)
    np.testing.assert_allclose(np.asarray(plain.reward, np.float64).reshape(15, 15, 2)[..., 0],
                               (own - COST) * share, rtol=1e-5, atol=1e-6)


def test_steered_grid_game_has_its_only_static_nash_at_the_lowest_price():
    """Every unilateral deviation of the closed-form profits: undercutting doubles the
    expected sales of a tie, so the only pure equilibrium is the grid's lowest price."""
    own = pdp_profit(GRID[:, None], GRID[None, :])
    best = own.max(axis=0)
    nash = {(i, j) for i in range(15) for j in range(15)
            if own[i, j] >= best[j] - 1e-9 and own[j, i] >= best[i] - 1e-9}
    assert nash == {(0, 0)}
    game = make_game(resolve(CONFIG))
    assert {tuple(int(x) for x in row) for row in pure_nash(game)} == nash


def test_steering_lowers_the_prices_learners_reach():
    """Reduced: 8 sessions each way with faster exploration decay (4e-5) and a 20,000-period
    convergence window, the same keys: the steered sessions' mean greedy price lies
    below the unsteered ones' by more than two grid steps."""
    faster = ["learners.sellers.exploration_decay=4e-5",
              "learners.sellers.convergence_window=20000"]
    prices = {}
    for steering in ("lowest_price", "none"):
        plan = resolve(CONFIG, [f"market.distributor.steering={steering}", *faster])
        result = run_sessions(plan, sessions=8, periods=600_000, key=jax.random.key(0),
                              stop="converged")
        assert np.all(result.converged)
        prices[steering] = float(np.mean(result.cycle_price))
    step = GRID[1] - GRID[0]
    assert prices["lowest_price"] < prices["none"] - 2 * step


def test_designs_name_the_config_the_rule_and_the_measure():
    import pandas as pd
    base, pdp = find_design("johnson2023_baseline"), find_design("johnson2023_pdp")
    assert base.measure == pdp.measure == "constant_price"
    assert "market.distributor.steering=none" in base.overrides
    assert not any("steering" in o for o in pdp.overrides)   # the config's rule
    assert (base.published, pdp.published) == (0.742, 0.060)
    # the measure: 1 for a one-period greedy cycle, else 0
    frame = pd.DataFrame({"cycle_length": [1, 2, 1, 6]})
    np.testing.assert_array_equal(per_session(frame, "constant_price"), [1.0, 0.0, 1.0, 0.0])
    assert float(per_session(frame, "constant_price").mean()) == pytest.approx(0.5)


def dynamic_profit(own, rival, own_before, rival_before):
    """Dynamic PDP as read here: the cheaper seller is shown alone; at a tie, the seller
    that was cheaper the period before, and a tie after a tie is split 1/2 each."""
    tie_share = np.where(own_before < rival_before, 1.0,
                         np.where(own_before == rival_before, 0.5, 0.0))
    share = np.where(own < rival, 1.0, np.where(own == rival, tie_share, 0.0))
    return (own - COST) * alone(own) * share


def test_dynamic_pair_tables_are_the_closed_form():
    """Every (previous, current) pair of the design's tables, row ``p J + j``."""
    game = make_game(resolve(CONFIG, ["market.distributor.steering=lowest_price_dynamic"]))
    reward = np.asarray(game.reward, np.float64).reshape(15, 15, 15, 15, 2)  # p0 p1 j0 j1
    b0, b1, a0, a1 = np.meshgrid(GRID, GRID, GRID, GRID, indexing="ij")
    np.testing.assert_allclose(reward[..., 0], dynamic_profit(a0, a1, b0, b1),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reward[..., 1], dynamic_profit(a1, a0, b1, b0),
                               rtol=1e-5, atol=1e-6)
    # a profile held is PDP's: the same static game and its one equilibrium
    held = np.asarray(game.expected_reward, np.float64).reshape(15, 15, 2)
    np.testing.assert_allclose(held[..., 0], pdp_profit(GRID[:, None], GRID[None, :]),
                               rtol=1e-5, atol=1e-6)
    assert {tuple(int(x) for x in row) for row in pure_nash(game)} == {(0, 0)}


def test_dynamic_rule_sends_learners_to_the_lowest_price():
    """Reduced: 8 sessions with faster exploration decay (4e-5) and a 20,000-period
    convergence window: every session's greedy cycle is the grid's lowest price for both
    sellers (the full design: 1000 of 1000)."""
    faster = ["market.distributor.steering=lowest_price_dynamic",
              "learners.sellers.exploration_decay=4e-5",
              "learners.sellers.convergence_window=20000"]
    result = run_sessions(resolve(CONFIG, faster), sessions=8, periods=600_000,
                          key=jax.random.key(0), stop="converged")
    assert np.all(result.converged)
    np.testing.assert_allclose(result.cycle_price, GRID[0], rtol=1e-6)
    np.testing.assert_array_equal(result.cycle_length, 1)


def test_dynamic_design_names_the_rule():
    dyn = find_design("johnson2023_dynamic_pdp")
    assert dyn.measure == "constant_price" and dyn.published == 0.147
    assert "market.distributor.steering=lowest_price_dynamic" in dyn.overrides
