"""Impulse responses (``jaxmarket.analysis.impulse_response``) of hand-made strategies
whose response to a deviation is known exactly (tit-for-tat, a one-period punishment, a
two-period collusive cycle), of a ``--save-strategies`` file, and of a trained
q_learning run restored from its checkpoint (checked against the logit closed form).

Two agents on the grid [1, 2, 3] (indices 0, 1, 2), memory 1: a state is the last
period's pair ``(a0, a1)``, numbered ``3 a0 + a1``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jaxmarket
from jaxmarket.market import economics
from jaxmarket.cli import run_cli
from jaxmarket.cli.impulse import main as impulse_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.analysis.impulse import Strategies, impulse_response, strategies_from_run
from jaxmarket.train.run import start_run

GRID = np.array([1.0, 2.0, 3.0])
PAIRS = [(a0, a1) for a0 in range(3) for a1 in range(3)]   # state 3 a0 + a1


def table(rule) -> np.ndarray:
    """greedy [2, 9] from ``rule(i, a0, a1) -> index``."""
    return np.array([[rule(i, a0, a1) for a0, a1 in PAIRS] for i in range(2)])


def strategies(rule, start=(2, 2), sessions=1, profit_table=None) -> Strategies:
    g = table(rule)
    return Strategies(greedy=np.broadcast_to(g, (sessions, 2, 9)),
                      last=np.tile(np.array(start), (sessions, 1)), grid=GRID, memory=1,
                      profit_table=profit_table)


def bertrand() -> np.ndarray:
    """[9, 2] profits p_i x share: the lower price takes the one unit, ties split."""
    out = np.zeros((9, 2))
    for row, (a0, a1) in enumerate(PAIRS):
        p = GRID[[a0, a1]]
        share = np.where(p == p.min(), 1.0 / np.sum(p == p.min()), 0.0)
        out[row] = p * share
    return out


def tit_for_tat(i, a0, a1):
    return (a1, a0)[i]          # play the rival's last index


def punish_once(i, a0, a1):
    """Collude at 2; after any price below 2 both cut to 0 for one period; from (0, 0)
    back to 2."""
    if (a0, a1) == (2, 2) or (a0, a1) == (0, 0):
        return 2
    return 0


def test_tit_for_tat_echoes_the_deviation_forever():
    r = impulse_response(strategies(tit_for_tat), agent=0, deviation=1.0, periods=5)
    # deviation (1, 3); then each copies the other: (3, 1), (1, 3), ...
    np.testing.assert_array_equal(r.price, [[1, 3], [3, 1], [1, 3], [3, 1], [1, 3]])
    np.testing.assert_array_equal(r.counterfactual, np.full((5, 2), 3.0))
    np.testing.assert_array_equal(r.pre_deviation, [3.0, 3.0])
    assert r.punishes.tolist() == [True] and r.share_punish == 1.0
    assert r.punishment_length.tolist() == [1.0]      # rival below only in period 1
    assert np.isnan(r.return_periods[0]) and r.returned.tolist() == [0.0]
    assert r.cycle_length.tolist() == [1]


def test_one_period_punishment_and_return_to_the_cycle():
    r = impulse_response(strategies(punish_once, profit_table=bertrand()), agent=1,
                         deviation="best_response", periods=4)
    # against the rival's 3, the best response is 2 (profit 2 > 1.5 at a tie);
    # then (1, 1) [both cut], then (3, 3): back on the cycle after period 2
    np.testing.assert_array_equal(r.price, [[3, 2], [1, 1], [3, 3], [3, 3]])
    assert r.deviation_index.tolist() == [1.0]
    assert r.punishes.tolist() == [True]
    assert r.punishment_length.tolist() == [1.0]
    assert r.return_periods.tolist() == [2.0]
    # profits: deviation (3, 2) -> agent 1 takes the unit at 2; (1, 1) split; (3, 3) split
    np.testing.assert_allclose(r.profit, [[0, 2], [0.5, 0.5], [1.5, 1.5], [1.5, 1.5]])
    np.testing.assert_allclose(r.counterfactual_profit, np.full((4, 2), 1.5))


def test_nash_deviation_is_the_grid_nash():
    """Bertrand on [1, 2, 3]: best responses from (1, 1) stay there (1 x 1/2 beats 0),
    so the Nash index is 0; the deviator plays price 1."""
    r = impulse_response(strategies(punish_once, profit_table=bertrand()), agent=0,
                         deviation="nash", periods=3)
    np.testing.assert_array_equal(r.price, [[1, 3], [1, 1], [3, 3]])


def alternate(i, a0, a1):
    """A two-period collusive cycle (3, 3) -> (2, 2) -> (3, 3) ...; anything else: cut
    to (1, 1), from which back to (3, 3)."""
    return {(2, 2): 1, (1, 1): 2, (0, 0): 2}.get((a0, a1), 0)


def test_averaged_over_the_limit_cycle():
    """From cycle position (3, 3) [the next pair is (2, 2)] and from (2, 2) [next
    (3, 3)], agent 0 deviates to price 1: both go (1, x) -> (1, 1) -> (3, 3) -> (2, 2)."""
    r = impulse_response(strategies(alternate, start=(0, 1)), agent=0, deviation=1.0,
                         periods=4)
    assert r.cycle_length.tolist() == [2]
    # position A (last (3, 3)): dev (1, 2), (1, 1), (3, 3), (2, 2); cycle (2,2),(3,3),(2,2),(3,3)
    # position B (last (2, 2)): dev (1, 3), (1, 1), (3, 3), (2, 2); cycle (3,3),(2,2),(3,3),(2,2)
    np.testing.assert_allclose(r.price, [[1, 2.5], [1, 1], [3, 3], [2, 2]])
    np.testing.assert_allclose(r.counterfactual, np.full((4, 2), 2.5))
    np.testing.assert_allclose(r.pre_deviation, [2.5, 2.5])
    # rival in period 1: 1 against 3 (A) and against 2 (B); period 2: 3 vs 2 (A), 3 vs 3 (B)
    assert r.punishes.tolist() == [True]
    assert r.punishment_length.tolist() == [1.0]
    # back on the cycle once the pair is (3, 3): after period 2 in both
    assert r.return_periods.tolist() == [2.0]


def test_sessions_are_averaged_and_counted():
    """Session 0 punishes (punish_once), session 1 does not (always 2: no punishment)."""
    g = np.stack([table(punish_once), table(lambda i, a0, a1: 2)])
    s = Strategies(greedy=g, last=np.array([[2, 2], [2, 2]]), grid=GRID, memory=1)
    r = impulse_response(s, agent=0, deviation=1.0, periods=3)
    assert r.punishes.tolist() == [True, False] and r.share_punish == 0.5
    np.testing.assert_allclose(r.session_price[1], [[1, 3], [3, 3], [3, 3]])
    np.testing.assert_allclose(r.price, (r.session_price[0] + r.session_price[1]) / 2)


def test_bad_arguments_are_config_errors():
    s = strategies(tit_for_tat)
    for kwargs, field in (({"agent": 2}, "agent"), ({"periods": 1}, "periods"),
                          ({"deviation": "best_response"}, "deviation"),
                          ({"deviation": "grim"}, "deviation")):
        with pytest.raises(ConfigError) as err:
            impulse_response(s, **kwargs)
        assert err.value.field == field


def test_save_strategies_file_and_cli(tmp_path, capsys):
    """The ``benchmarks/calvano.py --save-strategies`` layout, written here by hand."""
    g = np.broadcast_to(table(punish_once), (3, 2, 9))
    np.savez(tmp_path / "strategies.npz", q=np.zeros((3, 2, 9, 3), np.float32),
             greedy=g.astype(np.int32), last=np.full((3, 2), 2, np.int32),
             converged=np.ones(3, bool), grid=GRID, profit_table=bertrand(), memory=1,
             p_nash=1.0, p_monopoly=3.0, pi_nash=0.5, pi_monopoly=1.5)
    r = jaxmarket.analysis.impulse_response(str(tmp_path), agent=0, periods=3)
    np.testing.assert_array_equal(r.price, [[2, 3], [1, 1], [3, 3]])
    assert run_cli(impulse_main, [str(tmp_path), "--periods", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["share_punish"] == 1.0 and out["sessions"] == 3
    assert out["price"] == [[2, 3], [1, 1], [3, 3]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Calvano run: 5 prices, 2 seeds x 2 markets, a few hundred periods."""
    run_dir = tmp_path_factory.mktemp("impulse") / "run"
    start_run("configs/calvano.yaml", ["learners.sellers.grid_size=5",
                                       "learners.sellers.exploration_decay=0.01",
                                       "train.num_iterations=300", "train.num_seeds=2",
                                       "train.num_envs=2", "train.chunk_size=300",
                                       "train.checkpoint_every=1"], str(run_dir),
              command="test")
    return run_dir


