"""Reliability of the native offline dataset format (docs/reliability.md, "Offline
datasets"): a saved dataset is corrupted one way at a time and loading it must be one
DatasetError (a ConfigError, so a ValueError) naming the file, the key and what is
expected; an intact dataset loads exactly what was written.

The dataset is real: DatasetWriter (the writer collect uses) streams 4 chunks of 400 rows
of two groups."""

import errno
import importlib
import json
import os
import shutil
import zlib
from pathlib import Path

import jax
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
    return in_order(str(err), parts)


def in_order(msg, parts):
    """``msg``, asserting it holds every one of ``parts``, in that order."""
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
    # the metadata a loader needs, typed and bounded
    "action_dim a string": (lambda m: m["groups"]["seller"]["meta"].update(action_dim="1"),
                            "groups.seller.meta.action_dim: got '1'", "an integer in [1, "),
    "no action_low": (lambda m: m["groups"]["seller"]["meta"].__delitem__("action_low"),
                      "groups.seller.meta.action_low: got '<missing>'", "(required)"),
    "no action_high": (lambda m: m["groups"]["rival"]["meta"].__delitem__("action_high"),
                       "groups.rival.meta.action_high: got '<missing>'", "(required)"),
    "action_low of the wrong length": (lambda m: m["groups"]["seller"]["meta"]
                                       .update(action_low=[1.0, 1.0]),
                                       "groups.seller.meta.action_low: got [1.0, 1.0]",
                                       "a list of 1 finite numbers"),
    "action_low above action_high": (lambda m: m["groups"]["seller"]["meta"]
                                     .update(action_low=[3.0]),
                                     "groups.seller.meta.action_high: got [2.0]",
                                     "bounds >= groups.seller.meta.action_low"),
    "a NaN bound": (lambda m: m["groups"]["seller"]["meta"].update(action_high=[float("nan")]),
                    "groups.seller.meta.action_high: got [nan]", "a list of finite numbers"),
    "obs_dim negative": (lambda m: m["groups"]["seller"]["meta"].update(obs_dim=-2),
                         "groups.seller.meta.obs_dim: got -2", "an integer in [0, "),
    "discrete a string": (lambda m: m["groups"]["seller"]["meta"].update(discrete="false"),
                          "groups.seller.meta.discrete: got 'false'", "true or false"),
    "discrete without a grid": (lambda m: m["groups"]["seller"]["meta"].update(discrete=True),
                                "groups.seller.meta.action_values: got '<missing>'",
                                "(required in a discrete dataset)"),
    "observations not obs_dim wide": (lambda m: m["groups"]["seller"]["fields"]
                                      ["observations"].update(shape=[3]),
                                      "groups.seller.fields.observations.shape: got [3]",
                                      "[2] (groups.seller.meta.obs_dim)"),
    "a core field missing": (lambda m: m["groups"]["seller"]["fields"].pop("terminals"),
                             "groups.seller.fields.terminals: got '<missing>'",
                             "the fields observations, next_observations, actions"),
    "primary a list": (lambda m: m.update(primary=["seller"]), "primary: got ['seller']",
                       "null or a group name"),
    "steps a string": (lambda m: m.update(steps="200"), "steps: got '200'",
                       "null or an integer in [1, "),
    "config a list": (lambda m: m.update(config=[1]), "config: got [1]", "null or an object"),
    "chunk rows past 2**53": (lambda m: m["groups"]["seller"]["chunks"][0].update(rows=2**60),
                              f"groups.seller.chunks[0].rows: got {2**60}", "(2**53 - 1)"),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_a_manifest_breaking_the_schema_is_one_clear_error(ds_dir, case):
    edit, key, expected = SCHEMA_CASES[case]
    m = manifest(ds_dir)
    new = edit(m)
    save_manifest(ds_dir, new if isinstance(new, list) else m)
    msg = refused(ds_dir, str(ds_dir / "manifest.json") + ": ", key, "; allowed: ", expected)
    assert "\n" not in msg


