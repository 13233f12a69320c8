"""PPO's ``group_by_policy`` (jaxmarket/learners/ppo.py): each policy's slots evaluated
as one batch and minibatches with an equal share of every policy's samples."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import check_mapping
from jaxmarket.learners.base import LearnerSpec, Transition
from jaxmarket.learners.ppo import PPO

# 2 sessions x 3 markets x 2 agents: slot (s, m, a) driven by policy 2 s + a
INDEX = tuple(2 * s + a for s in range(2) for _ in range(3) for a in range(2))
T, A, D, P = 4, len(INDEX), 3, 2


def make(**hyper):
    spec = LearnerSpec(num_agents=A, obs_dim=D, num_products=P,
                       action_low=np.zeros((A, P), np.float32),
                       action_high=np.full((A, P), 2.0, np.float32),
                       num_policies=4, policy_index=INDEX)
    return PPO.make(check_mapping(PPO.hyper_fields, hyper, "learners.test"), spec), spec


def batch_of(learner, state, key):
    k_obs, k_next, k_rew, k_act = jax.random.split(key, 4)
    obs = jax.random.normal(k_obs, (T, A, D))
    action, aux = jax.vmap(learner.act, in_axes=(None, 0, 0))(
        state, obs, jax.random.split(k_act, T))
    return Transition(obs=obs, action=action, reward=jax.random.normal(k_rew, (T, A)),
                      next_obs=jax.random.normal(k_next, (T, A, D)),
                      done=jnp.zeros((T, A), bool), aux=aux)


def test_one_minibatch_update_equals_the_default_update():
    # with one minibatch and one epoch, each policy's loss is the mean over all its
    # samples in both layouts (order only changes rounding): same step, same actions
    hyper = {"update_epochs": 1, "num_minibatches": 1, "learning_rate": 0.01}
    plain, spec = make(**hyper, group_by_policy=False)
    grouped, _ = make(**hyper, group_by_policy=True)
    state = plain.init(jax.random.key(0), spec)
    grouped_state = grouped.init(jax.random.key(0), spec)
    a_plain, aux_plain = plain.act(state, jnp.ones((A, D)), jax.random.key(1))
    a_grouped, aux_grouped = grouped.act(grouped_state, jnp.ones((A, D)), jax.random.key(1))
    np.testing.assert_allclose(a_grouped, a_plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(aux_grouped["log_prob"], aux_plain["log_prob"], rtol=1e-5)
    batch = batch_of(plain, state, jax.random.key(2))
    new_plain, m_plain = jax.jit(plain.update)(state, batch)
    new_grouped, m_grouped = jax.jit(grouped.update)(grouped_state, batch)
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), new_plain.params,
                         state.params)
    assert max(jax.tree.leaves(moved)) > 1e-4     # the step did something
    for a, b in zip(jax.tree.leaves(new_grouped.params), jax.tree.leaves(new_plain.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m_grouped["value_loss"], m_plain["value_loss"], rtol=1e-4)


def test_each_policy_is_updated_on_its_own_samples_only():
    # the per-policy regrouping must route every sample to its slot's policy: changing
    # the rewards of the other policies' slots leaves policy 0's update bit-identical
    # and moves theirs (2 epochs x 2 minibatches of 6 samples per policy)
    learner, spec = make(num_minibatches=2, update_epochs=2, group_by_policy=True)
    state = learner.init(jax.random.key(0), spec)
    batch = batch_of(learner, state, jax.random.key(3))
    other = np.asarray(INDEX) != 0
    changed = batch.replace(reward=jnp.where(other, batch.reward + 1.0, batch.reward))
    update = jax.jit(learner.update)
    a, _ = update(state, batch)
    b, _ = update(state, changed)
    moved = []
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(x[0], y[0])
        moved.append(float(jnp.max(jnp.abs(x[1:] - y[1:]))))
    assert max(moved) > 1e-6


def test_unequal_slots_per_policy_is_a_config_error():
    spec = LearnerSpec(num_agents=3, obs_dim=D, num_products=1,
                       action_low=np.zeros((3, 1), np.float32),
                       action_high=np.ones((3, 1), np.float32),
                       num_policies=2, policy_index=(0, 0, 1))
    with pytest.raises(ConfigError, match="group_by_policy"):
        PPO.make(check_mapping(PPO.hyper_fields, {"group_by_policy": True}, "l"), spec)


def test_auto_groups_equal_layouts_and_keeps_per_slot_parameters_otherwise():
    # Bugs caught: auto not taking the grouped path where it can (the slow per-slot path
    # by default), or failing (a config error) where the policies drive unequal slots.
    hyper = {"update_epochs": 2, "num_minibatches": 2}
    auto, spec = make(**hyper)                     # default: auto
    grouped, _ = make(**hyper, group_by_policy=True)
    plain, _ = make(**hyper, group_by_policy=False)
    state = auto.init(jax.random.key(0), spec)
    batch = batch_of(auto, state, jax.random.key(4))
    a, b, c = (jax.jit(x.update)(state, batch)[0] for x in (auto, grouped, plain))
    for x, y, z in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params),
                       jax.tree.leaves(c.params)):
        np.testing.assert_array_equal(x, y)        # auto = grouped, bit for bit
    assert any(not np.array_equal(x, z) for x, z in
               zip(jax.tree.leaves(a.params), jax.tree.leaves(c.params)))  # != per slot

    uneven = LearnerSpec(num_agents=3, obs_dim=D, num_products=1,
                         action_low=np.zeros((3, 1), np.float32),
                         action_high=np.ones((3, 1), np.float32),
                         num_policies=2, policy_index=(0, 0, 1))
    fields = PPO.hyper_fields
    learners = [PPO.make(check_mapping(fields, {**hyper, **extra}, "l"), uneven)
                for extra in ({}, {"group_by_policy": False})]
    state = learners[0].init(jax.random.key(1), uneven)
    k_obs, k_act, k_rew = jax.random.split(jax.random.key(5), 3)
    obs = jax.random.normal(k_obs, (T, 3, D))
    action, aux = jax.vmap(learners[0].act, in_axes=(None, 0, 0))(
        state, obs, jax.random.split(k_act, T))
    batch = Transition(obs=obs, action=action, reward=jax.random.normal(k_rew, (T, 3)),
                       next_obs=obs, done=jnp.zeros((T, 3), bool), aux=aux)
    x, y = (jax.jit(learner.update)(state, batch)[0] for learner in learners)
    for u, v in zip(jax.tree.leaves(x.params), jax.tree.leaves(y.params)):
        np.testing.assert_array_equal(u, v)        # auto = per slot here
