"""The adapters' defaults as a new user meets them (issue 35, docs/ecosystem.md): every
shipped config builds in every adapter as shipped (a stateless group observes its own
price), actions are ``Box(-1, 1)`` unless ``normalize_actions=False``, observation spaces
carry the bounds the observation kinds declare, the vector entry point autoresets in
gymnasium's ``NEXT_STEP`` mode, and ``collect``'s D4RL / Minari exports store ``[-1, 1]``
actions unless ``--market-units``, saying which in their metadata."""

from __future__ import annotations

import json

import gymnasium as gym
import h5py
import jax
import minari
import numpy as np
import pytest
import yaml
from conftest import CONFIGS
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import NormalizeObservation

import jaxmarket
from jaxmarket.adapters import make_gymnasium_env, make_jaxmarl_env, make_parallel_env
from jaxmarket.adapters.registration import env_id, shipped_scenarios
from jaxmarket.cli.collect import main as collect_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.market.economics import logit_profits
from jaxmarket.offline import load_dataset

DUOPOLY = str(CONFIGS / "logit_duopoly.yaml")


def seller_bounds(name: str, group: int = 0) -> tuple[float, float]:
    """A seller group's low / high as its config file writes them."""
    seller = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["market"]["sellers"][group]
    return float(seller["low"]), float(seller["high"])


def inside(x, box) -> bool:
    x = np.asarray(x, np.float32)
    return bool(np.all(x >= box.low) and np.all(x <= box.high))


@pytest.mark.parametrize("name", shipped_scenarios())
def test_every_shipped_config_builds_in_every_adapter_with_the_defaults(name):
    # the id a new user makes, reset and stepped (one compile per config: the PettingZoo
    # and JaxMARL steps of the same market step are below, on the stateless scenarios)
    env = gym.make(env_id(name))
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, env.action_space.shape, np.float32)
    assert env.observation_space.shape[0] >= 1
    obs, _ = env.reset(seed=0)
    assert inside(obs, env.observation_space)
    obs, reward, *_ = env.step(np.ones(env.action_space.shape, np.float32))
    assert np.isfinite(reward) and inside(obs, env.observation_space)

    pz = make_parallel_env(str(CONFIGS / f"{name}.yaml"))
    obs, _ = pz.reset(seed=0)
    for a in pz.possible_agents:
        assert pz.action_space(a) == gym.spaces.Box(-1.0, 1.0, pz.action_space(a).shape,
                                                    np.float32)
        assert obs[a].shape[0] >= 1 and inside(obs[a], pz.observation_space(a))

    jm = make_jaxmarl_env(str(CONFIGS / f"{name}.yaml"))
    obs, _ = jm.reset(jax.random.key(0))
    for a in jm.agents:
        space = jm.action_space(a)
        assert float(space.low.min()) == -1.0 and float(space.high.max()) == 1.0
        assert obs[a].shape[0] >= 1 and inside(obs[a], jm.observation_space(a))


@pytest.mark.parametrize("name", ["logit_monopoly", "banchio2022_first"])
def test_a_stateless_scenario_steps_in_pettingzoo_and_jaxmarl_observing_its_own_price(name):
    low, high = seller_bounds(name)
    pz = make_parallel_env(str(CONFIGS / f"{name}.yaml"))
    pz.reset(seed=0)
    acts = {a: np.full(pz.action_space(a).shape, -1.0 + 0.5 * i)
            for i, a in enumerate(pz.agents)}
    obs, rewards, *_ = pz.step(acts)
    for a in pz.agents:                      # the own price: -1 + 0.5 i mapped on [low, high]
        expected = low + (acts[a] + 1) / 2 * (high - low)
        np.testing.assert_allclose(obs[a], expected, rtol=1e-6)
        assert np.isfinite(rewards[a])
    jm = make_jaxmarl_env(str(CONFIGS / f"{name}.yaml"))
    _, state = jm.reset(jax.random.key(0))
    obs, _, rewards, _, _ = jm.step(jax.random.key(1), state,
                                    {a: np.ones((1,), np.float32) for a in jm.agents})
    for a in jm.agents:
        np.testing.assert_allclose(obs[a], [high], rtol=1e-6)
        assert np.isfinite(float(rewards[a]))


