"""Readers that trust their input: a session-engine run's ``strategies.npz`` damaged in
every way we know of (truncated, empty, a pickled object, a key missing, an index out of
range or -1, a wrong shape or dtype, NaN in ``q``, a grid or a session count that is not
the run's, changed after publication) is one line naming the file and the key, exit code
1 from ``python -m jaxmarket.impulse``, never a traceback or a silent table
(:func:`jaxmarket.analysis.strategies.read_strategies`). The intact file reads whole and
gives the impulse response replayed here in plain Python.

The damaged files are re-published (their checksum written into ``published.json``) so
that the checks behind the checksum are reached: a file written wrong and published, or
one without a manifest, still meets them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxmarket.analysis.impulse import impulse_response, load_strategies
from jaxmarket.analysis.strategies import read_strategies
from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main as train_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.train.rundir import STRATEGIES_FILE, RunDirError

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["learners.sellers.grid_size=5", "train.num_seeds=3", "train.num_iterations=600",
         "train.chunk_size=300", "train.session_stop=periods",
         "learners.sellers.exploration_decay=0.01"]
KEYS = {"q", "greedy", "last", "converged", "grid", "profit_table", "memory", "p_nash",
        "p_monopoly", "pi_nash", "pi_monopoly", "lagged"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One small Calvano run on the session engine: 3 sessions, 5 prices, memory 1."""
    run_dir = tmp_path_factory.mktemp("readers") / "run"
    code = run_cli(train_main, [str(ROOT / "configs" / "calvano.yaml"), "--run-dir",
                                str(run_dir), *SMALL])
    assert code == 0 and (run_dir / STRATEGIES_FILE).is_file()
    return run_dir


