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
import pytest

from jaxmarket.analysis import impulse_compare
from jaxmarket.analysis.impulse import Strategies, impulse_response
from jaxmarket.config.errors import ConfigError

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


def test_committed_figure4_comparison_matches_its_published_values():
    """The committed comparison holds the published Figure 4 values of FIGURES and its
    summary figures are those of its rows."""
    path = ROOT / "benchmarks/results/impulse/calvano2020_figure4.json"
    result = json.loads(path.read_text())
    pub = impulse_compare.FIGURES["calvano2020_figure4"]
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