def test_observation_bounds_are_the_configs_and_hold_for_real_observations():
    # Calvano: history of both sellers' prices, in the config's [low, high]
    low, high = seller_bounds("calvano")
    env = make_gymnasium_env(str(CONFIGS / "calvano.yaml"), "sellers")
    np.testing.assert_allclose(env.observation_space.low, [low, low])
    np.testing.assert_allclose(env.observation_space.high, [high, high])
    # klein2021: the rival's price; the duopoly's default own price; both in [low, high]
    for name, group in (("klein2021", "sellers"), ("logit_duopoly", "sellers")):
        low, high = seller_bounds(name)
        space = make_gymnasium_env(str(CONFIGS / f"{name}.yaml"), group).observation_space
        assert (space.low.tolist(), space.high.tolist()) == ([low], [high])
    # a time feature: t / episode_length in [0, 1], the phase in [-1, 1]; own_traffic
    # declares no bounds; competitor statistics over sellers in [low, high]
    low, high = seller_bounds("logit_duopoly")
    obs_cfg = ("market.sellers[0].observation=[{kind: own_price}, {kind: time, period: 3},"
               " {kind: own_traffic}, {kind: competitor_prices, summary: [min, max]}]")
    pz = make_parallel_env(DUOPOLY, [obs_cfg, "market.episode_length=4"])
    space = pz.observation_space("sellers_1")
    np.testing.assert_array_equal(space.low, [low, 0, -1, -1, -np.inf, low, low])
    np.testing.assert_array_equal(space.high, [high, 1, 1, 1, np.inf, high, high])
    obs, _ = pz.reset(seed=0)
    seen = [obs["sellers_1"]]
    for a in (-1.0, 1.0, 7.0, -7.0):       # the bounds, and actions clipped to them
        obs, *_ = pz.step({"sellers_0": [a], "sellers_1": [-a]})
        seen += [obs[x] for x in obs]
    seen = np.stack(seen)
    assert all(space.contains(o.astype(np.float32)) for o in seen)
    assert seen[:, 0].min() == low and seen[:, 0].max() == high      # reached, not exceeded
    assert seen[:, 1].max() == 1.0                                    # t = episode_length
    # multi_product: a buyer's own budget in its bounds; statistics over a multiplier
    # seller (quote = multiplier x base price) unbounded; every market-units observation
    # after random actions inside
    market, params = jaxmarket.make(str(CONFIGS / "multi_product.yaml"))
    budget = market.action_space("buyers", params)
    jm = make_jaxmarl_env(str(CONFIGS / "multi_product.yaml"), normalize_actions=False)
    buyer = jm.observation_space("buyers_0")
    np.testing.assert_allclose(buyer.low[:3], np.broadcast_to(budget.low, budget.shape)[0])
    np.testing.assert_allclose(buyer.high[:3], np.broadcast_to(budget.high, budget.shape)[0])
    assert np.isinf(buyer.low[3:]).all() and np.isinf(buyer.high[3:]).all()
    obs, state = jm.reset(jax.random.key(0))
    for t in range(3):
        keys = jax.random.split(jax.random.key(10 + t), jm.num_agents)
        acts = {a: jm.action_space(a).sample(k) * 3.0 for a, k in zip(jm.agents, keys)}
        obs, state, *_ = jm.step(jax.random.key(t), state, acts)
        for a in jm.agents:
            assert inside(obs[a], jm.observation_space(a)), (t, a)


