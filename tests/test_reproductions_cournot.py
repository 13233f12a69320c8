"""The Cournot designs of the pricing lab: Waltman & Kaymak (JEDC 2008,
configs/waltman2008.yaml, designs waltman2008_n2/_n3/_n4) and imperfect monitoring after
Calvano et al. (IJIO 2021, configs/calvano2021.yaml, design calvano2021).

The market's outcome tables against the closed-form profits, the grid game's pure Nash
profiles against a brute force of those profits, the closed-form Cournot-Nash and
joint-monopoly quantities, the ``action_gain`` measure, the imperfect-monitoring state
(a function of the market price only), and reduced session runs of both designs (few
sessions and periods: the published-number handling, not the published size).
"""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.qlearning import obs_grid_of
from jaxmarket.market import economics
from jaxmarket.sessions.engine import run_sessions
from jaxmarket.sessions.game import make_game, pure_nash
from jaxmarket.sessions.reproduce import (MEASURES, NO_PUBLISHED, find_design, per_session,
                                          reproduce)
from jaxmarket.train.plan import resolve

# Waltman & Kaymak (as configs/waltman2008.yaml reads them): P = max(40 - Q, 0), cost 4,
# quantities {0, ..., 40}
A, B, C = 40.0, 1.0, 4.0
GRID = np.arange(41.0)


def wk_profit(own: np.ndarray, others: np.ndarray) -> np.ndarray:
    """A firm's profit: its quantity times the clearing price less its unit cost."""
    return own * (np.maximum(A - B * (own + others), 0.0) - C)


def wk_plan(n: int, *overrides: str):
    return resolve(load_config(find_design(f"waltman2008_n{n}").config,
                               [f"market.sellers.0.count={n}", *overrides]))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_waltman_closed_forms_and_designs(n):
    """Cournot-Nash (a - c) / (b (n + 1)) and joint monopoly (a - c) / (2 b n) per firm, as
    the design's figure states them; each design sets its number of firms."""
    assert economics.cournot_nash_quantity(n, A, B, C) == pytest.approx((A - C) / (B * (n + 1)))
    assert economics.cournot_monopoly_quantity(n, A, B, C) == pytest.approx((A - C) / (2 * B * n))
    design = find_design(f"waltman2008_n{n}")
    assert design.published is None and design.root_cause and design.measure == "action_gain"
    assert f"q_N = {(A - C) / (n + 1):g}" in design.figure
    assert f"q_M = {(A - C) / (2 * n):g}" in design.figure
    config = load_config(design.config, design.overrides)
    assert config["market"]["sellers"][0]["count"] == n
    assert config["learners"]["firms"]["boltzmann"] == {"temperature": 1000.0, "decay": 0.99999}