def test_a_group_name_with_a_line_break_still_gives_one_line(ds_dir):
    m = manifest(ds_dir)
    m["groups"]["sel\nler"] = m["groups"].pop("seller")
    m["groups"]["sel\nler"]["meta"]["action_dim"] = "1"
    m["primary"] = "rival"
    save_manifest(ds_dir, m)
    msg = refused(ds_dir, "groups.'sel\\nler'.meta.action_dim: got '1'")
    assert "\n" not in msg


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


# ------------------------------------------------------------------ paths, before any open

def loop(ds_dir, rel):
    """``rel`` becomes a symlink to itself."""
    (ds_dir / rel).unlink()
    os.symlink(ds_dir / rel, ds_dir / rel)


def two_loop(ds_dir, rel):
    """``rel`` -> ``a`` -> ``rel``, ``rel`` itself gone."""
    (ds_dir / rel).unlink()
    os.symlink(ds_dir / "a", ds_dir / rel)
    os.symlink(ds_dir / rel, ds_dir / "a")


def fifo(ds_dir, rel):
    """A named pipe in place of the chunk (opening it for reading would block)."""
    (ds_dir / rel).unlink()
    os.mkfifo(ds_dir / rel)


def directory(ds_dir, rel):
    (ds_dir / rel).unlink()
    (ds_dir / rel).mkdir()


PATH_CASES = {
    # name: (new path in the manifest, or a change on disk; what the error says)
    "a NUL byte": ("seller/rew\0ards.00001.npy", "it holds a NUL byte"),
    "an over-long name": ("seller/" + "r" * 300 + ".npy",
                          "a name of 304 bytes is longer than the file system allows"),
    "an over-long path": ("/".join(["d" * 200] * 30) + "/x.npy",
                          "bytes long, the file system allows"),
    "a symlink to itself": (loop, "it is a symlink loop"),
    "a loop of two symlinks": (two_loop, "it is a symlink loop"),
    "a FIFO": (fifo, "it is not a regular file"),
    "a directory": (directory, "it is a directory"),
}


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_a_bad_chunk_path_is_one_clear_error_before_any_open(ds_dir, case, monkeypatch):
    change, reason = PATH_CASES[case]
    rel = "seller/rewards.00001.npy"
    if callable(change):
        change(ds_dir, rel)
        shown = rel
    else:
        m = manifest(ds_dir)
        m["groups"]["seller"]["chunks"][1]["files"]["rewards"]["path"] = change
        save_manifest(ds_dir, m)
        shown = repr(change)[1:40]
    opened = []
    real_open = open

    def watch(file, *a, **kw):   # no chunk file may be opened before the refusal
        if str(file).endswith(".npy") or "\0" in str(file):
            opened.append(file)
        return real_open(file, *a, **kw)

    monkeypatch.setattr("builtins.open", watch)
    monkeypatch.setattr("io.open", watch)     # Path.open
    msg = refused(ds_dir, "groups.seller.chunks[1].files.rewards.path: got ", shown,
                  "a relative path inside the dataset directory", reason)
    assert "\n" not in msg and opened == []


def test_a_manifest_symlinked_out_of_the_dataset_is_refused(ds_dir):
    outside = ds_dir.parent.parent / "manifest.json"
    shutil.move(ds_dir / "manifest.json", outside)
    os.symlink(outside, ds_dir / "manifest.json")
    refused(ds_dir, f"--dataset: got '{ds_dir / 'manifest.json'}'", "a regular file inside",
            f"it resolves to {outside}")
    # a symlink to a manifest inside the directory is followed
    (ds_dir / "manifest.json").unlink()
    shutil.move(outside, ds_dir / "manifest.keep")
    os.symlink(ds_dir / "manifest.keep", ds_dir / "manifest.json")
    assert len(load_dataset(ds_dir)) == CHUNKS * ROWS


def test_a_manifest_symlink_loop_is_refused(ds_dir):
    (ds_dir / "manifest.json").unlink()
    os.symlink(ds_dir / "manifest.json", ds_dir / "manifest.json")
    refused(ds_dir, "manifest.json'", "it is a symlink loop")


def test_a_dataset_path_with_a_nul_byte_or_too_long_is_one_clear_error(tmp_path):
    refused(tmp_path / "da\0ta", "--dataset: got ", "it holds a NUL byte")
    refused(tmp_path / ("d" * 300), "--dataset: got ", "longer than the file system allows")
    refused(tmp_path.joinpath(*["d" * 200] * 30), "--dataset: got ", "bytes long")