def test_make_vec_defaults_to_next_step_and_same_step_is_reachable():
    rival = {"sellers": {"kind": "constant", "value": 1.5}}
    kwargs = {"overrides": ["market.episode_length=2"], "others": rival,
              "normalize_actions": False}
    venv = gym.make_vec("jaxmarket/logit_duopoly-v0", num_envs=2,
                        vectorization_mode="vector_entry_point", **kwargs)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    env = NormalizeObservation(venv)          # gymnasium refuses it on SAME_STEP
    env.reset(seed=0)
    prices = np.array([[1.3], [1.9]], np.float32)
    expected = logit_profits(np.concatenate([prices, np.full((2, 1), 1.5)], axis=1))[:, 0]
    rewards = []
    for _ in range(3):
        _, r, _, trunc, infos = env.step(prices)
        rewards.append(r)
    np.testing.assert_allclose(rewards[:2], [expected, expected], rtol=1e-5)
    np.testing.assert_array_equal(rewards[2], [0.0, 0.0])     # NEXT_STEP: the reset step
    assert not infos["_prices"].any()
    # SAME_STEP: a keyword argument of the vector entry point ...
    same = gym.make_vec("jaxmarket/logit_duopoly-v0", num_envs=2,
                        vectorization_mode="vector_entry_point", autoreset_mode="same_step",
                        **kwargs)
    assert same.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    same.reset(seed=0)
    for _ in range(2):
        obs, r, _, trunc, infos = same.step(prices)
    assert trunc.all() and infos["_final_obs"].all()
    np.testing.assert_allclose(obs, [[1.75], [1.75]])         # already reset, same step
    # ... or vector_kwargs of gymnasium's own vector envs (which take no others for the
    # vector entry point: gymnasium's rule)
    sync = gym.make_vec("jaxmarket/logit_duopoly-v0", num_envs=2, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs)
    assert sync.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    sync.reset(seed=0)
    for _ in range(2):
        obs, r, _, trunc, infos = sync.step(prices)
    assert trunc.all()
    np.testing.assert_allclose(obs, [[1.75], [1.75]])
    np.testing.assert_allclose(infos["final_obs"].tolist(), prices.tolist(), rtol=1e-6)


ARGS = ["--config", DUOPOLY, "--steps", "6", "--noise", "0.3", "--chunk", "6",
        "train.num_envs=2", "train.num_seeds=1"]


def test_collect_exports_normalised_actions_by_default_and_market_units_on_request(
        tmp_path, capsys):
    low, high = seller_bounds("logit_duopoly")
    paths = {}
    for flags, name in (([], "default.hdf5"), (["--market-units"], "market.hdf5")):
        paths[name] = tmp_path / name
        assert collect_main([*ARGS, "--out", str(paths[name]), "--format", "d4rl", *flags]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["normalize_actions"] is (not flags)
    with h5py.File(paths["default.hdf5"]) as f:
        normed, flag = np.asarray(f["actions"]), bool(f.attrs["actions_normalized"])
        np.testing.assert_allclose([f.attrs["action_low"], f.attrs["action_high"]],
                                   [[low], [high]])
    with h5py.File(paths["market.hdf5"]) as f:
        market, m_flag = np.asarray(f["actions"]), bool(f.attrs["actions_normalized"])
    assert flag and not m_flag
    assert normed.min() >= -1 and normed.max() <= 1 and market.min() >= low - 1e-6
    # the same collection: one is the other mapped onto [-1, 1]
    np.testing.assert_allclose(normed, 2 * (market - low) / (high - low) - 1, atol=2e-6)
    np.testing.assert_allclose(np.asarray(load_dataset(paths["default.hdf5"])["actions"]),
                               market, atol=3e-6)                # read back in market units
    with pytest.raises(ConfigError, match="--market-units"):
        collect_main([*ARGS, "--out", str(tmp_path / "x.hdf5"), "--format", "d4rl",
                      "--market-units", "--normalize-actions"])
    with pytest.raises(ConfigError, match="--market-units"):
        collect_main([*ARGS, "--out", str(tmp_path / "n"), "--market-units"])


def test_a_minari_export_of_a_stateless_scenario_has_an_env_spec_that_rebuilds_it(
        tmp_path, monkeypatch):
    # the duopoly as recorded (observing nothing): an env spec rebuilding it observing
    # nothing (not the adapters' default observation), actions in [-1, 1], metadata
    # saying so
    low, high = seller_bounds("logit_duopoly")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    assert collect_main([*ARGS, "--out", "jaxmarket/duopoly/bandit-v0", "--format",
                         "minari"]) == 0
    md = minari.load_dataset("jaxmarket/duopoly/bandit-v0")
    meta = json.loads(md.storage.metadata["description"])["jaxmarket"]
    assert meta["actions_normalized"] is True
    assert (meta["market_action_low"], meta["market_action_high"]) == ([low], [high])
    assert md.spec.env_spec is not None
    env = md.recover_environment()
    assert env.observation_space.shape == (0,) == md.spec.observation_space.shape
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([-1.0], np.float32))
    np.testing.assert_allclose(info["prices"], [low])
