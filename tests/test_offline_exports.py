"""D4RL and Minari exports for their clients (docs/ecosystem.md): ``python -m
jaxmarket.collect --format d4rl|minari [--normalize-actions]``, actions in [-1, 1] that
read back in market units, and a Minari env spec that rebuilds the market."""

from __future__ import annotations

import json

import h5py
import minari
import numpy as np
import pytest
from conftest import CONFIGS

from jaxmarket.adapters import registration
from jaxmarket.cli.collect import main as collect_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.market.economics import logit_profits
from jaxmarket.offline import collect, load_dataset
from jaxmarket.offline.export import ENV_ENTRY_POINT
from jaxmarket.offline.formats import export_dataset

DUOPOLY = str(CONFIGS / "logit_duopoly.yaml")
ARGS = ["--config", DUOPOLY, "--steps", "12", "--noise", "0.3", "--chunk", "12",
        "market.sellers[0].observation=[{kind: own_price}]", "train.num_envs=2",
        "train.num_seeds=1"]


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """The same collection as ARGS, natively, through the Python API."""
    out = tmp_path_factory.mktemp("native") / "ds"
    collect(DUOPOLY, 12, out, noise=0.3, chunk=12, overrides=ARGS[-3:])
    return load_dataset(out)


def bounds():
    seller = load_config(DUOPOLY)["market"]["sellers"][0]
    return float(seller["low"]), float(seller["high"])


def test_collect_format_d4rl_normalize_actions_maps_the_bounds_onto_minus_one_one(
        native, tmp_path, capsys):
    out = tmp_path / "duopoly.hdf5"
    assert collect_main([*ARGS, "--out", str(out), "--format", "d4rl",
                         "--normalize-actions"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["format"] == "d4rl" and summary["normalize_actions"] is True
    low, high = bounds()
    order = np.concatenate(native.episodes())        # save_d4rl writes episodes in order
    market = np.asarray(native["actions"])[order]
    with h5py.File(out) as f:
        stored = np.asarray(f["actions"])
        assert bool(f.attrs["actions_normalized"])
        np.testing.assert_allclose(f.attrs["action_low"], [low])
    assert stored.min() >= -1.0 and stored.max() <= 1.0 and stored.std() > 0.1
    np.testing.assert_allclose(stored, 2 * (market - low) / (high - low) - 1, atol=2e-6)
    back = load_dataset(out)                          # the reader maps back to market units
    np.testing.assert_allclose(np.asarray(back["actions"]), market, atol=3e-6)
    np.testing.assert_allclose(np.asarray(back["rewards"]), np.asarray(native["rewards"])[order],
                               rtol=1e-6)
    with pytest.raises(ConfigError, match="--normalize-actions"):
        collect_main([*ARGS, "--out", str(tmp_path / "n"), "--normalize-actions"])
    with pytest.raises(ConfigError, match="--out"):
        collect_main([*ARGS, "--out", str(tmp_path / "x.csv"), "--format", "d4rl"])


def test_minari_export_has_an_env_spec_that_rebuilds_the_market(native, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    where = export_dataset(native, "minari", "jaxmarket/duopoly/sellers-v0",
                           normalize_actions=True)
    md = minari.load_dataset("jaxmarket/duopoly/sellers-v0")
    assert md.spec.env_spec.entry_point == ENV_ENTRY_POINT == registration.ENTRY_POINT
    assert md.spec.env_spec.max_episode_steps == 12               # the dataset's episodes
    assert (md.spec.action_space.low, md.spec.action_space.high) == (-1.0, 1.0)
    env = md.recover_environment()
    low, high = bounds()
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs, [(low + high) / 2])          # the initial own price
    obs, reward, _, _, info = env.step(np.array([-1.0], np.float32))
    rival = float(np.asarray(env.unwrapped.market_state.prices["sellers"])[1, 0])
    np.testing.assert_allclose([info["prices"][0], obs[0]], [low, low], rtol=1e-6)
    np.testing.assert_allclose(reward, logit_profits([low, rival])[0], rtol=1e-5)
    back = load_dataset(where)                                    # market units again
    order = np.concatenate(native.episodes())
    np.testing.assert_allclose(np.sort(np.asarray(back["actions"]).ravel()),
                               np.sort(np.asarray(native["actions"])[order].ravel()), atol=3e-6)
    assert back.meta["action_low"] == [low]
