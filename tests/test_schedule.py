"""train.schedule: market changes applied inside the compiled loop (docs/poi.md)."""

import copy
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml

from jaxmarket.config.errors import ConfigError
from jaxmarket.train.plan import resolve
from jaxmarket.train.trainer import Trainer

MONOPOLY = yaml.safe_load("""
market:
  num_products: 1
  consumers: [{name: c, count: 1, budget: 1.0, queries: 1.0}]
  sellers: [{name: s, count: 1, low: 0.0, high: 1.0}]
  distributor: {kind: cheapest}
learners:
  s: {kind: constant, value: 0.5}
train:
  num_iterations: 6
  num_envs: 2
  num_seeds: 2
  chunk_size: 3
  schedule:
    - at: 2
      set:
        market.consumers[0].queries: 3.0
    - at: 4
      set:
        market.sellers[0].cost: [0.25]
""")


def test_schedule_changes_the_market_at_its_iteration_without_recompiling(tmp_path):
    # one seller quoting 0.5 <= budget 1 serves every query (cheapest-first): traffic =
    # queries; profit = (0.5 - cost) * traffic. Iterations 1-2 (0-based 0, 1): queries 1,
    # cost 0; from 0-based iteration 2 queries 3; from 4 cost 0.25.
    trainer = Trainer(resolve(copy.deepcopy(MONOPOLY)), tmp_path / "run")
    runner = trainer.initial_runner()
    chunk = trainer.chunk_fn(3)
    traffic, reward = [], []
    for _ in range(2):
        runner, m = chunk(runner)
        traffic += list(np.asarray(m["traffic/s"])[:, 0])
        reward += list(np.asarray(m["reward/s"]))
    np.testing.assert_allclose(traffic, [1, 1, 3, 3, 3, 3])
    np.testing.assert_allclose(reward, [0.5, 0.5, 1.5, 1.5, 0.75, 0.75])
    # the changes live in the runner's params (what a checkpoint saves)
    np.testing.assert_array_equal(np.asarray(runner.params.consumers["c"].queries), [[3.0]])
    np.testing.assert_array_equal(np.asarray(runner.params.sellers["s"].cost), [[0.25]])
    assert chunk._cache_size() == 1   # both chunks (either side of a change): one program


DUOPOLY = yaml.safe_load("""
market:
  num_products: 1
  consumers: [{name: consumer, count: 1, budget: 1000.0, queries: 1.0}]
  sellers: [{name: sellers, count: 2, low: 1.0, high: 2.5, cost: 1.0, quality: 2.0}]
  distributor: {kind: logit, temperature: 0.25, outside_option: true, outside_quality: 0.0}
learners:
  sellers: {kind: ppo_bandit, initial_stddev: 0.2, learning_rate: 0.01, buffer_length: 2}
train:
  num_iterations: 6
  num_envs: 2
  chunk_size: 2
  schedule:
    - at: 3
      set:
        market.distributor.temperature: 0.5
    - at: 5
      set:
        market.sellers[0].quality: [[2.0], [2.5]]
""")


def test_resume_across_a_change_is_bit_identical(tmp_path):
    full = Trainer(resolve(copy.deepcopy(DUOPOLY)), tmp_path / "full")
    runner = full.initial_runner()
    for _ in range(3):
        runner, _ = full.chunk_fn(2)(runner)
    # the other run checkpoints at iteration 4 (after the first change, before the
    # second) and a fresh Trainer resumes it
    # (the same config is the same program: the Trainers share the compiled functions,
    # so the test compiles once)
    part = Trainer(resolve(copy.deepcopy(DUOPOLY)), tmp_path / "part")
    part._init, part._chunks = full._init, full._chunks
    r = part.initial_runner()
    for _ in range(2):
        r, _ = part.chunk_fn(2)(r)
    part.save(r, 4)
    resumed = Trainer(resolve(copy.deepcopy(DUOPOLY)), tmp_path / "part")
    resumed._init, resumed._chunks = full._init, full._chunks
    r, start = resumed.restore()
    assert start == 4
    np.testing.assert_array_equal(np.asarray(r.params.distributor["temperature"]), 0.5)
    r, _ = resumed.chunk_fn(2)(r)
    np.testing.assert_array_equal(np.asarray(r.params.sellers["sellers"].quality), [[2.0], [2.5]])
    for a, b in zip(jax.tree.leaves(runner), jax.tree.leaves(r)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def with_schedule(schedule, **train):
    config = copy.deepcopy(MONOPOLY)
    config["train"] = {**config["train"], **train, "schedule": schedule}
    return config


@pytest.mark.parametrize("schedule, field, words", [
    ([{"at": 7, "set": {"market.sellers[0].cost": 0.1}}], "train.schedule[0].at", "[0, 6]"),
    ([{"at": 1, "set": {"market.sellers[0].count": 2}}],
     "train.schedule[0].set.market.sellers[0].count", "array-valued"),
    ([{"at": 1, "set": {"market.sellers[0].high": 2.0}}],
     "train.schedule[0].set.market.sellers[0].high", "action bounds"),
    ([{"at": 1, "set": {"market.distributor.kind": "logit"}}],
     "train.schedule[0].set.market.distributor.kind", "array-valued"),
    ([{"at": 1, "set": {"market.sellers[3].cost": 0.1}}],
     "train.schedule[0].set.market.sellers[3].cost", "array-valued"),
    ([{"at": 1, "set": {"market.sellers[0].cost": -1.0}}],
     "train.schedule[0].set.market.sellers[0].cost", ">= 0"),
    ([{"at": 1, "set": {"market.sellers[0].cost": [0.1, 0.2]}}],
     "train.schedule[0].set.market.sellers[0].cost", "shape"),
    ([{"at": 1}], "train.schedule[0]", "{at: ITERATION, set:"),
    ({"at": 1}, "train.schedule", "a list"),
])
def test_bad_schedule_is_one_config_error_before_compiling(schedule, field, words):
    with pytest.raises(ConfigError) as err:
        resolve(with_schedule(schedule))
    assert err.value.field == field
    assert words in str(err.value) and "\n" not in str(err.value)


def test_bad_schedule_from_the_cli_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_schedule(
        [{"at": 1, "set": {"market.sellers[0].low": 0.2}}])))
    out = subprocess.run([sys.executable, "-m", "jaxmarket.train", str(path), "--run-dir",
                          str(tmp_path / "run")], capture_output=True, text=True, check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.schedule[0].set.market.sellers[0].low" in lines[0]
    assert not (tmp_path / "run").exists()


def test_at_may_be_a_share_of_the_iterations():
    config = with_schedule([{"at": "50%", "set": {"market.sellers[0].cost": 0.1}},
                            {"at": "100%", "set": {"market.sellers[0].cost": 0.2}}],
                           num_iterations=5)
    plan = resolve(config)
    assert [e.at for e in plan.schedule] == [2, 5]   # 2.5 rounded down; the end
    with pytest.raises(ConfigError) as err:
        resolve(with_schedule([{"at": "150%", "set": {"market.sellers[0].cost": 0.1}}]))
    assert err.value.field == "train.schedule[0].at"