def test_huge_or_deep_json_in_a_manifest_is_one_clear_error(ds_dir):
    (ds_dir / "manifest.json").write_text('{"rows": ' + "9" * 5000 + "}")
    refused(ds_dir, "manifest.json'", "a valid JSON manifest")
    (ds_dir / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(ds_dir, "manifest.json'", "a valid JSON manifest")


CLI_CASES = {
    "action_dim a string": (lambda d: edit(d, lambda m: m["groups"]["seller"]["meta"]
                                           .update(action_dim="1")),
                            "groups.seller.meta.action_dim: got '1'"),
    "primary a list": (lambda d: edit(d, lambda m: m.update(primary=["seller"])),
                       "primary: got ['seller']"),
    "a NUL byte": (lambda d: edit(d, lambda m: m["groups"]["seller"]["chunks"][0]["files"]
                                  ["rewards"].update(path="a\0b")), "it holds a NUL byte"),
    "a symlink loop": (lambda d: loop(d, "seller/rewards.00001.npy"), "it is a symlink loop"),
    "a manifest symlinked out": (lambda d: (shutil.move(d / "manifest.json", d.parent.parent
                                                        / "m.json"),
                                            os.symlink(d.parent.parent / "m.json",
                                                       d / "manifest.json")),
                                 "it resolves to"),
}


def edit(d, change):
    m = manifest(d)
    change(m)
    save_manifest(d, m)


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_offline_cli_reports_each_bad_dataset_in_one_line(ds_dir, tmp_path, capsys, case):
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.offline import main
    change, part = CLI_CASES[case]
    change(ds_dir)
    code = run_cli(main, ["--dataset", str(ds_dir), "--algo", "bc",
                          "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("config error: ")
    assert part in err
    assert not (tmp_path / "r").exists()


def test_collect_refuses_an_out_path_it_cannot_create_in_one_line(tmp_path, capsys):
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.collect import main
    for out, part in ((tmp_path / ("o" * 250), "longer than the file system allows"),
                      (tmp_path.joinpath(*["d" * 200] * 30), "bytes long")):
        code = run_cli(main, ["--config", str(SCENARIO), "--steps", "5", "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1
        assert err.startswith("config error: --out: got ") and part in err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ storage faults

SCENARIO = Path(__file__).resolve().parents[1] / "benchmarks" / "offline_duopoly.yaml"
ERRNOS = {"ENOSPC": "No space left on device", "EROFS": "Read-only file system",
          "EACCES": "Permission denied"}


def fault(code, path=None):
    return OSError(getattr(errno, code), os.strerror(getattr(errno, code)),
                   *([str(path)] if path is not None else []))


def one_line(err, *parts):
    msg = str(err)
    assert "\n" not in msg, msg
    return in_order(msg, parts)


def test_a_storage_fault_while_collecting_is_one_line_and_leaves_nothing(tmp_path, capsys,
                                                                          monkeypatch):
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.collect import main
    saves = []
    real_save = np.save

    def save(file, arr, **kw):   # the fourth chunk file written: the disk is full
        saves.append(file)
        if len(saves) == 4:
            raise fault("ENOSPC")
        return real_save(file, arr, **kw)

    monkeypatch.setattr(np, "save", save)
    out = tmp_path / "d"
    code = run_cli(main, ["--config", str(SCENARIO), "--steps", "4", "--chunk", "2",
                          "--out", str(out), "train.num_envs=2"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    one_line(err, "storage error while writing chunk 0 of group seller: No space left on "
             "device (errno ENOSPC): ", f"{out}.partial-", str(saves[3])[-20:],
             f"; kept: nothing: the partial dataset {out}.partial-", "was removed",
             "free space or fix the permissions")
    assert list(tmp_path.iterdir()) == []          # no partial directory, no lock


WRITER_FAULTS = {
    # name: (owner, the write call, errno, what the line names, calls that succeed first)
    "a chunk file": (np, "save", "ENOSPC", "writing chunk 1 of group rival: ",
                     3 * len(DATA["rival"])),
    "the manifest": (Path, "write_text", "EROFS", "writing the manifest: ", 0),
}


@pytest.mark.parametrize("case", list(WRITER_FAULTS))
def test_a_storage_fault_of_the_dataset_writer_is_one_line_and_leaves_nothing(
        tmp_path, monkeypatch, case):
    from jaxmarket.train.rundir import StorageError
    owner, name, code, what, after = WRITER_FAULTS[case]
    real, calls = getattr(owner, name), []

    def failing(*a, **kw):
        calls.append(a)
        if len(calls) > after:
            raise fault(code)
        return real(*a, **kw)

    out = tmp_path / "out"
    w = DatasetWriter(out, META, {"primary": "seller"})
    monkeypatch.setattr(owner, name, failing)
    with pytest.raises(StorageError) as info, w:
        for c in range(2):
            for g in META:
                w.write(g, {k: v[c * ROWS:(c + 1) * ROWS] for k, v in DATA[g].items()})
    monkeypatch.undo()
    one_line(info.value, f"storage error while {what}", ERRNOS[code], f"{out}.partial-",
             f"; kept: nothing: the partial dataset {out}.partial-", f"was removed and {out} "
             "was not written", "free space or fix the permissions")
    assert list(tmp_path.iterdir()) == []


def test_a_storage_fault_creating_the_partial_directory_is_one_line(tmp_path, monkeypatch):
    from jaxmarket.train.rundir import StorageError

    def mkdir(self, *a, **kw):
        raise fault("EACCES", self)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(StorageError) as info:
        DatasetWriter(tmp_path / "out", META)
    monkeypatch.undo()
    one_line(info.value, "storage error while creating the dataset directory",
             "Permission denied (errno EACCES): ", f"{tmp_path / 'out'}.partial-",
             "; kept: nothing (nothing was written)")
    assert list(tmp_path.iterdir()) == []


def small_dataset():
    return make_dataset(np.zeros((10, 2)), np.ones((10, 1)), np.arange(10.0),
                        timeouts=np.arange(10) == 9,
                        meta={"action_low": [0.0], "action_high": [2.0]})


@pytest.mark.parametrize("style", ["errno", "h5py message"])
def test_a_storage_fault_writing_a_d4rl_file_is_one_line_and_keeps_the_old_file(
        tmp_path, monkeypatch, style):
    import h5py

    from jaxmarket.train.rundir import StorageError
    target = tmp_path / "d.hdf5"
    target.write_bytes(b"the previous export")
    real = h5py.File

    def failing(name, mode="r", **kw):
        f = real(name, mode, **kw)     # the temporary file is created, then the disk fills
        f.close()
        if style == "errno":
            raise fault("ENOSPC", name)
        raise OSError(f"Unable to synchronously create file (file write failed: errno = 28, "
                      f"error message = 'No space left on device', name = '{name}')")

    monkeypatch.setattr(h5py, "File", failing)
    with pytest.raises(StorageError) as info:
        save_d4rl(small_dataset(), target)
    monkeypatch.undo()
    one_line(info.value, f"storage error while writing the D4RL file {target}: ",
             "No space left on device (errno ENOSPC)", f"; kept: {target} as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.hdf5"]
    assert target.read_bytes() == b"the previous export"


def test_a_storage_fault_writing_a_minari_dataset_removes_the_partial_one(tmp_path,
                                                                         monkeypatch):
    import minari

    from jaxmarket.offline.minari_io import save_minari
    from jaxmarket.train.rundir import StorageError
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))

    def failing(dataset_id, *a, **kw):
        where = tmp_path / dataset_id / "data"
        where.mkdir(parents=True)
        (where / "main_data.hdf5").write_bytes(b"partial")
        raise fault("EROFS", where / "main_data.hdf5")

    monkeypatch.setattr(minari, "create_dataset_from_buffers", failing)
    with pytest.raises(StorageError) as info:
        save_minari(small_dataset(), "jaxmarket/test/x-v0", with_env=False)
    one_line(info.value, "storage error while writing the Minari dataset jaxmarket/test/x-v0",
             "Read-only file system (errno EROFS)", "; kept: nothing (the partial Minari "
             f"dataset {tmp_path / 'jaxmarket/test/x-v0'} was removed)")
    assert not (tmp_path / "jaxmarket" / "test" / "x-v0").exists()


def fit_setup():
    from jaxmarket.offline import make_algo
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(128, 2)).astype(np.float32)
    ds = make_dataset(obs, np.tanh(obs[:, :1]), rng.normal(size=128),
                      meta={"action_low": [-1.0], "action_high": [1.0]})
    return make_algo("bc", ds, hidden=[8]), ds


FIT_FAULTS = {
    # name: (patch target, errno, the line's stage)
    "the checkpoint": ("save", "ENOSPC", "saving the checkpoint at update 60"),
    "a metrics row": ("row", "EROFS", "appending the row of update 60 to "),
}


@pytest.mark.parametrize("case", list(FIT_FAULTS))
def test_a_storage_fault_in_an_offline_run_is_one_line_and_resumes_identically(
        tmp_path, monkeypatch, case):
    import orbax.checkpoint as ocp

    from jaxmarket.offline import fit
    fm = importlib.import_module("jaxmarket.offline.fit")   # the module (fit is the function)
    from jaxmarket.train.rundir import StorageError
    algo, ds = fit_setup()
    whole = fit(algo, ds, stop=90, chunk=30, batch_size=16, run_dir=tmp_path / "whole")
    what, code, stage = FIT_FAULTS[case]
    if what == "save":
        real = ocp.CheckpointManager.save

        def save(self, step, *a, **kw):
            if step == 60:
                raise fault(code, self.directory)
            return real(self, step, *a, **kw)

        monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    else:
        real = fm._append_row

        def append(path, row):
            if row["step"] == 60:
                raise fault(code, path)
            return real(path, row)

        monkeypatch.setattr(fm, "_append_row", append)
    run_dir = tmp_path / "r"
    with pytest.raises(StorageError) as info:
        fit(algo, ds, stop=90, chunk=30, batch_size=16, run_dir=run_dir)
    monkeypatch.undo()
    one_line(info.value, f"storage error while {stage}", ERRNOS[code], "; kept: the "
             "checkpoint at update 30 and the metrics.csv rows up to it",
             f"resume with python -m jaxmarket.offline --resume {run_dir}")
    resumed = fit(algo, ds, stop=90, chunk=30, batch_size=16, run_dir=run_dir, resume=True)
    assert resumed.history == whole.history
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (run_dir / "metrics.csv").read_text() == (tmp_path / "whole" / "metrics.csv").read_text()


def test_the_offline_cli_reports_storage_faults_in_one_line(tmp_path, capsys, monkeypatch):
    import jaxmarket.cli.offline as cli
    from jaxmarket.cli import run_cli
    from jaxmarket.offline import save_dataset
    _, ds = fit_setup()
    data = save_dataset(ds, tmp_path / "d")
    args = ["--dataset", str(data), "--algo", "bc", "--steps", "40", "--chunk", "20",
            "--batch-size", "16", "hidden=[8]"]
    real_text = Path.write_text

    def failing_config(self, *a, **kw):   # offline.json cannot be written
        if self.name.startswith("offline.json"):
            raise fault("EACCES", self)
        return real_text(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", failing_config)
    code = run_cli(cli.main, [*args, "--run-dir", str(tmp_path / "r1")])
    monkeypatch.undo()
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    one_line(err, f"storage error while writing {tmp_path / 'r1' / 'offline.json'}",
             "Permission denied (errno EACCES)", "; kept: nothing (nothing was trained)")

    def failing_summary(self, *a, **kw):   # the disk fills when the summary is written
        if self.name.startswith("summary.json"):
            raise fault("ENOSPC", self)
        return real_text(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", failing_summary)
    run_dir = tmp_path / "r2"
    code = run_cli(cli.main, [*args, "--run-dir", str(run_dir)])
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    one_line(err[0], f"storage error while writing {run_dir / 'summary.json'}",
             "No space left on device (errno ENOSPC)", f"; kept: the run in {run_dir}, "
             "trained to update 40", f"python -m jaxmarket.offline --resume {run_dir}")
    assert not (run_dir / "summary.json").exists()
    capsys.readouterr()
    assert run_cli(cli.main, ["--resume", str(run_dir)]) == 0   # writes it
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 40
