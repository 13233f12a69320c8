"""Per-policy hyperparameters (``state.hyper``) of Q-learning and actor-critic PPO, which
PBT mutates in-graph, and PBT on those learners in real training runs.

The reference for each policy is the same learner *built* with that policy's values:
policies never share anything in an update, so policy ``k`` of a learner whose
``hyper`` holds per-policy values must evolve exactly as policy ``k`` of a learner
configured with policy ``k``'s values for everyone."""

import csv
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONFIGS

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import check_mapping
from jaxmarket.config.loader import load_config
from jaxmarket.learners.base import LearnerSpec, Transition
from jaxmarket.learners.ppo import PPO
from jaxmarket.learners.qlearning import HYPER_FIELDS as Q_FIELDS
from jaxmarket.learners.qlearning import make as make_q
from jaxmarket.train.plan import resolve
from jaxmarket.train.trainer import Trainer
from jaxmarket.train.tracking import Tracker


def spec(num_agents, obs_dim, num_policies, policy_index, high=0.4):
    return LearnerSpec(num_agents=num_agents, obs_dim=obs_dim, num_products=1,
                       action_low=np.zeros((num_agents, 1), np.float32),
                       action_high=np.full((num_agents, 1), high, np.float32),
                       num_policies=num_policies, policy_index=policy_index)


# ---- Q-learning: alpha and beta per policy ---------------------------------------------

Q_BASE = {"grid_low": 0.0, "grid_high": 0.4, "grid_size": 5, "memory": 1, "discount": 0.9,
          "q_init": "zero"}


def q_learner(**hyper):
    h = check_mapping(Q_FIELDS, {**Q_BASE, **hyper}, "learners.q")
    sp = spec(4, 2, 2, (0, 1, 0, 1))    # two markets of two agents; policy = agent position
    return make_q(h, sp), sp


def q_rollout(learner, state, key, steps=40):
    """``steps`` periods of acting on exogenous grid-price observations (so no policy's
    actions reach another's data) with arbitrary rewards; returns the final state and
    every period's actions."""
    actions = []
    act, update = jax.jit(learner.act), jax.jit(learner.update)
    grid = jnp.linspace(0.0, 0.4, 5)
    key, k0 = jax.random.split(key)
    obs = grid[jax.random.randint(k0, (4, 2), 0, 5)]
    for _ in range(steps):
        key, k_act, k_r, k_o = jax.random.split(key, 4)
        a, aux = act(state, obs, k_act)
        nxt = grid[jax.random.randint(k_o, (4, 2), 0, 5)]
        reward = jax.random.uniform(k_r, (4,))
        batch = Transition(obs=obs[None], action=a[None], reward=reward[None],
                           next_obs=nxt[None], done=jnp.zeros((1, 4), bool),
                           aux=jax.tree.map(lambda x: x[None], aux))
        state, _ = update(state, batch)
        actions.append(np.asarray(a[:, 0]))
        obs = nxt
    return state, np.stack(actions)


def test_q_learning_alpha_and_beta_per_policy_match_learners_built_with_those_values():
    """Catches: a per-policy alpha or beta ignored (the scalar config value used instead),
    a slot reading another policy's values."""
    alphas, betas = (0.05, 0.6), (0.0, 0.08)    # policy 1 stops exploring quickly
    learner, _ = q_learner(learning_rate=0.3, exploration_decay=0.01)
    state = learner.init(jax.random.key(0))
    state = state.replace(hyper={"learning_rate": jnp.asarray(alphas, jnp.float32),
                                 "exploration_decay": jnp.asarray(betas, jnp.float32)})
    mixed, acts = q_rollout(learner, state, jax.random.key(1))
    for k in range(2):
        ref_learner, _ = q_learner(learning_rate=alphas[k], exploration_decay=betas[k])
        ref, ref_acts = q_rollout(ref_learner, ref_learner.init(jax.random.key(0)),
                                  jax.random.key(1))
        np.testing.assert_array_equal(np.asarray(mixed.q[k]), np.asarray(ref.q[k]))
        np.testing.assert_array_equal(acts[:, k::2], ref_acts[:, k::2])
    # beta = 0 keeps policy 0 exploring uniformly; policy 1 is nearly greedy by the end
    late = acts[-15:]
    assert len(np.unique(late[:, 0::2])) > 2


