"""External models, POI fields, the POI exploration bonus and the ground-truth
evaluator (docs/poi.md)."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jaxmarket.config.errors import ConfigError
from jaxmarket.models.base import MODELS, ModelDef, make_mlp_model
from jaxmarket.models.metrics import asymptotic, auc, convergence, iqm
from jaxmarket.models.poi import POI_FIELDS, PoiDef, make_poi
from jaxmarket.train.loop import make_train
from jaxmarket.train.plan import resolve

SETTINGS = {"hidden_sizes": (4,), "activation": "tanh", "ensemble": 3, "bootstrap": 1.0,
            "dropout": 0.0, "learning_rate": 0.01, "epochs": 1, "minibatch_size": 8}


def numpy_forward(params, x):
    """The members' predictions ``[M, B, O]`` of a one-hidden-layer tanh MLP, in float64
    numpy from the raw flax parameter arrays (independent of flax's apply)."""
    p = jax.tree.map(lambda v: np.asarray(v, np.float64), params["params"])
    h = np.tanh(np.einsum("bi,mih->mbh", x, p["Dense_0"]["kernel"]) + p["Dense_0"]["bias"][:, None])
    return np.einsum("mbh,mho->mbo", h, p["Dense_1"]["kernel"]) + p["Dense_1"]["bias"][:, None]


@pytest.fixture(scope="module")
def fitted():
    model = make_mlp_model(SETTINGS, in_dim=2, out_dim=2, make_io=None)
    state = model.init(jax.random.key(0))
    x = np.asarray(jax.random.uniform(jax.random.key(1), (5, 2), minval=-1, maxval=1))
    y = np.asarray(jax.random.normal(jax.random.key(2), (5, 2)))
    return model, state, x, y


def test_disagreement_and_error_poi_match_their_formulas(fitted):
    model, state, x, y = fitted
    preds = numpy_forward(state.params, x.astype(np.float64))              # [M, B, O]
    np.testing.assert_allclose(make_poi("disagreement", model)(state, x), preds.std(0).mean(-1),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(make_poi("error", model)(state, x, y),
                               np.square(preds.mean(0) - y).mean(-1), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(make_poi("zero", model)(state, x), np.zeros(5))


def test_gradient_poi_is_the_per_example_gradient_norm(fitted):
    model, state, x, y = fitted
    leaves, treedef = jax.tree.flatten(state.params)
    flat = np.concatenate([np.asarray(v, np.float64).ravel() for v in leaves])

    def loss(theta, xi, yi):   # l = (1/M) sum_m ||f_m(x) - y||^2 / O, float64
        parts, pos = [], 0
        for v in leaves:
            parts.append(theta[pos:pos + v.size].reshape(v.shape))
            pos += v.size
        pred = numpy_forward(jax.tree.unflatten(treedef, parts), xi[None])[:, 0]
        return np.mean(np.square(pred - yi).mean(-1))

    eps, want = 1e-6, []
    for xi, yi in zip(x.astype(np.float64), y.astype(np.float64)):
        grad = [(loss(flat + eps * e, xi, yi) - loss(flat - eps * e, xi, yi)) / (2 * eps)
                for e in np.eye(flat.size)]
        want.append(np.linalg.norm(grad))
    np.testing.assert_allclose(make_poi("gradient", model)(state, x, y), want, rtol=2e-3)


def test_mc_dropout_disagreement_is_a_spread_over_passes():
    model = make_mlp_model({**SETTINGS, "ensemble": 1, "dropout": 0.5}, 2, 2, None)
    state = model.init(jax.random.key(0))
    x = jnp.linspace(-1, 1, 6).reshape(3, 2)
    poi = make_poi("disagreement", model, {"mc_passes": 30})
    a, b = poi(state, x), poi(state, x)
    assert np.all(np.asarray(a) > 0)
    np.testing.assert_array_equal(a, b)   # same state (key), same value


def test_fit_learns_a_known_function():
    model = make_mlp_model({**SETTINGS, "hidden_sizes": (16,), "learning_rate": 0.02,
                            "epochs": 4, "bootstrap": 0.7}, 2, 2, None)
    x = jax.random.uniform(jax.random.key(3), (256, 2), minval=-1, maxval=1)
    y = jnp.stack([0.5 * x[:, 0] - x[:, 1], jnp.sin(x[:, 0])], -1)
    fit = jax.jit(model.fit)
    state = model.init(jax.random.key(4))

    def mse(s):
        return float(np.mean(np.square(numpy_forward(s.params, np.asarray(x, np.float64))
                                       - np.asarray(y)[None])))
    before = mse(state)
    for _ in range(60):
        state, _ = fit(state, x, y)
    assert mse(state) < 0.05 * before and mse(state) < 3e-3


def test_error_curve_summaries():
    t = [0, 10, 20, 30]
    e = [1.0, 0.5, 0.2, 0.1]
    assert auc(t, e) == pytest.approx((1.0 + 0.5 + 0.2 + 0.1) / 4)   # equal spacing: mean
    assert convergence(t, e, threshold=0.35, smooth=2) == 20        # (0.5 + 0.2) / 2
    assert convergence(t, e, threshold=0.01) is None
    assert asymptotic(e, tail=0.5) == pytest.approx(0.15)
    assert iqm([0, 1, 2, 3, 4, 5, 6, 100]) == pytest.approx(3.5)   # middle half: 2..5


# ------------------------------------------------------------------ in the training loop

SCENARIO = yaml.safe_load("""
market:
  num_products: 1
  consumers: [{name: c, count: 1, budget: 1000.0, queries: 1.0}]
  sellers:
    - {name: me, count: 1, low: 1.0, high: 2.5, cost: 1.0, quality: 2.0}
    - {name: rivals, count: 2, low: 1.0, high: 2.5, initial: 1.6, cost: 1.0, quality: 2.0}
  distributor: {kind: logit, temperature: 0.25, outside_option: true, outside_quality: 0.0}
learners:
  me: {kind: ppo_bandit, initial_stddev: 0.2, learning_rate: 0.05, buffer_length: 2}
  rivals: {kind: constant, value: 1.6}
train: {num_iterations: 4, num_envs: 32, num_seeds: 2}
""")
MODEL = {"kind": "demand", "ensemble": 2, "hidden_sizes": [8], "rivals": "mean",
         "eval_every": 2, "eval_grid": 5, "eval_random": 0}


def scenario(model=None, learner=None, queries=1.0):
    config = copy.deepcopy(SCENARIO)
    config["market"]["consumers"][0]["queries"] = queries
    if learner is not None:
        config["learners"]["me"] = learner
    if model is not None:
        config["learners"]["me"] = {**config["learners"]["me"], "external_model": model}
    return config


def run(config, iterations):
    init, run_chunk = make_train(resolve(config))
    runner = jax.jit(init)(jax.random.key(0))
    return jax.jit(lambda r: run_chunk(r, iterations))(runner)


# a POI that grows with the agent's own price
POI_FIELDS.register(PoiDef("own_price", lambda model, state, x, y, s: x[:, 0]))


def test_bonus_reaches_the_bandit_policy_gradient_and_a_model_alone_changes_nothing():
    # no queries: every task reward is 0, so the standardised advantages are exactly 0
    # and the mean never moves; the bonus (growing with the price) alone moves it up
    plain, _ = run(scenario(queries=0.0), 4)
    modelled, _ = run(scenario(MODEL, queries=0.0), 4)
    for a, b in zip(jax.tree.leaves(plain.learners), jax.tree.leaves(modelled.learners)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(plain.learners["me"].params["mean"]), 1.75)
    bonus, m = run(scenario({**MODEL, "poi": {"kind": "own_price", "beta": 1.0}}, queries=0.0), 4)
    assert np.all(np.asarray(bonus.learners["me"].params["mean"]) > 1.8)
    np.testing.assert_array_equal(np.asarray(m["poi/me/beta"]), 1.0)


def test_bonus_reaches_the_ppo_policy_gradient():
    # the loop adds the bonus to Transition.reward (test above); PPO computes its GAE
    # advantages and value targets from that reward, so a bonus growing with the sampled
    # action moves the actor's mean up, and the opposite bonus moves it down
    from jaxmarket.learners.base import LearnerSpec, Transition
    from jaxmarket.learners.ppo import make_ppo

    spec = LearnerSpec(num_agents=64, obs_dim=0, num_products=1,
                       action_low=np.ones((64, 1), np.float32),
                       action_high=np.full((64, 1), 2.5, np.float32), num_policies=1,
                       policy_index=(0,) * 64)
    ppo = make_ppo({"learning_rate": 0.01, "hidden_sizes": (8,), "num_minibatches": 2}, spec)
    state = ppo.init(jax.random.key(0))
    obs = jnp.zeros((64, 0))
    acts = [ppo.act(state, obs, k) for k in jax.random.split(jax.random.key(1), 4)]
    aux = jax.tree.map(lambda *v: jnp.stack(v), *[a for _, a in acts])       # [4, 64]
    raw = aux["raw_action"][..., 0]
    batch = Transition(obs=jnp.zeros((4, 64, 0)), action=None, reward=jnp.zeros((4, 64)),
                       next_obs=jnp.zeros((4, 64, 0)), done=jnp.zeros((4, 64), bool), aux=aux)
    bonus = (raw - raw.mean()) / raw.std()                  # normalised POI ~ the action
    update = jax.jit(ppo.update)

    def actor_mean(st):
        from jaxmarket.learners.ppo import ActorCritic
        net = ActorCritic((8,), "tanh", "gaussian", 1, 11)
        (mu, _), _ = net.apply(jax.tree.map(lambda v: v[0], st.params), jnp.zeros((0,)))
        return float(mu[0])

    start = actor_mean(state)
    plain = actor_mean(update(state, batch)[0])
    up = actor_mean(update(state, batch.replace(reward=batch.reward + bonus))[0])
    down = actor_mean(update(state, batch.replace(reward=batch.reward - bonus))[0])
    # the bonus's sign sets the direction; without it the mean only drifts with the
    # noise of normalising equal advantages, by less than the bonus moves it
    assert up > start + 0.2 and down < start - 0.2
    assert abs(plain - start) < min(up - start, start - down)


# ------------------------------------------------------------------ bad input


class Wrong:
    pass


def wrong_io_model(settings, ctx):   # declares 3 inputs, make_io builds 2
    def make_io(transition, info):
        x = jnp.stack([info["prices"]["me"][..., 0]] * 2, -1)
        return x, info["traffic"]["me"]
    return make_mlp_model({**SETTINGS, **settings}, 3, 1, make_io)


MODELS.register(ModelDef("wrong_io", wrong_io_model, {}))


@pytest.mark.parametrize("model, field, words", [
    ({**MODEL, "ensemble": 1, "poi": {"kind": "disagreement"}},
     "learners.me.external_model.poi.kind", "ensemble >= 2"),
    ({**MODEL, "poi": {"kind": "error", "beta": -0.1}},
     "learners.me.external_model.poi.beta", ">= 0"),
    ({**MODEL, "poi": {"kind": "curiosity"}}, "learners.me.external_model.poi.kind", "one of"),
    ({**MODEL, "kind": "oracle"}, "learners.me.external_model.kind", "one of"),
    ({**MODEL, "ensemble": 0}, "learners.me.external_model.ensemble", ">= 1"),
    ({"kind": "wrong_io"}, "learners.me.external_model", "inputs [1, 1, 3]"),
])
def test_bad_model_config_is_one_config_error(model, field, words):
    with pytest.raises(ConfigError) as err:
        resolve(scenario(model))
    assert err.value.field == field
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_consumer_group_has_no_demand_model():
    config = scenario()
    config["market"]["consumers"][0].update(agent=True)
    config["learners"]["c"] = {"kind": "random", "external_model": MODEL}
    with pytest.raises(ConfigError) as err:
        resolve(config)
    assert err.value.field == "learners.c.external_model.kind" and "seller group" in str(err.value)


def test_nan_model_loss_stops_the_run(tmp_path):
    from jaxmarket.train.plan import resolve
    from jaxmarket.train.trainer import Trainer
    from jaxmarket.train.tracking import with_tracker

    def nan_model(settings, ctx):
        def make_io(transition, info):
            return info["prices"]["me"], info["traffic"]["me"] * jnp.nan
        return make_mlp_model({**SETTINGS, "hidden_sizes": (2,)}, 1, 1, make_io)

    MODELS.register(ModelDef("nan_targets", nan_model, {}))
    config = scenario({"kind": "nan_targets", "eval_random": 0, "eval_grid": 2})
    config["train"].update(num_iterations=4, chunk_size=2, num_envs=2)
    trainer = Trainer(resolve(config), tmp_path)
    summary = with_tracker("files", tmp_path, config,
                           lambda t: trainer.train(t, trainer.initial_runner(), 0))
    assert summary["stopped"].startswith("non-finite metric model/me/")
    assert summary["iterations"] == 2 and trainer.checkpoints.latest() == 2


def test_running_statistics_merge_batches_and_forget_beyond_the_horizon():
    from jaxmarket.models.runtime import running_update
    batches = [np.random.default_rng(i).normal(i, 1 + i, (2, 50)).astype(np.float32)
               for i in range(3)]
    stats = {"count": np.zeros(2, np.float32), "mean": np.zeros(2, np.float32),
             "var": np.ones(2, np.float32)}
    capped = dict(stats)
    for b in batches:
        stats = running_update(stats, b)
        capped = running_update(capped, b, horizon=1)
    every = np.concatenate(batches, 1)
    np.testing.assert_allclose(stats["mean"], every.mean(1), rtol=1e-5)
    np.testing.assert_allclose(stats["var"], every.var(1), rtol=1e-4)
    # horizon 1: the past weighs as one batch, so the last batch counts for half
    prev = running_update(running_update({"count": np.zeros(2, np.float32), "mean":
                                          np.zeros(2, np.float32), "var": np.ones(2, np.float32)},
                                         batches[0], 1), batches[1], 1)
    np.testing.assert_allclose(capped["mean"], 0.5 * (prev["mean"] + batches[2].mean(1)),
                               rtol=1e-5)


def test_surprise_restarts_beta_and_the_heldout_error_is_against_the_true_demand():
    config = scenario({**MODEL, "eval_every": 1, "poi": {
        "kind": "disagreement", "beta": 0.5, "beta_schedule": "exp", "decay_iterations": 5,
        "restart_on_surprise": 20.0}})
    config["train"].update(num_iterations=40, schedule=[
        {"at": 30, "set": {"market.consumers[0].queries": 3.0}}])   # traffic triples
    runner, m = run(config, 40)
    restarts = np.asarray(m["poi/me/restarts"])
    assert restarts[30] == 1.0 and restarts[:30].sum() == 0
    beta = np.asarray(m["poi/me/beta"])
    # the clock restarts at 30: beta(30) = 0.5 again, having decayed to 0.5 e^-(29/5)
    np.testing.assert_allclose(beta[[0, 29, 30]], [0.5, 0.5 * np.exp(-29 / 5), 0.5], rtol=1e-5)
    # the last evaluation (after the last fit) against the logit formula in the changed
    # market: 3 queries, rivals at 1.6; targets scaled by the configured 1 query, fees
    # also by the highest price 2.5
    p = np.linspace(1.0, 2.5, 5)
    own, rival = np.exp((2.0 - p) / 0.25), np.exp((2.0 - 1.6) / 0.25)
    traffic = 3.0 * own / (own + 2 * rival + 1.0)
    truth = np.stack([traffic, p * traffic / 2.5], -1)
    x = np.stack([(p - 1.75) / 0.75, np.full(5, (1.6 - 1.75) / 0.75)], -1)
    for s in range(2):
        params = jax.tree.map(lambda v, s=s: v[s], runner.components["models"]["me"]["model"].params)
        pred = numpy_forward(params, x).mean(0)
        rmse = np.sqrt(np.mean(np.square(pred - truth)))
        np.testing.assert_allclose(m["per_seed/model/me/heldout_error"][-1, s], rmse, rtol=1e-4)


def test_make_io_scales_prices_and_targets():
    from jaxmarket.learners.base import Transition
    from jaxmarket.models.config import build_model

    plan = resolve(scenario({**MODEL, "rivals": "all"}))
    info = {"prices": {"me": jnp.array([[[1.0]], [[2.5]]]),
                       "rivals": jnp.array([[[1.6], [2.2]], [[1.0], [1.75]]])},
            "traffic": {"me": jnp.array([[[0.5]], [[0.1]]])},
            "fees": {"me": jnp.array([[[0.5]], [[0.25]]])}}
    tr = Transition(obs=None, action=None, reward=jnp.array([[0.2], [0.3]]), next_obs=None,
                    done=None, aux={})
    # prices -> (p - 1.75) / 0.75 on the bounds [1, 2.5]; 1 query; fees / (1 * 2.5)
    x, y = build_model(plan.env, plan.params, "me", plan.models["me"]).make_io(tr, info)
    np.testing.assert_allclose(x[:, 0], [[-1.0, -0.2, 0.6], [1.0, -1.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(y[:, 0], [[0.5, 0.2], [0.1, 0.1]], atol=1e-6)
    reward = {"kind": "reward", "rivals": "mean", "eval_random": 0}
    plan = resolve(scenario(reward))
    x, y = build_model(plan.env, plan.params, "me", plan.models["me"]).make_io(tr, info)
    np.testing.assert_allclose(x[:, 0], [[-1.0, 0.2], [1.0, -0.5]], atol=1e-6)
    np.testing.assert_allclose(y[:, 0], [[0.2 / 2.5], [0.3 / 2.5]], atol=1e-6)  # / (Q max high)


def test_summary_reports_the_model_errors():
    from jaxmarket.train.summary import _models
    header = ["iteration", "reward/me", "model/me/heldout_error", "model/me/loss"]
    data = np.array([[i + 1, 0.0, 5.0 - i, 9.0] for i in range(5)])
    # equal spacing: the AUC is the mean (3); the last 20% is the last point
    assert _models(header, data) == {"me": {"heldout_error": {"final": 1.0, "auc": 3.0,
                                                              "asymptotic": 1.0}}}
