"""NaN and +-inf actions (docs/reliability.md, "Non-finite actions"): an entry of an
action that is not finite keeps the agent's action in force for that entry, for every
action kind (price, multiplier, budget: configs/multi_product.yaml; quantity:
configs/cournot.yaml); ``info["nonfinite_actions"]`` flags it; the market stays finite
and money conserved; in training, ``stop_on_nan`` stops on it and
``nonfinite_actions.csv`` / ``summary.json`` count it, while a run without any writes
the same files as before (no column, no file, no key)."""

from __future__ import annotations

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONFIGS, duopoly_config

import jaxmarket
from jaxmarket.config.fields import Field
from jaxmarket.learners.base import LEARNERS, Learner, LearnerDef
from jaxmarket.learners.fixed import resolve_hyper
from jaxmarket.market.state import ACTION_FIELDS
from jaxmarket.train.plan import resolve
from jaxmarket.train.tracking import Tracker, read_metrics
from jaxmarket.train.trainer import NONFINITE_FILE, Trainer

CASES = [("multi_product", "posted", "price"), ("multi_product", "multiplied", "multiplier"),
         ("multi_product", "buyers", "budget"), ("cournot", "firms", "quantity")]
BAD = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}


def bounds(env, params, g):
    space = env.action_space(g, params)
    shape = space.shape
    return (np.broadcast_to(np.asarray(space.low, np.float32), shape),
            np.broadcast_to(np.asarray(space.high, np.float32), shape))


def at(env, params, fraction):
    """Every group's action at ``low + fraction * (high - low)``."""
    out = {}
    for g in env.agent_groups:
        low, high = bounds(env, params, g)
        out[g] = jnp.asarray(low + np.float32(fraction) * (high - low))
    return out


def finite(tree) -> bool:
    return all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(tree)
               if jnp.issubdtype(x.dtype, jnp.floating))


@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
@pytest.mark.parametrize("config,group,kind", CASES, ids=[c[2] for c in CASES])
def test_a_nonfinite_action_keeps_the_action_in_force_and_is_flagged(config, group, kind, bad):
    env, params = jaxmarket.make(CONFIGS / f"{config}.yaml")
    assert env.spec.group(group).action == kind
    _, state = env.reset(jax.random.key(0), params)
    # step 1: every agent at the middle of its bounds (the action in force afterwards)
    middle = at(env, params, 0.5)
    _, state, *_ = env.step(jax.random.key(1), state, middle, params)
    field = ACTION_FIELDS[kind]
    np.testing.assert_array_equal(getattr(state, field)[group], middle[group])
    # step 2: everyone moves to a quarter of the bounds, but one entry of `group` is bad
    quarter = at(env, params, 0.25)
    actions = {**quarter, group: quarter[group].at[0, 0].set(BAD[bad])}
    obs, new, rewards, _, _, info = env.step(jax.random.key(2), state, actions, params)

    want = np.array(quarter[group])
    want[0, 0] = np.asarray(middle[group])[0, 0]          # the entry in force stays
    np.testing.assert_array_equal(getattr(new, field)[group], want)
    for g in env.agent_groups:                              # the others move as told
        if g != group:
            np.testing.assert_array_equal(
                getattr(new, ACTION_FIELDS[env.spec.group(g).action])[g], quarter[g])
    # flagged: exactly that entry
    flags = {g: np.asarray(m) for g, m in info["nonfinite_actions"].items()}
    assert set(flags) == set(env.agent_groups)
    expected = np.zeros(want.shape, bool)
    expected[0, 0] = True
    np.testing.assert_array_equal(flags[group], expected)
    assert all(not f.any() for g, f in flags.items() if g != group)
    assert int(sum(f.sum() for f in flags.values())) == 1
    # finite everywhere
    assert finite((obs, new, rewards, {k: v for k, v in info.items()
                                       if k != "nonfinite_actions"}))
    # money and queries conserved: paid = received, served + unserved = sent
    fees = sum(np.asarray(x, np.float64).sum(0) for x in info["fees"].values())
    spend = sum(np.asarray(x, np.float64).sum(0) for x in info["spend"].values())
    np.testing.assert_allclose(fees, spend, rtol=1e-5, atol=1e-6)
    served = sum(np.asarray(x, np.float64).sum(0) for x in info["traffic"].values())
    unserved = sum(np.asarray(x, np.float64).sum(0) for x in info["unserved"].values())
    sent = sum(np.asarray(x, np.float64).sum(0) for x in info["queries"].values())
    np.testing.assert_allclose(served + unserved, sent, rtol=1e-5, atol=1e-6)
    # the step is the step with that entry at its action in force, bit for bit
    held = {**quarter, group: quarter[group].at[0, 0].set(middle[group][0, 0])}
    ref = env.step(jax.random.key(2), state, held, params)
    got = (obs, new, rewards, {k: v for k, v in info.items() if k != "nonfinite_actions"})
    want_tree = (ref[0], ref[1], ref[2], {k: v for k, v in ref[5].items()
                                          if k != "nonfinite_actions"})
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want_tree)):
        np.testing.assert_array_equal(a, b)
    assert not any(bool(m.any()) for m in ref[5]["nonfinite_actions"].values())


def test_finite_actions_flag_nothing_and_out_of_bounds_still_clip():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    _, state = env.reset(jax.random.key(0), params)
    actions = at(env, params, 2.0)                          # beyond every upper bound
    _, new, *_, info = env.step(jax.random.key(1), state, actions, params)
    for g in env.agent_groups:
        assert not bool(info["nonfinite_actions"][g].any())
        _, high = bounds(env, params, g)
        np.testing.assert_array_equal(
            getattr(new, ACTION_FIELDS[env.spec.group(g).action])[g], high)


