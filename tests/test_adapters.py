"""The ecosystem adapters (jaxmarket.adapters): each passes its ecosystem's official checker
and gives, for the same key chain and actions, exactly what the native market gives
(or, on the deterministic logit markets, the closed-form profits)."""

import importlib.util
import sys
import warnings

import jax
import numpy as np
import pytest
from conftest import CONFIGS, ROOT
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test

import jaxmarket
from jaxmarket.adapters import (
    make_gymnasium_env,
    make_jaxmarl_env,
    make_parallel_env,
    make_vector_env,
)
from jaxmarket.market.economics import logit_profits, nash_price

MULTI = str(CONFIGS / "multi_product.yaml")
DUOPOLY = str(CONFIGS / "logit_duopoly.yaml")
CALVANO = str(CONFIGS / "calvano.yaml")
CONSTANT_RIVAL = {"sellers": {"kind": "constant", "value": 1.5}}
# the duopoly's sellers observe nothing (a bandit): the adapters' default observation
# would be this; spelled out here where a test reads the observation
OWN_PRICE = "market.sellers[0].observation=[{kind: own_price}]"
# these tests compare with the native market, so actions in market units (the opt-in)
MARKET_UNITS = {"normalize_actions": False}


def native_chain(seed: int):
    """The adapters' documented key chain: start at key(seed), split before every call."""
    key = jax.random.key(seed)
    while True:
        key, sub = jax.random.split(key)
        yield sub


def random_group_actions(env, params, key):
    keys = jax.random.split(key, len(env.agent_groups))
    return {g: env.action_space(g, params).sample(k) for g, k in zip(env.agent_groups, keys)}


# ----------------------------------------------------------------------------- PettingZoo

def test_parallel_env_passes_the_pettingzoo_parallel_api_test():
    pz = make_parallel_env(MULTI)          # 3 agent groups, episodes of 200 steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # PettingZoo reports API slips as warnings
        parallel_api_test(pz, num_cycles=300)
    env, params = jaxmarket.make(MULTI)
    assert pz.possible_agents == ["buyers_0", "buyers_1", "posted_0", "posted_1", "posted_2",
                                  "multiplied_0", "multiplied_1"]
    # actions in [-1, 1] by default; market units (the group's bounds) on request
    assert all((pz.action_space(a).low == -1).all() and (pz.action_space(a).high == 1).all()
               for a in pz.possible_agents)
    pz = make_parallel_env(MULTI, **MARKET_UNITS)
    box = env.action_space("posted", params)
    np.testing.assert_array_equal(pz.action_space("posted_2").low,
                                  np.broadcast_to(box.low, box.shape)[2])
    np.testing.assert_array_equal(pz.action_space("posted_2").high,
                                  np.broadcast_to(box.high, box.shape)[2])
    assert pz.observation_space("multiplied_1").shape == (33,)


def test_parallel_env_steps_exactly_like_the_market_for_the_same_keys_and_actions():
    pz = make_parallel_env(MULTI, **MARKET_UNITS)
    env, params = jaxmarket.make(MULTI)
    keys = native_chain(7)
    obs, infos = pz.reset(seed=7)
    n_obs, state = env.reset(next(keys), params)
    native_step = jax.jit(env.step_env)
    sample = jax.jit(lambda k: random_group_actions(env, params, k))
    first = None
    for t in range(3):
        acts = sample(jax.random.key(100 + t))
        per_agent = {f"{g}_{i}": np.asarray(acts[g][i]) for g in acts for i in range(len(acts[g]))}
        obs, rew, _, _, infos = pz.step(per_agent)
        first = first or (per_agent, rew)
        n_obs, state, n_rew, _, n_info = native_step(next(keys), state, acts, params)
        for g in env.agent_groups:
            for i in range(env.num_agents(g)):
                name = f"{g}_{i}"
                # same numbers up to float32 rounding between differently fused programs
                np.testing.assert_allclose(obs[name], np.asarray(n_obs[g][i]), rtol=1e-6)
                np.testing.assert_allclose(rew[name], float(n_rew[g][i]), rtol=1e-6)
        np.testing.assert_allclose(infos["posted_1"]["traffic"],
                                   np.asarray(n_info["traffic"]["posted"][1]), rtol=1e-6)
    # stochastic demand: another seed gives other rewards for the same first actions
    pz.reset(seed=8)
    assert pz.step(first[0])[1] != first[1]
    pz.reset(seed=7)
    assert pz.step(first[0])[1] == first[1]