# ---- PPO: learning rate, entropy, value and clip coefficients per policy ---------------

PPO_HYPER = ("learning_rate", "ent_coef", "vf_coef", "clip_eps")


def ppo_learner(**hyper):
    sp = spec(4, 3, 2, (0, 1, 0, 1), high=1.0)
    h = check_mapping(PPO.hyper_fields, {"hidden_sizes": [8], "num_minibatches": 2,
                                         "update_epochs": 2, **hyper}, "learners.p")
    return PPO.make(h, sp), sp


@functools.partial(jax.jit, static_argnums=0)
def ppo_update(learner, state, key):
    k_obs, k_next, k_rew, k_act = jax.random.split(key, 4)
    T = 6
    obs = jax.random.normal(k_obs, (T, 4, 3))
    a, aux = jax.vmap(learner.act, in_axes=(None, 0, 0))(state, obs, jax.random.split(k_act, T))
    batch = Transition(obs=obs, action=a, reward=jax.random.normal(k_rew, (T, 4)),
                       next_obs=jax.random.normal(k_next, (T, 4, 3)),
                       done=jnp.zeros((T, 4), bool), aux=aux)
    return learner.update(state, batch)[0]


def test_ppo_hyperparameters_per_policy_match_learners_built_with_those_values():
    """Catches: a per-policy value ignored or read for the wrong policy, the schedule
    applied twice or not at all under ``anneal_lr`` (the plain learning rate's path is
    the next test's)."""
    values = {"learning_rate": (1e-3, 3e-2), "ent_coef": (0.0, 0.5), "vf_coef": (0.1, 2.0),
              "clip_eps": (0.05, 0.4)}
    extra = {"anneal_lr": True, "num_updates": 3}
    learner, _ = ppo_learner(**extra)
    state = learner.init(jax.random.key(0))
    state = state.replace(hyper={n: jnp.asarray(v, jnp.float32) for n, v in values.items()})
    for i in range(2):
        state = ppo_update(learner, state, jax.random.key(10 + i))
    for k in range(2):
        ref_learner, _ = ppo_learner(**extra, **{n: v[k] for n, v in values.items()})
        ref = ref_learner.init(jax.random.key(0))
        for i in range(2):
            ref = ppo_update(ref_learner, ref, jax.random.key(10 + i))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]),
                                                             rtol=2e-6, atol=1e-7),
                     state.params, ref.params)
    # the two policies really moved by different amounts (the values matter)
    init = learner.init(jax.random.key(0))
    moved = [sum(float(jnp.abs(x[k] - y[k]).sum()) for x, y in
                 zip(jax.tree.leaves(state.params), jax.tree.leaves(init.params)))
             for k in range(2)]
    assert moved[1] > 3 * moved[0]


def test_ppo_learning_rate_per_policy_scales_the_adam_step_exactly():
    """``hyper.learning_rate`` = 0 freezes its policy bit for bit; doubling it doubles the
    first Adam step (the direction is the same)."""
    learner, _ = ppo_learner(update_epochs=1, num_minibatches=1)
    s0 = learner.init(jax.random.key(3))
    lr = lambda a, b: s0.replace(hyper={**s0.hyper, "learning_rate": jnp.asarray(  # noqa: E731
        [a, b], jnp.float32)})
    one = ppo_update(learner, lr(0.0, 1e-3), jax.random.key(4))
    two = ppo_update(learner, lr(0.0, 2e-3), jax.random.key(4))
    for a, b, c in zip(jax.tree.leaves(s0.params), jax.tree.leaves(one.params),
                       jax.tree.leaves(two.params)):
        np.testing.assert_array_equal(np.asarray(b[0]), np.asarray(a[0]))
        np.testing.assert_allclose(np.asarray(c[1] - a[1]), 2 * np.asarray(b[1] - a[1]),
                                   rtol=1e-4, atol=1e-8)


# ---- PBT in training runs ---------------------------------------------------------------

