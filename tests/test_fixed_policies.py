"""Fixed policies (constant, schedule, undercut, random) as learners with no-op updates."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.learners import fixed  # noqa: F401  (registers the kinds)
from jaxmarket.learners.base import LEARNERS, LearnerSpec, Transition


def make_spec(A=2, P=2, low=0.0, high=10.0, obs_dim=0):
    return LearnerSpec(num_agents=A, obs_dim=obs_dim, num_products=P,
                       action_low=np.full((A, P), low, np.float32),
                       action_high=np.full((A, P), high, np.float32))


def steps_batch(T, A=2, P=2):
    return Transition(obs=jnp.zeros((T, A, 0)), action=jnp.zeros((T, A, P)),
                      reward=jnp.ones((T, A)), next_obs=jnp.zeros((T, A, 0)),
                      done=jnp.zeros((T, A), bool), aux={})


def test_registered():
    for kind in ("constant", "schedule", "undercut", "random"):
        assert kind in LEARNERS


def test_importing_the_base_module_alone_registers_every_kind():
    """``LEARNERS`` is the one config.registry.Registry of learner kinds; importing
    ``jaxmarket.learners.base`` in a fresh interpreter (no cycle: base does not import the
    package) runs the package ``__init__``, which imports every learner module."""
    code = ("from jaxmarket.config.registry import Registry\n"
            "from jaxmarket.learners.base import LEARNERS\n"
            "assert isinstance(LEARNERS, Registry)\n"
            "print(' '.join(sorted(LEARNERS)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
    assert out.split() == sorted(["constant", "schedule", "undercut", "random", "vpg_bandit",
                                  "ppo_bandit", "rolling_ppo_bandit", "epsilon_greedy",
                                  "ucb1", "ucb_tuned", "thompson", "exp3", "q_learning",
                                  "ppo"])


def test_an_unknown_kind_names_every_known_one():
    with pytest.raises(ConfigError, match="one of the learner kinds constant, epsilon_greedy"):
        LEARNERS.lookup("constantt", "learners.seller.kind")


def test_settings_are_static_values():
    """The learner's functions are module-level functions bound to a frozen, hashable
    settings value: equal inputs give equal settings (a usable jit static argument)."""
    spec = make_spec()
    one, two = (LEARNERS["schedule"].make({"timestamps": [0, 3], "values": [1.0, 2.0]}, spec)
                for _ in range(2))
    assert one.act.func is fixed.schedule_act
    assert one.act.args == two.act.args and hash(one.act.args) == hash(two.act.args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.act.args[0].timestamps = (1,)


def test_constant_scalar_per_product_and_per_slot():
    spec = make_spec()
    key = jax.random.PRNGKey(0)
    for value, expect in ((2.5, np.full((2, 2), 2.5)),
                          ([1.0, 3.0], np.array([[1.0, 3.0], [1.0, 3.0]])),
                          ([[1.0, 2.0], [3.0, 4.0]], np.array([[1.0, 2.0], [3.0, 4.0]]))):
        learner = LEARNERS["constant"].make({"value": value}, spec)
        state = learner.init(key, spec)
        action, aux = jax.jit(learner.act)(state, jnp.zeros((2, 0)), key)
        np.testing.assert_allclose(np.asarray(action), expect)
        assert aux == {}
        new, metrics = learner.update(state, steps_batch(3))
        assert metrics == {} and int(new["t"]) == 3
        again, _ = learner.act(new, jnp.zeros((2, 0)), jax.random.PRNGKey(9))
        np.testing.assert_allclose(np.asarray(again), expect)     # update is a no-op
    with pytest.raises(ConfigError, match="learners.constant.value"):
        LEARNERS["constant"].make({"value": 11.0}, spec)          # outside the bounds
    with pytest.raises(ConfigError, match="learners.constant.value"):
        LEARNERS["constant"].make({}, spec)                       # required


def test_schedule_follows_the_last_timestamp_at_or_before_t():
    spec = make_spec()
    learner = LEARNERS["schedule"].make(
        {"timestamps": [2, 4, 5], "values": [1.0, [2.0, 3.0], 4.0]}, spec)
    act, update = jax.jit(learner.act), jax.jit(learner.update)
    state = learner.init(jax.random.PRNGKey(0), spec)
    seen = []
    for _ in range(7):
        action, _ = act(state, jnp.zeros((2, 0)), jax.random.PRNGKey(0))
        seen.append(np.asarray(action[0]).tolist())
        state, _ = update(state, steps_batch(1))
    # t = 0, 1 precede the first timestamp: the first value
    assert seen == [[1, 1], [1, 1], [1, 1], [1, 1], [2, 3], [4, 4], [4, 4]]
    # a batch of T transitions advances t by T
    state = learner.init(jax.random.PRNGKey(0), spec)
    state, _ = learner.update(state, steps_batch(4))
    assert int(state["t"]) == 4
    np.testing.assert_allclose(np.asarray(learner.act(state, None, None)[0]), [[2, 3], [2, 3]])
    with pytest.raises(ConfigError, match="learners.schedule.timestamps"):
        LEARNERS["schedule"].make({"timestamps": [3, 1], "values": [1.0, 2.0]}, spec)
    with pytest.raises(ConfigError, match="learners.schedule.values"):
        LEARNERS["schedule"].make({"timestamps": [0, 1], "values": [1.0]}, spec)


def test_undercut_reads_competitor_min_from_the_first_features():
    spec = make_spec(A=2, P=2, low=1.0, high=5.0, obs_dim=3)
    learner = LEARNERS["undercut"].make({"amount": [0.5, 0.25]}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    obs = jnp.array([[3.0, 1.1, 99.0],     # competitors' min prices, then another feature
                     [9.0, 4.0, -5.0]])
    action, _ = jax.jit(learner.act)(state, obs, jax.random.PRNGKey(0))
    # max(action_low, min - amount), and never above action_high
    np.testing.assert_allclose(np.asarray(action), [[2.5, 1.0], [5.0, 3.75]])
    default = LEARNERS["undercut"].make({}, spec)
    a, _ = default.act(state, obs, None)
    np.testing.assert_allclose(float(a[0, 0]), 2.99, rtol=1e-6)
    with pytest.raises(ConfigError, match="competitor_prices"):
        LEARNERS["undercut"].make({}, make_spec(obs_dim=1))


def test_random_is_uniform_within_bounds():
    A, P = 500, 2
    spec = LearnerSpec(num_agents=A, obs_dim=0, num_products=P,
                       action_low=np.tile(np.array([[1.0, -2.0]], np.float32), (A, 1)),
                       action_high=np.tile(np.array([[3.0, 2.0]], np.float32), (A, 1)))
    learner = LEARNERS["random"].make({}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    act = jax.jit(learner.act)
    a1, _ = act(state, None, jax.random.PRNGKey(1))
    a2, _ = act(state, None, jax.random.PRNGKey(2))
    a1 = np.asarray(a1)
    assert a1.shape == (A, P)
    assert np.all(a1[:, 0] >= 1.0) and np.all(a1[:, 0] <= 3.0)
    assert np.all(a1[:, 1] >= -2.0) and np.all(a1[:, 1] <= 2.0)
    np.testing.assert_allclose(a1.mean(0), [2.0, 0.0], atol=0.15)
    np.testing.assert_allclose(a1.std(0), [2 / np.sqrt(12), 4 / np.sqrt(12)], rtol=0.1)
    assert not np.allclose(a1, np.asarray(a2))             # randomness from the key only
    np.testing.assert_allclose(a1, np.asarray(act(state, None, jax.random.PRNGKey(1))[0]))
    with pytest.raises(ConfigError, match="learners.random"):
        LEARNERS["random"].make({}, make_spec(high=np.inf))
