"""The adapters as outside clients meet them (docs/ecosystem.md): a stateless group
observes its own price by default (without the default, an empty observation is refused
with the config line that fixes it), a too-old gymnasium shows its real import error,
``normalize_actions`` on the PettingZoo env, the vector env's NEXT_STEP autoreset under
gymnasium's observation wrappers, ``gym.make`` ids of the shipped scenarios, and the
optional extras (sacred, clients) in pyproject.toml.

Every market here is the deterministic logit duopoly, so rewards are closed forms
(``jaxmarket.market.economics.logit_profits``) and gymnasium's own ``SyncVectorEnv`` over
single-market envs gives the reference for the vector env."""

from __future__ import annotations

import sys
import tomllib

import gymnasium as gym
import numpy as np
import pytest
from conftest import CONFIGS, ROOT
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import DtypeObservation, FlattenObservation, NormalizeObservation

import jaxmarket
from jaxmarket.adapters import (
    make_gymnasium_env,
    make_jaxmarl_env,
    make_parallel_env,
    make_vector_env,
    registration,
)
from jaxmarket.adapters.registration import env_id, shipped_scenarios
from jaxmarket.config.errors import ConfigError
from jaxmarket.market.economics import logit_profits
from jaxmarket.train.tracking import with_tracker

DUOPOLY = str(CONFIGS / "logit_duopoly.yaml")
OWN_PRICE = "market.sellers[0].observation=[{kind: own_price}]"
SHORT = ["market.episode_length=2", OWN_PRICE]
RIVAL = {"sellers": {"kind": "constant", "value": 1.5}}
MARKET_UNITS = {"normalize_actions": False}     # prices as numbers, for closed forms


def test_a_stateless_group_observes_its_own_price_by_default_and_without_it_is_refused():
    makers = {"make_parallel_env": lambda o, **kw: make_parallel_env(DUOPOLY, o, **kw),
              "make_gymnasium_env": lambda o, **kw: make_gymnasium_env(DUOPOLY, "sellers", o,
                                                                       **kw),
              "make_vector_env": lambda o, **kw: make_vector_env(DUOPOLY, "sellers", 2, o,
                                                                 **kw),
              "make_jaxmarl_env": lambda o, **kw: make_jaxmarl_env(DUOPOLY, o, **kw)}
    for name, make in makers.items():
        with pytest.raises(ConfigError) as err:
            make([], default_observation=())
        msg = str(err.value)
        assert err.value.field == "market.sellers[0].observation" and name in msg
        assert "'market.sellers[0].observation=[{kind: own_price}]'" in msg
        make([OWN_PRICE], default_observation=())    # the line the message names is the fix
    # the default: the duopoly (configured observation: []) observes its own price
    market, params = jaxmarket.make(DUOPOLY)
    assert market.observation_space("sellers", params).shape == (2, 0)   # as configured
    box = market.action_space("sellers", params)
    low, high = float(np.min(box.low)), float(np.max(box.high))
    pz = make_parallel_env(DUOPOLY, **MARKET_UNITS)
    obs, _ = pz.reset(seed=0)
    np.testing.assert_allclose(obs["sellers_0"], [(low + high) / 2])   # the initial price
    obs, *_ = pz.step({"sellers_0": [1.3], "sellers_1": [2.2]})
    np.testing.assert_allclose([obs["sellers_0"][0], obs["sellers_1"][0]], [1.3, 2.2],
                               rtol=1e-6)
    assert make_gymnasium_env(DUOPOLY, "sellers").observation_space.shape == (1,)
    # the Gymnasium adapter gives it to the acting group only; the fixed policies of the
    # other groups keep the scenario's observation (here: a seller group made stateless)
    env = make_gymnasium_env(str(CONFIGS / "multi_product.yaml"), "buyers",
                             ["market.sellers[0].observation=[]"])
    view = env.unwrapped.view
    assert view.env.observation_space("posted", env.unwrapped.params).shape[1] == 0
    # a consumer group is pointed at its own entry (the third consumer of multi_product)
    with pytest.raises(ConfigError, match=r"market\.consumers\[2\]\.observation=\[\{kind: "):
        make_gymnasium_env(str(CONFIGS / "multi_product.yaml"), "buyers",
                           ["market.consumers[2].observation=[]"], default_observation=())
    # ... and by default observes its budget: its own action value
    env = make_gymnasium_env(str(CONFIGS / "multi_product.yaml"), "buyers",
                             ["market.consumers[2].observation=[]"], **MARKET_UNITS)
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.array([0.5, 1.0, 1.5], np.float32))
    np.testing.assert_allclose(obs, [0.5, 1.0, 1.5], rtol=1e-6)


