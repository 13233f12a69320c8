"""Every learner/market mismatch a valid-looking config can hold is a ConfigError raised
by ``resolve`` (what ``check`` and ``train`` call before compiling), naming the field
and the value; none is a bare ValueError from a learner's factory or from tracing.

The cases are the raise sites of ``jaxmarket/learners/*.py`` that a config reaches
(the ``ValueError``s left in the learners are internal invariants: a spec tiled
differently from the loop's, ``init`` with another learner's spec).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from jaxmarket.cli import run_cli
from jaxmarket.cli.check import main as check_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.learners.base import LearnerSpec
from jaxmarket.learners.fixed import make_random
from jaxmarket.train.plan import resolve

MARKET = {
    "num_products": 1,
    "consumers": [{"name": "consumer", "count": 1, "budget": 2.0, "queries": 1.0}],
    "sellers": [{"name": "sellers", "count": 2, "action": "price", "low": 0.5, "high": 2.0,
                 "cost": 0.1, "reward": [{"kind": "profit"}],
                 "observation": [{"kind": "history", "k": 1}]}],
    "distributor": {"kind": "logit", "temperature": 0.25, "outside_option": True},
}
TRAIN = {"num_iterations": 2, "rollout_length": 2, "num_envs": 2, "num_seeds": 1}


def config(learner: dict, market: dict | None = None, seller: dict | None = None,
           train: dict | None = None) -> dict:
    m = copy.deepcopy(MARKET)
    m.update(market or {})
    m["sellers"][0].update(seller or {})
    return {"market": m, "learners": {"sellers": learner}, "train": {**TRAIN, **(train or {})}}


NO_OBSERVATION = {"observation": []}
CASES = {
    # the two tracebacks
    "q_learning, two products": (
        config({"kind": "q_learning"}, market={"num_products": 2}),
        "learners.sellers.kind", "q_learning", "num_products=2"),
    "q_learning, no observation for memory 1": (
        config({"kind": "q_learning"}, seller=NO_OBSERVATION),
        "learners.sellers.memory", 1, "observes nothing"),
    # the others a learner's factory raises on a market
    "q_learning, memory 2 on a one-period history": (
        config({"kind": "q_learning", "memory": 2, "grid_size": 3},
               seller={"observation": [{"kind": "history", "k": 1}, {"kind": "own_price"}]}),
        "learners.sellers.memory", 2, "or 1, the periods the group's observation holds"),
    "q_learning, grid outside the action bounds": (
        config({"kind": "q_learning", "grid": [0.1, 1.0, 1.5]}),
        "learners.sellers.grid", [0.1, 1.0, 1.5], "[0.5, 2]"),
    "q_learning, more states than int32": (
        config({"kind": "q_learning", "grid_size": 50000}),
        "learners.sellers.grid_size", 50000, "2^31"),
    "q_learning, random_rival over too many joint prices": (
        config({"kind": "q_learning", "grid_size": 1000, "memory": 0},
               seller={"count": 3}),
        "learners.sellers.q_init", "random_rival", "1000^3"),
    "q_learning, full feedback under random demand": (
        config({"kind": "q_learning", "memory": 0, "feedback": "full", "grid_size": 3},
               market={"consumers": [{"name": "consumer", "count": 1, "budget": 2.0,
                                      "queries": 1.0, "demand": {"kind": "noisy",
                                                                 "sigma": 0.1}}]}),
        "learners.sellers.feedback", "full", "noisy"),
    "q_learning, simultaneous target under alternating moves": (
        config({"kind": "q_learning", "grid_size": 3}, market={"move_order": "alternating"}),
        "learners.sellers.target", "simultaneous", "sequential"),
    "ppo under alternating moves": (
        config({"kind": "ppo"}, market={"move_order": "alternating"}),
        "learners.sellers.kind", "ppo", "alternating"),
    "ppo, more minibatches than samples": (
        config({"kind": "ppo", "num_minibatches": 64}),
        "learners.sellers.num_minibatches", 64, "8 samples"),
    "undercut without a competitor-price observation": (
        config({"kind": "undercut"}, seller=NO_OBSERVATION),
        "learners.sellers", "obs_dim=0", "competitor_prices"),
    "constant outside the action bounds": (
        config({"kind": "constant", "value": 5.0}),
        "learners.sellers.value", 5.0, "[0.5, 2]"),
    "exp3, reward_high not above reward_low": (
        config({"kind": "exp3", "reward_low": 1.0, "reward_high": 1.0}),
        "learners.sellers.reward_high", 1.0, "reward_low"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_learner_market_mismatch_is_a_config_error_naming_field_and_value(name):
    cfg, field, value, needle = CASES[name]
    with pytest.raises(ConfigError) as err:
        resolve(cfg)
    assert type(err.value) is ConfigError
    assert err.value.field == field
    got = err.value.value
    assert (tuple(got) if isinstance(got, (list, tuple)) else got) == (
        tuple(value) if isinstance(value, list) else value)
    assert str(err.value).startswith(f"{field}: got ")
    assert str(value).strip("[]") in str(err.value)
    assert needle in str(err.value)


def test_enough_minibatch_samples_resolve():
    """The minibatch bounds are exact. An update holds rollout_length x slots = 2 x 2 x 2
    = 8 samples: 9 minibatches are refused before anything is traced. PPO groups the
    samples by policy (one policy per seller: 2 x 2 = 4 samples each), so 4 minibatches
    resolve, and 5 are refused on the group's field when the update is traced
    (not a traceback at compile time)."""
    with pytest.raises(ConfigError, match="8 samples"):
        resolve(config({"kind": "ppo", "num_minibatches": 9}))
    T, envs, sellers = 2, 2, 2
    per_policy = T * envs * sellers // sellers
    ok = resolve(config({"kind": "ppo", "num_minibatches": per_policy}, train={"num_envs": envs}))
    assert ok.learner_settings["sellers"][1]["num_minibatches"] == per_policy
    with pytest.raises(ConfigError) as err:
        resolve(config({"kind": "ppo", "num_minibatches": per_policy + 1},
                       train={"num_envs": envs}))
    assert err.value.field == "learners.sellers.num_minibatches"
    assert f"{per_policy} samples per policy" in str(err.value)


def test_minibatch_bound_is_checked_before_the_probe_is_traced():
    """A large run is sized on a probe of a few markets, whose program is traced; the
    bound is the run's (rollout 1 x 2 agents x 4096 markets = 8192 samples) and is
    checked first, so the error is this one and not the probe's trace failing."""
    train = {"num_envs": 4096, "rollout_length": 1, "num_seeds": 1}
    with pytest.raises(ConfigError, match="8192 samples") as err:
        resolve(config({"kind": "ppo", "num_minibatches": 8193}, train=train),
                validate_only=True)
    assert err.value.field == "learners.sellers.num_minibatches"


