"""The rival model, ``poi target: state``, the POI bonus in the discrete bandits' update
and POI observations (docs/poi.md). Two compiled training programs serve every test of
the module: compiling is most of the cost."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jaxmarket.config.errors import ConfigError
from jaxmarket.models.poi import POI_FIELDS, PoiDef
from jaxmarket.train.loop import make_train
from jaxmarket.train.plan import resolve

# probes: POI "fields" that read one model input or target, so that the mean POI the
# loop logs (poi/<g>/value) says what the model was given
PROBES = {"own_input": lambda model, state, x, y, s: x[:, 0],
          "first_target": lambda model, state, x, y, s: y[:, 0]}
for _name, _fn in PROBES.items():
    if _name not in POI_FIELDS:
        POI_FIELDS.register(PoiDef(_name, _fn))

LOW, HIGH = 1.0, 2.5
MID, HALF = 0.5 * (LOW + HIGH), 0.5 * (HIGH - LOW)
SCHEDULE = [1.2, 2.0, 1.5, 2.4, 1.1, 1.9]   # the rival r's price at steps 0, 1, ...


def u(p):
    """A price scaled to [-1, 1] by the bounds [1, 2.5], as the models' inputs are."""
    return (np.asarray(p, np.float64) - MID) / HALF


def rival_model(probe, target, beta=0.5):
    return {"kind": "rival", "ensemble": 1, "hidden_sizes": [2], "eval_every": 100,
            "eval_grid": 2, "eval_random": 0,
            "poi": {"kind": probe, "beta": beta, "normalize": "none", "target": target}}


# three sellers, no queries (every task reward is 0): a and b play uniformly random arms
# of the grid [1, 1.5, 2, 2.5]; r follows a known schedule. Each has a rival model.
BANDITS = yaml.safe_load(f"""
market:
  num_products: 1
  consumers: [{{name: c, count: 1, budget: 1000.0, queries: 0.0}}]
  sellers:
    - {{name: a, count: 1, low: {LOW}, high: {HIGH}, initial: 1.3}}
    - {{name: r, count: 1, low: {LOW}, high: {HIGH}, initial: 1.6}}
    - {{name: b, count: 1, low: {LOW}, high: {HIGH}, initial: 2.2}}
  distributor: {{kind: logit, temperature: 0.25}}
learners:
  a: {{kind: epsilon_greedy, grid_size: 4, epsilon: 1.0}}
  b: {{kind: epsilon_greedy, grid_size: 4, epsilon: 1.0}}
  r: {{kind: schedule, timestamps: {list(range(len(SCHEDULE)))}, values: {SCHEDULE}}}
train: {{num_iterations: {len(SCHEDULE)}, num_envs: 8, num_seeds: 1, rollout_length: 1}}
""")
BANDITS["learners"]["a"]["external_model"] = rival_model("own_input", "state")
BANDITS["learners"]["b"]["external_model"] = rival_model("own_input", "action")
BANDITS["learners"]["r"]["external_model"] = rival_model("first_target", "action", beta=0.0)


@pytest.fixture(scope="module")
def bandits():
    init, run_chunk = make_train(resolve(BANDITS))
    return jax.jit(lambda key: run_chunk(init(key), len(SCHEDULE)))(jax.random.key(0))


def test_rival_model_targets_are_the_rivals_prices_of_the_rollout(bandits):
    # r's model: targets y = the rivals' (a, b) prices quoted at the step, each scaled;
    # its probe logs mean_markets y[:, 0] = a's scaled price, the price/a metric
    _, m = bandits
    price_a = np.asarray(m["price/a"])[:, 0]
    np.testing.assert_allclose(m["poi/r/value"], u(price_a), atol=1e-6)
    assert np.ptp(price_a) > 0.1   # a's prices vary: the join is not a constant