def test_a_too_old_gymnasium_shows_the_real_import_error(monkeypatch):
    # gymnasium 1.0 has no gymnasium.vector.AutoresetMode: remove it and re-import the module
    monkeypatch.delattr(gym.vector, "AutoresetMode")
    monkeypatch.delitem(sys.modules, "jaxmarket.adapters.gym_env")
    with pytest.raises(ImportError) as err:
        make_gymnasium_env(DUOPOLY, "sellers", [OWN_PRICE])
    msg = str(err.value)
    assert "cannot import name 'AutoresetMode'" in msg
    assert f"gymnasium {gym.__version__}" in msg and "gymnasium>=1.1" in msg
    assert isinstance(err.value.__cause__, ImportError)      # the real error, chained


def test_registration_imports_nothing_without_gymnasium_and_a_missing_library_is_named(
        monkeypatch):
    # gymnax (a core dependency) brings gymnasium, so "absent" is simulated: find_spec
    # finds nothing, or the module is blocked in sys.modules
    ours = [i for i in list(gym.registry) if i.startswith("jaxmarket/")]
    for i in ours:
        monkeypatch.delitem(gym.registry, i)
    monkeypatch.setattr(registration.importlib.util, "find_spec", lambda name: None)
    assert registration.register_if_installed() is False
    assert not [i for i in gym.registry if i.startswith("jaxmarket/")]
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pettingzoo", None)   # import pettingzoo -> ImportError
    monkeypatch.delitem(sys.modules, "jaxmarket.adapters.parallel", raising=False)
    with pytest.raises(ImportError, match=r"make_parallel_env could not import pettingzoo.*"
                       r"pettingzoo>=1\.24: pip install -U 'jaxmarket\[adapters\]'"):
        make_parallel_env(DUOPOLY, [OWN_PRICE])
    assert all(i in gym.registry for i in ours)            # undo restored them


def test_parallel_env_normalize_actions_maps_minus_one_and_one_to_the_bounds():
    pz = make_parallel_env(DUOPOLY, SHORT)                  # normalize_actions by default
    env, params = jaxmarket.make(DUOPOLY, SHORT)
    box = env.action_space("sellers", params)
    low, high = float(np.min(box.low)), float(np.max(box.high))
    assert pz.action_space("sellers_0") == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    pz.reset(seed=0)
    obs, rew, _, _, infos = pz.step({"sellers_0": [-1.0], "sellers_1": [0.0]})
    mid = (low + high) / 2
    np.testing.assert_allclose([infos["sellers_0"]["prices"][0], obs["sellers_1"][0]],
                               [low, mid], rtol=1e-6)
    np.testing.assert_allclose([rew["sellers_0"], rew["sellers_1"]],
                               logit_profits([low, mid]), rtol=1e-5)
    _, rew, _, _, infos = pz.step({"sellers_0": [1.0], "sellers_1": [7.0]})   # clipped to +1
    np.testing.assert_allclose(infos["sellers_1"]["prices"], [high], rtol=1e-6)
    np.testing.assert_allclose(rew["sellers_0"], logit_profits([high, high])[0], rtol=1e-5)


def reference_vector_env(n: int) -> SyncVectorEnv:
    return SyncVectorEnv([lambda: make_gymnasium_env(DUOPOLY, "sellers", SHORT, others=RIVAL,
                                                     **MARKET_UNITS)
                          for _ in range(n)], autoreset_mode=AutoresetMode.NEXT_STEP)