@pytest.mark.parametrize("override, needle", [
    ("market.num_products=2", "learners.sellers.kind: got 'q_learning'"),
    ("market.sellers[0].observation=[]", "learners.sellers.memory: got 1"),
    # issue 43: memory 2 over an observation of one period ran as memory 1, silently
    ("learners.sellers.memory=2", "learners.sellers.memory: got 2; allowed: 0 (stateless) "
     "or 1, the periods the group's observation holds"),
])
def test_check_prints_one_config_error_line(override, needle, capsys, tmp_path):
    """``python -m jaxmarket.check`` on the issue's two configs: exit 2 and one line."""
    path = tmp_path / "calvano_like.yaml"
    import yaml
    path.write_text(yaml.safe_dump(config({"kind": "q_learning"})))
    assert run_cli(check_main, [str(path), override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: " + needle)
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_random_needs_finite_bounds():
    """A Python-made spec (configs cannot hold infinite bounds) with an infinite bound."""
    spec = LearnerSpec(num_agents=1, obs_dim=0, num_products=1,
                       action_low=np.zeros((1, 1), np.float32),
                       action_high=np.full((1, 1), np.inf, np.float32))
    with pytest.raises(ConfigError) as err:
        make_random({"kind": "random"}, spec)
    assert err.value.field == "learners.random"