def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def check_events_match_state(run_dir, state, fields, last_iteration, num_members):
    """Every member replaced at the last iteration holds its source's leaves bit for bit
    and the logged new hyperparameter values."""
    events = [e for e in rows(run_dir / "pbt.csv") if int(e["iteration"]) == last_iteration]
    assert events, "no PBT event at the last iteration"
    for e in events:
        i = int(e["seed"]) * num_members + int(e["member"])
        src = int(e["seed"]) * num_members + int(e["source"])
        assert float(e["source_objective"]) > float(e["objective"])
        np.testing.assert_allclose(float(state.hyper[e["hyperparameter"]][i]), float(e["new"]),
                                   rtol=1e-6)
        for leaf in jax.tree.leaves(getattr(state, fields)):
            np.testing.assert_array_equal(np.asarray(leaf[i]), np.asarray(leaf[src]))


def test_pbt_on_q_learning_copies_q_tables_and_mutates_alpha_and_beta(tmp_path):
    """Calvano's duopoly with a population of 4 Q-learners per seat: the bottom members of
    each seed take a top member's Q table and perturbed (alpha, beta)."""
    config = load_config(CONFIGS / "calvano.yaml", [
        "train.num_iterations=40", "train.chunk_size=40", "train.num_envs=4",
        "train.num_seeds=2", "learners.sellers.population=4",
        "learners.sellers.grid_size=5", "learners.sellers.q_init=zero"])
    config["learners"]["sellers"]["pbt"] = {
        "period": 20, "replace_fraction": 0.5, "mutation_rate": 1.0,
        "replace_reward_gap": {"relative": 0.0, "absolute": 0.0},
        "hyperparams": {"learning_rate": [0.01, 1.0], "exploration_decay": [1e-6, 1e-1]}}
    trainer = Trainer(resolve(config), tmp_path / "q")
    trainer.train(Tracker(), trainer.initial_runner(), 0)
    state = trainer.restore()[0].learners["sellers"]
    check_events_match_state(tmp_path / "q", state, "rows", 40, 4)
    # at the first step every member still held the configured values: a replaced
    # member's alpha and beta are those times or divided by a factor in [1.2, 1.5]
    configured = {"learning_rate": 0.15, "exploration_decay": 4e-6}
    first = [e for e in rows(tmp_path / "q" / "pbt.csv") if int(e["iteration"]) == 20]
    assert {e["hyperparameter"] for e in first} == set(configured)
    for e in first:
        assert float(e["old"]) == pytest.approx(configured[e["hyperparameter"]], rel=1e-6)
        factor = float(e["new"]) / configured[e["hyperparameter"]]
        factor = max(factor, 1 / factor)
        assert 1.2 - 1e-5 <= factor <= 1.5 + 1e-5


def test_pbt_on_actor_critic_ppo_copies_parameters_and_adam_state(tmp_path):
    config = load_config(CONFIGS / "logit_monopoly.yaml", [
        "train.num_iterations=6", "train.chunk_size=6", "train.num_envs=4",
        "train.num_seeds=2", "train.rollout_length=4"])
    config["learners"]["seller"] = {
        "kind": "ppo", "hidden_sizes": [8], "population": 4, "num_minibatches": 2,
        "pbt": {"period": 3, "replace_fraction": 0.5, "mutation_rate": 1.0,
                "replace_reward_gap": {"relative": 0.0, "absolute": 0.0},
                "hyperparams": {"learning_rate": [1e-5, 1e-1], "ent_coef": [1e-4, 1.0]}}}
    trainer = Trainer(resolve(config), tmp_path / "ppo")
    trainer.train(Tracker(), trainer.initial_runner(), 0)
    state = trainer.restore()[0].learners["seller"]
    check_events_match_state(tmp_path / "ppo", state, "params", 6, 4)
    check_events_match_state(tmp_path / "ppo", state, "opt_state", 6, 4)


@pytest.mark.parametrize("kind,name", [("q_learning", "discount"), ("ppo", "gamma")])
def test_pbt_hyperparameters_the_learner_does_not_keep_per_member_are_config_errors(kind, name):
    config = load_config(CONFIGS / "calvano.yaml", ["train.num_envs=4",
                                                   "learners.sellers.population=2"])
    if kind == "ppo":
        config["learners"]["sellers"] = {"kind": "ppo", "population": 2}
    config["learners"]["sellers"]["pbt"] = {"hyperparams": {name: [0.5, 0.99]}}
    with pytest.raises(ConfigError) as err:
        resolve(config)
    assert err.value.field == f"learners.sellers.pbt.hyperparams.{name}"