def test_next_step_autoreset_equals_gymnasiums_sync_vector_env():
    n = 3
    venv = make_vector_env(DUOPOLY, "sellers", n, SHORT, others=RIVAL, **MARKET_UNITS)
    ref = reference_vector_env(n)                  # NEXT_STEP is the default, as gymnasium's
    assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs, _ = venv.reset(seed=0)
    r_obs, _ = ref.reset(seed=0)
    np.testing.assert_allclose(obs, r_obs)
    prices = np.array([[1.3], [1.6], [1.9]], np.float32)
    for t in range(5):       # episodes of 2 steps: done at t = 1, reset at t = 2, done at 4
        out = venv.step(prices)
        r_out = ref.step(prices)
        for a, b in zip(out[:4], r_out[:4]):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        obs, rewards, terms, truncs, infos = out
        resetting = t == 2
        expected = np.zeros(n) if resetting else logit_profits(
            np.concatenate([prices, np.full((n, 1), 1.5)], axis=1))[:, 0]
        np.testing.assert_allclose(rewards, expected, rtol=1e-5)
        np.testing.assert_allclose(obs, np.full((n, 1), 1.75) if resetting else prices)
        assert truncs.all() == (t in (1, 4)) and not terms.any()
        assert infos["_prices"].all() == (not resetting)
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        make_vector_env(DUOPOLY, "sellers", 2, SHORT, autoreset_mode="disabled")


def test_gymnasiums_observation_wrappers_run_on_next_step_and_match_the_sync_env():
    n = 3
    prices = np.array([[1.3], [1.6], [1.9]], np.float32)

    def wrap(v):
        return DtypeObservation(FlattenObservation(NormalizeObservation(v)), np.float64)

    mine = wrap(make_vector_env(DUOPOLY, "sellers", n, SHORT, others=RIVAL,
                                autoreset_mode=AutoresetMode.NEXT_STEP, **MARKET_UNITS))
    ref = wrap(reference_vector_env(n))
    np.testing.assert_allclose(mine.reset(seed=0)[0], ref.reset(seed=0)[0])
    for _ in range(4):
        a, b = mine.step(prices), ref.step(prices)
        assert a[0].dtype == np.float64
        for x, y in zip(a[:4], b[:4]):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    # the same-step mode is what gymnasium's stateful observation wrappers refuse
    with pytest.raises(AssertionError):
        NormalizeObservation(make_vector_env(DUOPOLY, "sellers", n, SHORT,
                                             autoreset_mode="same_step"))


def test_gym_make_ids_for_every_shipped_scenario_build_the_gymnasium_adapter():
    names = shipped_scenarios()
    assert {p.stem for p in CONFIGS.glob("*.yaml")} == set(names)
    assert all(env_id(n) in gym.registry for n in names)
    env = gym.make("jaxmarket/logit_duopoly-v0", overrides=SHORT, others=RIVAL,
                   **MARKET_UNITS)
    direct = make_gymnasium_env(DUOPOLY, "sellers", SHORT, others=RIVAL, **MARKET_UNITS)
    assert env.unwrapped.view.group == "sellers"        # the first agent group by default
    np.testing.assert_allclose(env.reset(seed=3)[0], direct.reset(seed=3)[0])
    a = np.array([1.6], np.float32)
    step, d_step = env.step(a), direct.step(a)
    np.testing.assert_allclose(step[1], d_step[1], rtol=1e-6)
    np.testing.assert_allclose(step[1], logit_profits([1.6, 1.5])[0], rtol=1e-5)
    venv = gym.make_vec("jaxmarket/logit_duopoly-v0", num_envs=4,
                        vectorization_mode="vector_entry_point", overrides=SHORT)
    assert venv.reset(seed=0)[0].shape == (4, 1)
    # the module:id form imports the registering module itself
    assert gym.make("jaxmarket.adapters:jaxmarket/calvano-v0").observation_space.shape == (2,)


def test_sacred_tracker_without_sacred_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sacred", None)      # import sacred -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'jaxmarket\[sacred\]'") as err:
        with_tracker("sacred", tmp_path, {}, lambda tracker: None)
    assert err.value.field == "--tracker"


def test_pyproject_extras_gymnasium_1_1_sacred_optional_no_setuptools_pin_in_core():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "setuptools" not in core and "sacred" not in core
    extras = project["optional-dependencies"]
    assert "gymnasium>=1.1" in extras["adapters"]
    assert any(d.startswith("sacred>=") for d in extras["sacred"])
    assert "sacred" in extras["test"][-1] and "sacred" in extras["all"][-1]
    clients = " ".join(extras["clients"])
    assert "stable-baselines3" in clients and "supersuit" in clients
