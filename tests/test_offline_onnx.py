"""ONNX export of offline policies: onnxruntime reproduces the jitted policy to 1e-5."""

import jax
import numpy as np
import onnx
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import make_algo, make_dataset
from jaxmarket.offline.onnx_export import export_onnx, onnx_max_abs_diff

rng = np.random.default_rng(0)
OBS = rng.normal(size=(300, 3)).astype(np.float32) * [1.0, 5.0, 0.1] + [0.0, 2.0, -1.0]
CONT = make_dataset(OBS, rng.uniform(1.0, 2.5, (300, 2)), rng.normal(size=300),
                    meta={"action_low": [1.0, 0.5], "action_high": [2.5, 3.0]})
GRID = [[1.0], [1.5], [2.0], [2.5]]
IDX = rng.integers(0, 4, 300)
DISC = make_dataset(OBS, np.asarray(GRID)[IDX], rng.normal(size=300), action_index=IDX,
                    log_probs=np.full(300, np.log(0.25)),
                    meta={"discrete": True, "action_values": GRID})


# the three kinds of head: tanh of every output (bc; td3_bc and iql are the same graph),
# tanh of the mean half (cql's mean and log-std), argmax + gather (discrete)
@pytest.mark.parametrize("name, ds", [("bc", CONT), ("cql", CONT), ("iql", DISC)])
def test_onnx_policy_matches_the_jitted_policy(name, ds, tmp_path):
    algo = make_algo(name, ds, hidden=[16, 16])
    # random parameters (not trained): the graph must compute the policy for any weights
    state = algo.init(jax.random.key(7))
    path = export_onnx(algo, state, tmp_path / "policy.onnx")
    onnx.checker.check_model(onnx.load(path))
    assert onnx_max_abs_diff(algo, state, path, OBS) <= 1e-5
    if ds.discrete:   # the argmax really varies with the observation
        assert len(np.unique(np.asarray(algo.policy(state, OBS)))) > 1


def test_onnx_export_refuses_what_it_cannot_write(tmp_path):
    algo = make_algo("dm", CONT, hidden=[4])    # a search over candidates, not one network
    state = algo.init(jax.random.key(0))
    with pytest.raises(ConfigError, match="--export-onnx: got 'dm \\(continuous\\)'"):
        export_onnx(algo, state, tmp_path / "p.onnx")
    bc = make_algo("bc", CONT, hidden=[4])
    with pytest.raises(ConfigError, match="ending in .onnx"):
        export_onnx(bc, bc.init(jax.random.key(0)), tmp_path / "p.txt")
    assert list(tmp_path.iterdir()) == []
