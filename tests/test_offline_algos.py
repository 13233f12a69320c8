"""make_algo infers shapes, bounds and the reward scale from the data; TD3+BC and discrete
CQL find the best action of a one-step pricing problem from uniformly logged actions."""

import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import fit, make_algo, make_dataset

rng = np.random.default_rng(0)
N = 2000
OBS = np.zeros((N, 1), np.float32)
# expected reward -(p - 1.9)^2: the best price is 1.9 (continuous), 2.0 on the grid
PRICES = rng.uniform(1.0, 2.5, (N, 1)).astype(np.float32)
CONT = make_dataset(OBS, PRICES, -(PRICES[:, 0] - 1.9) ** 2 + 0.05 * rng.normal(size=N),
                    terminals=np.ones(N, bool), meta={"action_low": [1.0], "action_high": [2.5]})
GRID = [[1.0], [1.5], [2.0], [2.5]]
IDX = rng.integers(0, 4, N)
DISC = make_dataset(OBS, np.asarray(GRID)[IDX],
                    -(np.asarray(GRID)[IDX, 0] - 1.9) ** 2 + 0.05 * rng.normal(size=N),
                    terminals=np.ones(N, bool), action_index=IDX,
                    meta={"discrete": True, "action_values": GRID})


def test_make_algo_infers_from_the_dataset():
    algo = make_algo("td3_bc", CONT, hidden=[8])
    np.testing.assert_allclose(algo.norm.act_low, [1.0])
    np.testing.assert_allclose(algo.norm.act_high, [2.5])
    assert float(algo.norm.reward_scale) == pytest.approx(1.0 / CONT["rewards"].std(), rel=1e-5)
    assert not algo.discrete and make_algo("cql", DISC, hidden=[8]).discrete
    with pytest.raises(ConfigError, match="td3_bc.*continuous-action dataset"):
        make_algo("td3_bc", DISC)
    with pytest.raises(ConfigError, match="algo.iql.expectile: got 0.2"):
        make_algo("iql", CONT, expectile=0.2)
    with pytest.raises(ConfigError, match="--algo: got 'sac'; allowed: one of bc, cql, iql"):
        make_algo("sac", CONT)


def test_td3_bc_and_discrete_cql_find_the_best_price():
    algo = make_algo("td3_bc", CONT, hidden=[16, 16], learning_rate=3e-3, bc_alpha=10.0)
    state = fit(algo, CONT, stop=400, chunk=400, batch_size=128).state
    assert abs(float(algo.policy(state, OBS[:1])[0, 0]) - 1.9) < 0.15
    algo = make_algo("cql", DISC, hidden=[16], learning_rate=3e-3)
    state = fit(algo, DISC, stop=400, chunk=400, batch_size=128).state
    np.testing.assert_allclose(algo.policy(state, OBS[:1]), [[2.0]])
    np.testing.assert_allclose(algo.probs(state, OBS[:1]), [[0, 0, 1, 0]])


def test_simulator_evaluator_refuses_a_dataset_whose_spaces_differ_from_its_scenario():
    from pathlib import Path

    import yaml

    from jaxmarket.offline import SimulatorValue
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "benchmarks"
                             / "offline_duopoly.yaml").read_text())
    wrong = make_dataset(np.zeros((4, 3)), np.ones((4, 1)), np.zeros(4),
                         meta={"group": "seller", "config": config})
    with pytest.raises(ConfigError, match="obs_dim 3 .* group seller of its scenario: obs_dim 2"):
        SimulatorValue(wrong)
