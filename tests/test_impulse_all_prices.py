"""The impulse response to a deviation to every grid price
(``jaxmarket.analysis.impulse_response_all``, ``python -m jaxmarket.impulse RUN --deviation
all``) of hand-made strategies whose answer is worked out below by formula: grim trigger
(every deviation punished for ever; the deviation to the middle price pays exactly when
``delta < 1/3``), always-Nash (no punishment, the discounted gain is the one-period
gain), a two-period cycle that a deviation puts out of phase for ever, a two-period
punishment remembered over two periods (memory 2); the row of the best-response price is
``impulse_response(..., deviation="best_response")``; and a real session-engine run
through the command, against a plain period-by-period replay and against the run's own
equilibrium check (``sessions.csv``).

Two agents on the grid [1, 2, 3] (indices 0, 1, 2), memory 1 unless said: a state is the
last period's pair ``(a0, a1)``, numbered ``3 a0 + a1``; profits: Bertrand for one unit
(``bertrand()``: the lower price takes it, ties split)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from jaxmarket.analysis.impulse import Strategies, impulse_response, impulse_response_all
from jaxmarket.cli import run_cli
from jaxmarket.cli.impulse import main as impulse_main
from jaxmarket.cli.train import main as train_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.train.rundir import STRATEGIES_FILE

from test_impulse_response import GRID, alternate, bertrand, punish_once, table

ROOT = Path(__file__).resolve().parents[1]


def grim(i, a0, a1):
    """Price 3 while both played 3; anything else: price 1, for ever ((1, 1) is absorbing)."""
    return 2 if (a0, a1) == (2, 2) else 0


def strategies(*rules, profit_table=None, discount=None, start=(2, 2)) -> Strategies:
    """One session per rule, both agents playing it."""
    return Strategies(greedy=np.stack([table(r) for r in rules]),
                      last=np.tile(np.array(start), (len(rules), 1)), grid=GRID, memory=1,
                      profit_table=bertrand() if profit_table is None else profit_table,
                      discount=discount)


@pytest.mark.parametrize("delta", [0.95, 0.5, 0.2])
def test_grim_trigger_punishes_every_deviation_and_the_gain_is_by_formula(delta):
    """Agent 1 earns twice Bertrand (so a mix-up of the agents shows). On the cycle (3, 3)
    it earns 2 x 1.5 = 3; a deviation to a < 3 takes the unit, 2a, then (1, 1) for ever at
    2 x 0.5 = 1: gain(a) = 2a - 3 + delta (1 - 3) / (1 - delta). The deviation to 2 pays
    exactly when 1 > 2 delta / (1 - delta), delta < 1/3; to 1 never; to 3 it is no
    deviation."""
    profits = bertrand() * np.array([1.0, 2.0])
    r = impulse_response_all(strategies(grim, profit_table=profits), agent=1, periods=5,
                             discount=delta)
    a = GRID
    expected = np.where(a < 3, 2 * a - 3 - 2 * delta / (1 - delta), 0.0)
    np.testing.assert_allclose(r.discounted_gain, [expected], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.one_period_gain, [np.where(a < 3, 2 * a - 3, 0.0)])
    assert r.pays.tolist() == [[False, delta < 1 / 3, False]]
    assert r.punishes.tolist() == [[True, True, False]]
    assert r.punishment_length.tolist() == [[4.0, 4.0, 0.0]]     # periods 1 .. 4
    np.testing.assert_array_equal(r.returned, [[0.0, 0.0, 1.0]])
    np.testing.assert_array_equal(r.return_periods, [[np.nan, np.nan, 0.0]])
    np.testing.assert_array_equal(r.price[0], [[3, 1]] + [[1, 1]] * 4)
    np.testing.assert_array_equal(r.price[1], [[3, 2]] + [[1, 1]] * 4)
    np.testing.assert_array_equal(r.price[2], [[3, 3]] * 5)
    np.testing.assert_array_equal(r.counterfactual, [[3, 3]] * 5)
    np.testing.assert_allclose(r.profit[1, :, 1], [4, 1, 1, 1, 1])
    assert r.discount == delta and r.grid.tolist() == GRID.tolist()
    np.testing.assert_allclose(r.ci95["discounted_gain"][:, 0], expected)   # one session


def test_always_nash_never_punishes_and_the_gain_is_the_one_period_gain():
    """Both always play 1 (the one-shot Nash price): from (1, 1) agent 0 deviates to a;
    its profit is 0.5 at a = 1 (a tie), 0 above (the rival's 1 takes the unit); then
    (1, 1) again whatever happened, so the discounted gain is the one-period gain, the
    profit table's pi_0(a, 1) - pi_0(1, 1) = [0, -0.5, -0.5]. The discount comes from
    the strategies."""
    nash = strategies(lambda i, a0, a1: 0, discount=0.9, start=(0, 0))
    r = impulse_response_all(nash, agent=0, periods=4)
    table_ = bertrand()
    by_hand = [table_[3 * a + 0, 0] - table_[0, 0] for a in range(3)]
    assert by_hand == [0.0, -0.5, -0.5]
    np.testing.assert_allclose(r.one_period_gain, [by_hand])
    np.testing.assert_allclose(r.discounted_gain, [by_hand], atol=1e-12)
    assert r.discount == 0.9
    assert not r.punishes.any() and not r.pays.any()
    np.testing.assert_array_equal(r.punishment_length, [[0, 0, 0]])
    # off the cycle's state (a, 1) after period 0, back on it after period 1
    np.testing.assert_array_equal(r.return_periods, [[0, 1, 1]])


def test_a_deviation_that_puts_a_cycle_out_of_phase_is_summed_for_ever():
    """``alternate``: the cycle (3, 3) -> (2, 2) -> ... Agent 0 deviates to 1 (index 0).
    From the point whose next pair is (2, 2): profits 1, 0.5 [(1, 1)], then the cycle
    from (3, 3): 1.5, 1, 1.5 ...; undeviated 1, 1.5, 1, 1.5 ...: the differences 0, -1,
    then +0.5, -0.5, ... for ever, gain -delta + 0.5 delta^2 / (1 + delta). From the
    point whose next pair is (3, 3): 1, 0.5, 1.5, 1 ... against 1.5, 1, 1.5, 1 ...: gain
    -0.5 - 0.5 delta. The session's figure is their mean. A deviation to 2 pays at the
    second point alone, 2 against 1.5, then 0.5 against 1 and back in phase: 0.5 - 0.5
    delta > 0 (at the first point it is no deviation); the session counts it as paying."""
    delta = 0.9
    s = strategies(alternate, start=(0, 1))
    r = impulse_response_all(s, agent=0, periods=6, discount=delta)
    ahead = -delta + 0.5 * delta ** 2 / (1 + delta)
    behind = -0.5 - 0.5 * delta
    assert r.cycle_length.tolist() == [2]
    assert r.discounted_gain[0, 0] == pytest.approx((ahead + behind) / 2, abs=1e-12)
    assert r.one_period_gain[0, 0] == pytest.approx((0.0 - 0.5) / 2)
    assert r.discounted_gain[0, 1] == pytest.approx((0.0 + 0.5 - 0.5 * delta) / 2,
                                                    abs=1e-12)
    assert r.pays.tolist() == [[False, True, False]]
    # and a plain sum over a long horizon agrees (the tail is below 1e-30)
    steps = np.arange(700)
    dev = np.r_[1.0, 0.5, np.tile([1.5, 1.0], 349)]
    plain = [np.sum(delta ** steps * (dev - np.tile(cf, 350)))
             for cf in ([1.0, 1.5], [1.5, 1.0])]
    assert r.discounted_gain[0, 0] == pytest.approx(np.mean(plain), abs=1e-12)


def two_period_punishment(i, *digits):
    """Memory 2, prices L (index 0) and H (1): play H after (H, H) unless the profile
    before was mixed, and after (L, L) if the one before was (L, L) too; else L. A
    deviation to L is answered by (L, L) twice, then (H, H) again."""
    last, prev = digits[:2], digits[2:]
    if last == (1, 1):
        return 1 if prev in ((1, 1), (0, 0)) else 0
    return 1 if last == (0, 0) and prev == (0, 0) else 0


def test_memory_two_the_punishment_and_its_cost_are_two_periods_long():
    """A prisoner's dilemma of prices (H, H) 3 each, (L, H) 4 / 0, (L, L) 1 each. Agent 0
    deviates to L: 4, then 1, 1, then 3 for ever; gain 1 - 2 delta - 2 delta^2, which pays
    exactly below delta = (sqrt 3 - 1) / 2 = 0.366. The state (the last two profiles,
    the most recent first) is back on the cycle after period 4."""
    grid = np.array([1.0, 3.0])
    states = np.indices((2,) * 4).reshape(4, -1).T                   # [16, 4] digits
    greedy = np.array([[two_period_punishment(i, *map(int, d)) for d in states]
                       for i in range(2)])
    profits = np.array([[1.0, 1.0], [4.0, 0.0], [0.0, 4.0], [3.0, 3.0]])  # LL LH HL HH
    for delta in (0.9, 0.3):
        s = Strategies(greedy=greedy[None], last=np.array([[1, 1, 1, 1]]), grid=grid,
                       memory=2, profit_table=profits, discount=delta)
        r = impulse_response_all(s, agent=0, periods=6)
        gain = 1 - 2 * delta - 2 * delta ** 2
        np.testing.assert_allclose(r.discounted_gain, [[gain, 0.0]], atol=1e-12)
        np.testing.assert_allclose(r.one_period_gain, [[1.0, 0.0]])
        assert r.pays.tolist() == [[gain > 0, False]]
        np.testing.assert_array_equal(r.price[0], [[1, 3], [1, 1], [1, 1], [3, 3],
                                                   [3, 3], [3, 3]])
        assert r.punishment_length.tolist() == [[2.0, 0.0]]
        assert r.return_periods.tolist() == [[4.0, 0.0]]


def test_the_best_response_row_is_the_best_response_impulse_response():
    """Two sessions on the cycle (3, 3), ``punish_once`` and ``grim``: agent 1's unique
    static best response to 3 is 2 (profit 2 against 1.5 at a tie and 1 at price 1), so
    row 1 of the every-price result is ``impulse_response(deviation="best_response")``."""
    s = strategies(punish_once, grim, discount=0.95)
    one = impulse_response(s, agent=1, deviation="best_response", periods=5)
    assert one.deviation_index.tolist() == [1.0, 1.0]
    every = impulse_response_all(s, agent=1, periods=5)
    np.testing.assert_array_equal(every.price[1], one.price)
    np.testing.assert_array_equal(every.counterfactual, one.counterfactual)
    np.testing.assert_array_equal(every.pre_deviation, one.pre_deviation)
    np.testing.assert_allclose(every.profit[1], one.profit)
    np.testing.assert_allclose(every.counterfactual_profit, one.counterfactual_profit)
    np.testing.assert_array_equal(every.punishes[:, 1], one.punishes)
    np.testing.assert_array_equal(every.punishment_length[:, 1], one.punishment_length)
    np.testing.assert_array_equal(every.return_periods[:, 1], one.return_periods)
    np.testing.assert_array_equal(every.returned[:, 1], one.returned)
    assert one.punishment_length.tolist() == [1.0, 4.0]           # once; for ever
    # the sessions' means and intervals
    assert every.mean("punishment_length")[1] == 2.5
    lo, hi = every.ci95["punishment_length"][1]
    assert lo <= 2.5 <= hi and (lo, hi) != (2.5, 2.5)


def test_bad_arguments_are_config_errors():
    s = strategies(grim)
    for kwargs, field in (({}, "discount"), ({"discount": 1.0}, "discount"),
                          ({"discount": 0.9, "agent": 2}, "agent"),
                          ({"discount": 0.9, "periods": 1}, "periods")):
        with pytest.raises(ConfigError) as err:
            impulse_response_all(s, **kwargs)
        assert err.value.field == field
    without = Strategies(greedy=s.greedy, last=s.last, grid=GRID, memory=1, discount=0.9)
    with pytest.raises(ConfigError) as err:
        impulse_response_all(without)
    assert err.value.field == "deviation"


# ------------------------------------------------------------------ a real run

SMALL = ["learners.sellers.grid_size=5", "train.num_seeds=3", "train.num_iterations=600",
         "train.chunk_size=300", "train.session_stop=periods",
         "learners.sellers.exploration_decay=0.01"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A small Calvano run on the session engine: 3 sessions, 5 prices, memory 1,
    delta = 0.95."""
    run_dir = tmp_path_factory.mktemp("every_price") / "run"
    code = run_cli(train_main, [str(ROOT / "configs" / "calvano.yaml"), "--run-dir",
                                str(run_dir), *SMALL])
    assert code == 0 and (run_dir / STRATEGIES_FILE).is_file()
    return run_dir


def plain_gains(path: Path, agent: int, delta: float, horizon: int = 900):
    """``(one [N, m], discounted [N, m], pays [N, m])`` replayed period by period in plain
    Python: the cycle from the last pair, then from each of its pairs a deviation to each
    price and the undeviated play, ``horizon`` periods (delta^900 < 1e-20)."""
    with np.load(path) as d:
        greedy, last, table_ = d["greedy"], d["last"], d["profit_table"]
    N, _, _ = greedy.shape
    m = int(round(np.sqrt(table_.shape[0])))

    def play(s, pair):
        return tuple(int(greedy[s, i, m * pair[0] + pair[1]]) for i in range(2))

    one, disc, pays = np.zeros((N, m)), np.zeros((N, m)), np.zeros((N, m), bool)
    for s in range(N):
        pair = tuple(int(x) for x in last[s])
        for _ in range(m * m):
            pair = play(s, pair)
        cycle = [pair]
        while play(s, cycle[-1]) != cycle[0]:
            cycle.append(play(s, cycle[-1]))
        for a in range(m):
            for z in cycle:
                stay = play(s, z)
                dev = list(stay)
                dev[agent] = a
                dev = tuple(dev)
                total, q, x, y = 0.0, 0.0, dev, stay
                for t in range(horizon):
                    total += delta ** t * (table_[m * x[0] + x[1], agent]
                                           - table_[m * y[0] + y[1], agent])
                    q += delta ** t * table_[m * y[0] + y[1], agent]
                    x, y = play(s, x), play(s, y)
                gain_t0 = table_[m * dev[0] + dev[1], agent] - table_[m * stay[0] + stay[1],
                                                                     agent]
                one[s, a] += gain_t0 / len(cycle)
                disc[s, a] += total / len(cycle)
                pays[s, a] |= total > 1e-9 * max(abs(q), 1.0)
    return one, disc, pays


def test_every_price_of_a_real_run_through_the_command(run, capsys):
    """``--deviation all --json``: the run's discount (0.95), one table row per price,
    the gains equal to a plain replay of the strategies (for agent 1 at ``--discount
    0.5`` too), and no price pays in a session exactly where the run's own equilibrium
    check says the agent best-replies all along its cycle."""
    assert run_cli(impulse_main, [str(run), "--deviation", "all", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    m = len(out["grid"])
    assert m == 5 and out["discount"] == 0.95 and out["sessions"] == 3
    rows = lines[3:-1]
    assert len(rows) == m
    for k, row in enumerate(rows):
        cells = row.split()
        assert float(cells[0]) == pytest.approx(out["grid"][k], abs=5e-5)
        assert float(cells[4]) == pytest.approx(out["mean_discounted_gain"][k], abs=5e-5)
    one, disc, pays = plain_gains(run / STRATEGIES_FILE, 0, 0.95)
    np.testing.assert_allclose(out["one_period_gain"], one, atol=1e-12)
    np.testing.assert_allclose(out["discounted_gain"], disc, atol=1e-9)
    assert out["pays"] == pays.tolist()
    with (run / "sessions.csv").open() as f:
        best_reply = [float(row["best_reply_on_path_0"]) == 1.0 for row in csv.DictReader(f)]
    assert [not any(p) for p in out["pays"]] == best_reply
    assert run_cli(impulse_main, [str(run), "--deviation", "all", "--agent", "1",
                                  "--discount", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    one, disc, _ = plain_gains(run / STRATEGIES_FILE, 1, 0.5)
    assert out["discount"] == 0.5
    np.testing.assert_allclose(out["discounted_gain"], disc, atol=1e-9)
    with pytest.raises(SystemExit) as stop:   # --discount belongs to --deviation all
        impulse_main([str(run), "--discount", "0.5"])
    assert stop.value.code == 2