def test_poi_target_state_uses_the_next_step_inputs_and_action_the_inputs_before(bandits):
    # a rival model's inputs of a step are the prices in force before it; the state
    # reached has the prices just quoted. target: state (a) -> the own price quoted at
    # the iteration; target: action (b) -> the own price of the iteration before (the
    # initial 2.2 at the first)
    _, m = bandits
    price_a, price_b = np.asarray(m["price/a"])[:, 0], np.asarray(m["price/b"])[:, 0]
    np.testing.assert_allclose(m["poi/a/value"], u(price_a), atol=1e-6)
    before = np.concatenate([[2.2], price_b[:-1]])
    np.testing.assert_allclose(m["poi/b/value"], u(before), atol=1e-6)
    assert np.max(np.abs(u(price_b) - u(before))) > 0.1   # they differ where prices move


def test_bonus_reaches_the_discrete_bandit_update(bandits):
    # every task reward is 0; a's bonus is beta * u(price of the arm pulled) (state
    # target, no normalisation), so the update formula q_g = s_g / n_g gives every
    # pulled arm the value beta * u(grid_g); with beta = 0 every s_g would stay 0 (r's
    # model has beta 0: its schedule learner's rewards are untouched, as are b's arms'
    # sums of beta * u(previous price))
    runner, m = bandits
    st = runner.learners["a"]
    counts, sums = np.asarray(st.counts)[0, 0], np.asarray(st.sums)[0, 0]     # [G]
    grid = np.linspace(LOW, HIGH, 4)
    assert counts.sum() == 8 * len(SCHEDULE) and np.all(counts > 0)
    np.testing.assert_allclose(sums / counts, 0.5 * u(grid), atol=1e-6)
    np.testing.assert_array_equal(m["reward/a"], 0.0)   # the logged reward stays the task's
    np.testing.assert_array_equal(m["poi/a/beta"], 0.5)


# a PPO seller with a rival model (of a constant rival at 1.6) whose disagreement is
# fed back as k = 4 observations through a learned embedding of size 3
PPO_OBS = yaml.safe_load(f"""
market:
  num_products: 1
  consumers: [{{name: c, count: 1, budget: 1000.0, queries: 1.0}}]
  sellers:
    - {{name: me, count: 1, low: {LOW}, high: {HIGH}, initial: 1.75, quality: 2.0}}
    - {{name: c1, count: 1, low: {LOW}, high: {HIGH}, initial: 1.6, quality: 2.0}}
  distributor: {{kind: logit, temperature: 0.25, outside_option: true}}
learners:
  me:
    kind: ppo
    hidden_sizes: [4]
    num_minibatches: 1
    update_epochs: 1
    learning_rate: 0.01
    external_model:
      kind: rival
      ensemble: 2
      hidden_sizes: [4]
      learning_rate: 0.03
      epochs: 4
      eval_every: 10
      eval_grid: 3
      eval_random: 0
      poi: {{kind: disagreement, beta: 0.1}}
      poi_obs: {{k: 4, sampler: grid, emb_size: 3}}
  c1: {{kind: constant, value: 1.6}}
train: {{num_iterations: 80, num_envs: 4, num_seeds: 2, rollout_length: 1}}
""")


@pytest.fixture(scope="module")
def ppo_obs():
    plan = resolve(PPO_OBS)
    env, params = plan.env, plan.params
    init, run_chunk = make_train(plan)
    one = jax.jit(lambda r: run_chunk(r, 1))
    runner = jax.jit(init)(jax.random.key(0))
    states, metrics = [runner], []
    for _ in range(80):
        runner, m = one(runner)
        states.append(runner)
        metrics.append(m)
    metrics = {k: np.concatenate([np.asarray(m[k]) for m in metrics]) for k in metrics[0]}
    return env, params, plan, states, metrics


def members_forward(params, x):
    """The members' predictions ``[M, B, O]`` of a one-hidden-layer tanh MLP, float64."""
    p = jax.tree.map(lambda v: np.asarray(v, np.float64), params["params"])
    h = np.tanh(np.einsum("bi,mih->mbh", x, p["Dense_0"]["kernel"])
                + p["Dense_0"]["bias"][:, None])
    return np.einsum("mbh,mho->mbo", h, p["Dense_1"]["kernel"]) + p["Dense_1"]["bias"][:, None]


