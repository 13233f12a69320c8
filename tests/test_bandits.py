"""Gaussian-policy bandits (vpg/ppo/rolling ppo) and discrete-grid bandits (epsilon-greedy,
UCB1, UCB-tuned, Thompson, EXP3): hand-computed updates, the legacy defects that must not come back,
policy sharing, and small learning tests on toy rewards written here."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.learners import discrete_bandits as db
from jaxmarket.learners import gaussian_bandits as gb
from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec, Transition


def make_spec(A=1, P=1, low=0.0, high=10.0, num_policies=None, policy_index=None):
    return LearnerSpec(num_agents=A, obs_dim=0, num_products=P,
                       action_low=np.full((A, P), low, np.float32),
                       action_high=np.full((A, P), high, np.float32),
                       num_policies=num_policies, policy_index=policy_index)


def make(kind, hyper, spec):
    """The learner with jitted act/update (one compilation instead of op-by-op dispatch)."""
    learner = LEARNERS[kind].make(hyper, spec)
    return Learner(learner.init, jax.jit(learner.act), jax.jit(learner.update))


def make_batch(aux, reward, action=None):
    reward = jnp.asarray(reward, jnp.float32)
    T, A = reward.shape
    if action is None:
        action = jnp.zeros((T, A, 1))
    return Transition(obs=jnp.zeros((T, A, 0)), action=action, reward=reward,
                      next_obs=jnp.zeros((T, A, 0)), done=jnp.zeros((T, A), bool),
                      aux={k: jnp.asarray(v) for k, v in aux.items()})


def np_logp(z, mu, sigma):
    return -0.5 * ((z - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)


def set_params(state, mean, std):
    return state.replace(params={"mean": jnp.asarray(mean, jnp.float32),
                                 "log_std": jnp.log(jnp.asarray(std, jnp.float32))})


def hand_pg_grads(z, r, mu, sigma, ratio_weight=None):
    """d/dmu and d/dlog_sigma of -mean_i(w_i * adv_i * logp_i) for one slot, one product,
    with adv standardised over the buffer (population std). ``ratio_weight`` w_i defaults
    to 1 (VPG, or PPO's first epoch)."""
    z, r = np.asarray(z, np.float64), np.asarray(r, np.float64)
    adv = (r - r.mean()) / (r.std() + 1e-8)
    w = np.ones_like(r) if ratio_weight is None else ratio_weight
    eps = (z - mu) / sigma
    d_mu = -np.mean(w * adv * eps / sigma)
    d_logsig = -np.mean(w * adv * (eps ** 2 - 1.0))
    return d_mu, d_logsig


# --------------------------------------------------------------------- Gaussian: basics


def test_registered_kinds():
    for kind in ("vpg_bandit", "ppo_bandit", "rolling_ppo_bandit",
                 "epsilon_greedy", "ucb1", "ucb_tuned", "thompson", "exp3"):
        assert kind in LEARNERS and LEARNERS[kind].hyper_fields


def test_settings_are_static_values():
    """Each kind's learner is its module's ``init``/``act``/``update`` bound to a frozen,
    hashable settings value (validated before anything is traced): equal configs give
    equal settings, and the settings compare by value."""
    spec = make_spec(A=4, num_policies=2, policy_index=(0, 1, 1, 0))
    for kind, module in (("ppo_bandit", gb), ("rolling_ppo_bandit", gb), ("exp3", db)):
        one, two = (LEARNERS[kind].make({"learning_rate": 0.01} if module is gb else {}, spec)
                    for _ in range(2))
        assert (one.init.func, one.act.func, one.update.func) == (
            module.init, module.act, module.update)
        settings = one.update.args[0]
        assert settings == two.update.args[0] and hash(settings) == hash(two.update.args[0])
        assert settings.kind == kind
    a = gb.gaussian_bandit_settings("ppo_bandit", {"learning_rate": 0.01}, spec)
    b = gb.gaussian_bandit_settings("ppo_bandit", {"learning_rate": 0.02}, spec)
    assert a != b


def test_standardised_advantages():
    r = jnp.array([[1.0], [2.0], [3.0], [4.0]])
    adv = gb.standardised(r, jnp.ones_like(r))
    expect = (np.array([1, 2, 3, 4.0]) - 2.5) / (np.sqrt(1.25) + 1e-8)
    np.testing.assert_allclose(np.asarray(adv[:, 0]), expect, rtol=1e-6)
    # only the valid entries count: the first two, so +-1, zeros elsewhere
    mask = jnp.array([[1.0], [1.0], [0.0], [0.0]])
    np.testing.assert_allclose(np.asarray(gb.standardised(r, mask)[:, 0]), [-1, 1, 0, 0],
                               atol=1e-6)


@pytest.mark.parametrize("scaled", [False, True])
def test_act_clips_and_log_prob_is_of_the_exact_sample(scaled):
    spec = make_spec(A=3, P=2, low=0.5, high=1.5)
    hyper = {"scaled": scaled, "initial_mean": 1.4 if not scaled else math.log(1.4),
             "initial_stddev": 0.6}
    learner = make("ppo_bandit", hyper, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    action, aux = jax.jit(learner.act)(state, jnp.zeros((3, 0)), jax.random.PRNGKey(1))
    z = np.asarray(aux["sample"])
    value = np.exp(z) if scaled else z
    action = np.asarray(action)
    assert action.shape == (3, 2) and np.all(action >= 0.5) and np.all(action <= 1.5)
    np.testing.assert_allclose(action, np.clip(value, 0.5, 1.5), rtol=1e-6)
    assert np.any(value > 1.5) or np.any(value < 0.5)  # clipping actually happened
    mu = np.asarray(state.params["mean"])[0]
    sigma = np.exp(np.asarray(state.params["log_std"]))[0]
    # behaviour log-prob of the pre-clip sample that produced the action, not of the
    # clipped action
    np.testing.assert_allclose(np.asarray(aux["log_prob"]), np_logp(z, mu, sigma).sum(-1),
                               rtol=1e-5)
    clipped = np.log(action) if scaled else action
    assert not np.allclose(np_logp(clipped, mu, sigma).sum(-1), np.asarray(aux["log_prob"]))


def test_vpg_single_update_hand_computed():
    spec = make_spec()
    lr, ent, pull = 0.1, 0.05, 0.5
    learner = make("vpg_bandit", 
        {"buffer_length": 2, "optimizer": "sgd", "learning_rate": lr, "entropy_coef": ent,
         "pullback_coef": pull, "initial_mean": 5.0, "initial_stddev": 1.0}, spec)
    state = set_params(learner.init(jax.random.PRNGKey(0), spec), [[4.0]], [[0.5]])
    z, r = np.array([3.8, 4.6]), np.array([1.0, 3.0])
    batch = make_batch({"sample": z.reshape(2, 1, 1), "log_prob": np_logp(z, 4.0, 0.5)[:, None]},
                       r[:, None])
    new, metrics = jax.jit(learner.update)(state, batch)
    d_mu, d_ls = hand_pg_grads(z, r, 4.0, 0.5)
    d_mu += 2 * pull * (4.0 - 5.0)      # pull-back towards the initial mean
    d_ls -= ent                         # entropy bonus: d/dlog_sigma of -ent*(log_sigma + c)
    np.testing.assert_allclose(float(new.params["mean"][0, 0]), 4.0 - lr * d_mu, rtol=1e-5)
    np.testing.assert_allclose(float(new.params["log_std"][0, 0]),
                               math.log(0.5) - lr * d_ls, rtol=1e-5)
    assert int(metrics["num_updates"]) == 1 and int(new.count) == 0  # buffer cleared


def test_ppo_first_epoch_matches_vpg_and_buffer_clears():
    spec = make_spec()
    hyper = {"buffer_length": 3, "optimizer": "sgd", "learning_rate": 0.05,
             "initial_mean": 4.0, "initial_stddev": 0.5}
    vpg = make("vpg_bandit", hyper, spec)
    ppo = make("ppo_bandit", {**hyper, "update_epochs": 1}, spec)
    z, r = np.array([3.5, 4.2, 4.4]), np.array([0.0, 2.0, 1.0])
    batch = make_batch({"sample": z.reshape(3, 1, 1), "log_prob": np_logp(z, 4.0, 0.5)[:, None]},
                       r[:, None])
    a, _ = vpg.update(vpg.init(jax.random.PRNGKey(0), spec), batch)
    b, _ = ppo.update(ppo.init(jax.random.PRNGKey(0), spec), batch)
    np.testing.assert_allclose(np.asarray(a.params["mean"]), np.asarray(b.params["mean"]),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(a.params["log_std"]), np.asarray(b.params["log_std"]),
                               rtol=1e-6)
    # 7 transitions into a buffer of 3: two updates, one sample left over
    batch7 = make_batch({"sample": np.linspace(3, 5, 7).reshape(7, 1, 1),
                         "log_prob": np.zeros((7, 1))}, np.arange(7.0)[:, None])
    s, m = ppo.update(ppo.init(jax.random.PRNGKey(0), spec), batch7)
    assert int(m["num_updates"]) == 2 and int(s.count) == 1 and int(s.updates) == 2


def test_ppo_uses_the_stored_behaviour_log_prob():
    """Defect: log-probs recomputed after the update (ratio always 1). With stored
    behaviour log-probs one nat above the current ones, every ratio is e^-1 < 1 - eps:
    negative-advantage samples are clipped (no gradient) and positive ones are weighted
    by the ratio."""
    spec = make_spec()
    lr = 0.05
    learner = make("ppo_bandit", 
        {"buffer_length": 4, "optimizer": "sgd", "learning_rate": lr, "update_epochs": 1,
         "clip_eps": 0.2, "initial_mean": 4.0, "initial_stddev": 0.5}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    z, r = np.array([3.4, 3.9, 4.3, 4.8]), np.array([1.0, 0.0, 3.0, 2.0])
    stale = np_logp(z, 4.0, 0.5) + 1.0
    new, _ = learner.update(state, make_batch({"sample": z.reshape(4, 1, 1),
                                               "log_prob": stale[:, None]}, r[:, None]))
    adv = (r - r.mean()) / (r.std() + 1e-8)
    weight = np.where(adv > 0, math.exp(-1.0), 0.0)
    d_mu, d_ls = hand_pg_grads(z, r, 4.0, 0.5, ratio_weight=weight)
    np.testing.assert_allclose(float(new.params["mean"][0, 0]), 4.0 - lr * d_mu, rtol=1e-5)
    np.testing.assert_allclose(float(new.params["log_std"][0, 0]),
                               math.log(0.5) - lr * d_ls, rtol=1e-5)
    # and it is not the ratio-1 update
    d_mu1, _ = hand_pg_grads(z, r, 4.0, 0.5)
    assert abs(d_mu1 - d_mu) > 0.1


def test_only_real_transitions_enter_the_buffer():
    """Defect: the reset action with reward 0 entering the buffer. ``act`` cannot write
    the state; only the transitions passed to ``update`` are stored, and the update uses
    exactly those."""
    spec = make_spec()
    hyper = {"buffer_length": 5, "optimizer": "sgd", "learning_rate": 0.05,
             "update_epochs": 1, "initial_mean": 4.0, "initial_stddev": 0.5}
    learner = make("ppo_bandit", hyper, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    assert int(state.count) == 0
    z = np.array([3.6, 4.1, 4.7, 3.9, 4.4])
    r = np.array([2.0, 3.0, 1.0, 5.0, 4.0])
    aux = {"sample": z.reshape(5, 1, 1), "log_prob": np_logp(z, 4.0, 0.5)[:, None]}
    first = make_batch({k: v[:3] for k, v in aux.items()}, r[:3, None])
    s3, m3 = learner.update(state, first)
    assert int(s3.count) == 3 and int(m3["num_updates"]) == 0
    # one slot: the buffer rows are the same numbers in either layout ([L, A], [N, L, M])
    np.testing.assert_allclose(np.asarray(s3.buf_reward).ravel()[:3], r[:3])
    np.testing.assert_allclose(np.asarray(s3.buf_logp).ravel()[:3], aux["log_prob"][:3, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(s3.params["mean"]), [[4.0]])
    second = make_batch({k: v[3:] for k, v in aux.items()}, r[3:, None])
    s5, m5 = learner.update(s3, second)
    assert int(m5["num_updates"]) == 1
    d_mu, _ = hand_pg_grads(z, r, 4.0, 0.5)   # exactly the 5 real samples, no reward-0 row
    np.testing.assert_allclose(float(s5.params["mean"][0, 0]), 4.0 - 0.05 * d_mu, rtol=1e-5)


def test_rolling_ppo_window_uses_only_stored_samples_and_is_fifo():
    spec = make_spec()
    lr = 0.05
    learner = make("rolling_ppo_bandit", 
        {"buffer_length": 4, "optimizer": "sgd", "learning_rate": lr, "update_epochs": 1,
         "initial_mean": 4.0, "initial_stddev": 0.5}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    z, r = np.array([3.7, 4.5]), np.array([1.0, 2.0])
    batch = make_batch({"sample": z.reshape(2, 1, 1), "log_prob": np_logp(z, 4.0, 0.5)[:, None]},
                       r[:, None])
    new, m = learner.update(state, batch)
    # step 1: a single sample has advantage 0 (no change); step 2: the window holds the two
    # real samples only (an empty/zero-reward slot would change the standardisation)
    assert int(m["num_updates"]) == 2 and int(new.count) == 2
    d_mu, d_ls = hand_pg_grads(z, r, 4.0, 0.5)
    np.testing.assert_allclose(float(new.params["mean"][0, 0]), 4.0 - lr * d_mu, rtol=1e-5)
    np.testing.assert_allclose(float(new.params["log_std"][0, 0]),
                               math.log(0.5) - lr * d_ls, rtol=1e-5)
    # FIFO: after 6 samples the window holds the last 4
    more = make_batch({"sample": np.arange(4.0).reshape(4, 1, 1), "log_prob": np.zeros((4, 1))},
                      np.array([10.0, 11.0, 12.0, 13.0])[:, None])
    s6, _ = learner.update(new, more)
    assert int(s6.count) == 4 and int(s6.steps) == 6
    assert sorted(np.asarray(s6.buf_reward[:, 0]).tolist()) == [10.0, 11.0, 12.0, 13.0]


@pytest.mark.parametrize("bad_log_std", [math.log(1e-5), float("nan")])
def test_stddev_fallback_is_not_scaled_by_pullback(bad_log_std):
    """Defect: the stddev fallback multiplied by the pull-back strength."""
    spec = make_spec()
    lr, pull = 0.01, 3.0
    learner = make("vpg_bandit", 
        {"buffer_length": 2, "optimizer": "sgd", "learning_rate": lr, "pullback_coef": pull,
         "stddev_low": 1e-3, "stddev_fallback": 0.3, "initial_mean": 5.0}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    state = state.replace(params={"mean": jnp.array([[4.0]]),
                                  "log_std": jnp.array([[bad_log_std]])})
    z = np.array([4.0, 4.0])
    batch = make_batch({"sample": z.reshape(2, 1, 1), "log_prob": np.zeros((2, 1))},
                       np.array([[1.0], [1.0]]))   # equal rewards: zero advantage
    new, _ = learner.update(state, batch)
    np.testing.assert_allclose(float(jnp.exp(new.params["log_std"][0, 0])), 0.3, rtol=1e-6)
    mean = float(new.params["mean"][0, 0])
    if math.isfinite(bad_log_std):
        np.testing.assert_allclose(mean, 4.0 - lr * 2 * pull * (4.0 - 5.0), rtol=1e-6)
    else:
        assert mean == 5.0  # a non-finite mean is reset to the initial mean
    # without a fallback the stddev is floored at stddev_low
    floor = make("vpg_bandit", {"buffer_length": 2, "stddev_low": 1e-3,
                                         "initial_mean": 5.0}, spec)
    s = floor.init(jax.random.PRNGKey(0), spec)
    s = s.replace(params={"mean": jnp.array([[4.0]]), "log_std": jnp.array([[math.log(1e-5)]])})
    s, _ = floor.update(s, batch)
    np.testing.assert_allclose(float(jnp.exp(s.params["log_std"][0, 0])), 1e-3, rtol=1e-5)


def test_mean_and_stddev_bounds_respected():
    spec = make_spec(low=0.0, high=3.0)
    learner = make("vpg_bandit", 
        {"buffer_length": 2, "optimizer": "sgd", "learning_rate": 100.0, "initial_mean": 1.0,
         "initial_stddev": 0.5, "mean_low": 0.8, "mean_high": 1.2, "stddev_high": 0.6}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    for rewards in ([0.0, 1.0], [1.0, 0.0]):
        z = np.array([0.5, 1.5])
        new, _ = learner.update(state, make_batch(
            {"sample": z.reshape(2, 1, 1), "log_prob": np.zeros((2, 1))},
            np.array(rewards)[:, None]))
        mean = new.params["mean"][0, 0]
        assert np.float32(0.8) <= mean <= np.float32(1.2)
        assert mean in (np.float32(0.8), np.float32(1.2))   # the huge step hit a bound
        assert float(jnp.exp(new.params["log_std"][0, 0])) <= 0.6 + 1e-6
    with pytest.raises(ConfigError, match="stddev_fallback"):
        make("ppo_bandit", {"stddev_low": 0.1, "stddev_fallback": 0.01}, spec)
    with pytest.raises(ConfigError, match="learners.ppo_bandit.nope"):
        make("ppo_bandit", {"nope": 1}, spec)


def test_policy_sharing_two_slots_one_policy():
    """Two slots on one policy: one parameter set, updated with the mean of the slots'
    gradients (each slot's advantages standardised within its own buffer); a third slot on
    its own policy is unaffected by the others' data."""
    spec = make_spec(A=3, num_policies=2, policy_index=(0, 1, 0))
    lr = 0.05
    learner = make("vpg_bandit", 
        {"buffer_length": 2, "optimizer": "sgd", "learning_rate": lr, "initial_mean": 4.0,
         "initial_stddev": 0.5}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    assert state.params["mean"].shape == (2, 1)
    _, aux = learner.act(state, jnp.zeros((3, 0)), jax.random.PRNGKey(3))
    z = np.array([[3.6, 4.1, 4.9], [4.3, 3.8, 4.2]])       # [T, A]
    r = np.array([[1.0, 0.0, 5.0], [2.0, 1.0, 1.0]])
    batch = make_batch({"sample": z[..., None], "log_prob": np_logp(z, 4.0, 0.5)}, r)
    new, _ = learner.update(state, batch)
    g0 = hand_pg_grads(z[:, 0], r[:, 0], 4.0, 0.5)
    g2 = hand_pg_grads(z[:, 2], r[:, 2], 4.0, 0.5)
    g1 = hand_pg_grads(z[:, 1], r[:, 1], 4.0, 0.5)
    np.testing.assert_allclose(float(new.params["mean"][0, 0]),
                               4.0 - lr * 0.5 * (g0[0] + g2[0]), rtol=1e-5)
    np.testing.assert_allclose(float(new.params["log_std"][0, 0]),
                               math.log(0.5) - lr * 0.5 * (g0[1] + g2[1]), rtol=1e-5)
    np.testing.assert_allclose(float(new.params["mean"][1, 0]), 4.0 - lr * g1[0], rtol=1e-5)
    # slots 0 and 2 act with the same parameters
    _, aux = learner.act(new, jnp.zeros((3, 0)), jax.random.PRNGKey(4))
    mu, sd = float(new.params["mean"][0, 0]), float(jnp.exp(new.params["log_std"][0, 0]))
    for slot in (0, 2):
        np.testing.assert_allclose(float(aux["log_prob"][slot]),
                                   np_logp(float(aux["sample"][slot, 0]), mu, sd), rtol=1e-5)


# ----------------------------------------------------------------- Gaussian: learning


def _run_gaussian(kind, hyper, reward_fn, steps, seeds, high=3.0):
    spec = make_spec(low=0.0, high=high)
    learner = make(kind, hyper, spec)

    def body(state, key):
        action, aux = learner.act(state, jnp.zeros((1, 0)), key)
        reward = reward_fn(action)[..., 0]
        batch = Transition(obs=jnp.zeros((1, 1, 0)), action=action[None], reward=reward[None],
                           next_obs=jnp.zeros((1, 1, 0)), done=jnp.zeros((1, 1), bool),
                           aux=jax.tree.map(lambda x: x[None], aux))
        state, _ = learner.update(state, batch)
        return state, None

    @jax.jit
    @jax.vmap
    def run(key):
        state = learner.init(key, spec)
        state, _ = jax.lax.scan(body, state, jax.random.split(key, steps))
        return state.params["mean"][0, 0]

    return np.asarray(run(jax.random.split(jax.random.PRNGKey(0), seeds)))


def test_ppo_bandit_learns_budget_capped_monopoly_price():
    """r(p) = p if p <= budget else 0 on [0, 3]: revenue grows with the price up to the
    consumer's budget and drops to zero above it, so the optimal price is the budget."""
    budget = 0.5
    best = budget
    means = _run_gaussian(
        "ppo_bandit",
        {"learning_rate": 0.002, "buffer_length": 8, "update_epochs": 16,
         "initial_mean": budget / 2, "initial_stddev": 0.1, "stddev_low": 0.002},
        lambda p: jnp.where(p <= budget, p, 0.0), steps=3000, seeds=8)
    assert np.all(np.abs(means - best) <= 0.02 * best), means


@pytest.mark.parametrize("kind,hyper", [
    ("vpg_bandit", {"learning_rate": 0.02}),
    ("rolling_ppo_bandit", {}),
])
def test_vpg_and_rolling_ppo_learn_a_smooth_optimum(kind, hyper):
    target = 1.2
    means = _run_gaussian(kind, hyper, lambda p: -(p - target) ** 2, steps=1500, seeds=4)
    assert np.all(np.abs(means - target) < 0.1), means


# --------------------------------------------------------------------- discrete bandits


def _arm_batch(arms, rewards, prob=None):
    arms = np.asarray(arms, np.int32)
    aux = {"action_index": arms}
    if prob is not None:
        aux["prob"] = np.asarray(prob, np.float32)
    return make_batch(aux, rewards)


def test_grid_actions_and_action_index():
    spec = make_spec(A=2, P=3, low=1.0, high=2.0)
    learner = make("epsilon_greedy", {"grid_size": 5, "epsilon": 1.0}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    action, aux = learner.act(state, jnp.zeros((2, 0)), jax.random.PRNGKey(1))
    idx = np.asarray(aux["action_index"])
    assert idx.shape == (2, 3) and idx.dtype == np.int32
    np.testing.assert_allclose(np.asarray(action), 1.0 + 0.25 * idx, rtol=1e-6)
    explicit = make("ucb1", {"grid": [1.1, 1.7]}, spec)
    a, aux = explicit.act(explicit.init(jax.random.PRNGKey(0), spec), None, jax.random.PRNGKey(2))
    np.testing.assert_allclose(np.asarray(a), np.array([1.1, 1.7])[np.asarray(aux["action_index"])],
                               rtol=1e-6)
    with pytest.raises(ConfigError, match="learners.ucb1.grid"):
        make("ucb1", {"grid": [0.5, 1.5]}, spec)


def test_ucb1_arm_choice_hand_example():
    spec = make_spec(P=1, low=0.0, high=2.0)
    # arms 0..2 pulled 2, 1, 3 times with means 0.5, 0.9, 0.95
    arms = [[[0]], [[0]], [[1]], [[2]], [[2]], [[2]]]
    rewards = [[0.4], [0.6], [0.9], [0.95], [0.9], [1.0]]
    for c, expected in ((1.0, None), (0.0, 2)):
        learner = make("ucb1", {"grid_size": 3, "c": c}, spec)
        state, _ = learner.update(learner.init(jax.random.PRNGKey(0), spec),
                                  _arm_batch(arms, rewards))
        n = np.array([2.0, 1.0, 3.0])
        q = np.array([0.5, 0.9, 0.95])
        index = q + c * np.sqrt(2 * np.log(6.0) / n)
        if expected is None:
            expected = int(np.argmax(index))
            assert expected == 1  # the bonus overturns the greedy choice
        _, aux = learner.act(state, None, jax.random.PRNGKey(5))
        assert int(aux["action_index"][0, 0]) == expected
    # an unpulled arm is tried first
    learner = make("ucb1", {"grid_size": 4}, spec)
    state, _ = learner.update(learner.init(jax.random.PRNGKey(0), spec),
                              _arm_batch(arms, rewards))
    _, aux = learner.act(state, None, jax.random.PRNGKey(5))
    assert int(aux["action_index"][0, 0]) == 3


def _np_ucb_tuned(rewards_per_arm, cap=0.25):
    """UCB-tuned's statistics and index, in float64, from each arm's list of rewards (every
    arm pulled at least once)."""
    n = np.array([len(r) for r in rewards_per_arm], np.float64)
    s = np.array([np.sum(r) for r in rewards_per_arm], np.float64)
    s2 = np.array([np.sum(np.square(r)) for r in rewards_per_arm], np.float64)
    log_n = np.log(n.sum())
    q = s / n
    v = s2 / n - q ** 2 + np.sqrt(2 * log_n / n)
    return n, s, s2, v, q + np.sqrt(log_n / n * np.minimum(cap, v))


def _pulls_batches(rewards_per_arm, parts=2):
    """The pulls of every arm, interleaved, as ``parts`` consecutive [T, 1, 1] batches."""
    pulls = sorted(((i, arm, r) for arm, rs in enumerate(rewards_per_arm)
                    for i, r in enumerate(rs)))
    arms = [[[arm]] for _, arm, _ in pulls]
    rewards = [[r] for _, _, r in pulls]
    cut = np.linspace(0, len(pulls), parts + 1).astype(int)
    return [_arm_batch(arms[a:b], rewards[a:b]) for a, b in zip(cut[:-1], cut[1:])]


def _fed(kind, hyper, spec, batches):
    learner = make(kind, hyper, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    for batch in batches:
        state, _ = learner.update(state, batch)
    return learner, state


def test_ucb_tuned_arm_choice_hand_example():
    """Arm 0: 400 pulls alternating 0.7/0.9 (its V_g, 0.18, is under the cap); arm 1: three
    pulls around 0.2; arm 2: five around 0.6. The index of the numpy formula picks arm 2,
    UCB1's (c = 1) picks arm 1 for the same statistics."""
    rewards = [[0.7, 0.9] * 200, [0.1, 0.3, 0.2], [0.5, 0.7, 0.6, 0.6, 0.6]]
    n, s, s2, v, index = _np_ucb_tuned(rewards)
    spec = make_spec(P=1, low=0.0, high=1.0)
    batches = _pulls_batches(rewards)
    learner, state = _fed("ucb_tuned", {"grid_size": 3}, spec, batches)
    np.testing.assert_allclose(np.asarray(state.counts[0, 0]), n)
    np.testing.assert_allclose(np.asarray(state.sums[0, 0]), s, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state.sq_sums[0, 0]), s2, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(db.ucb_tuned_index(state.counts, state.sums, state.sq_sums, 0.25)[0, 0]),
        index, rtol=1e-4)
    assert v[0] < 0.25 < v[1] and v[2] > 0.25      # both branches of the min
    expected = int(np.argmax(index))
    assert expected == 2
    for seed in range(5):
        _, aux = learner.act(state, None, jax.random.PRNGKey(seed))
        assert int(aux["action_index"][0, 0]) == expected
    # UCB1 on the same pulls: argmax q + sqrt(2 ln N / n) is another arm
    ucb1, ucb1_state = _fed("ucb1", {"grid_size": 3}, spec, batches)
    ucb1_index = s / n + np.sqrt(2 * np.log(n.sum()) / n)
    assert int(np.argmax(ucb1_index)) == 1
    _, aux = ucb1.act(ucb1_state, None, jax.random.PRNGKey(0))
    assert int(aux["action_index"][0, 0]) == 1
    # the existing kinds' state is unchanged: no squared sums
    assert not hasattr(ucb1_state, "sq_sums")
    assert len(jax.tree.leaves(ucb1_state)) == 3 and len(jax.tree.leaves(state)) == 4


def test_ucb_tuned_tries_unpulled_arms_first():
    spec = make_spec(P=1, low=0.0, high=1.0)
    learner = make("ucb_tuned", {"grid_size": 4}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    # nothing pulled: every arm is a tie, broken at random
    first = {int(learner.act(state, None, jax.random.PRNGKey(k))[1]["action_index"][0, 0])
             for k in range(40)}
    assert first == {0, 1, 2, 3}
    # arm 0 pulled with a high reward, arm 2 with a low one: arms 1 and 3 come first
    state, _ = learner.update(state, _arm_batch([[[0]], [[2]]], [[5.0], [-5.0]]))
    chosen = {int(learner.act(state, None, jax.random.PRNGKey(k))[1]["action_index"][0, 0])
              for k in range(40)}
    assert chosen == {1, 3}
    state, _ = learner.update(state, _arm_batch([[[1]]], [[0.0]]))
    for k in range(5):
        assert int(learner.act(state, None, jax.random.PRNGKey(k))[1]["action_index"][0, 0]) == 3


def test_ucb_tuned_variance_cap_changes_the_choice():
    """Arm 0: mean 0.5 with variance 1 (rewards -0.5, 1.5); arm 1: 0.6 every time; four pulls
    each. Capped at 1/4 both bounds are the cap and the better mean wins; with the cap at 4
    arm 0's larger V_g wins."""
    rewards = [[-0.5, 1.5] * 2, [0.6] * 4]
    spec = make_spec(P=1, low=0.0, high=1.0)
    batches = _pulls_batches(rewards)
    choices = {}
    for cap in (0.25, 4.0):
        *_, v, index = _np_ucb_tuned(rewards, cap)
        learner, state = _fed("ucb_tuned", {"grid_size": 2, "variance_cap": cap}, spec, batches)
        _, aux = learner.act(state, None, jax.random.PRNGKey(3))
        choices[cap] = int(aux["action_index"][0, 0])
        assert choices[cap] == int(np.argmax(index))
    assert np.all(v > 0.25) and np.all(v < 4.0)
    assert choices == {0.25: 1, 4.0: 0}
    with pytest.raises(ConfigError, match="learners.ucb_tuned.variance_cap"):
        make("ucb_tuned", {"variance_cap": 0.0}, spec)


def _noisy_runs(learner, spec, reward, steps: int, seed: int):
    """The learner's states after ``steps`` one-slot periods of a jitted ``lax.scan``, 4
    seeds ``vmap``ped; ``reward(action, aux, key) -> [1]`` pays each period."""

    def body(state, key):
        k_act, k_noise = jax.random.split(key)
        action, aux = learner.act(state, None, k_act)
        r = reward(action, aux, k_noise)
        batch = Transition(obs=jnp.zeros((1, 1, 0)), action=action[None], reward=r[None],
                           next_obs=jnp.zeros((1, 1, 0)), done=jnp.zeros((1, 1), bool),
                           aux=jax.tree.map(lambda x: x[None], aux))
        return learner.update(state, batch)[0], None

    @jax.jit
    @jax.vmap
    def run(key):
        state, _ = jax.lax.scan(body, learner.init(key, spec), jax.random.split(key, steps))
        return state

    return run(jax.random.split(jax.random.PRNGKey(seed), 4))


def test_ucb_tuned_pulls_the_best_of_three_noisy_arms_most():
    """Arms with mean rewards 0.3, 0.5, 0.4 and Gaussian noise (sd 0.2); 3000 steps of a
    jitted ``lax.scan``, 4 seeds: the middle arm is pulled most, in over 80% of the steps."""
    spec = make_spec(P=1, low=0.0, high=1.0)
    learner = make("ucb_tuned", {"grid_size": 3}, spec)
    means = jnp.array([0.3, 0.5, 0.4])
    states = _noisy_runs(learner, spec, lambda action, aux, key: means[aux["action_index"][:, 0]]
                         + 0.2 * jax.random.normal(key, (1,)), 3000, 2)
    counts = np.asarray(states.counts[:, 0, 0])
    assert np.all(np.argmax(counts, -1) == 1), counts
    assert np.all(counts[:, 1] > 0.8 * 3000), counts


def test_thompson_posterior_update_formula_and_sampling():
    prior_mean, prior_var, noise_var = 0.5, 2.0, 0.25
    obs = [1.0, 0.2, 0.7]
    # sequential Bayes: one observation at a time
    m, v = prior_mean, prior_var
    for x in obs:
        m, v = (m / v + x / noise_var) / (1 / v + 1 / noise_var), 1 / (1 / v + 1 / noise_var)
    spec = make_spec(P=1, low=0.0, high=1.0)
    learner = make("thompson", {"grid_size": 2, "prior_mean": prior_mean,
                                         "prior_var": prior_var, "noise_var": noise_var}, spec)
    state, _ = learner.update(learner.init(jax.random.PRNGKey(0), spec),
                              _arm_batch([[[1]]] * 3, [[x] for x in obs]))
    np.testing.assert_allclose(np.asarray(state.counts[0, 0]), [0, 3])
    post_m, post_v = db.thompson_posterior(state.counts, state.sums, prior_mean, prior_var,
                                           noise_var)
    np.testing.assert_allclose(np.asarray(post_m[0, 0]), [prior_mean, m], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(post_v[0, 0]), [prior_var, v], rtol=1e-5)
    # sampling: many slots sharing the policy draw arm 1 with P(theta_1 > theta_0)
    A = 4000
    spec_many = make_spec(A=A, P=1, low=0.0, high=1.0, num_policies=1, policy_index=(0,) * A)
    many = make("thompson", {"grid_size": 2, "prior_mean": prior_mean,
                                      "prior_var": prior_var, "noise_var": noise_var}, spec_many)
    _, aux = many.act(state, None, jax.random.PRNGKey(7))
    p1 = 0.5 * (1 + math.erf((m - prior_mean) / math.sqrt(2 * (v + prior_var))))
    assert abs(float(jnp.mean(aux["action_index"] == 1)) - p1) < 0.03


def test_exp3_weight_update_formula():
    gamma, G = 0.3, 3
    spec = make_spec(P=1, low=0.0, high=1.0)
    learner = make("exp3", {"grid_size": G, "gamma": gamma, "reward_low": 0.0,
                                     "reward_high": 10.0}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    _, aux = learner.act(state, None, jax.random.PRNGKey(1))
    np.testing.assert_allclose(float(aux["prob"][0, 0]), 1 / 3, rtol=1e-6)
    arm = int(aux["action_index"][0, 0])
    state, _ = learner.update(state, _arm_batch([[[arm]]], [[5.0]], prob=[[[1 / 3]]]))
    w = np.ones(G)
    w[arm] *= math.exp(gamma * 0.5 / ((1 / 3) * G))        # x = (5 - 0) / 10
    probs = (1 - gamma) * w / w.sum() + gamma / G
    np.testing.assert_allclose(np.asarray(db.exp3_probs(state.log_weights, gamma)[0, 0]), probs,
                               rtol=1e-5)
    # rewards beyond reward_high are clipped to x = 1
    s2, _ = learner.update(learner.init(jax.random.PRNGKey(0), spec),
                           _arm_batch([[[0]]], [[50.0]], prob=[[[0.5]]]))
    np.testing.assert_allclose(float(s2.log_weights[0, 0, 0] - s2.log_weights[0, 0, 1]),
                               gamma * 1.0 / (0.5 * G), rtol=1e-5)


def test_epsilon_greedy_exploration_rate_and_decay():
    A = 3000
    spec = make_spec(A=A, P=1, low=0.0, high=1.0, num_policies=1, policy_index=(0,) * A)
    arms = np.repeat(np.arange(4)[:, None, None], A, axis=1)          # [T=4, A, P=1]
    batch = _arm_batch(arms, np.repeat(np.array([[0.1], [0.9], [0.3], [0.2]]), A, axis=1))
    pulls = 4 * A                                   # per product, pooled over the slots
    for hyper, eps in (({"epsilon": 1.0, "epsilon_decay": 0.5 ** (1 / pulls)}, 0.5),
                       ({"epsilon": 1.0, "epsilon_decay": 0.99, "epsilon_min": 0.05}, 0.05)):
        learner = make("epsilon_greedy", {"grid_size": 4, **hyper}, spec)
        state, _ = learner.update(learner.init(jax.random.PRNGKey(0), spec), batch)
        _, aux = learner.act(state, None, jax.random.PRNGKey(2))
        other = float(jnp.mean(aux["action_index"] != 1))
        assert abs(other - eps * 3 / 4) < 0.03, (hyper, other)


def test_discrete_policy_sharing_pools_statistics():
    spec = make_spec(A=2, P=2, low=0.0, high=1.0, num_policies=1, policy_index=(0, 0))
    learner = make("ucb1", {"grid_size": 3}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    assert state.counts.shape == (1, 2, 3)
    batch = _arm_batch([[[0, 2], [1, 2]]], [[1.0, 3.0]])
    state, _ = learner.update(state, batch)
    np.testing.assert_allclose(np.asarray(state.counts[0]), [[1, 1, 0], [0, 0, 2]])
    np.testing.assert_allclose(np.asarray(state.sums[0]), [[1, 3, 0], [0, 0, 4]])


@pytest.mark.parametrize("kind,hyper", [
    ("epsilon_greedy", {"epsilon": 0.1, "initial_value": 5.0}),
    ("ucb1", {"c": 1.0}),
    ("ucb_tuned", {}),
    ("thompson", {"prior_var": 1.0, "noise_var": 0.09}),
    ("exp3", {"gamma": 0.1, "reward_low": -0.5, "reward_high": 1.5}),
])
def test_discrete_bandits_find_the_best_arm(kind, hyper):
    """5 arms on [0, 1]; reward = 4 p (1 - p) + noise (sd 0.3): the best arm is the middle
    one (price 0.5, mean reward 1 against 0.75 for its neighbours)."""
    spec = make_spec(P=1, low=0.0, high=1.0)
    learner = make(kind, {"grid_size": 5, **hyper}, spec)
    grid = np.linspace(0.0, 1.0, 5)
    best = int(np.argmax(4 * grid * (1 - grid)))
    states = _noisy_runs(learner, spec, lambda action, aux, key: (4 * action * (1 - action)).sum(-1)
                         + 0.3 * jax.random.normal(key, (1,)), 1500, 1)
    # exp3: the arm with the largest weight; the others: the arm pulled most
    score = states.log_weights if kind == "exp3" else states.counts
    assert np.all(np.argmax(np.asarray(score), -1) == best), np.asarray(score)


@pytest.mark.parametrize("shape", [((5, 2, 4, 3, 3), (2, 1, 3, 3)), ((6, 1, 1, 7, 2), (1, 1, 7, 2))])
def test_centred_log_prob_value_and_gradient_equal_the_gaussian_log_density(shape):
    """The PPO bandits' log-probability from centred samples (hand-written gradient)
    equals autodiff of the elementwise Gaussian log-density, in float64, for parameters
    broadcast over the sample and market axes."""
    from jaxmarket.learners.gaussian_bandits import centred_log_prob, normal_log_prob
    sample_shape, param_shape = shape
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(2.0, 0.7, sample_shape))
        centre = jnp.asarray(rng.normal(2.0, 0.1, param_shape))
        mean = jnp.asarray(rng.normal(2.0, 0.3, param_shape))
        log_std = jnp.asarray(rng.normal(-0.5, 0.3, param_shape))
        weight = jnp.asarray(rng.normal(0.0, 1.0, sample_shape[:-1]))

        def direct(mean, log_std):
            return (weight * normal_log_prob(x, mean, log_std).sum(-1)).sum()

        def centred(mean, log_std):
            d = x - centre
            return (weight * centred_log_prob(d, d * d, mean - centre, log_std)).sum()

        v0, g0 = jax.value_and_grad(direct, argnums=(0, 1))(mean, log_std)
        v1, g1 = jax.value_and_grad(centred, argnums=(0, 1))(mean, log_std)
        np.testing.assert_allclose(v1, v0, rtol=1e-12)
        for a, b in zip(g1, g0):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind, hyper, perm", [
    ("ppo_bandit", {"update_epochs": 3, "entropy_coef": 0.01, "pullback_coef": 0.1},
     [2, 0, 3, 1]),                  # a gather layout
    ("ppo_bandit", {"update_epochs": 2}, [1, 0, 3, 2]),   # tiled, positions swapped per seed
    ("vpg_bandit", {}, [2, 0, 3, 1])])
def test_policy_major_feature_buffer_updates_as_the_per_slot_buffer(kind, hyper, perm):
    """One policy per seller position (2 seeds x 3 markets x 2 sellers, 2 products): the
    learner keeps each policy's samples as features (d, d**2) about a centre and takes
    the loss's sums as matrix-vector products. The same problem with the policies
    numbered in another order (a gather layout, per-slot buffer) must give the same
    parameters: over two full buffers, with the parameters moved between two samples of
    the second buffer (as a PBT exploit does), so the centre is not the update's start."""
    S, M, n, P, L = 2, 3, 2, 2, 4
    A = S * M * n
    ident = tuple(int(s * n + a % n) for s in range(S) for a in range(M * n))
    perm = np.array(perm)                                # policy p -> perm[p]
    spec_f = LearnerSpec(num_agents=A, obs_dim=0, num_products=P,
                         action_low=np.zeros((A, P), np.float32),
                         action_high=np.full((A, P), 4.0, np.float32), num_policies=S * n,
                         policy_index=ident, num_markets=S * M, num_sessions=S)
    spec_g = LearnerSpec(**{**spec_f.__dict__, "policy_index": tuple(int(perm[p]) for p in ident)})
    h = {"buffer_length": L, "learning_rate": 0.05, **hyper}
    fast, slow = make(kind, h, spec_f), make(kind, h, spec_g)
    sf, sg = fast.init(jax.random.PRNGKey(0), spec_f), slow.init(jax.random.PRNGKey(0), spec_g)
    assert sf.buf_sample.shape == (S * n, L, M, 2 * P)      # the feature layout
    assert sg.buf_sample.shape == (L, A, P)                  # the per-slot layout
    inv = np.argsort(perm)

    def relabel(params):            # fast's policy p is slow's policy perm[p]
        return jax.tree.map(lambda x: x[inv], params)

    rng = np.random.default_rng(1)
    for step in range(2 * L):
        if step == L + 2:           # move the parameters mid-buffer, in both learners
            moved = {"mean": sf.params["mean"] + jnp.asarray(rng.normal(0, 0.2, (S * n, P)),
                                                             jnp.float32),
                     "log_std": sf.params["log_std"] - 0.1}
            sf, sg = sf.replace(params=moved), sg.replace(params=relabel(moved))
        _, aux = fast.act(sf, jnp.zeros((A, 0)), jax.random.PRNGKey(10 + step))
        z = np.asarray(aux["sample"])
        reward = -np.square(z - 1.5).sum(-1) + rng.normal(0, 0.1, A)
        batch = make_batch({"sample": z[None], "log_prob": np.asarray(aux["log_prob"])[None]},
                           reward[None], action=jnp.asarray(z[None]))
        sf, mf = fast.update(sf, batch)
        sg, mg = slow.update(sg, batch)
        if (step + 1) % L == 0:     # an update happened: same parameters, same loss
            for key in ("mean", "log_std"):
                np.testing.assert_allclose(np.asarray(sf.params[key]),
                                           np.asarray(sg.params[key])[perm], rtol=2e-5,
                                           atol=2e-6)
            np.testing.assert_allclose(float(mf["loss"]), float(mg["loss"]), rtol=1e-4)
    assert int(sf.updates) == 2
    assert np.abs(np.asarray(sf.params["mean"]) - 2.0).max() > 1e-3   # it learned something


@pytest.mark.parametrize("kind", ["ucb_tuned", "epsilon_greedy"])
def test_recent_window_median_is_numpys_over_the_last_k_played_prices(kind):
    # two slots, two products, a 6-arm grid over [0, 1]: the arms played in batches of
    # 3, 1 and 7 periods (the last one longer than the window)
    K, G = 4, 6
    spec = make_spec(A=2, P=2, low=0.0, high=1.0)
    learner = make(kind, {"grid_size": G, "recent_window": K}, spec)
    state = learner.init(jax.random.PRNGKey(0), spec)
    settings = db.discrete_bandit_settings(kind, {"grid_size": G, "recent_window": K}, spec)
    grid = np.linspace(0.0, 1.0, G)
    rng = np.random.default_rng(4)
    played = []
    hyper = {"grid_size": G, "recent_window": K}
    assert np.all(np.isnan(np.asarray(db.recent_median(settings, state))))
    for T in (3, 1, 7):
        arms = rng.integers(0, G, (T, 2, 2))
        played.append(arms)
        state, _ = learner.update(state, _arm_batch(arms, np.ones((T, 2))))
        history = np.concatenate(played)[-K:]                    # [<=K, A, P]
        expected = np.median(grid[history], axis=0)
        got = db.readout(kind, hyper, spec, state)["recent_median"]
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6)
    # the statistics are the plain learner's: the window only adds the ring buffer
    plain = make(kind, {"grid_size": G}, spec)
    ref = plain.init(jax.random.PRNGKey(0), spec)
    for arms in played:
        ref, _ = plain.update(ref, _arm_batch(arms, np.ones((arms.shape[0], 2))))
    np.testing.assert_array_equal(np.asarray(state.stats.counts), np.asarray(ref.counts))
    a1, _ = learner.act(state, None, jax.random.PRNGKey(7))
    a2, _ = plain.act(ref, None, jax.random.PRNGKey(7))
    np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
    # without a window nothing is read out, and the state is the plain one
    assert db.readout(kind, {"grid_size": G}, spec, ref) == {}
    assert not isinstance(ref, db.RecentArms)