def arrays_of(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def republish(run_dir: Path) -> None:
    """The damaged file's checksum into ``published.json`` (where the run has one)."""
    manifest = run_dir / "published.json"
    if not manifest.is_file():
        return
    from jaxmarket.train.publish import digest
    m = json.loads(manifest.read_text())
    path = run_dir / STRATEGIES_FILE
    if path.exists():
        m["files"][STRATEGIES_FILE] = {"bytes": path.stat().st_size, "sha256": digest(path)}
    manifest.write_text(json.dumps(m, indent=2) + "\n")


def rewrite(path: Path, change) -> None:
    """``strategies.npz`` rewritten with ``change(arrays)`` applied (it edits in place)."""
    arrays = arrays_of(path)
    change(arrays)
    with path.open("wb") as f:
        np.savez_compressed(f, **arrays)


def _set(key, value):
    def change(a):
        a[key] = value(a) if callable(value) else value
    return change


def _poke(key, index, value, dtype=None):
    def change(a):
        x = a[key].astype(dtype or a[key].dtype)
        x[index] = value
        a[key] = x
    return change


def _drop(key):
    return lambda a: a.pop(key)


def _drop_session(a):
    for key in ("q", "greedy", "last", "converged"):
        a[key] = a[key][:-1]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _pickle(path: Path) -> None:
    arrays = arrays_of(path)
    arrays["greedy"] = np.array([{"not": "an array"}], dtype=object)
    with path.open("wb") as f:
        np.savez(f, **arrays)


def _garble(path: Path) -> None:   # bytes flipped inside the compressed data
    data = bytearray(path.read_bytes())
    for i in range(200, min(len(data) - 100, 1200), 7):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


#: name -> (damage of the file, the words the one line must hold)
DAMAGE = {
    "truncated": (_truncate, ["cannot be read"]),
    "empty": (_empty, ["cannot be read", "EOFError"]),
    "garbled": (_garble, ["cannot be read"]),
    "pickled object": (_pickle, ["cannot be read", "allow_pickle"]),
    "a key missing": (lambda p: rewrite(p, _drop("greedy")), ["greedy is missing"]),
    "profit table missing": (lambda p: rewrite(p, _drop("profit_table")),
                             ["profit_table is missing"]),
    "greedy out of range": (lambda p: rewrite(p, _poke("greedy", (1, 0, 3), 5)),
                            ["greedy holds indices outside", "max 5"]),
    "greedy -1": (lambda p: rewrite(p, _poke("greedy", (0, 1, 7), -1)),
                  ["greedy holds indices outside", "min -1"]),
    "last out of range": (lambda p: rewrite(p, _poke("last", (2, 1), 9)),
                          ["last holds indices outside"]),
    "greedy of floats": (lambda p: rewrite(p, _set("greedy", lambda a: a["greedy"] + 0.0)),
                         ["greedy has dtype float64"]),
    "q of the wrong shape": (lambda p: rewrite(p, _set("q", lambda a: a["q"][..., :4])),
                             ["q has shape (3, 2, 25, 4)"]),
    "last of the wrong rank": (lambda p: rewrite(p, _set("last", lambda a: a["last"][0])),
                               ["last has shape (2,)", "rank 1"]),
    "last of the wrong width": (lambda p: rewrite(p, _set("last", lambda a: a["last"][:, :1])),
                                ["last has shape (3, 1)", "memory x sellers"]),
    "profit table of the wrong shape": (
        lambda p: rewrite(p, _set("profit_table", lambda a: a["profit_table"][:-1])),
        ["profit_table has shape (24, 2), not (prices^sellers, sellers)"]),
    "a profile table said to be of pairs (lagged)": (
        lambda p: rewrite(p, _set("lagged", lambda a: np.asarray(True))),
        ["profit_table has shape (25, 2), not ((prices^sellers)^2, sellers) = (625, 2)"]),
    "converged of the wrong length": (
        lambda p: rewrite(p, _set("converged", lambda a: a["converged"][:-1])),
        ["converged has shape (2,)"]),
    "NaN in q": (lambda p: rewrite(p, _poke("q", (2, 0, 11, 4), np.nan)),
                 ["q holds 1 NaN"]),
    "grid not finite": (lambda p: rewrite(p, _poke("grid", 2, np.nan)),
                        ["grid is not a finite price grid"]),
    "grid not increasing": (lambda p: rewrite(p, _set("grid", lambda a: a["grid"][::-1])),
                            ["grid is not increasing"]),
    "grid not the run's": (lambda p: rewrite(p, _set("grid", lambda a: a["grid"] * 1.1)),
                           ["grid is not the run's grid", "config.yaml"]),
    "sessions not the run's": (lambda p: rewrite(p, _drop_session),
                               ["greedy has 2 sessions", "train.num_seeds"]),
    "memory not the run's": (
        lambda p: rewrite(p, lambda a: a.update(memory=np.int64(0),
                                                last=a["last"][:, :0])),
        ["memory is 0", "config.yaml gives 1"]),
}


def damaged(run: Path, tmp_path: Path, damage) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    damage(copy / STRATEGIES_FILE)
    republish(copy)
    return copy


def assert_one_line(text: str, words: list[str]) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text and STRATEGIES_FILE in text, text
    for w in words:
        assert w in text, (w, text)


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_strategies_file_is_one_line_naming_the_file_and_key(run, tmp_path, name):
    damage, words = DAMAGE[name]
    copy = damaged(run, tmp_path, damage)
    with pytest.raises(RunDirError) as err:
        impulse_response(copy, agent=0, periods=4)
    assert_one_line(str(err.value), words + [f"--resume {copy}"])
    with pytest.raises(RunDirError):   # the one reader every consumer goes through
        load_strategies(str(copy / STRATEGIES_FILE))


@pytest.mark.parametrize("name", ["empty", "greedy -1", "grid not the run's"])
def test_the_impulse_command_prints_one_line_and_exits_1(run, tmp_path, name):
    damage, words = DAMAGE[name]
    copy = damaged(run, tmp_path, damage)
    out = subprocess.run([sys.executable, "-m", "jaxmarket.impulse", str(copy)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout == ""
    assert_one_line(out.stderr, words)


def test_a_file_changed_after_publication_fails_its_checksum(run, tmp_path):
    """A change every other check accepts (one Q value moved, still finite) is caught by
    the published checksum (``published.json``); a file removed from a published run is
    named missing."""
    if not (run / "published.json").is_file():
        pytest.skip("this run publishes no manifest (jaxmarket.train.publish)")
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    rewrite(copy / STRATEGIES_FILE, _poke("q", (0, 0, 0, 0), 123.0))
    with pytest.raises(RunDirError) as err:
        read_strategies(copy)
    assert_one_line(str(err.value), ["published.json", "--resume"])
    (copy / STRATEGIES_FILE).unlink()
    with pytest.raises(RunDirError) as err:
        impulse_response(copy)
    assert_one_line(str(err.value), ["missing"])


def test_a_file_on_its_own_is_checked_too(run, tmp_path):
    """A ``--save-strategies`` copy (no config.yaml beside it) gets every check that
    needs no config, and says to copy it again."""
    alone = tmp_path / "saved"
    alone.mkdir()
    shutil.copyfile(run / STRATEGIES_FILE, alone / STRATEGIES_FILE)
    assert read_strategies(alone).keys() == KEYS
    rewrite(alone / STRATEGIES_FILE, _poke("greedy", (0, 0, 0), -1))
    with pytest.raises(RunDirError) as err:
        impulse_response(alone)
    assert_one_line(str(err.value), ["greedy holds indices outside", "copy it again"])


def test_the_intact_file_reads_whole_and_replays_as_computed_here(run):
    """Every array as written; the impulse response of a one-period cut to the lowest
    price replayed here in plain Python: each session's limit cycle from its last
    profile, the cut from each of the cycle's points, its prices in periods 0 and 1 and
    the undeviated cycle's, averaged over the points and then over the sessions."""
    arrays = read_strategies(run)
    raw = arrays_of(run / STRATEGIES_FILE)
    assert arrays.keys() == KEYS == raw.keys()
    for k in KEYS:
        np.testing.assert_array_equal(arrays[k], raw[k])
    greedy, last, grid = raw["greedy"], raw["last"], raw["grid"]
    m = grid.size
    assert greedy.shape == (3, 2, 25) and int(raw["memory"]) == 1

    def act(s, profile):
        return tuple(int(greedy[s, i, profile[0] * m + profile[1]]) for i in range(2))

    price0, price1, cycle_price = [], [], []
    for s in range(3):
        profile = tuple(int(x) for x in last[s])
        for _ in range(m * m):                    # onto the cycle
            profile = act(s, profile)
        cycle = [profile]
        while (profile := act(s, profile)) != cycle[0]:
            cycle.append(profile)
        p0, p1, cf = [], [], []
        for point in cycle:
            dev = (0, act(s, point)[1])           # agent 0 cuts to grid[0]
            p0.append(grid[list(dev)])
            p1.append(grid[list(act(s, dev))])
            cf.append(grid[list(act(s, point))])
        price0.append(np.mean(p0, 0))
        price1.append(np.mean(p1, 0))
        cycle_price.append(np.mean(cf, 0))
    r = impulse_response(run, agent=0, deviation=float(grid[0]), periods=4)
    np.testing.assert_allclose(r.price[0], np.mean(price0, 0), rtol=1e-12)
    np.testing.assert_allclose(r.price[1], np.mean(price1, 0), rtol=1e-12)
    np.testing.assert_allclose(r.counterfactual, np.broadcast_to(np.mean(cycle_price, 0),
                                                                 (4, 2)), rtol=1e-12)
    np.testing.assert_array_equal(r.converged, raw["converged"])


def test_files_of_designs_the_replay_cannot_use_are_config_errors(run, tmp_path):
    """A genuine file whose states are not the last price profile (an observation such
    as own_price or market_price) is a ConfigError naming the observation; one with a
    table per random period outcome has no one-shot profit table, so only a price
    deviation replays."""
    raw = arrays_of(run / STRATEGIES_FILE)
    alone = tmp_path / "own"
    alone.mkdir()
    np.savez(alone / STRATEGIES_FILE, **{**raw, "memory": np.int64(0),
                                         "last": raw["last"][:, :0]})
    with pytest.raises(ConfigError) as err:
        impulse_response(alone, periods=3)
    assert err.value.field == "market.sellers[0].observation"
    shocks = tmp_path / "shocks"
    shocks.mkdir()
    table = raw["profit_table"]
    np.savez(shocks / STRATEGIES_FILE, **{**raw, "profit_table": np.stack([table, table])})
    with pytest.raises(ConfigError) as err:
        impulse_response(shocks, periods=3)
    assert err.value.field == "deviation"
    r = impulse_response(shocks, deviation=float(raw["grid"][0]), periods=3)
    assert r.profit is None and r.price.shape == (3, 2)