def test_rival_model_learns_a_constant_rival(ppo_obs):
    # target: c1's next price, always 1.6 -> u = -0.2, whatever the inputs; learned
    # where the seller priced (its own prices of the last 10 iterations; elsewhere is
    # what POI exploration is for)
    *_, states, m = ppo_obs
    model = states[-1].components["models"]["me"]["model"]
    own = u(m["price/me"][-10:, 0])
    x = np.stack([own, np.full(own.shape, u(1.6))], -1)
    for s in range(2):
        pred = members_forward(jax.tree.map(lambda v, s=s: v[s], model.params), x)
        np.testing.assert_allclose(pred, u(1.6), atol=0.01)
    loss = m["model/me/loss"]
    assert loss[-1] < 1e-4 and loss[0] > 1e-3
    # the ground truth (rivals held at their prices: c1 at 1.6) over the whole own-price
    # grid [1, 1.75, 2.5] agrees too
    heldout = m["model/me/heldout_error"]
    assert heldout[-1] < 0.02 and heldout[0] > 0.2


def test_poi_observations_are_the_poi_at_the_grid_points(ppo_obs):
    # iteration i's observations: the disagreement of the model as it was before
    # iteration i at x_j = [linspace(-1, 1, 4)_j, u(c1's price in force = 1.6)]; one
    # agent per market and a deterministic rival, so every market of a seed sees the
    # same 4 values and poi/me/obs (their mean over seeds) is the mean over seeds
    *_, states, m = ppo_obs
    x = np.stack([np.linspace(-1, 1, 4), np.full(4, u(1.6))], -1)
    for i in (0, 40, 79):
        model = states[i].components["models"]["me"]["model"]
        want = np.mean([members_forward(jax.tree.map(lambda v, s=s: v[s], model.params),
                                        x).std(0).mean(-1) for s in range(2)], 0)
        np.testing.assert_allclose(m["poi/me/obs"][i], want, rtol=1e-4, atol=1e-7)
    assert np.ptp(m["poi/me/obs"][0]) > 0   # not a constant feature


def test_the_poi_embedding_is_part_of_the_policy_and_trains(ppo_obs):
    states = ppo_obs[3]
    first, last = (s.learners["me"].params["params"] for s in (states[0], states[-1]))
    assert first["poi_embed"]["kernel"].shape == (2, 4, 3)   # [seeds, k, emb_size]
    assert first["actor_0"]["kernel"].shape == (2, 3, 4)     # the torso sees the embedding
    moved = np.abs(np.asarray(last["poi_embed"]["kernel"]) - np.asarray(first["poi_embed"]["kernel"]))
    assert moved.max() > 1e-3


