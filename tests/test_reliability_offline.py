"""Reliability of the native offline dataset format (docs/reliability.md, "Offline
datasets"): a saved dataset is corrupted one way at a time and loading it must be one
DatasetError (a ConfigError, so a ValueError) naming the file, the key and what is
expected; an intact dataset loads exactly what was written.

The dataset is real: DatasetWriter (the writer collect uses) streams 4 chunks of 400 rows
of two groups."""

import json
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import DatasetError, load_dataset, make_dataset, save_d4rl
from jaxmarket.offline.dataset import DatasetWriter, read_manifest

CHUNKS, ROWS = 4, 400


def arrays(seed):
    """Every field of a dataset: 1600 rows, 4 streams of 400 steps."""
    rng = np.random.default_rng(seed)
    n = CHUNKS * ROWS
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    return {
        "observations": obs, "next_observations": obs + 1, "actions":
        rng.uniform(1, 2, size=(n, 1)).astype(np.float32),
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminals": np.zeros(n, bool), "timeouts": np.arange(n) % ROWS == ROWS - 1,
        "log_probs": np.where(np.arange(n) % 3 == 0, np.nan, -1.5).astype(np.float32),
        "stream": (np.arange(n) // ROWS).astype(np.int32), "episode": np.zeros(n, np.int32),
        "step": (np.arange(n) % ROWS).astype(np.int32),
        "info/prices": rng.uniform(1, 2, size=(n, 1)).astype(np.float32),
    }


META = {"seller": {"group": "seller", "obs_dim": 2, "action_dim": 1, "action_low": [1.0],
                   "action_high": [2.0], "discrete": False},
        "rival": {"group": "rival", "obs_dim": 2, "action_dim": 1, "action_low": [1.0],
                  "action_high": [2.0], "discrete": False}}
DATA = {"seller": arrays(0), "rival": arrays(1)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "intact"
    with DatasetWriter(out, META, {"primary": "seller"}) as w:
        for c in range(CHUNKS):
            for g in META:
                w.write(g, {k: v[c * ROWS:(c + 1) * ROWS] for k, v in DATA[g].items()})
    return out


@pytest.fixture
def ds_dir(written, tmp_path):
    """A fresh copy of the written dataset, inside tmp_path/work (tmp_path is 'outside')."""
    dst = tmp_path / "work" / "data"
    shutil.copytree(written, dst)
    return dst


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def save_manifest(d, m):
    (d / "manifest.json").write_text(json.dumps(m))


def crc(path):
    return zlib.crc32(Path(path).read_bytes())


def refused(d, *parts, **kw):
    """load_dataset(d) raises a DatasetError whose message holds every part, in order."""
    with pytest.raises(DatasetError) as info:
        load_dataset(d, **kw)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, ValueError)
    msg = str(err)
    pos = 0
    for part in parts:
        found = msg.find(part, pos)
        assert found >= 0, f"{part!r} not after position {pos} in {msg!r}"
        pos = found + len(part)
    return msg


def test_an_intact_dataset_loads_exactly_what_was_written(written):
    for group, meta in META.items():
        ds = load_dataset(written, group)
        assert sorted(ds.fields) == sorted(DATA[group])
        for name, value in DATA[group].items():
            np.testing.assert_array_equal(np.asarray(ds[name]), value)   # NaN == NaN here
            assert ds[name].dtype == value.dtype
        assert ds.meta == meta
    assert load_dataset(written).meta["group"] == "seller"   # the primary group
    m = read_manifest(written)
    assert m["version"] == 2 and m["groups"]["seller"]["rows"] == CHUNKS * ROWS


def test_a_version_1_manifest_still_loads(ds_dir):
    m = manifest(ds_dir)
    m["version"] = 1
    for g in m["groups"].values():
        del g["rows"]
    save_manifest(ds_dir, m)
    np.testing.assert_array_equal(load_dataset(ds_dir)["rewards"], DATA["seller"]["rewards"])


SCHEMA_CASES = {
    # name: (edit of the manifest, the key named, what is expected)
    "a JSON list": (lambda m: [m], "<top level>", "a JSON object with format, version and groups"),
    "no groups": (lambda m: m.pop("groups"), "groups: got '<missing>'", "an object {group"),
    "groups not an object": (lambda m: m.update(groups=["seller"]), "groups: got ['seller']",
                             "an object {group"),
    "no meta": (lambda m: m["groups"]["seller"].pop("meta"),
                "groups.seller.meta: got '<missing>'", "an object (the group's metadata)"),
    "no crc32": (lambda m: m["groups"]["seller"]["chunks"][1]["files"]["rewards"].pop("crc32"),
                 "groups.seller.chunks[1].files.rewards.crc32: got '<missing>'",
                 "an integer in [0, 2**32)"),
    "crc32 a string": (lambda m: m["groups"]["rival"]["chunks"][0]["files"]["actions"]
                       .update(crc32="123"),
                       "groups.rival.chunks[0].files.actions.crc32: got '123'", "an integer"),
    "no path": (lambda m: m["groups"]["seller"]["chunks"][2]["files"]["step"].pop("path"),
                "groups.seller.chunks[2].files.step.path: got '<missing>'", "a relative path"),
    "chunk rows negative": (lambda m: m["groups"]["seller"]["chunks"][0].update(rows=-1),
                            "groups.seller.chunks[0].rows: got -1", "an integer >= 0"),
    "chunk rows a bool": (lambda m: m["groups"]["seller"]["chunks"][0].update(rows=True),
                          "groups.seller.chunks[0].rows: got True", "an integer >= 0"),
    "group rows missing (version 2)": (lambda m: m["groups"]["seller"].pop("rows"),
                                       "groups.seller.rows: got '<missing>'", "an integer >= 0"),
    "a field without a file": (lambda m: m["groups"]["seller"]["chunks"][3]["files"]
                               .pop("info/prices"),
                               "groups.seller.chunks[3].files.info/prices: got '<missing>'",
                               "a file for every field of groups.seller.fields"),
    "a file without a field": (lambda m: m["groups"]["seller"]["fields"].pop("log_probs"),
                               "groups.seller.chunks[0].files: got 'log_probs'",
                               "only the fields of groups.seller.fields"),
    "chunks not a list": (lambda m: m["groups"]["seller"].update(chunks={}),
                          "groups.seller.chunks: got {}", "a list of chunks"),
    "a bad dtype": (lambda m: m["groups"]["seller"]["fields"]["rewards"].update(dtype="|O"),
                    "groups.seller.fields.rewards.dtype: got '|O'", "a numeric or bool"),
    "a bad shape": (lambda m: m["groups"]["seller"]["fields"]["actions"].update(shape=[-1]),
                    "groups.seller.fields.actions.shape: got [-1]", "a list of integers >= 0"),
    "an unknown primary": (lambda m: m.update(primary="buyer"), "primary: got 'buyer'",
                           "null or one of the groups seller, rival"),
    "a wrong format": (lambda m: m.update(format="other"), "format: got 'other'",
                       "'jaxmarket-offline'"),
    "an unknown version": (lambda m: m.update(version=3), "version: got 3", "1 or 2"),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_a_manifest_breaking_the_schema_is_one_clear_error(ds_dir, case):
    edit, key, expected = SCHEMA_CASES[case]
    m = manifest(ds_dir)
    new = edit(m)
    save_manifest(ds_dir, new if isinstance(new, list) else m)
    refused(ds_dir, str(ds_dir / "manifest.json") + ": ", key, "; allowed: ", expected)


def test_a_chunk_listed_twice_is_refused(ds_dir):
    m = manifest(ds_dir)
    chunks = m["groups"]["seller"]["chunks"]
    chunks.insert(2, dict(chunks[1]))          # 5 entries, 2000 rows of 1600
    save_manifest(ds_dir, m)
    refused(ds_dir, "groups.seller.chunks[2].files.observations.path: got "
            "'seller/observations.00001.npy'", "a file listed once (it is also "
            "groups.seller.chunks[1].files.observations.path")
    # also when the total is raised to match: the duplicate file is still refused
    m["groups"]["seller"]["rows"] += ROWS
    save_manifest(ds_dir, m)
    refused(ds_dir, "groups.seller.chunks[2]", "a file listed once")


def test_a_removed_chunk_entry_is_refused(ds_dir):
    m = manifest(ds_dir)
    del m["groups"]["seller"]["chunks"][2]     # 1200 rows of 1600
    save_manifest(ds_dir, m)
    refused(ds_dir, "manifest.json: groups.seller.chunks: got '3 chunks of 1200 rows in all'",
            "chunks adding up to groups.seller.rows = 1600")
    # the manifest is checked as a whole: its other, intact group is refused too
    refused(ds_dir, "groups.seller.chunks: got '3 chunks", group="rival")


def test_a_removed_chunk_entry_of_a_version_1_manifest_is_refused(ds_dir):
    m = manifest(ds_dir)
    m["version"] = 1
    for g in m["groups"].values():
        del g["rows"]
    del m["groups"]["seller"]["chunks"][3]
    save_manifest(ds_dir, m)
    refused(ds_dir, "groups.seller.chunks: got 'no entry for seller/", ".00003.npy'",
            "an entry for every chunk file of the group")


def outside_copy(ds_dir, rel):
    """A byte copy of the chunk file ``rel`` two directories above the dataset (its CRC
    matches the manifest, so only the path rule can refuse it)."""
    outside = ds_dir.parent.parent / "outside.npy"
    shutil.copy(ds_dir / rel, outside)
    return outside


def test_a_chunk_path_leaving_the_directory_is_refused(ds_dir):
    m = manifest(ds_dir)
    f = m["groups"]["seller"]["chunks"][0]["files"]["rewards"]
    outside_copy(ds_dir, f["path"])
    f["path"] = "../../outside.npy"
    save_manifest(ds_dir, m)
    refused(ds_dir, "groups.seller.chunks[0].files.rewards.path: got '../../outside.npy'",
            f"a relative path inside the dataset directory {ds_dir}")
    # '..' that comes back inside is refused too: no '..' at all
    f["path"] = "seller/../seller/rewards.00000.npy"
    save_manifest(ds_dir, m)
    refused(ds_dir, "rewards.path: got 'seller/../seller/rewards.00000.npy'", "no '..'")


def test_an_absolute_chunk_path_is_refused(ds_dir):
    m = manifest(ds_dir)
    f = m["groups"]["seller"]["chunks"][0]["files"]["rewards"]
    f["path"] = str(outside_copy(ds_dir, f["path"]))    # absolute, valid file, CRC matches
    save_manifest(ds_dir, m)
    refused(ds_dir, f"rewards.path: got '{f['path']}'", "no absolute path")


def test_a_symlink_leaving_the_directory_is_refused(ds_dir):
    rel = "seller/rewards.00001.npy"
    outside = outside_copy(ds_dir, rel)
    (ds_dir / rel).unlink()
    os.symlink(outside, ds_dir / rel)               # same bytes, the CRC matches
    refused(ds_dir, f"groups.seller.chunks[1].files.rewards.path: got '{rel}'",
            "no symlink leading out of it", f"it resolves to {outside}")


def test_a_symlink_inside_the_directory_is_accepted(ds_dir):
    rel = "seller/rewards.00001.npy"
    shutil.move(ds_dir / rel, ds_dir / "moved.npy.keep")
    os.symlink(ds_dir / "moved.npy.keep", ds_dir / rel)
    np.testing.assert_array_equal(load_dataset(ds_dir)["rewards"], DATA["seller"]["rewards"])


def replace_chunk(ds_dir, group, field, chunk, change):
    """Rewrite one chunk file with ``change(array)`` and give the manifest its new CRC-32
    (a consistent dataset whose numbers are bad)."""
    m = manifest(ds_dir)
    f = m["groups"][group]["chunks"][chunk]["files"][field]
    arr = np.load(ds_dir / f["path"]).copy()
    change(arr)
    np.save(ds_dir / f["path"], arr, allow_pickle=False)
    f["crc32"] = crc(ds_dir / f["path"])
    save_manifest(ds_dir, m)
    return ds_dir / f["path"]


def test_nan_data_with_a_matching_crc_is_refused_unless_allowed(ds_dir):
    file = replace_chunk(ds_dir, "seller", "rewards", 2, lambda a: a.__setitem__(7, np.nan))
    refused(ds_dir, f"{file}: rewards[{2 * ROWS + 7}]: got nan", "allowed: finite numbers",
            "allow_nonfinite=True")
    ds = load_dataset(ds_dir, allow_nonfinite=True)
    assert np.isnan(ds["rewards"][2 * ROWS + 7])
    assert np.isnan(ds["rewards"]).sum() == 1


def test_infinite_observations_are_refused(ds_dir):
    file = replace_chunk(ds_dir, "rival", "next_observations", 0,
                         lambda a: a.__setitem__((5, 1), -np.inf))
    refused(ds_dir, f"{file}: next_observations[5]: got -inf", "finite numbers", group="rival")
    assert len(load_dataset(ds_dir, "seller")) == CHUNKS * ROWS   # its data is fine


def test_log_probs_may_be_nan_but_not_infinite(ds_dir):
    # the intact data already holds NaN log-probs (unknown behaviour): they load
    assert np.isnan(load_dataset(ds_dir)["log_probs"]).sum() == -(-CHUNKS * ROWS // 3)
    file = replace_chunk(ds_dir, "seller", "log_probs", 1, lambda a: a.__setitem__(1, np.inf))
    refused(ds_dir, f"{file}: log_probs[{ROWS + 1}]: got inf",
            "finite numbers or NaN (unknown)")


def test_nonfinite_d4rl_data_is_refused_unless_allowed(tmp_path):
    rewards = np.arange(10, dtype=np.float32)
    rewards[4] = np.nan
    ds = make_dataset(np.zeros((10, 2)), np.ones((10, 1)), rewards,
                      timeouts=np.arange(10) == 9)
    save_d4rl(ds, tmp_path / "d.hdf5")
    refused(tmp_path / "d.hdf5", f"{tmp_path / 'd.hdf5'}: rewards[4]: got nan")
    assert np.isnan(load_dataset(tmp_path / "d.hdf5", allow_nonfinite=True)["rewards"][4])


def test_the_offline_cli_reports_a_corrupt_manifest_in_one_line(ds_dir, tmp_path, capsys):
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.offline import main
    m = manifest(ds_dir)
    del m["groups"]["seller"]["chunks"][0]["files"]["rewards"]["crc32"]
    save_manifest(ds_dir, m)
    code = run_cli(main, ["--dataset", str(ds_dir), "--algo", "bc",
                          "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "groups.seller.chunks[0].files.rewards.crc32: got '<missing>'" in err
