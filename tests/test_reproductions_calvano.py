"""Calvano et al. (AER 2020) beyond the baseline: the deviation of their Figure 4
(``best_response_lowest``), the period-by-period comparison with the published average
impulse response, and reduced runs of the robustness designs.

The hand-made strategies: two agents on the grid [1, 2, 3] (indices 0, 1, 2), memory 1,
a state is the last period's pair ``(a0, a1)``, numbered ``3 a0 + a1``; profits are
Bertrand's (the lower price takes the one unit, ties split)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq, fsolve

from jaxmarket.analysis import impulse_compare
from jaxmarket.analysis.impulse import Strategies, impulse_response
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.equilibrium import benchmarks, equilibrium, outcome_benchmarks
from jaxmarket.market import economics
from jaxmarket.sessions import run as session_run
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.reproduce import find_design, reproduce
from jaxmarket.train.plan import resolve

ROOT = Path(__file__).resolve().parents[1]
GRID = np.array([1.0, 2.0, 3.0])
PAIRS = [(a0, a1) for a0 in range(3) for a1 in range(3)]   # state 3 a0 + a1


def bertrand() -> np.ndarray:
    """[9, 2] profits p_i x share."""
    out = np.zeros((9, 2))
    for row, (a0, a1) in enumerate(PAIRS):
        p = GRID[[a0, a1]]
        out[row] = p * np.where(p == p.min(), 1.0 / np.sum(p == p.min()), 0.0)
    return out


def best_index(agent: int, rival_index: int) -> int:
    """The agent's first profit-maximising grid index against the rival's index."""
    rows = [3 * a + rival_index if agent == 0 else 3 * rival_index + a for a in range(3)]
    return int(np.argmax(bertrand()[rows, agent]))


def strategies(rule, start=(2, 2)) -> Strategies:
    g = np.array([[rule(i, a0, a1) for a0, a1 in PAIRS] for i in range(2)])
    return Strategies(greedy=g[None], last=np.array([start]), grid=GRID, memory=1,
                      profit_table=bertrand())


def collude_or_crash(i, a0, a1):
    """Both keep price 3 after (3, 3); after (1, 1) both stay at 1; else both go to 1."""
    return 2 if (a0, a1) == (2, 2) else 0


def test_best_response_lowest_answers_the_rivals_play_after_the_lowest_prices():
    """On the cycle (3, 3) the rival plays 3, so the static best response is price 2
    (profit 2); after the lowest prices (1, 1) the rival plays 1, so the deviation of
    ``best_response_lowest`` is the best response to 1: price 1 (a tie, 1/2 > 0)."""
    s = strategies(collude_or_crash)
    current = impulse_response(s, agent=0, deviation="best_response", periods=3)
    lowest = impulse_response(s, agent=0, deviation="best_response_lowest", periods=3)
    assert current.deviation_index.tolist() == [best_index(0, 2)] == [1]
    assert lowest.deviation_index.tolist() == [best_index(0, 0)] == [0]
    np.testing.assert_array_equal(lowest.price[0], [GRID[best_index(0, 0)], 3.0])
    np.testing.assert_array_equal(current.price[0], [GRID[best_index(0, 2)], 3.0])


def alternate(i, a0, a1):
    """A two-period cycle (3, 3) -> (2, 2) -> (3, 3); from (1, 1) to (3, 3); from (1, 2)
    [state 1] both play 1; anything else: (1, 1)."""
    return {(2, 2): 1, (1, 1): 2, (0, 0): 2, (0, 1): 0}.get((a0, a1), 0)


def test_best_response_lowest_numbers_the_state_by_the_cycle_position():
    """Cycle position 0 takes state 0 = (1, 1), after which the rival plays 3; position 1
    takes state 1 = (1, 2), after which it plays 1: deviations best_index(1, 2) and
    best_index(1, 0), averaged over the cycle's two points."""
    r = impulse_response(strategies(alternate, start=(0, 1)), agent=1,
                         deviation="best_response_lowest", periods=3)
    assert r.cycle_length.tolist() == [2]
    expected = (best_index(1, alternate(0, 0, 0)) + best_index(1, alternate(0, 0, 1))) / 2
    assert r.deviation_index.tolist() == [expected] == [0.5]