def test_parallel_env_ends_every_agent_together_and_rejects_bad_actions():
    pz = make_parallel_env(DUOPOLY, ["market.episode_length=2", OWN_PRICE], **MARKET_UNITS)
    pz.reset(seed=0)
    good = {"sellers_0": [1.5], "sellers_1": [1.6]}
    with pytest.raises(ValueError, match=r"no entry for agents \['sellers_1'\]"):
        pz.step({"sellers_0": [1.5]})
    with pytest.raises(ValueError, match=r"agent sellers_0: action must have shape \(1,\)"):
        pz.step({**good, "sellers_0": [1.5, 1.6]})
    _, rew, _, trunc, _ = pz.step(good)
    np.testing.assert_allclose([rew["sellers_0"], rew["sellers_1"]],
                               logit_profits([1.5, 1.6]), rtol=1e-5)
    assert pz.agents == ["sellers_0", "sellers_1"] and not any(trunc.values())
    _, _, _, trunc, _ = pz.step(good)
    assert all(trunc.values()) and pz.agents == []
    with pytest.raises(RuntimeError, match="call reset"):
        pz.step(good)


# ----------------------------------------------------------------------------- Gymnasium

def test_gymnasium_env_passes_check_env():
    env = make_gymnasium_env(MULTI, "posted", agent=1, normalize_actions=True,
                             others={"buyers": {"kind": "constant", "value": 2.0}})
    check_env(env.unwrapped)
    assert env.action_space.shape == (3,) and env.observation_space.shape == (9,)


def test_gymnasium_env_rewards_and_observations_are_the_markets():
    # Calvano: deterministic logit demand, observation = last period's price pair
    env = make_gymnasium_env(CALVANO, "sellers", others=CONSTANT_RIVAL, **MARKET_UNITS)
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs, [1.7, 1.7])            # both at the initial price
    for price in (1.6, 1.9, 1.45):
        obs, reward, terminated, truncated, info = env.step(np.array([price], np.float32))
        np.testing.assert_allclose(obs, [price, 1.5], rtol=1e-6)
        np.testing.assert_allclose(reward, logit_profits([price, 1.5])[0], rtol=1e-5)
        assert (terminated, truncated) == (False, False)
        np.testing.assert_allclose(info["prices"], [price], rtol=1e-6)
    # normalize_actions (the default): -1 is the lower bound, +1 the upper one
    low, high = 1.427725, 1.970185
    env = make_gymnasium_env(CALVANO, "sellers", others=CONSTANT_RIVAL)
    env.reset(seed=0)
    for a, price in ((-1.0, low), (1.0, high), (0.0, (low + high) / 2)):
        obs = env.step(np.array([a], np.float32))[0]
        np.testing.assert_allclose(obs[0], price, rtol=1e-6)
    with pytest.raises(ValueError, match=r"action must have shape \(1,\)"):
        env.step(np.zeros(2))