def test_a_broadcast_nonfinite_action_flags_every_entry_it_fills():
    env, params = jaxmarket.make(CONFIGS / "cournot.yaml")
    obs, state = env.reset(jax.random.key(0), params)
    _, new, rewards, *_, info = env.step(jax.random.key(1), state, {"firms": jnp.nan}, params)
    np.testing.assert_array_equal(new.quantities["firms"], state.quantities["firms"])
    assert info["nonfinite_actions"]["firms"].shape == state.quantities["firms"].shape
    assert bool(info["nonfinite_actions"]["firms"].all()) and finite(rewards)


# ------------------------------------------------------------------ the training loop

NAN_FIELDS = {"value": Field("float", 1.6, doc="the action otherwise"),
              "from_step": Field("int", 0, low=0, doc="NaN from this step on")}


def make_nan_after(hyper, spec):
    """A constant action, except slot 0's first product: NaN from step ``from_step``."""
    h = resolve_hyper(NAN_FIELDS, hyper, "test_nan_after")
    base = jnp.full((spec.num_agents, spec.num_products), h["value"], jnp.float32)

    def act(state, obs, key):
        return base.at[0, 0].set(jnp.where(state["t"] >= h["from_step"], jnp.nan,
                                           h["value"])), {}

    def update(state, batch):
        return {"t": state["t"] + jnp.int32(batch.reward.shape[0])}, {}

    return Learner(lambda key, spec: {"t": jnp.zeros((), jnp.int32)}, act, update)


@pytest.fixture
def nan_learner(monkeypatch):
    monkeypatch.setitem(LEARNERS._table, "test_nan_after",
                        LearnerDef("test_nan_after", make_nan_after, NAN_FIELDS,
                                   doc="NaN after a step (tests)", fixed_policy=True))


ROLLOUT, SEEDS, ENVS, FROM_STEP = 2, 2, 2, 6   # NaN from iteration 4 (steps 6, 7)


def nan_config(from_step: int, iterations: int, stop_on_nan: bool) -> dict:
    config = duopoly_config()
    config["learners"] = {"sellers": {"kind": "test_nan_after", "from_step": from_step}}
    config["train"] = {"num_iterations": iterations, "rollout_length": ROLLOUT,
                       "num_envs": ENVS, "num_seeds": SEEDS, "chunk_size": 3,
                       "checkpoint_every": 1, "stop_on_nan": stop_on_nan}
    return config


def train(config: dict, run_dir, resume_from: int | None = None) -> dict:
    run_dir.mkdir(exist_ok=True)
    trainer = Trainer(resolve(copy.deepcopy(config)), run_dir)
    runner, start = trainer.restore() if resume_from is not None else \
        (trainer.initial_runner(), 0)
    assert start == (resume_from or 0)
    return trainer.train(Tracker(), runner, start)


def test_training_stops_on_nonfinite_actions_and_counts_them(nan_learner, tmp_path):
    # one NaN entry per step (slot 0, product 0) from iteration 4 on
    per_iteration = ROLLOUT
    clean = train(nan_config(10**6, 9, True), tmp_path / "clean")
    assert clean["stopped"] is None and "nonfinite_actions" not in clean
    assert not (tmp_path / "clean" / NONFINITE_FILE).exists()

    # stop_on_nan (the default): the run stops at the end of the chunk holding iteration 4
    stopped = train(nan_config(FROM_STEP, 9, True), tmp_path / "stop")
    assert stopped["iterations"] == 6
    assert stopped["stopped"].startswith("non-finite actions at iteration 4: sellers sent "
                                         f"{per_iteration} NaN/inf action entries")
    assert stopped["nonfinite_actions"] == {"sellers": {
        "entries": 3 * per_iteration, "iterations": 3, "first_iteration": 4}}

    # stop_on_nan false: the run goes on, the market on the actions in force
    full = train(nan_config(FROM_STEP, 9, False), tmp_path / "full")
    assert full["stopped"] is None and full["iterations"] == 9
    assert full["nonfinite_actions"] == {"sellers": {
        "entries": 6 * per_iteration, "iterations": 6, "first_iteration": 4}}
    header, rows = read_metrics(tmp_path / "full" / NONFINITE_FILE)
    assert header == ["iteration", "sellers"]
    np.testing.assert_array_equal(rows, [[i, per_iteration] for i in range(4, 10)])
    # no column: metrics.csv has the clean run's header, and its market metrics are finite
    h_full, data = read_metrics(tmp_path / "full" / "metrics.csv")
    assert h_full == read_metrics(tmp_path / "clean" / "metrics.csv")[0]
    assert not any(h.startswith("nonfinite") for h in h_full)
    assert np.isfinite(data).all()
    # the price kept: slot 0 holds the price it set before iteration 4 (1.6)
    assert np.allclose(data[:, h_full.index("price/sellers/p0")], 1.6)

    # a resumed run writes the same files as the uninterrupted one
    train(nan_config(FROM_STEP, 6, False), tmp_path / "resumed")
    resumed = train(nan_config(FROM_STEP, 9, False), tmp_path / "resumed", resume_from=6)
    assert resumed == full
    for name in (NONFINITE_FILE, "metrics.csv", "summary.json"):
        assert (tmp_path / "resumed" / name).read_bytes() == \
            (tmp_path / "full" / name).read_bytes(), name
    assert json.loads((tmp_path / "full" / "summary.json").read_text()) == full
