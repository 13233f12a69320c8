"""The joins of the training loop (jaxmarket/train/loop.py): what the learners receive
(transitions with auto-resets, slot layout, time-major order, aux) and what the metric
columns of ``metrics.csv`` report, after real training steps.

Expected values are computed by hand here from closed forms (the market, the prices
and the budgets of these configs are deterministic), never by stepping the env.

A "spy" learner kind is registered: its action is a fixed function of the slot index
and of the time feature of its observation, and its ``update`` records every batch it
receives into its state, which is read back from the run's last checkpoint.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.fields import Field
from jaxmarket.learners.base import LEARNERS, Learner, LearnerDef, Transition
from jaxmarket.learners.fixed import resolve_hyper
from jaxmarket.learners.ppo import HYPER_FIELDS as PPO_FIELDS
from jaxmarket.learners.ppo import PPO
from jaxmarket.train.plan import resolve
from jaxmarket.train.trainer import Trainer
from jaxmarket.train.tracking import Tracker, read_metrics

# ----------------------------------------------------------------------------- spies

SPY_FIELDS = {
    "base": Field("float", 1.0),
    "slot_step": Field("float", 0.1),
    "product_step": Field("float", 0.0),
    "time_weight": Field("float", 0.0, doc="times obs[:, 0] (the `time` component)"),
    "steps": Field("int", 1, low=1, doc="rollout_length: T of the recorded batches"),
    "updates": Field("int", 1, low=1, doc="how many batches to record"),
}


def make_spy(hyper, spec) -> Learner:
    """``action[i, p] = base + slot_step * i + product_step * p + time_weight * obs[i, 0]``;
    ``update`` stores the batch at ``log[n]`` (``n`` = updates so far)."""
    h = resolve_hyper(SPY_FIELDS, hyper, "spy")
    A, P, D = spec.num_agents, spec.num_products, spec.obs_dim
    T, L = h["steps"], h["updates"]

    def act(state, obs, key):
        del state, key
        slot = jnp.arange(A, dtype=jnp.float32)[:, None]
        prod = jnp.arange(P, dtype=jnp.float32)[None, :]
        action = h["base"] + h["slot_step"] * slot + h["product_step"] * prod
        if D:
            action = action + h["time_weight"] * obs[:, :1]
        return action, {"slot": jnp.arange(A, dtype=jnp.int32), "policy": spec.index(),
                        "echo": action}

    def init(key, spec_=None):
        del key, spec_
        z = lambda *shape, dtype=jnp.float32: jnp.zeros((L, T, A) + shape, dtype)  # noqa: E731
        log = Transition(obs=z(D), action=z(P), reward=z(), next_obs=z(D), done=z(dtype=bool),
                         aux={"slot": z(dtype=jnp.int32), "policy": z(dtype=jnp.int32),
                              "echo": z(P)})
        return {"n": jnp.zeros((), jnp.int32), "log": log}

    def update(state, batch):
        n = state["n"]
        log = jax.tree.map(lambda buf, x: buf.at[n].set(x.astype(buf.dtype)), state["log"], batch)
        return {"n": n + 1, "log": log}, {"updates": (n + 1).astype(jnp.float32)}

    return Learner(init, act, update)


PPO_SPY_FIELDS = {**PPO_FIELDS, "steps": Field("int", 1, low=1)}


def make_ppo_spy(hyper, spec) -> Learner:
    """The real ``ppo`` learner; its state also keeps the last batch it was given and
    its own state before that update."""
    h = resolve_hyper(PPO_SPY_FIELDS, hyper, "ppo_spy")
    T = h.pop("steps")
    ppo = PPO.make(h, spec)
    A, D = spec.num_agents, spec.obs_dim

    def init(key, spec_=None):
        s = ppo.init(key, spec)
        action, aux = jax.eval_shape(ppo.act, s, jnp.zeros((A, D)), jax.random.key(0))
        z = lambda x: jnp.zeros((T,) + x.shape, x.dtype)  # noqa: E731
        batch = Transition(obs=jnp.zeros((T, A, D)), action=z(action),
                           reward=jnp.zeros((T, A)), next_obs=jnp.zeros((T, A, D)),
                           done=jnp.zeros((T, A), bool), aux=jax.tree.map(z, aux))
        return {"ppo": s, "prev": s, "batch": batch}

    def act(state, obs, key):
        return ppo.act(state["ppo"], obs, key)

    def update(state, batch):
        new, metrics = ppo.update(state["ppo"], batch)
        return {"ppo": new, "prev": state["ppo"], "batch": batch}, metrics

    return Learner(init, act, update), ppo


LEARNERS.register(LearnerDef("test_spy", make_spy, SPY_FIELDS, doc="test spy (tests/test_loop_joins.py)"))
LEARNERS.register(LearnerDef("test_ppo_spy", lambda h, s: make_ppo_spy(h, s)[0], PPO_SPY_FIELDS,
                    doc="ppo recording its batches (tests/test_loop_joins.py)"))


def train(config: dict, run_dir):
    """Train through the real host loop (``Trainer``): metrics.csv columns and the
    final runner (restored from the last checkpoint)."""
    trainer = Trainer(resolve(copy.deepcopy(config)), run_dir)
    trainer.train(Tracker(), trainer.initial_runner(), 0)
    runner, step = trainer.restore()
    assert step == config["train"]["num_iterations"]
    header, data = read_metrics(run_dir / "metrics.csv")
    columns = {name: data[:, j] for j, name in enumerate(header)}
    return trainer, runner, columns


def np_tree(x):
    return jax.tree.map(np.asarray, x)


# ---------------------------------------------------- sellers: truncation and layout
# 2 seeds x 2 markets x 2 sellers = 8 slots, episode_length 3, rollout_length 4: over
# 3 iterations (12 steps) the truncations fall at t = 2 | 1 | 0 and 3 (the last step
# of a rollout, whose next obs is the first obs of the next iteration's rollout).

S, E, N, L, T, ITERS = 2, 2, 2, 3, 4, 3
INITIAL = 0.5
SELLER_OBS = [{"kind": "time"}, {"kind": "history", "k": 1}]   # [t / L, p_0, p_1]


def sellers_config(learner: dict) -> dict:
    return {
        "market": {
            "num_products": 1, "episode_length": L,
            "consumers": [{"name": "consumer", "count": 1, "budget": 10.0, "queries": 1.0}],
            "sellers": [{"name": "sellers", "count": N, "action": "price", "low": 0.0,
                         "high": 3.0, "initial": INITIAL, "reward": [{"kind": "profit"}],
                         "observation": SELLER_OBS}],
            "distributor": {"kind": "cheapest"},
        },
        "learners": {"sellers": learner},
        "train": {"num_iterations": ITERS, "rollout_length": T, "num_envs": E, "num_seeds": S,
                  "chunk_size": ITERS, "checkpoint_every": 1},
        "seed": 0,
    }


SPY = {"kind": "test_spy", "base": 1.0, "slot_step": 0.1, "time_weight": 0.05,
       "steps": T, "updates": ITERS}


def hand_sellers():
    """Closed form of the spy-driven seller markets, ``[ITERS, T, slots, ...]``.

    Step ``k = it * T + t`` is step ``tau = k % L`` of its episode; slot ``i`` is agent
    ``i % N`` of market ``i // N`` (= (seed * E + market) * N + agent); its price is
    ``1 + 0.1 i + 0.05 tau / L``. The cheapest seller of a market (its agent 0) serves
    the one query and earns its price."""
    A = S * E * N
    slot = np.arange(A)
    market = slot // N
    out = {k: [] for k in ("obs", "next_obs", "action", "reward", "done", "traffic")}
    for k in range(ITERS * T):
        tau = k % L
        price = lambda tau_: 1.0 + 0.1 * slot + 0.05 * tau_ / L  # noqa: E731
        p = price(tau)
        if tau == 0:
            hist = np.full((A, N), INITIAL)
        else:
            hist = price(tau - 1).reshape(-1, N)[market]       # the market's last prices
        out["obs"].append(np.column_stack([np.full(A, tau / L), hist]))
        out["next_obs"].append(np.column_stack([np.full(A, (tau + 1) / L),
                                                p.reshape(-1, N)[market]]))
        out["action"].append(p[:, None])
        out["reward"].append(np.where(slot % N == 0, p, 0.0))
        out["traffic"].append(np.where(slot % N == 0, 1.0, 0.0))
        out["done"].append(np.full(A, tau + 1 == L))
    return {k: np.asarray(v).reshape((ITERS, T) + np.asarray(v).shape[1:])
            for k, v in out.items()}


@pytest.fixture(scope="module")
def seller_run(tmp_path_factory):
    _, runner, columns = train(sellers_config(SPY), tmp_path_factory.mktemp("sellers"))
    return np_tree(runner.learners["sellers"]["log"]), columns


def test_done_is_true_exactly_at_truncation_steps(seller_run):
    # catches: done taken from the step before/after (off by one), or `time > L`
    log, _ = seller_run
    hand = hand_sellers()
    assert log.done.shape == (ITERS, T, S * E * N)
    np.testing.assert_array_equal(log.done, hand["done"])
    assert log.done[:, :, 0].tolist() == [[False, False, True, False], [False, True, False, False],
                                          [True, False, False, True]]


def test_next_obs_is_the_observation_before_the_auto_reset(seller_run):
    # catches: next_obs taken from the post-reset obs (time 0, initial prices) on done
    log, _ = seller_run
    hand = hand_sellers()
    np.testing.assert_allclose(log.next_obs, hand["next_obs"], rtol=1e-6)
    assert np.all(log.next_obs[log.done][:, 0] == 1.0)          # time = episode_length


def test_obs_follows_next_obs_except_across_a_reset(seller_run):
    # catches: the carried obs not advanced (or advanced twice) between steps/iterations
    log, _ = seller_run
    obs = log.obs.reshape((ITERS * T,) + log.obs.shape[2:])      # one long trajectory
    nxt = log.next_obs.reshape(obs.shape)
    done = log.done.reshape(obs.shape[:2])
    cont = ~done[:-1]
    np.testing.assert_array_equal(obs[1:][cont], nxt[:-1][cont])
    reset = obs[1:][done[:-1]]                                   # after a truncation
    np.testing.assert_array_equal(reset, np.tile([0.0, INITIAL, INITIAL], (len(reset), 1)))
    np.testing.assert_allclose(log.obs, hand_sellers()["obs"], rtol=1e-6)


def test_batches_are_time_major_seed_market_agent_slots(seller_run):
    # catches: [slots, T] instead of [T, slots], or slots ordered agent-major / market-major
    # across seeds (another market's prices in a slot's history)
    log, _ = seller_run
    hand = hand_sellers()
    A = S * E * N
    np.testing.assert_allclose(log.action, hand["action"], rtol=1e-6)
    np.testing.assert_allclose(log.reward, hand["reward"], rtol=1e-6)
    np.testing.assert_array_equal(log.aux["slot"], np.broadcast_to(np.arange(A), (ITERS, T, A)))
    np.testing.assert_array_equal(log.aux["echo"], log.action)
    # seed s owns policies s*N .. s*N + N - 1 and the slots of its markets
    slot = np.arange(A)
    np.testing.assert_array_equal(log.aux["policy"][0, 0], (slot // (E * N)) * N + slot % N)


def test_seller_metric_columns_are_the_means_of_the_steps(seller_run):
    # catches: metrics from the last step only, or not averaged over seeds and markets
    log, columns = seller_run
    hand = hand_sellers()
    np.testing.assert_array_equal(columns["iteration"], np.arange(1, ITERS + 1))
    np.testing.assert_allclose(columns["reward/sellers"], hand["reward"].mean((1, 2)), rtol=1e-6)
    np.testing.assert_allclose(columns["price/sellers/p0"], hand["action"].mean((1, 2, 3)),
                               rtol=1e-6)
    np.testing.assert_allclose(columns["traffic/sellers/p0"], hand["traffic"].mean((1, 2)))
    np.testing.assert_allclose(columns["reward/sellers"], log.reward.mean((1, 2)), rtol=1e-6)
    np.testing.assert_array_equal(columns["learner/sellers/updates"], np.arange(1, ITERS + 1))


# ----------------------------------------------------------------------- through PPO

PPO_HYPER = {"hidden_sizes": [8], "update_epochs": 1, "num_minibatches": 1,
             "gamma": 0.9, "gae_lambda": 0.8, "log_std_init": -1.0, "learning_rate": 0.01}


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    config = sellers_config({"kind": "test_ppo_spy", **PPO_HYPER, "steps": T})
    trainer, runner, columns = train(config, tmp_path_factory.mktemp("ppo"))
    _, ppo = make_ppo_spy({**PPO_HYPER, "steps": T}, trainer.specs["sellers"])
    return ppo, runner.learners["sellers"], columns


def test_ppo_gets_done_at_truncation_and_aux_of_its_own_step(ppo_run):
    # catches: aux (values) of another step or of the post-update parameters in the batch
    ppo, state, _ = ppo_run
    batch = np_tree(state["batch"])
    np.testing.assert_array_equal(batch.done, hand_sellers()["done"][-1])
    values = jax.jit(jax.vmap(lambda o: ppo.act(state["prev"], o, jax.random.key(0))[1]["value"]))
    np.testing.assert_allclose(batch.aux["value"], values(batch.obs), rtol=1e-5, atol=1e-6)
    # the cheapest seller of each market earns its (clipped) price, the other nothing
    price = batch.action[..., 0].reshape(T, S * E, N)
    cheapest = price == price.min(-1, keepdims=True)
    np.testing.assert_allclose(batch.reward.reshape(T, S * E, N), np.where(cheapest, price, 0.0),
                               rtol=1e-6)


def test_ppo_gae_does_not_bootstrap_across_done(ppo_run):
    # catches: GAE bootstrapping V(next_obs) or recursing across a truncation
    # With 1 epoch x 1 minibatch the value-loss metric is evaluated at the pre-update
    # parameters, where V = V_old, so it equals 0.5 * mean(A_t^2) with A from GAE.
    ppo, state, columns = ppo_run
    batch = np_tree(state["batch"])
    values = jax.jit(jax.vmap(lambda o: ppo.act(state["prev"], o, jax.random.key(0))[1]["value"]))
    v, v_next = batch.aux["value"], np.asarray(values(batch.next_obs))
    g, lam = PPO_HYPER["gamma"], PPO_HYPER["gae_lambda"]

    def value_loss(done):
        adv, following = np.zeros_like(v), np.zeros_like(v[0])
        for t in reversed(range(T)):
            keep = 1.0 - done[t]
            delta = batch.reward[t] + g * keep * v_next[t] - v[t]
            following = delta + g * lam * keep * following
            adv[t] = following
        return 0.5 * np.mean(adv ** 2)

    done = hand_sellers()["done"][-1].astype(np.float64)       # truncations at t = 0 and 3
    expected = value_loss(done)
    got = columns["learner/sellers/value_loss"][-1]
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert abs(value_loss(np.zeros_like(done)) - expected) > 1e-2 * expected  # test has teeth


# ------------------------------------------------------------- a consumer-agent group
# 2 buyer agents (action: a budget per product) x 1 market x 2 seeds = 4 slots, after a
# non-agent consumer group (so the buyers' consumer offset is 1); two sellers both at
# prices (1.0, 1.3); cheapest-first: a buyer is served on product p iff b_p >= m_p,
# otherwise its queries go unserved.

CL, CT, CITERS, CS = 4, 3, 3, 2
Q, M = 3.0, np.array([1.0, 1.3])
BUYER_SPY = {"kind": "test_spy", "base": 0.65, "slot_step": 0.2, "product_step": 0.1,
             "time_weight": 0.28, "steps": CT, "updates": CITERS}


def consumer_config() -> dict:
    return {
        "market": {
            "num_products": 2, "episode_length": CL,
            "consumers": [
                {"name": "crowd", "count": 1, "budget": 5.0, "queries": 1.0},
                {"name": "buyers", "count": 2, "agent": True, "budget": 1.0,
                 "budget_low": 0.1, "budget_high": 2.0, "queries": Q,
                 "reward": [{"kind": "regret_ratio"}], "observation": [{"kind": "time"}]},
            ],
            "sellers": [{"name": "sellers", "count": 2, "action": "price", "low": 0.0,
                         "high": 3.0, "reward": [{"kind": "revenue"}]}],
            "distributor": {"kind": "cheapest", "no_eligible": "unserved"},
        },
        "learners": {"buyers": BUYER_SPY,
                     "sellers": {"kind": "constant", "value": M.tolist()}},
        "train": {"num_iterations": CITERS, "rollout_length": CT, "num_envs": 1,
                  "num_seeds": CS, "chunk_size": CITERS, "checkpoint_every": 1},
        "seed": 0,
    }


def hand_buyers():
    """Budgets ``b[i, p] = 0.65 + 0.2 i + 0.1 p + 0.28 tau / L`` (4 slots), served iff
    ``b >= m``; regret ratio = spend / (budget . sent) = sum_p [served] m_p / sum_p b_p."""
    A = CS * 2
    slot = np.arange(A)[:, None]
    out = {k: [] for k in ("budget", "served", "reward", "obs", "next_obs", "done")}
    for k in range(CITERS * CT):
        tau = k % CL
        b = 0.65 + 0.2 * slot + 0.1 * np.arange(2)[None] + 0.28 * tau / CL
        served = b >= M[None]
        assert np.all(np.abs(b - M[None]) > 5e-3)                 # no float ties
        out["budget"].append(b)
        out["served"].append(served)
        out["reward"].append((served * M[None]).sum(1) / b.sum(1))
        out["obs"].append(np.full((A, 1), tau / CL))
        out["next_obs"].append(np.full((A, 1), (tau + 1) / CL))
        out["done"].append(np.full(A, tau + 1 == CL))
    return {k: np.asarray(v).reshape((CITERS, CT) + np.asarray(v).shape[1:])
            for k, v in out.items()}


@pytest.fixture(scope="module")
def consumer_run(tmp_path_factory):
    _, runner, columns = train(consumer_config(), tmp_path_factory.mktemp("buyers"))
    return np_tree(runner.learners["buyers"]["log"]), columns


def test_consumer_agent_transitions(consumer_run):
    # catches: a consumer group's actions/rewards/obs taken at another offset or step
    log, _ = consumer_run
    hand = hand_buyers()
    np.testing.assert_allclose(log.action, hand["budget"], rtol=1e-6)
    np.testing.assert_allclose(log.obs, hand["obs"], rtol=1e-6)
    np.testing.assert_allclose(log.next_obs, hand["next_obs"], rtol=1e-6)
    np.testing.assert_array_equal(log.done, hand["done"])
    np.testing.assert_allclose(log.reward, hand["reward"], rtol=1e-5)
    assert 0 < hand["served"].mean() < 1                       # served and unserved both occur


def test_consumer_price_column_is_its_budget(consumer_run):
    # catches: price/<consumer> reporting seller prices or the reset budget
    _, columns = consumer_run
    hand = hand_buyers()
    for j in range(2):
        np.testing.assert_allclose(columns[f"price/buyers/p{j}"],
                                   hand["budget"][..., j].mean((1, 2)), rtol=1e-6)
        np.testing.assert_allclose(columns[f"price/sellers/p{j}"], M[j], rtol=1e-6)


def test_consumer_traffic_column_is_queries_served(consumer_run):
    # catches: consumer traffic = queries sent (ignoring unserved), or products swapped
    _, columns = consumer_run
    hand = hand_buyers()
    for j in range(2):
        served = Q * hand["served"][..., j]
        np.testing.assert_allclose(columns[f"traffic/buyers/p{j}"], served.mean((1, 2)),
                                   rtol=1e-6)
        # in each market both sellers split the crowd's query and the buyers' served ones
        per_market = 1.0 + served.reshape(CITERS, CT, CS, 2).sum(3)
        np.testing.assert_allclose(columns[f"traffic/sellers/p{j}"],
                                   per_market.mean((1, 2)) / 2, rtol=1e-6)
    assert not np.allclose(columns["traffic/buyers/p0"], Q)


def test_consumer_reward_column_is_mean_regret_ratio(consumer_run):
    # catches: reward/<consumer> from another group or not averaged over slots and steps
    log, columns = consumer_run
    hand = hand_buyers()
    np.testing.assert_allclose(columns["reward/buyers"], hand["reward"].mean((1, 2)), rtol=1e-5)
    np.testing.assert_allclose(columns["reward/buyers"], log.reward.mean((1, 2)), rtol=1e-6)
