"""summary.json's ``profit_gain`` (docs/equilibrium.md): a real run of the logit duopoly,
its window's mean reward against the static Nash and joint-monopoly profits worked out
here from the multinomial logit in float64 (scipy), independently of the solver."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar

from jaxmarket.learners.equilibrium import deterministic
from jaxmarket.train.plan import resolve
from jaxmarket.train.run import start_run

Q, C, MU, LOW, HIGH = 2.0, 1.0, 0.25, 1.0, 2.5     # configs/logit_duopoly.yaml
SHORT = ["train.num_iterations=20", "train.chunk_size=10", "train.num_envs=2",
         "train.num_seeds=3"]


def share(p_own: float, p_other: float) -> float:
    e = lambda p: np.exp((Q - p) / MU)  # noqa: E731
    return e(p_own) / (e(p_own) + e(p_other) + 1.0)   # outside option quality 0


def best_response(p_other: float) -> float:
    return minimize_scalar(lambda p: -(p - C) * share(p, p_other), bounds=(LOW, HIGH),
                           method="bounded", options={"xatol": 1e-10}).x


def profits() -> tuple[float, float]:
    """Per seller: the symmetric Nash (p = BR(p)) and the joint optimum."""
    p_n = brentq(lambda p: best_response(p) - p, LOW, HIGH, xtol=1e-10)
    p_m = minimize_scalar(lambda p: -2 * (p - C) * share(p, p), bounds=(LOW, HIGH),
                          method="bounded", options={"xatol": 1e-10}).x
    return (p_n - C) * share(p_n, p_n), (p_m - C) * share(p_m, p_m)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pg")
    start_run("configs/logit_duopoly.yaml", SHORT, str(d / "on"))
    start_run("configs/logit_duopoly.yaml", SHORT + ["train.profit_gain=false"], str(d / "off"))
    return {k: json.loads((d / k / "summary.json").read_text()) for k in ("on", "off")}


def test_profit_gain_is_the_window_reward_against_nash_and_monopoly(runs):
    pi_n, pi_m = profits()
    s = runs["on"]
    reward = s["final"]["sellers"]["mean_reward"]
    # the solver's profits are float32 on a searched grid: 1e-4 of the profit range
    assert s["profit_gain"]["sellers"] == pytest.approx((reward - pi_n) / (pi_m - pi_n),
                                                        abs=1e-3)
    seeds = s["per_seed"]["sellers"]
    want = [(r - pi_n) / (pi_m - pi_n) for r in seeds["mean_reward"]]
    assert seeds["profit_gain"] == pytest.approx(want, abs=1e-3)
    assert len(set(np.round(want, 6))) == 3    # three different seeds, three gains


def test_profit_gain_can_be_turned_off(runs):
    assert "profit_gain" not in runs["off"]
    assert runs["off"]["final"] == runs["on"]["final"]   # nothing else changes


def test_auto_computes_it_where_a_period_is_deterministic():
    """multi_product's demand is noisy (its static game averages 256 keys per profile):
    auto leaves it out and says how to ask for it; the logit duopoly's is not."""
    assert deterministic(resolve("configs/logit_duopoly.yaml"))
    assert not deterministic(resolve("configs/multi_product.yaml"))


# --------------------------------------------- firms that differ: per firm and industry

COSTS = (1.0, 1.25)
CALVANO_LOW, CALVANO_HIGH = 1.427725, 1.970185   # configs/calvano.yaml's grid interval


def profit(i: int, p: np.ndarray) -> float:
    """Firm i's logit profit (Calvano's economy: quality 2, mu 0.25, outside good 0)."""
    return (p[i] - COSTS[i]) * share(p[i], p[1 - i])


def asymmetric_benchmarks(low: float = 0.0, high: float = 10.0) -> tuple[np.ndarray, ...]:
    """Each firm's Nash and joint-optimum profits and prices with prices in ``[low,
    high]`` (default: free; scipy, float64): best responses iterated to a fixed point;
    the sum maximised in the box."""
    from scipy.optimize import minimize
    p = np.array([1.5, 1.6])
    for _ in range(200):
        for i in (0, 1):
            p[i] = minimize_scalar(
                lambda x, i=i: -profit(i, np.where(np.arange(2) == i, x, p)),
                bounds=(low, high), method="bounded", options={"xatol": 1e-12}).x
    joint = minimize(lambda q: -(profit(0, q) + profit(1, q)), np.array([1.8, 1.9]),
                     bounds=[(low, high)] * 2, tol=1e-14).x
    return (np.array([profit(i, p) for i in (0, 1)]),
            np.array([profit(i, joint) for i in (0, 1)]), p, joint)