def test_sampler_points(ppo_obs):
    # grid: own price on linspace(-1, 1, k), the rival at its price in force in each
    # market; uniform: the seed's own-price draws; replay: k distinct rows of the
    # iteration's (x, y), and the POI there for every agent of the seed
    import dataclasses

    from jaxmarket.models.runtime import GroupModel

    env, params, plan, states, _ = ppo_obs
    cfg = plan.models["me"]
    prices = {"me": jnp.array([[[1.0]], [[2.5]]]), "c1": jnp.array([[[1.6]], [[2.2]]])}
    obs = jnp.zeros((2, 1, 0))

    def sampler(name):
        c = dataclasses.replace(cfg, poi_obs=tuple(sorted({**cfg.poi_obs_settings,
                                                           "sampler": name}.items())))
        return GroupModel(env, params, "me", c, num_seeds=1, envs_per_seed=2)

    pts = np.asarray(sampler("grid").obs_points(None, prices, obs))           # [E, A, k, I]
    np.testing.assert_allclose(pts[:, 0, :, 0], [np.linspace(-1, 1, 4)] * 2, atol=1e-6)
    np.testing.assert_allclose(pts[:, 0, :, 1], [[u(1.6)] * 4, [u(2.2)] * 4], atol=1e-6)
    draws = jnp.array([[[0.3], [-0.7], [0.9], [0.1]]])                          # [S, k, P]
    pts = np.asarray(sampler("uniform").obs_points({"obs": {"u": draws}}, prices, obs))
    np.testing.assert_allclose(pts[:, 0, :, 0], [[0.3, -0.7, 0.9, 0.1]] * 2, atol=1e-6)
    np.testing.assert_allclose(pts[:, 0, :, 1], [[u(1.6)] * 4, [u(2.2)] * 4], atol=1e-6)
    rep = sampler("replay")
    model = jax.tree.map(lambda v: v[:1], states[-1].components["models"]["me"]["model"])   # seed 0
    x = jnp.arange(20.0).reshape(1, 10, 2) / 20
    y = jnp.arange(10.0).reshape(1, 10, 1)
    state = rep.refresh_obs({"model": model}, x, y, jax.random.key(1))
    xs, ys = np.asarray(state["obs"]["x"])[0], np.asarray(state["obs"]["y"])[0]
    rows = np.round(xs[:, 0] * 10).astype(int)        # x row i is [2i, 2i + 1] / 20
    assert len(set(rows)) == 4                        # without replacement
    np.testing.assert_allclose(xs, np.asarray(x)[0, rows])
    np.testing.assert_array_equal(ys[:, 0], rows)
    feats = np.asarray(rep.obs_features(state, prices, obs))                 # [E, A, k]
    want = members_forward(jax.tree.map(lambda v: v[0], model.params), xs).std(0).mean(-1)
    np.testing.assert_allclose(feats, np.broadcast_to(want, (2, 1, 4)), rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------ bad input


def with_model(config, group, **changes):
    config = copy.deepcopy(config)
    block = config["learners"][group]["external_model"]
    for key, value in changes.items():
        if value is None:
            block.pop(key, None)
        else:
            block[key] = value
    return config


@pytest.mark.parametrize("config, field, words", [
    (with_model(PPO_OBS, "me", poi_obs={"k": 4, "sampler": "sobol"}),
     "learners.me.external_model.poi_obs.sampler", "one of"),
    (with_model(PPO_OBS, "me", poi_obs={"k": 0}),
     "learners.me.external_model.poi_obs.k", ">= 1"),
    (with_model(PPO_OBS, "me", poi_obs={"k": 2, "emb_size": -1}),
     "learners.me.external_model.poi_obs.emb_size", ">= 0"),
    (with_model(PPO_OBS, "me", poi=None),
     "learners.me.external_model.poi_obs", "a poi block"),
    (with_model(PPO_OBS, "me", poi={"kind": "error"}),
     "learners.me.external_model.poi_obs.sampler", "replay"),
    (with_model(PPO_OBS, "me", poi={"kind": "gradient", "target": "state"}, poi_obs=None),
     "learners.me.external_model.poi.target", "action"),
    (with_model(PPO_OBS, "me", poi={"kind": "zero", "target": "next"}, poi_obs=None),
     "learners.me.external_model.poi.target", "one of"),
    (with_model(BANDITS, "a", poi_obs={"k": 2}),
     "learners.a.external_model.poi_obs", "of kind ppo"),
])
def test_bad_poi_config_is_one_config_error(config, field, words):
    with pytest.raises(ConfigError) as err:
        resolve(config)
    assert err.value.field == field
    assert words in str(err.value) and "\n" not in str(err.value)


def test_metrics_csv_names_the_poi_observation_columns_by_sample_not_product():
    from jaxmarket.train.metrics import flatten_metrics
    rows = flatten_metrics({"poi/s/obs": np.array([[1.0, 2.0, 3.0]]),
                             "price/s": np.array([[4.0, 5.0]]), "loss": np.array([7.0])}, 10)
    assert rows == [{"iteration": 11, "poi/s/obs/k0": 1.0, "poi/s/obs/k1": 2.0,
                     "poi/s/obs/k2": 3.0, "price/s/p0": 4.0, "price/s/p1": 5.0, "loss": 7.0}]