def test_best_response_lowest_needs_a_profit_table():
    s = Strategies(greedy=np.zeros((1, 2, 9), np.int64), last=np.array([[2, 2]]),
                   grid=GRID, memory=1)
    with pytest.raises(ConfigError) as err:
        impulse_response(s, deviation="best_response_lowest")
    assert err.value.field == "deviation"


def test_compare_averages_the_deviating_agents_and_aligns_tau(tmp_path):
    """compare() on hand-made strategies: tau = 0 is the cycle's price, tau = 1 the
    deviation (price 1 after (1, 1): both agents alike), tau = 2 the play after it."""
    s = strategies(collude_or_crash)
    path = tmp_path / "strategies.npz"
    np.savez(path, greedy=s.greedy, last=s.last, grid=GRID, memory=1,
             profit_table=bertrand(), converged=np.ones(1, bool))
    dev, non = impulse_compare.session_paths(str(path), "best_response_lowest", 3)
    # tau 0: (3, 3); tau 1: deviator 1, rival 3; then (1, 1) forever
    np.testing.assert_array_equal(dev, [[3, 1, 1, 1]])
    np.testing.assert_array_equal(non, [[3, 3, 1, 1]])
    ci = impulse_compare.bootstrap_paths(np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert ci.shape == (2, 2) and np.all(ci[:, 0] <= ci[:, 1])
    np.testing.assert_array_equal(ci[:, 0] >= [1.0, 2.0], [True, True])


@pytest.mark.parametrize("figure", ["calvano2020_figure4", "calvano2020_figure6"])
def test_committed_impulse_comparison_matches_its_published_values(figure):
    """The committed comparison holds the published values of FIGURES and its summary
    figures are those of its rows."""
    path = ROOT / f"benchmarks/results/impulse/{figure}.json"
    result = json.loads(path.read_text())
    pub = impulse_compare.FIGURES[figure]
    rows = result["rows"]
    for side in ("deviating", "nondeviating"):
        got = [r["published"] for r in rows if r["agent"] == side]
        assert got == pub[side]
    diffs = [abs(r["ours"] - r["published"]) for r in rows]
    assert result["max_abs_difference"] == pytest.approx(max(diffs))
    assert result["share_inside_ci"] == pytest.approx(
        np.mean([r["ci95"][0] <= r["published"] <= r["ci95"][1] for r in rows]))
    # tau = 0: the price before the deviation, the same for both sides
    assert rows[0]["ours"] == pytest.approx(rows[len(rows) // 2]["ours"])


# ------------------------------------------------------------------ robustness designs

SHOCK = ["market.distributor.shock_values=[-0.15, 0.0, 0.15]",
         "market.distributor.shock_probs=[0.25, 0.5, 0.25]",
         # the grid of calvano2020_demand015: it holds every outcome's monopoly price
         "market.sellers.0.low=1.399047", "market.sellers.0.high=2.09466",
         "learners.sellers.grid_size=5", "train.num_seeds=2"]


def test_logit_demand_shock_tables_are_the_closed_form_per_outcome():
    """Each outcome's table is the logit profit with that a_0; the probabilities are the
    declared ones."""
    plan = resolve(load_config("configs/calvano.yaml", SHOCK))
    game = make_game(plan)
    assert game.probs == (0.25, 0.5, 0.25)
    grid = np.asarray(game.grid.prices, np.float64)
    joint = np.indices((5, 5)).reshape(2, -1).T
    for k, a0 in enumerate((-0.15, 0.0, 0.15)):
        closed = economics.logit_profits(grid[joint], outside_quality=a0)
        np.testing.assert_allclose(np.asarray(game.reward[k]), closed, rtol=1e-5, atol=1e-6)


def test_outcome_benchmarks_are_the_expected_informed_nash_and_monopoly_profits():
    plan = resolve(load_config("configs/calvano.yaml", SHOCK))
    got = outcome_benchmarks(plan)["sellers"]
    probs = (0.25, 0.5, 0.25)
    nash = sum(p * economics.logit_profits([economics.nash_price(outside_quality=a)] * 2,
                                           outside_quality=a)[0]
               for p, a in zip(probs, (-0.15, 0.0, 0.15)))
    joint = sum(p * economics.logit_profits(
        [economics.joint_monopoly_price(outside_quality=a)] * 2, outside_quality=a)[0]
        for p, a in zip(probs, (-0.15, 0.0, 0.15)))
    assert got["nash_profit"] == pytest.approx(nash, abs=2e-5)
    assert got["joint_profit"] == pytest.approx(joint, abs=2e-5)
    assert [o["probability"] for o in got["outcomes"]] == list(probs)
    assert outcome_benchmarks(resolve(load_config("configs/calvano.yaml"))) is None


def test_logit_shock_options_come_together():
    with pytest.raises(ConfigError) as err:
        resolve(load_config("configs/calvano.yaml",
                            ["market.distributor.shock_values=[0.0, 0.1]"]))
    assert err.value.field == "market.distributor.shock_probs"
    with pytest.raises(ConfigError) as err:
        resolve(load_config("configs/calvano.yaml",
                            ["market.distributor.shock_values=[0.0, 0.1]",
                             "market.distributor.shock_probs=[0.5, 0.6]"]))
    assert err.value.field == "market.distributor.shock_probs"


def _override(design, key):
    return next(float(o.split("=", 1)[1]) for o in design.overrides if o.startswith(key))


@pytest.mark.parametrize("name,mu", [("calvano2020_mu05", 0.5), ("calvano2020_mu01", 0.1)])
def test_substitutability_designs_use_the_grid_of_their_economy(name, mu):
    d = find_design(name)
    grid = economics.calvano_grid(mu=mu)
    assert _override(d, "market.distributor.temperature") == mu
    assert _override(d, "market.sellers.0.low") == pytest.approx(grid[0], abs=1e-6)
    assert _override(d, "market.sellers.0.high") == pytest.approx(grid[-1], abs=1e-6)


@pytest.mark.parametrize("name,h", [("calvano2020_demand015", 0.15),
                                    ("calvano2020_demand025", 0.25)])
def test_stochastic_demand_designs_span_the_three_economies(name, h):
    d = find_design(name)
    pn = [economics.nash_price(outside_quality=a) for a in (-h, 0.0, h)]
    pm = [economics.joint_monopoly_price(outside_quality=a) for a in (-h, 0.0, h)]
    spread = 0.1 * (max(pm) - min(pn))
    assert _override(d, "market.sellers.0.low") == pytest.approx(min(pn) - spread, abs=1e-6)
    assert _override(d, "market.sellers.0.high") == pytest.approx(max(pm) + spread, abs=1e-6)
    assert d.measure == "profit_gain_outcomes"


def test_reduced_stochastic_demand_run_reports_both_profit_gains(tmp_path):
    """4 sessions of 3,000 periods (fast exploration): the summary's informed
    benchmarks are the expected closed forms and each session's Delta against them is
    (pi - E pi_N(k)) / (E pi_M(k) - E pi_N(k)) of its cycle profits."""
    d = find_design("calvano2020_demand015")
    out = reproduce(d, tmp_path / "run", ["train.num_seeds=4", "train.num_iterations=3000",
                                          "learners.sellers.exploration_decay=0.005",
                                          "learners.sellers.convergence_window=200",
                                          "train.chunk_size=1000"])
    assert out["sessions"] == 4 and out["design_sessions"] == 1000
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    inf = summary["outcome_benchmarks"]["sellers"]
    nash = np.mean([economics.logit_profits([economics.nash_price(outside_quality=a)] * 2,
                                            outside_quality=a)[0]
                    for a in (-0.15, 0.0, 0.15)])
    assert inf["nash_profit"] == pytest.approx(nash, abs=2e-5)
    frame = pd.read_csv(tmp_path / "run/sessions.csv")
    pi = frame[["cycle_profit_0", "cycle_profit_1"]].mean(axis=1)
    expected = (pi - inf["nash_profit"]) / (inf["joint_profit"] - inf["nash_profit"])
    np.testing.assert_allclose(frame["profit_gain_outcomes"], expected, rtol=1e-9)
    assert out["value"] == pytest.approx(float(expected.mean()))


@pytest.mark.parametrize("name,mu", [("calvano2020_mu05", 0.5),
                                     ("calvano2020_memoryless", 0.25)])
def test_reduced_design_runs_measure_delta_against_the_closed_forms(tmp_path, name, mu):
    """4 sessions of 2,000 periods (fast exploration): the benchmarks are the logit
    closed forms of the design's economy and each session's Delta is
    (pi - pi_N) / (pi_M - pi_N) of its cycle profits."""
    out = reproduce(find_design(name), tmp_path / "run",
                    ["train.num_seeds=4", "train.num_iterations=2000",
                     "learners.sellers.exploration_decay=0.005",
                     "learners.sellers.convergence_window=200", "train.chunk_size=1000"])
    bench = json.loads((tmp_path / "run/summary.json").read_text())["benchmarks"]["sellers"]
    pn, pm = economics.nash_price(mu=mu), economics.joint_monopoly_price(mu=mu)
    nash = economics.logit_profits([pn, pn], mu=mu)[0]
    joint = economics.logit_profits([pm, pm], mu=mu)[0]
    assert bench["nash_profit"] == pytest.approx(nash, abs=2e-5)
    assert bench["joint_profit"] == pytest.approx(joint, abs=2e-5)
    frame = pd.read_csv(tmp_path / "run/sessions.csv")
    pi = frame[["cycle_profit_0", "cycle_profit_1"]].mean(axis=1)
    np.testing.assert_allclose(frame["profit_gain"], (pi - nash) / (joint - nash),
                               atol=2e-3)
    assert out["sessions"] == 4 and out["value"] == pytest.approx(frame["profit_gain"].mean())


@pytest.mark.parametrize("name,m", [("calvano2020_m50", 50), ("calvano2020_m100", 100)])
def test_finer_grid_designs_keep_the_baseline_interval(name, m):
    d = find_design(name)
    assert _override(d, "learners.sellers.grid_size") == m
    assert not any(o.startswith("market.sellers.0.low") for o in d.overrides)


def test_outcome_benchmarks_are_written_only_when_asked(tmp_path):
    """Without train.session_outcome_benchmarks a random period's run writes what it
    always wrote: no profit_gain_outcomes column, no outcome_benchmarks."""
    config = load_config("configs/calvano.yaml", SHOCK + [
        "train.num_iterations=500", "learners.sellers.exploration_decay=0.01",
        "learners.sellers.convergence_window=100", "train.chunk_size=500"])
    _, _, plan = session_run.choose_engine(config)
    summary = session_run.start(config, plan, str(tmp_path / "plain"), command="test")
    assert "outcome_benchmarks" not in summary
    header = (tmp_path / "plain/sessions.csv").read_text().splitlines()[0].split(",")
    assert "profit_gain_outcomes" not in header and "profit_gain" in header


def test_boltzmann_design_reads_the_replication_parameters():
    """Temperature 1000 (eps = 1.d3 at start) times lambda = 1 - 10^Beta per period,
    Beta = -4.41414, alpha = 0.05: the replication package's Boltzmann experiment."""
    d = find_design("calvano2020_boltzmann")
    hyper = load_config(d.config, d.overrides)["learners"]["sellers"]
    assert hyper["boltzmann"]["temperature"] == 1000.0
    assert hyper["boltzmann"]["decay"] == pytest.approx(1 - 10 ** -4.41414, abs=1e-10)
    assert hyper["learning_rate"] == 0.05


def test_committed_figure1_comparison_is_consistent():
    """Every cell of our alpha x beta map is a point of the paper's 100 x 91 grid, and
    the summary counts are those of the rows (distance 0: inside the colour's interval)."""
    result = json.loads((ROOT / "benchmarks/results/figures/calvano2020_figure1.json").read_text())
    rows = result["rows"]
    assert len(rows) == result["cells"] == 60
    for r in rows:
        assert (r["alpha"] - 0.025) / 0.0025 == pytest.approx(round((r["alpha"] - 0.025)
                                                                    / 0.0025))
        assert r["beta"] / 2e-7 == pytest.approx(round(r["beta"] / 2e-7))
        lo, hi = r["published_interval"]
        assert hi - lo == pytest.approx(0.0162, abs=2e-4)
        expected = 0.0 if lo <= r["ours"] <= hi else min(abs(r["ours"] - lo),
                                                        abs(r["ours"] - hi))
        assert r["distance"] == pytest.approx(expected, abs=1e-4)
    assert result["inside"] == sum(r["distance"] == 0 for r in rows)
    assert result["max_distance"] == max(r["distance"] for r in rows)


@pytest.mark.parametrize("name,c2", [("calvano2020_cost0875", 0.875),
                                     ("calvano2020_cost075", 0.75),
                                     ("calvano2020_cost05", 0.5),
                                     ("calvano2020_cost025", 0.25)])
def test_cost_asymmetry_designs_give_each_firm_its_calvano_grid(name, c2):
    """The asymmetric Nash prices solve each firm's first-order condition
    p_i - c_i = mu / (1 - s_i); the joint prices have equal margins p_i - c_i (a
    multiproduct logit monopolist's); firm i's 15 prices span its own Calvano interval,
    the market's bounds hold both, and the run's benchmarks are the mean Nash and joint
    profits."""
    cost = np.array([1.0, c2])
    pn = fsolve(lambda p: (p - cost) - 0.25 / (1 - economics.logit_shares(p)), [1.4, 1.4],
                xtol=1e-13)
    # equal margins m: the joint optimum's m solves m = mu / (1 - sum_i s_i)
    margin = brentq(lambda m: m - 0.25 / (1 - economics.logit_shares(cost + m).sum()),
                    0.01, 5.0, xtol=1e-14)
    pm = cost + margin
    lo, hi = pn - 0.1 * (pm - pn), pm + 0.1 * (pm - pn)
    d = find_design(name)
    assert _override(d, "market.sellers.0.low") <= lo.min()
    assert _override(d, "market.sellers.0.high") >= hi.max()
    grid = np.asarray(make_game(session_run.session_plan(load_config(
        d.config, d.overrides))).grid.prices, np.float64)
    np.testing.assert_allclose(grid, np.linspace(lo, hi, 15, axis=1), atol=2e-6)
    bench = benchmarks(equilibrium(resolve(load_config(d.config, d.overrides)))["sellers"])
    # the equilibrium solver works on float32 payoffs: profits to 1e-4
    assert bench["nash_profit"] == pytest.approx(
        economics.logit_profits(pn, cost=cost).mean(), abs=1e-4)
    assert bench["joint_profit"] == pytest.approx(
        economics.logit_profits(pm, cost=cost).mean(), abs=1e-4)


def test_quality_asymmetry_design_is_the_cost_design_with_firm_2_shifted():
    """Logit demand exp((a_i - p_i) / mu) and profit (p_i - c_i) q_i: a firm of quality
    2.25 and cost 1 is the firm of quality 2 and cost 0.75 with its prices 0.25 higher,
    so calvano2020_quality225's Calvano grids are calvano2020_cost075's with firm 2's
    shifted by 0.25, its outcome tables the same profits, and the bounds hold both."""
    games = {}
    for name in ("calvano2020_quality225", "calvano2020_cost075"):
        d = find_design(name)
        games[name] = make_game(session_run.session_plan(load_config(d.config, d.overrides)))
    quality, cost = games["calvano2020_quality225"], games["calvano2020_cost075"]
    shifted = np.asarray(cost.grid.prices, np.float64) + np.array([[0.0], [0.25]])
    np.testing.assert_allclose(np.asarray(quality.grid.prices, np.float64), shifted,
                               atol=2e-5)
    np.testing.assert_allclose(np.asarray(quality.reward), np.asarray(cost.reward),
                               rtol=2e-4, atol=2e-5)
    assert find_design("calvano2020_quality225").published is None