def test_waltman_tables_are_the_closed_form_profits_and_their_pure_nash():
    game = make_game(wk_plan(2))
    reward = np.asarray(game.reward, np.float64).reshape(41, 41, 2)
    own, rival = GRID[:, None], GRID[None, :]
    np.testing.assert_allclose(reward[..., 0], wk_profit(own, rival), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(reward[..., 1], wk_profit(rival, own), rtol=1e-5, atol=1e-3)
    # the grid game's pure Nash profiles by brute force over unilateral deviations
    profit = wk_profit(own, rival)                    # [mine, rival's]
    best = profit.max(axis=0)                         # best reply value to each rival q
    nash = {(i, j) for i in range(41) for j in range(41)
            if profit[i, j] >= best[j] - 1e-9 and profit[j, i] >= best[i] - 1e-9}
    assert (12, 12) in nash                           # the continuous Cournot-Nash, on grid
    assert {tuple(int(x) for x in row) for row in pure_nash(game)} == nash


def test_action_gain_is_the_quantity_index_against_the_benchmarks():
    frame = pd.DataFrame({"cycle_price_0": [12.0, 9.0, 11.0], "cycle_price_1": [12.0, 9.0, 10.0]})
    frame.attrs["summary"] = {"benchmarks": {"firms": {"nash_price": 12.0, "joint_price": 9.0}}}
    q = np.array([12.0, 9.0, 10.5])
    np.testing.assert_allclose(per_session(frame, "action_gain"), (12.0 - q) / (12.0 - 9.0))
    assert "action_gain" in MEASURES
    frame.attrs["summary"] = {"benchmarks": {}}
    with pytest.raises(ConfigError, match="joint-optimum"):
        per_session(frame, "action_gain")


def test_waltman_reduced_sessions_end_between_monopoly_and_walras():
    """Eight sessions cooled 500 times faster than the design (T from 1000 to 1 in 20,000
    periods): logit choice is then all but greedy, so the played and greedy quantities
    agree, and every firm's final quantity is one that earns a positive profit."""
    decay = float(np.exp(np.log(1e-3) / 20_000))
    plan = wk_plan(2, f"learners.firms.boltzmann={{temperature: 1000.0, decay: {decay}}}")
    result = run_sessions(plan, sessions=8, periods=20_000, key=jax.random.key(0), window=500)
    q = result.greedy_price                                   # [S, 2] quantities
    assert np.all(np.isin(q, GRID))
    total = q.sum(axis=1)
    assert np.all(total < A - C)              # the price stays above cost: profits > 0
    played = result.tail_reward.mean(axis=1)  # mean profit per firm in the last 500 periods
    greedy = result.greedy_reward.mean(axis=1)
    np.testing.assert_allclose(played, greedy, rtol=0.05)


def test_imperfect_monitoring_state_is_the_market_price():
    """configs/calvano2021.yaml: one table per shock (intercept 0.9 or 1.1), the profits
    q_i max(a - Q, 0), and a firm's state a function of the clearing price alone: two
    profiles with the same total quantity under the same shock are the same state, the
    same profile under the two shocks two states."""
    plan = resolve(load_config(find_design("calvano2021").config))
    game = make_game(plan)
    assert game.probs == (0.5, 0.5)
    q = np.arange(13) / 24
    reward = np.asarray(game.reward, np.float64).reshape(2, 13, 13, 2)
    for k, a in enumerate((0.9, 1.1)):
        price = np.maximum(a - (q[:, None] + q[None, :]), 0.0)
        np.testing.assert_allclose(reward[k, ..., 0], q[:, None] * price, atol=1e-6)
    states = np.asarray(obs_grid_of(game.settings).state_index(game.obs))   # [2, 169, 2]
    states = states.reshape(2, 13, 13, 2)
    assert np.all(states[..., 0] == states[..., 1])       # both firms see the same price
    assert states[0, 3, 5, 0] == states[0, 5, 3, 0] == states[0, 4, 4, 0]
    assert states[0, 4, 4, 0] != states[1, 4, 4, 0]
    # the expected profits' benchmarks: Cournot-Nash 1/3 and monopoly 1/4 per firm at the
    # mean intercept 1 (profit is linear in the intercept where the price is positive)
    assert economics.cournot_nash_quantity(2) == pytest.approx(1 / 3)
    assert economics.cournot_monopoly_quantity(2) == pytest.approx(1 / 4)


def test_calvano2021_reduced_reproduction_has_no_published_number(tmp_path):
    design = find_design("calvano2021")
    result = reproduce(design, tmp_path / "run", ["train.num_seeds=4",
                                                   "train.num_iterations=2000",
                                                   "train.chunk_size=1000"])
    assert result["published"] is None and result["verdict"] == NO_PUBLISHED
    assert result["root_cause"] == design.root_cause
    assert result["sessions"] == 4 and result["design_sessions"] == 100
    lo, hi = result["ci95"]
    assert np.isfinite([lo, hi, result["value"]]).all() and lo <= result["value"] <= hi
    frame = pd.read_csv(tmp_path / "run" / "sessions.csv")
    np.testing.assert_allclose(result["value"], frame["profit_gain"].mean())
