"""Making datasets (collect), the native format, D4RL HDF5 import/export, bad files."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from scipy import stats

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import collect, load_d4rl, load_dataset, make_dataset, save_d4rl
from jaxmarket.offline.dataset import DatasetWriter

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "benchmarks" / "offline_duopoly.yaml"


def scenario(**train):
    config = yaml.safe_load(SCENARIO.read_text())
    config["train"] = {"num_envs": 2, **train}
    return config


def logit_profit(p_own, p_other, quality=2.0, cost=1.0, mu=0.25):
    """(p - c) * exp((a - p) / mu) / (sum_j exp((a - p_j) / mu) + exp(0))."""
    e_own, e_other = np.exp((quality - p_own) / mu), np.exp((quality - p_other) / mu)
    return (p_own - cost) * e_own / (e_own + e_other + 1.0)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "noisy"
    summary = collect(scenario(), steps=6, out=out, chunk=4, noise=0.3)
    return out, summary


def test_collect_records_market_transitions(noisy):
    out, summary = noisy
    ds = load_dataset(out)
    assert summary["rows"] == {"seller": 12, "rival": 12} and len(ds) == 12
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["rows"] for c in manifest["groups"]["seller"]["chunks"]] == [8, 4]   # 4 + 2 steps
    assert not list(out.parent.glob("noisy.partial*"))
    rival = load_dataset(out, "rival")
    key = lambda d: np.lexsort((d["stream"], d["step"]))
    s, r = ds.take(key(ds)), rival.take(key(rival))
    np.testing.assert_array_equal(s["step"], np.repeat(np.arange(6), 2))
    # the reward is the logit profit at the two quoted prices
    np.testing.assert_allclose(s["rewards"], logit_profit(s["actions"][:, 0], r["actions"][:, 0]),
                               rtol=1e-4)
    # observation = (rival's last price, own last price); next_obs is the next row's obs
    for stream in (0, 1):
        rows = s["stream"] == stream
        np.testing.assert_allclose(s["next_observations"][rows][:-1], s["observations"][rows][1:])
        np.testing.assert_allclose(s["observations"][rows][1:, 1], s["actions"][rows][:-1, 0])
    np.testing.assert_allclose(s["observations"][s["step"] == 0], 1.75)   # reset prices
    # the rival undercuts the seller's last price by 0.05 (its scenario learner), within
    # its bounds [1, 2.5]
    later = r["step"] > 0
    np.testing.assert_allclose(r["actions"][later, 0],
                               np.clip(r["observations"][later, 0] - 0.05, 1.0, 2.5), atol=1e-6)
    assert np.isnan(rival["log_probs"]).all() and not ds["terminals"].any()


def test_collect_log_probs_are_the_truncated_gaussian_density(noisy):
    ds = load_dataset(noisy[0])
    # behaviour: constant 1.4 plus noise sigma 0.3, truncated to the bounds [1, 2.5]
    a, b = (1.0 - 1.4) / 0.3, (2.5 - 1.4) / 0.3
    expected = stats.truncnorm.logpdf(ds["actions"][:, 0], a, b, loc=1.4, scale=0.3)
    np.testing.assert_allclose(ds["log_probs"], expected, rtol=1e-4, atol=1e-4)
    assert ds["actions"].min() >= 1.0 and ds["actions"].max() <= 2.5
    assert ds["actions"].std() > 0.1


def test_collect_grid_behaviour_has_exact_propensities(tmp_path):
    collect(scenario(), steps=30, out=tmp_path / "g", grid=4, epsilon=0.4)
    ds = load_dataset(tmp_path / "g")
    values = np.asarray(ds.meta["action_values"])
    np.testing.assert_allclose(values[:, 0], [1.0, 1.5, 2.0, 2.5])
    np.testing.assert_allclose(ds["actions"], values[ds["action_index"]])
    greedy = 1    # the heuristic's 1.4 is nearest to grid point 1.5
    probs = np.where(ds["action_index"] == greedy, 0.6 + 0.4 / 4, 0.4 / 4)
    np.testing.assert_allclose(np.exp(ds["log_probs"]), probs, rtol=1e-6)
    # the greedy action's frequency is near its propensity 0.7 (60 draws)
    assert abs((ds["action_index"] == greedy).mean() - 0.7) < 4 * np.sqrt(0.7 * 0.3 / 60)


def test_collect_capacity_keeps_a_reservoir_sample(tmp_path):
    summary = collect(scenario(), steps=20, out=tmp_path / "r", capacity=15, chunk=8)
    ds = load_dataset(tmp_path / "r")
    assert len(ds) == 15 and summary["offered"]["seller"] == 40
    pairs = {(int(a), int(b)) for a, b in zip(ds["stream"], ds["step"])}
    assert len(pairs) == 15 and all(0 <= b < 20 for _, b in pairs)


def test_d4rl_round_trip_keeps_episode_boundaries(tmp_path):
    collect(scenario(), steps=7, out=tmp_path / "e", noise=0.2,
            overrides=["market.episode_length=3"])
    ds = load_dataset(tmp_path / "e")
    assert ds["timeouts"].sum() == 2 * 2          # steps 3 and 6 of both markets end episodes
    eps = ds.episodes()
    assert sorted(len(e) for e in eps) == [1, 1, 3, 3, 3, 3]
    for e in eps:   # one market's consecutive steps
        assert len(set(ds["stream"][e])) == 1
        np.testing.assert_array_equal(ds["step"][e], np.arange(len(e)))
        np.testing.assert_allclose(ds["next_observations"][e][:-1], ds["observations"][e][1:])
    save_d4rl(ds, tmp_path / "e.hdf5")
    back = load_d4rl(tmp_path / "e.hdf5")
    assert len(back) == len(ds)
    got = back.episodes()
    assert [len(e) for e in got] == [len(e) for e in eps]
    for e_src, e_back in zip(eps, got):
        for name in ("observations", "actions", "rewards", "next_observations", "log_probs"):
            np.testing.assert_array_equal(back[name][e_back], ds[name][e_src])
        np.testing.assert_array_equal(back["step"][e_back], np.arange(len(e_back)))


def test_d4rl_file_without_next_observations(tmp_path):
    # 2 episodes: rows 0-2 end in a terminal, rows 3-5 are cut by a timeout
    obs = np.arange(6, dtype=np.float32)[:, None]
    with h5py.File(tmp_path / "d.hdf5", "w") as f:
        f["observations"] = obs
        f["actions"] = np.ones((6, 1), np.float32)
        f["rewards"] = np.arange(6, dtype=np.float32)
        f["terminals"] = np.array([0, 0, 1, 0, 0, 0], bool)
        f["timeouts"] = np.array([0, 0, 0, 0, 0, 1], bool)
    ds = load_d4rl(tmp_path / "d.hdf5")
    # the timeout row has no next observation in the file: dropped (d4rl's qlearning_dataset)
    np.testing.assert_array_equal(ds["rewards"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(ds["next_observations"][:, 0], [1, 2, 2, 4, 5])
    np.testing.assert_array_equal(ds["episode"], [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(ds["step"], [0, 1, 2, 0, 1])
    assert [list(e) for e in ds.episodes()] == [[0, 1, 2], [3, 4]]


def test_truncated_or_corrupt_files_are_one_clear_error(noisy, tmp_path):
    import shutil
    src = tmp_path / "copy"
    shutil.copytree(noisy[0], src)
    chunk = src / "seller" / "rewards.00001.npy"
    chunk.write_bytes(chunk.read_bytes()[:-5])            # truncated
    with pytest.raises(ConfigError, match="rewards.00001.npy.*corrupt or truncated"):
        load_dataset(src)
    with pytest.raises(ConfigError, match="readable .npy"):
        load_dataset(src, verify=False)
    (src / "manifest.json").write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON manifest"):
        load_dataset(src)
    (tmp_path / "bad.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(ConfigError, match="corrupt or truncated"):
        load_d4rl(tmp_path / "bad.hdf5")
    with pytest.raises(ConfigError, match="at least one transition"):
        make_dataset(np.zeros((0, 2)), np.zeros((0, 1)), np.zeros(0))


def test_a_failed_collect_leaves_no_files(tmp_path, monkeypatch):
    calls = []

    def failing_write(self, group, fields):
        calls.append(group)
        if len(calls) > 2:
            raise RuntimeError("disk full")
        return original(self, group, fields)

    original = DatasetWriter.write
    monkeypatch.setattr(DatasetWriter, "write", failing_write)
    with pytest.raises(RuntimeError):
        collect(scenario(), steps=6, out=tmp_path / "x", chunk=2)
    assert list(tmp_path.iterdir()) == []


def test_collect_cli_bad_input_exits_2(tmp_path, capsys):
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.collect import main
    code = run_cli(main, ["--config", str(SCENARIO), "--steps", "5",
                          "--out", str(tmp_path / "o"), "--noise", "-1"])
    assert code == 2
    assert capsys.readouterr().err.strip() == ("config error: --noise: got -1.0; allowed: "
                                               "a number > 0")
    assert list(tmp_path.iterdir()) == []


def test_minari_round_trip_with_minaris_own_api(noisy, tmp_path, monkeypatch):
    import minari

    from jaxmarket.offline.minari_io import load_minari, save_minari
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    ds = load_dataset(noisy[0])
    save_minari(ds, "jaxmarket/duopoly/seller-v0")
    md = minari.load_dataset("jaxmarket/duopoly/seller-v0")      # read by Minari itself
    assert md.total_episodes == 2 and md.total_steps == 12        # one episode per market
    ep = next(md.iterate_episodes())
    assert ep.observations.shape == (7, 2) and ep.actions.shape == (6, 1)
    assert list(ep.truncations) == [False] * 5 + [True]
    back = load_minari("jaxmarket/duopoly/seller-v0")
    for a, b in zip(ds.episodes(), back.episodes()):
        for name in ("observations", "actions", "rewards", "next_observations", "log_probs",
                     "stream", "step"):
            np.testing.assert_array_equal(back[name][b], ds[name][a])
    with pytest.raises(ConfigError, match="not used locally"):
        save_minari(ds, "jaxmarket/duopoly/seller-v0")


def test_collect_policy_needs_a_checkpointed_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError, match="--policy: .*a run directory holding config.yaml"):
        collect(policy_dir=run, steps=2, out=tmp_path / "o")
    (run / "config.yaml").write_text(yaml.safe_dump(scenario()))
    with pytest.raises(ConfigError, match="--policy: .*a run with at least one checkpoint"):
        collect(policy_dir=run, steps=2, out=tmp_path / "o")
    assert not (tmp_path / "o").exists() and sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_collect_refuses_league_opponents_and_records_a_poi_bonus_scenario(tmp_path):
    """collect calls the learners' act alone: a league's frozen opponents (a training-loop
    component) cannot be played, a config error naming it; a POI model that only shapes
    rewards (no POI observations) changes nothing collect records, so that scenario runs."""
    root = Path(__file__).resolve().parents[1] / "configs"
    with pytest.raises(ConfigError) as err:
        collect(str(root / "league.yaml"), steps=2, out=tmp_path / "league")
    assert err.value.field == "learners" and err.value.value == "league"
    assert not (tmp_path / "league").exists()
    summary = collect(str(root / "poi_demand.yaml"), steps=2, out=tmp_path / "poi",
                      overrides=["train.num_envs=1", "train.num_seeds=1"])
    ds = load_dataset(tmp_path / "poi")
    assert summary["rows"] and len(ds) > 0
    assert np.all(np.isfinite(np.asarray(ds["rewards"])))