def test_trained_run_restores_its_greedy_strategies(trained):
    """Sessions are (seed, market) pairs playing their seed's policies from their
    market's last prices; the profit table is the logit closed form (a = 2, c = 1,
    a0 = 0, mu = 0.25) on the 5-price grid."""
    s = strategies_from_run(trained)
    grid = np.linspace(1.427725, 1.970185, 5)
    np.testing.assert_allclose(s.grid, grid, atol=1e-6)
    joint = np.indices((5, 5)).reshape(2, -1).T
    closed = economics.logit_profits(grid[joint], quality=2.0, cost=1.0,
                                     outside_quality=0.0, mu=0.25)
    np.testing.assert_allclose(s.profit_table, closed, rtol=1e-4, atol=1e-6)
    runner = jaxmarket.load_run(trained).runner()
    greedy = np.asarray(runner.learners["sellers"].greedy)            # [2 seeds x 2, 25]
    for seed in range(2):
        for market in range(2):
            np.testing.assert_array_equal(s.greedy[2 * seed + market], greedy[2 * seed:
                                                                              2 * seed + 2])
    prices = np.asarray(runner.obs["sellers"])[:, 0, :]               # [4 markets, 2]
    np.testing.assert_allclose(grid[s.last], prices, atol=1e-5)
    r = impulse_response(trained, agent=0, deviation="best_response", periods=4)
    assert r.punishes.shape == (4,) and r.price.shape == (4, 2)
    one = [i for i in range(4) if r.cycle_length[i] == 1]
    for i in one:   # a fixed point: the deviation is the closed-form best response
        rival = int(np.argmin(np.abs(grid - r.session_price[i, 0, 1])))
        best = int(np.argmax(closed.reshape(5, 5, 2)[:, rival, 0]))
        assert r.session_price[i, 0, 0] == pytest.approx(grid[best], abs=1e-5)
