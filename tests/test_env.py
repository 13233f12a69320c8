"""The multi-agent environment: step semantics, batching, determinism, bounds,
conservation, truncation/auto-reset, the actions in force (current_actions) and the
single-agent gymnax view."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONFIGS, duopoly_config

import jaxmarket
from jaxmarket.adapters.single_agent import SingleAgentEnv
from jaxmarket.market.state import ACTION_FIELDS, current_actions


def random_actions(env, params, key):
    keys = jax.random.split(key, len(env.agent_groups))
    return {g: env.action_space(g, params).sample(k) for g, k in zip(env.agent_groups, keys)}


def logit_profit(prices, quality, cost, a0, mu):
    """Closed-form multinomial-logit profits (docs/ground_truths.md)."""
    e = np.exp((quality - prices) / mu)
    return (prices - cost) * e / (e.sum() + np.exp(a0 / mu))


def test_duopoly_rewards_match_closed_form_logit_profit():
    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml")
    _, state = env.reset(jax.random.key(0), params)
    prices = np.array([[1.6], [1.45]], np.float32)
    _, state, rewards, term, trunc, info = env.step(jax.random.key(1), state,
                                                    {"sellers": prices}, params)
    expected = logit_profit(prices[:, 0].astype(np.float64), 2.0, 1.0, 0.0, 0.25)
    np.testing.assert_allclose(rewards["sellers"], expected, rtol=1e-5)
    assert not bool(term) and not bool(trunc)
    assert set(info) >= {"traffic", "fees", "unserved"}
    assert info["traffic"]["sellers"].shape == (2, 1)
    assert info["unserved"]["consumer"].shape == (1, 1)


def test_conservation_in_info_for_multi_group_market():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    _, state = env.reset(jax.random.key(0), params)
    for t in range(3):
        acts = random_actions(env, params, jax.random.key(10 + t))
        _, state, _, _, _, info = env.step(jax.random.key(t), state, acts, params)
        served = sum(x.sum(0) for x in info["traffic"].values())
        unserved = sum(x.sum(0) for x in info["unserved"].values())
        sent = sum(x.sum(0) for x in info["queries"].values())
        np.testing.assert_allclose(served + unserved, sent, rtol=1e-5)
        assert float(sum(x.sum() for x in info["traffic"].values())) > 0


def test_vmapped_step_equals_step_one_market_at_a_time():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    B = 4
    keys = jax.random.split(jax.random.key(0), B)
    obs, states = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    actions = jax.vmap(lambda k: random_actions(env, params, k))(keys)
    batched = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))(keys, states, actions, params)
    for b in range(B):
        pick = lambda x: x[b]  # noqa: E731
        single = env.step(keys[b], jax.tree.map(pick, states), jax.tree.map(pick, actions), params)
        for got, want in zip(jax.tree.leaves(jax.tree.map(pick, batched)), jax.tree.leaves(single)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_same_key_same_result_different_key_differs_with_noise():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    _, state = env.reset(jax.random.key(0), params)
    acts = random_actions(env, params, jax.random.key(1))
    a = env.step(jax.random.key(7), state, acts, params)
    b = env.step(jax.random.key(7), state, acts, params)
    c = env.step(jax.random.key(8), state, acts, params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    # the enterprises' demand is noisy: another key gives other queries
    assert not np.allclose(a[5]["queries"]["enterprises"], c[5]["queries"]["enterprises"])


def test_actions_are_clipped_to_bounds():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    _, state = env.reset(jax.random.key(0), params)
    acts = {g: jnp.full(env.action_space(g, params).shape, 1e6) for g in env.agent_groups}
    acts["posted"] = acts["posted"].at[0].set(-5.0)
    _, state, *_ = env.step(jax.random.key(0), state, acts, params)
    np.testing.assert_allclose(state.prices["posted"][0], 0.0)
    np.testing.assert_allclose(state.prices["posted"][1:], 3.0)
    np.testing.assert_allclose(state.multipliers["multiplied"], 2.0)
    np.testing.assert_allclose(state.budgets["buyers"], 2.0)


def test_truncation_and_auto_reset():
    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml", ["market.episode_length=3"])
    _, state = env.reset(jax.random.key(0), params)
    acts = {"sellers": jnp.array([[1.2], [2.2]])}
    flags = []
    for t in range(4):
        obs, state, _, term, trunc, _ = env.step(jax.random.key(t), state, acts, params)
        flags.append(bool(trunc))
        assert not bool(term)
    assert flags == [False, False, True, False]
    assert int(state.time) == 1  # reset after step 3, then one more step


def test_reset_state_restored_on_truncation():
    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml", ["market.episode_length=1"])
    _, state0 = env.reset(jax.random.key(0), params)
    _, state1, *_ = env.step(jax.random.key(0), state0, {"sellers": jnp.array([[1.2], [2.2]])},
                             params)
    np.testing.assert_allclose(state1.prices["sellers"], params.sellers["sellers"].initial)
    assert int(state1.time) == 0


def test_multiplier_sellers_quote_multiplier_times_base_price():
    cfg = duopoly_config()
    cfg["market"]["consumers"][0]["base_price"] = 0.5
    cfg["market"]["sellers"][0].update(action="multiplier", low=0.0, high=10.0)
    env, params = jaxmarket.make(cfg)
    _, state = env.reset(jax.random.key(0), params)
    mults = np.array([[3.2], [2.9]], np.float32)
    _, _, rewards, _, _, info = env.step(jax.random.key(0), state, {"sellers": mults}, params)
    np.testing.assert_allclose(info["prices"]["sellers"], 0.5 * mults, rtol=1e-6)
    expected = logit_profit(0.5 * mults[:, 0].astype(np.float64), 2.0, 1.0, 0.0, 0.25)
    np.testing.assert_allclose(rewards["sellers"], expected, rtol=1e-5)


def test_budget_monopoly_market_pays_price_up_to_budget_only():
    env, params = jaxmarket.make(CONFIGS / "budget_monopoly.yaml")
    _, state = env.reset(jax.random.key(0), params)
    budget = float(params.consumers["consumer"].budget[0, 0])
    below, above = 0.8 * budget, 1.2 * budget
    _, _, r, _, _, info = env.step(jax.random.key(0), state, {"seller": jnp.array([[below]])}, params)
    np.testing.assert_allclose(r["seller"], [below], rtol=1e-6)
    _, _, r, _, _, info = env.step(jax.random.key(0), state, {"seller": jnp.array([[above]])}, params)
    np.testing.assert_allclose(r["seller"], [0.0])
    # legacy rule: with no eligible seller the consumer sends nothing
    np.testing.assert_allclose(info["queries"]["consumer"], 0.0)
    np.testing.assert_allclose(info["unserved"]["consumer"], 0.0)


def test_consumer_agents_choose_budgets_and_earn_regret_ratio():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    _, state = env.reset(jax.random.key(0), params)
    acts = random_actions(env, params, jax.random.key(3))
    _, state, rewards, _, _, info = env.step(jax.random.key(0), state, acts, params)
    spend = np.asarray(info["spend"]["buyers"]).sum(-1)
    budget_x_sent = (np.asarray(state.budgets["buyers"]) * np.asarray(info["queries"]["buyers"])).sum(-1)
    # reward: -(spend / sum(budget x queries)) from [regret_ratio, scale -1]
    np.testing.assert_allclose(rewards["buyers"], -spend / budget_x_sent, rtol=1e-5)
    assert np.all(spend <= budget_x_sent + 1e-5)


def test_observation_shapes_follow_config_order():
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    obs, _ = env.reset(jax.random.key(0), params)
    P, S = 3, 5
    assert obs["posted"].shape == (3, P + P + P)               # own price, traffic, min rival
    assert obs["multiplied"].shape == (2, P + 2 * S * P)       # own price, 2-step history
    assert obs["buyers"].shape == (2, P + 2 * P)
    assert env.observation_space("posted", params).shape == (3, 9)


def test_current_actions_are_each_groups_action_in_force_after_real_steps():
    """Price, multiplier and budget groups in one market. Catches: a group's action read
    from another kind's field, a group left out or out of order, the reset action
    reported after a step, the unclipped action instead of the one in force."""
    env, params = jaxmarket.make(CONFIGS / "multi_product.yaml")
    # every action kind a posted-price market can hold (quantities need cournot:
    # tests/test_pricing_market.py)
    assert sorted({g.action for g in env.spec.agent_groups}) == sorted(set(ACTION_FIELDS)
                                                                      - {"quantity"})
    _, state = env.reset(jax.random.key(0), params)
    held = current_actions(env.spec, state)
    assert list(held) == list(env.agent_groups) == ["buyers", "posted", "multiplied"]
    np.testing.assert_array_equal(held["posted"], params.sellers["posted"].initial)
    np.testing.assert_array_equal(held["multiplied"], np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(held["buyers"], np.ones((2, 3), np.float32))
    for t in range(3):
        acts = random_actions(env, params, jax.random.key(20 + t))
        acts = {g: 1.5 * a - 0.2 for g, a in acts.items()}   # some outside the bounds
        _, state, _, _, _ = env.step_env(jax.random.key(t), state, acts, params)
        held = current_actions(env.spec, state)
        for g in env.agent_groups:
            box = env.action_space(g, params)
            np.testing.assert_array_equal(held[g], np.clip(acts[g], box.low, box.high))
    # passed back to step, they hold every agent where it is
    _, again, _, _, _ = env.step_env(jax.random.key(9), state, held, params)
    for g, a in current_actions(env.spec, again).items():
        np.testing.assert_array_equal(a, held[g])


def test_single_agent_view_works_with_gymnax_log_wrapper():
    from gymnax.wrappers.purerl import LogWrapper

    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml", ["market.episode_length=4"])
    view = SingleAgentEnv(env, "sellers", agent=0,
                          others={"sellers": {"kind": "constant", "value": 1.5}}, params=params)
    wrapped = LogWrapper(view)
    assert view.action_space(params).shape == (1,)
    obs, state = wrapped.reset(jax.random.key(0), params)
    my_price = 1.7
    per_step = logit_profit(np.array([my_price, 1.5]), 2.0, 1.0, 0.0, 0.25)[0]
    total = 0.0
    for t in range(4):
        obs, state, r, term, trunc, info = wrapped.step(jax.random.key(t), state,
                                                        jnp.array([my_price]), params)
        np.testing.assert_allclose(r, per_step, rtol=1e-5)
        total += float(r)
    assert bool(info["returned_episode"])
    np.testing.assert_allclose(info["returned_episode_returns"], 4 * per_step, rtol=1e-5)
    np.testing.assert_allclose(total, 4 * per_step, rtol=1e-5)


def test_single_agent_view_rejects_entity_groups():
    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml")
    with pytest.raises(ValueError, match="not an agent group"):
        SingleAgentEnv(env, "consumer", params=params)
