"""The pricing lab's designs (configs/klein2021, asker2022_*, banchio2022_*) and the
session engine: the market's outcome tables against the designs' closed forms, the
static Nash of the homogeneous Bertrand grid, reduced runs of the synchronous and
asynchronous learners of Asker et al. through both the session engine and the
training loop (``train.engine=loop``), and the config errors of mismatched learners and
markets. ``jaxmarket reproduce`` itself: tests/test_reproduce.py."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions.engine import run_sessions
from jaxmarket.sessions.game import make_game, pure_nash
from jaxmarket.train.plan import resolve
from jaxmarket.train.run import final_learner_state, start_run
from jaxmarket.train.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# Asker et al.: 100 prices on [0.01, 10], unit demand at p <= 10, cost 2
ASKER_GRID = np.linspace(0.01, 10.0, 100)
COST = 2.0


def bertrand_profit(own: np.ndarray, rival: np.ndarray) -> np.ndarray:
    """Homogeneous Bertrand with one unit demanded at any price <= 10: the cheaper
    seller sells it, a tie splits it."""
    share = np.where(own < rival, 1.0, np.where(own == rival, 0.5, 0.0))
    return (own - COST) * share * (own <= 10.0)


def bertrand_grid_nash() -> set[tuple[int, int]]:
    """Pure Nash profiles (grid indices) of the one-shot game, by checking every
    unilateral deviation of the closed-form profits."""
    p = ASKER_GRID
    own = bertrand_profit(p[:, None], p[None, :])          # [i, j]: seller 0 at p_i
    best0 = own.max(axis=0)                                  # best reply to each p_j
    nash = set()
    for i in range(p.size):
        for j in range(p.size):
            if own[i, j] >= best0[j] - 1e-9 and own[j, i] >= best0[i] - 1e-9:
                nash.add((i, j))
    return nash


def test_bertrand_grid_static_nash_from_the_market_tables():
    game = make_game(resolve(str(CONFIGS / "asker2022_sync.yaml")))
    expected = bertrand_grid_nash()
    # the two symmetric profiles just above cost: 2.028 and 2.129 (undercutting 2.129
    # to 2.028 earns 0.028 < 0.129 / 2; at 2.230 undercutting pays)
    assert expected == {(20, 20), (21, 21)}
    assert ASKER_GRID[21] == pytest.approx(2.1291, abs=1e-4)
    assert {tuple(int(x) for x in row) for row in pure_nash(game)} == expected
    # the tables are the market's own profits
    reward = np.asarray(game.reward).reshape(100, 100, 2)
    np.testing.assert_allclose(reward[..., 0], bertrand_profit(ASKER_GRID[:, None],
                                                               ASKER_GRID[None, :]),
                               rtol=1e-5, atol=1e-5)


def test_klein_tables_are_linear_demand_with_ties_split():
    game = make_game(resolve(str(CONFIGS / "klein2021.yaml")))
    p = np.arange(7) / 6
    reward = np.asarray(game.reward, np.float64).reshape(7, 7, 2)
    own, rival = p[:, None], p[None, :]
    share = np.where(own < rival, 1.0, np.where(own == rival, 0.5, 0.0))
    np.testing.assert_allclose(reward[..., 0], own * (1 - own) * share, atol=1e-6)
    # each seller observes the rival's price
    obs = np.asarray(game.obs).reshape(7, 7, 2, 1)
    np.testing.assert_allclose(obs[3, 5, 0, 0], p[5], atol=1e-6)
    np.testing.assert_allclose(obs[3, 5, 1, 0], p[3], atol=1e-6)
    assert game.turns == (2, 0)


def test_synchronous_learners_end_at_a_static_nash_price():
    """Full feedback (Asker et al.'s synchronous updating): every session's final greedy
    profile is a pure Nash equilibrium of the one-shot grid game."""
    plan = resolve(str(CONFIGS / "asker2022_sync.yaml"))
    result = run_sessions(plan, sessions=6, periods=4000, key=jax.random.key(1))
    nash = bertrand_grid_nash()
    assert {tuple(int(x) for x in row) for row in result.greedy_index} <= nash


def test_asynchronous_learners_stay_above_the_static_nash_price():
    """Learning only from the price played, from optimistic Q0 ~ U[10, 20]: no session
    ends at (or below) a static Nash price."""
    plan = resolve(str(CONFIGS / "asker2022_async.yaml"))
    result = run_sessions(plan, sessions=6, periods=4000, key=jax.random.key(1))
    highest_nash = max(ASKER_GRID[i] for i, _ in bertrand_grid_nash())
    assert np.all(result.greedy_price.mean(axis=1) > highest_nash + 0.05)
    # sessions are independent draws: their initial Q (uniform) differs
    assert len({tuple(row) for row in result.greedy_index.tolist()}) > 1


def test_full_feedback_through_the_training_loop(tmp_path):
    """The same synchronous learners trained by ``python -m jaxmarket.train``'s loop
    (counterfactual payoffs from the market's one-shot payoff, sessions folded into the
    slot axis) also end at a static Nash profile."""
    run_dir = tmp_path / "run"
    start_run(str(CONFIGS / "asker2022_sync.yaml"), [
        "train.engine=loop", "train.num_seeds=2", "train.num_iterations=3000",
        "train.chunk_size=1000"],
        str(run_dir))
    state = final_learner_state(run_dir).learners["sellers"]
    greedy = np.asarray(state.greedy)[:, 0].reshape(2, 2)   # [seed, seller], one state
    assert {tuple(int(x) for x in row) for row in greedy} <= bertrand_grid_nash()


def config(name: str, **changes) -> dict:
    raw = load_config(str(CONFIGS / f"{name}.yaml"))
    for path, value in changes.items():
        node = raw
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return raw


@pytest.mark.parametrize("name,changes,field,needle", [
    ("klein2021", {"learners.sellers": {"kind": "ppo_bandit"}}, "learners.sellers.kind",
     "move_order"),
    ("klein2021", {"learners.sellers.target": "simultaneous"}, "learners.sellers.target",
     "sequential"),
    ("asker2022_sync", {"market.consumers.0.demand": {"kind": "noisy", "sigma": 0.1}},
     "learners.sellers.feedback", "demand"),
    ("asker2022_sync", {"learners.sellers.memory": 1}, "learners.sellers.memory", "obs"),
    ("asker2022_sync", {"learners.sellers.grid_size": 50000,
                        "market.sellers.0.observation": [{"kind": "history", "k": 1}],
                        "learners.sellers.memory": 1, "learners.sellers.feedback": "taken"},
     "learners.sellers.grid_size", "int32"),
])
def test_mismatched_learner_and_market_is_a_config_error(name, changes, field, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        resolve(config(name, **changes))
    assert err.value.field == field


def test_cournot_through_the_training_loop_reports_quantities_and_the_clearing_price(tmp_path):
    """configs/cournot.yaml trained by the loop: ``quantity/firms`` is what the firms set,
    ``price/firms`` the clearing price P = 1 - (q_1 + q_2) of the same periods, and the
    reward the profit P q of each firm on average."""
    run_dir = tmp_path / "run"
    start_run(str(CONFIGS / "cournot.yaml"), ["train.engine=loop", "train.num_seeds=1",
                                               "train.num_iterations=200",
                                               "train.chunk_size=100"], str(run_dir))
    header, data = read_metrics(run_dir / "metrics.csv")
    q = data[:, header.index("quantity/firms/p0")]        # mean over the two firms
    price = data[:, header.index("price/firms/p0")]
    sold = q > 0       # nothing sold: no transaction price (the metric says 0)
    assert sold.sum() > 150 and (~sold).any()
    np.testing.assert_allclose(price[sold], 1.0 - 2.0 * q[sold], atol=1e-5)
    assert np.all(price[~sold] == 0)
    assert np.all((q >= 0) & (q <= 0.5)) and np.ptp(q) > 0   # exploring, within bounds
    np.testing.assert_allclose(data[:, header.index("traffic/firms/p0")], q, atol=1e-6)
    np.testing.assert_allclose(data[:, header.index("reward/firms")], price * q, atol=1e-5)


def test_alternating_market_through_the_training_loop(tmp_path):
    """configs/klein2021.yaml trained by the loop: the sequential learner's clock counts
    the market's periods, and after two periods both sellers have had a turn."""
    run_dir = tmp_path / "run"
    start_run(str(CONFIGS / "klein2021.yaml"), ["train.engine=loop", "train.num_seeds=2",
                                                 "train.num_iterations=5",
                                                 "train.chunk_size=5"], str(run_dir))
    state = final_learner_state(run_dir).learners["sellers"]
    assert int(state.clock) == 5
    assert np.asarray(state.pending["valid"]).tolist() == [True] * 4   # 2 seeds x 2 sellers
    np.testing.assert_array_equal(np.asarray(state.step), [5, 5])