def test_vector_env_is_one_jitted_vmapped_call_per_step_and_matches_the_closed_form():
    n = 5
    venv = make_vector_env(DUOPOLY, "sellers", n, ["market.episode_length=3", OWN_PRICE],
                           others=CONSTANT_RIVAL, autoreset_mode="same_step", **MARKET_UNITS)
    calls = []
    jitted = venv._step
    venv._step = lambda *a: calls.append(1) or jitted(*a)
    obs, _ = venv.reset(seed=1)
    assert obs.shape == (n, 1) and venv.action_space.shape == (n, 1)
    prices = np.linspace(1.2, 2.0, n, dtype=np.float32)[:, None]
    expected = logit_profits(np.concatenate([prices, np.full((n, 1), 1.5)], axis=1))[:, 0]
    for t in range(3):
        obs, rewards, terms, truncs, infos = venv.step(prices)
        np.testing.assert_allclose(rewards, expected, rtol=1e-5)
        np.testing.assert_allclose(infos["prices"], prices, rtol=1e-6)
        # observation: the own price just set, or (same-step reset) the initial 1.75
        np.testing.assert_allclose(obs, np.full((n, 1), 1.75) if t == 2 else prices, rtol=1e-6)
        assert not terms.any() and truncs.all() == (t == 2)
        assert infos["_final_obs"].all() == (t == 2)
    assert len(calls) == 3 and jitted._cache_size() == 1     # one compiled call per step
    # auto-reset in the same step: every market is back at time 0 with its initial prices
    assert (np.asarray(venv.market_states.time) == 0).all()
    np.testing.assert_allclose(np.asarray(venv.market_states.prices["sellers"])[:, 0, 0], 1.75)


# ----------------------------------------------------------------------------- JaxMARL

def test_jaxmarl_env_equals_the_market_step_including_the_auto_reset():
    jm = make_jaxmarl_env(MULTI, ["market.episode_length=2"], **MARKET_UNITS)
    env, params = jaxmarket.make(MULTI, ["market.episode_length=2"])
    assert jm.agents[:3] == ["buyers_0", "buyers_1", "posted_0"] and jm.num_agents == 7
    assert jm.agent_classes["multiplied"] == ["multiplied_0", "multiplied_1"]
    B = 4
    keys = jax.random.split(jax.random.key(3), B)
    obs, state = jax.vmap(jm.reset)(keys)
    n_obs, n_state = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, params)
    step = jax.jit(jax.vmap(jm.step))
    n_step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    sample = jax.jit(jax.vmap(lambda k: random_group_actions(env, params, k)))
    for t in range(3):                      # crosses the episode end at t = 1
        acts = sample(jax.random.split(jax.random.key(50 + t), B))
        per_agent = {f"{g}_{i}": acts[g][:, i] for g in acts for i in range(acts[g].shape[1])}
        skeys = jax.random.split(jax.random.key(60 + t), B)
        obs, state, rew, dones, infos = step(skeys, state, per_agent)
        n_obs, n_state, n_rew, _, n_trunc, _ = n_step(skeys, n_state, acts, params)
        for g in env.agent_groups:
            for i in range(env.num_agents(g)):
                np.testing.assert_allclose(obs[f"{g}_{i}"], n_obs[g][:, i], rtol=1e-6)
                np.testing.assert_allclose(rew[f"{g}_{i}"], n_rew[g][:, i], rtol=1e-6)
        np.testing.assert_array_equal(dones["__all__"], n_trunc)
        assert bool(dones["__all__"].all()) == (t == 1) and infos == {}
        np.testing.assert_array_equal(state.time, n_state.time)
    with pytest.raises(KeyError, match="no entry for agents"):
        jm.step(jax.random.key(0), jax.tree.map(lambda x: x[0], state), {"buyers_0": 1.0})


def test_jaxmarl_ippo_example_learns_the_nash_price_of_the_duopoly():
    spec = importlib.util.spec_from_file_location(
        "ippo_jaxmarl_market", ROOT / "docs" / "examples" / "ippo_jaxmarl_market.py")
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    result = example.main({**example.CONFIG, "TOTAL_TIMESTEPS": 40_000})
    assert result["agents"] == ["sellers_0", "sellers_1"]
    # starts at the midpoint 1.75 with wide exploration, ends near the static Nash price
    np.testing.assert_allclose(result["price"], nash_price(), atol=0.015)
    first, last = result["reward"][:10].mean(0), result["reward"][-10:].mean(0)
    assert (last > first + 0.02).all(), (first, last)
    assert (np.abs(last - logit_profits([nash_price()] * 2)[0]) < 0.01).all()