def test_firms_that_differ_get_their_own_benchmarks_and_delta(tmp_path):
    # Bugs caught (issue 43): only the mean of the firms' benchmarks was reported, and no
    # Delta_i; the industry Delta and the mean of the Delta_i are different figures.
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.train import main as train_main
    import pandas as pd
    d = tmp_path / "asym"
    assert run_cli(train_main, ["configs/calvano.yaml", "--run-dir", str(d),
                                "train.num_seeds=6", "train.num_iterations=3000",
                                "train.chunk_size=1000",
                                "market.sellers[0].cost=[[1.0], [1.25]]"]) == 0
    s = json.loads((d / "summary.json").read_text())
    b = s["benchmarks"]["sellers"]
    # Calvano et al.'s benchmarks are the static game's with prices free ...
    pi_n, pi_m, p_n, p_m = asymmetric_benchmarks()
    np.testing.assert_allclose(b["nash_prices"], p_n, atol=2e-4)
    np.testing.assert_allclose(b["joint_prices"], p_m, atol=2e-3)
    # (float32 prices sit on a ~1e-4 plateau: a rival's profit moves with them by ~1e-4)
    np.testing.assert_allclose(b["nash_profits"], pi_n, rtol=5e-4)
    np.testing.assert_allclose(b["joint_profits"], pi_m, rtol=5e-4)
    # ... firm 1's joint price lies beyond the grid, said so, the grid's kept beside them
    assert p_m[1] > CALVANO_HIGH and "prices free" in b["method"]
    assert b["outside_grid"].startswith("the free joint price of agent 1 lies beyond the "
                                        "grid's highest price 1.97")
    _, pi_m_grid, _, p_m_grid = asymmetric_benchmarks(CALVANO_LOW, CALVANO_HIGH)
    np.testing.assert_allclose(b["bounded"]["joint_prices"], p_m_grid, atol=2e-3)
    assert b["bounded"]["joint_profit"] == pytest.approx(pi_m_grid.mean(), rel=1e-4)
    rows = pd.read_csv(d / "sessions.csv")
    cycle = rows[["cycle_profit_0", "cycle_profit_1"]].to_numpy()
    # the gains against the run's benchmarks (checked against scipy's above)
    bn, bm = np.array(b["nash_profits"]), np.array(b["joint_profits"])
    firms = (cycle - bn) / (bm - bn)                                 # [S, 2] Delta_i
    industry = (cycle.mean(1) - bn.mean()) / (bm.mean() - bn.mean())
    np.testing.assert_allclose(s["profit_gain_firms"]["sellers"], firms.mean(0), rtol=1e-9)
    assert s["profit_gain_firm_mean"]["sellers"] == pytest.approx(firms.mean(), rel=1e-9)
    assert s["profit_gain"]["sellers"] == pytest.approx(industry.mean(), rel=1e-6)
    assert abs(industry.mean() - firms.mean()) > 1e-3   # two figures, named apart
    for lo_hi, mean in zip(s["profit_gain_firms_ci95"]["sellers"],
                           s["profit_gain_firms"]["sellers"]):
        assert lo_hi[0] <= mean <= lo_hi[1]


def test_a_firm_without_a_gain_over_nash_has_no_delta_i_and_says_why():
    from jaxmarket.sessions.engine import firm_profit_gains
    reward = np.array([[0.3, 0.2], [0.25, 0.1]])
    gains, why = firm_profit_gains(reward, [0.2, 0.1], [0.4, 0.1])
    np.testing.assert_allclose(gains[:, 0], [(0.3 - 0.2) / 0.2, (0.25 - 0.2) / 0.2])
    assert np.isnan(gains[:, 1]).all() and why[0] is None
    assert why[1].startswith("firm 1: pi_M (0.1) does not exceed pi_N (0.1)")
