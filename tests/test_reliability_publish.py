"""A run directory is one result (jaxmarket.train.publish, docs/reliability.md): a writer
stopped at each step of a publication leaves the previous result whole or a directory
every reader refuses in one line naming a file and ``--resume``, which repairs it to the
files of an uninterrupted run; a file changed after publication fails its checksum;
``--allow-config-change`` records from which period a change was in force, and a change
the checkpoints cannot hold is refused naming the key, not blamed on the checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import jaxmarket
from jaxmarket.analysis.plots import plot_sessions, run_data
from jaxmarket.analysis.strategies import read_strategies
from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main as train_main
from jaxmarket.config.loader import load_config
from jaxmarket.train import publish
from jaxmarket.train.publish import MANIFEST, Publication, read_summary, verify
from jaxmarket.train.rundir import RunDirError

ROOT = Path(__file__).resolve().parents[1]
CALVANO = str(ROOT / "configs" / "calvano.yaml")
DUOPOLY = str(ROOT / "configs" / "logit_duopoly.yaml")
SESSIONS = ["train.num_seeds=4", "train.num_iterations=2000", "train.chunk_size=1000",
            "train.session_stop=periods"]
LOOP = ["train.num_iterations=40", "train.chunk_size=20", "train.num_seeds=2"]
SESSION_STEPS = [MANIFEST, "sessions.csv", "strategies.npz", "summary.json"]


class Crash(BaseException):
    """The writer's process ends here (no handler of the program catches it)."""


def crash_at(monkeypatch, step: str) -> None:
    def hook(name):
        if name == step:
            raise Crash(name)
    monkeypatch.setattr(publish, "_HOOK", hook)


def _extension_stopped_at(step: str, base: Path, tmp_path: Path, monkeypatch,
                          extend: str) -> Path:
    """A copy of ``base`` whose resume ``extend`` stopped at ``step`` of its publication."""
    d = tmp_path / "run"
    shutil.copytree(base, d)
    crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        train("--resume", str(d), extend)
    monkeypatch.undo()
    return d


def train(*args: str) -> int:
    return run_cli(train_main, list(args))


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# ------------------------------------------------------------------ the manifest itself

def _config(d: Path, n: int) -> None:
    (d / "config.yaml").write_text(yaml.safe_dump({"train": {"num_iterations": n}}))


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def _publish(d: Path, period: int, tag: str) -> None:
    _append(d / "metrics.csv", f"{period},{tag}\n")
    pub = Publication(d, "loop", period)
    pub.text("summary.json", json.dumps({"period": period, "tag": tag}))
    pub.text("sessions.csv", f"session,tag\n0,{tag}\n")
    pub.log("metrics.csv")
    pub.publish()


def test_a_publication_verifies_and_every_later_change_is_named(tmp_path):
    # Bugs caught: a reader that skips the checksum (flipped bytes), the size (an
    # appended or cut file), the config check (an extension that has not finished) or a
    # missing manifest; staged files left behind.
    d = tmp_path
    _config(d, 10)
    (d / "metrics.csv").write_text("iteration,x\n")
    _publish(d, 10, "a")
    manifest = verify(d)
    assert manifest["period"] == 10 and set(manifest["files"]) == {"summary.json",
                                                                   "sessions.csv"}
    assert not list(d.glob("*.staged*"))
    assert read_summary(d) == {"period": 10, "tag": "a"}
    good = (d / "sessions.csv").read_bytes()
    (d / "sessions.csv").write_bytes(good.replace(b"a", b"b"))   # same size, one byte
    with pytest.raises(RunDirError, match=r"sessions.csv does not match the checksum of the "
                       r"result published at period 10 .*--resume"):
        verify(d)
    (d / "sessions.csv").write_bytes(good)
    _append(d / "metrics.csv", "11,b\n")   # a live run's next rows
    with pytest.raises(RunDirError, match=r"metrics.csv has \d+ bytes, not the \d+"):
        verify(d)
    assert verify(d, growing=True)["period"] == 10
    rows = (d / "metrics.csv").read_bytes()
    (d / "metrics.csv").write_bytes(b"I" + rows[1:])   # a published row damaged
    with pytest.raises(RunDirError, match="metrics.csv does not match the checksum"):
        verify(d, growing=True)
    (d / "metrics.csv").write_bytes(rows[: manifest["logs"]["metrics.csv"]["bytes"]])
    _config(d, 20)   # an extending resume under way
    with pytest.raises(RunDirError, match=r"config.yaml differs from the config of the result "
                       r"published at period 10 \(train.num_iterations\)"):
        verify(d)
    _config(d, 10)
    (d / MANIFEST).unlink()
    with pytest.raises(RunDirError, match=r"summary.json is not part of a published result .*"
                       r"no published.json"):
        verify(d)
    (d / "summary.json").unlink()
    assert verify(d) is None   # a first segment still running: nothing published yet


@pytest.mark.parametrize("step", [MANIFEST, "summary.json", "sessions.csv"])
def test_a_publication_stopped_at_any_step_is_never_read_as_the_new_result(tmp_path,
                                                                          monkeypatch, step):
    # Bug caught: files renamed before the manifest (or no manifest at all), so that a
    # stop between two renames leaves a mixed directory that verifies.
    d = tmp_path
    _config(d, 10)
    (d / "metrics.csv").write_text("iteration,x\n")
    _publish(d, 10, "a")
    crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        _publish(d, 20, "b")
    monkeypatch.undo()
    if step == MANIFEST:   # stopped before the manifest: the previous result is whole,
        assert verify(d, ["summary.json", "sessions.csv"])["period"] == 10
        with pytest.raises(RunDirError, match=r"metrics.csv has \d+ bytes, not the \d+ of "
                           r"the result published at period 10"):
            read_summary(d)   # but its rows have moved on
    else:
        with pytest.raises(RunDirError, match=r"(summary|sessions)\.(json|csv) (does not "
                           r"match|has \d+ bytes).* published at period 20"):
            verify(d)


# ------------------------------------------------------------------ the session engine

@pytest.fixture(scope="module")
def sessions_runs(tmp_path_factory):
    """A 2,000-period sessions run and the same run extended to 3,000 periods."""
    root = tmp_path_factory.mktemp("publish")
    base, longer = root / "base", root / "longer"
    assert train(CALVANO, "--run-dir", str(base), *SESSIONS) == 0
    shutil.copytree(base, longer)
    assert train("--resume", str(longer), "train.num_iterations=3000") == 0
    return base, longer


def _same_result(got: Path, want: Path) -> None:
    for name in ("sessions.csv", "summary.json"):
        assert (got / name).read_bytes() == (want / name).read_bytes(), name
    with np.load(got / "strategies.npz") as a, np.load(want / "strategies.npz") as b:
        assert set(a.files) == set(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k])
    verify(got)


def _refused_everywhere(d: Path) -> None:
    """Every reader of a sessions run refuses ``d`` in one line naming ``--resume``."""
    for read in (jaxmarket.load_run, read_summary, read_strategies, plot_sessions,
                 lambda p: jaxmarket.compare([p])):
        with pytest.raises(RunDirError, match=rf"--resume {d}$"):
            read(d)


@pytest.mark.parametrize("step", SESSION_STEPS)
def test_an_extension_stopped_while_publishing_is_refused_then_repaired(
        sessions_runs, tmp_path, monkeypatch, step):
    # Bug caught (issue 45 item 1): killed while it writes summary.json, an extending
    # resume left the old summary beside the new sessions.csv and strategies.npz, read
    # without a warning by load_run and impulse.
    base, longer = sessions_runs
    d = _extension_stopped_at(step, base, tmp_path, monkeypatch, "train.num_iterations=3000")
    _refused_everywhere(d)
    assert train("--resume", str(d)) == 0
    _same_result(d, longer)


def test_a_first_start_stopped_while_publishing_is_refused_then_repaired(
        sessions_runs, tmp_path, monkeypatch):
    base, _ = sessions_runs
    d = tmp_path / "run"
    crash_at(monkeypatch, "summary.json")
    with pytest.raises(Crash):
        train(CALVANO, "--run-dir", str(d), *SESSIONS)
    monkeypatch.undo()
    with pytest.raises(RunDirError, match=r"summary.json is missing"):
        jaxmarket.load_run(d)
    assert train("--resume", str(d)) == 0
    _same_result(d, base)


def test_a_changed_learner_setting_is_recorded_from_its_period(sessions_runs, tmp_path,
                                                                capsys):
    # Bug caught (issue 45 item 2): --allow-config-change on a finished run wrote the new
    # value into config.yaml as if every result had been made with it.
    base, _ = sessions_runs
    d = tmp_path / "run"
    shutil.copytree(base, d)
    before = load_config(d / "config.yaml")["learners"]["sellers"]["learning_rate"]
    key = "learners.sellers.learning_rate"
    assert train("--resume", str(d), "--allow-config-change", key, f"{key}=0.2") == 0
    out = capsys.readouterr().out
    assert f"{key} is 0.2 from period 2000 on ({before!r} before)" in out
    assert "no period is played under it" in out
    change = {"key": key, "from": before, "to": 0.2, "from_period": 2000}
    record = json.loads((d / "run.json").read_text())
    assert record["segments"][-1]["config_changes"] == [change]
    first = (d / "config.yaml").read_text().splitlines()[0]
    assert first.startswith(f"# {key}: 0.2 from period 2000 on ({before} before")
    assert load_config(d / "config.yaml")["learners"]["sellers"]["learning_rate"] == 0.2
    for name in ("sessions.csv", "summary.json"):   # nothing was played under it
        assert (d / name).read_bytes() == (base / name).read_bytes()
    assert verify(d)["config"]["learners"]["sellers"]["learning_rate"] == 0.2
    # the next extension keeps the earlier change's line and plays under the new value
    assert train("--resume", str(d), "train.num_iterations=3000") == 0
    assert (d / "config.yaml").read_text().splitlines()[0] == first
    segments = json.loads((d / "run.json").read_text())["segments"]
    assert segments[-2]["config_changes"] == [change] and "config_changes" not in segments[-1]


def test_a_change_the_checkpoints_cannot_hold_is_refused_naming_the_key(sessions_runs,
                                                                        tmp_path, capsys):
    # Bug caught (issue 45 item 2): --allow-config-change train.num_seeds blamed the
    # checkpoint ("no checkpoint can be restored ... start the run again").
    base, _ = sessions_runs
    d = tmp_path / "run"
    shutil.copytree(base, d)
    config = (d / "config.yaml").read_bytes()
    rc = train("--resume", str(d), "--allow-config-change", "train.num_seeds",
               "train.num_seeds=8")
    line = one_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith("config error: train.num_seeds: got 8; allowed: 4, "
                                       "as the run has it: a resume cannot honour")
    assert "no checkpoint" not in line
    assert (d / "config.yaml").read_bytes() == config
    assert train("--resume", str(d)) == 0   # the checkpoints were kept and restore
    _same_result(d, base)


# ------------------------------------------------------------------ the loop

@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("publish-loop")
    base, longer = root / "base", root / "longer"
    assert train(DUOPOLY, "--run-dir", str(base), *LOOP) == 0
    shutil.copytree(base, longer)
    assert train("--resume", str(longer), "train.num_iterations=60") == 0
    return base, longer


@pytest.mark.parametrize("step", [MANIFEST, "summary.json"])
def test_a_loop_extension_stopped_while_publishing_is_refused_then_repaired(
        loop_runs, tmp_path, monkeypatch, step):
    base, longer = loop_runs
    d = _extension_stopped_at(step, base, tmp_path, monkeypatch, "train.num_iterations=60")
    for read in (jaxmarket.load_run, read_summary, lambda p: jaxmarket.compare([p])):
        with pytest.raises(RunDirError, match=rf"--resume {d}$"):
            read(d)
    if step == MANIFEST:   # plot reads the rows as a live run's: all 60 iterations
        assert run_data(d).data.shape == run_data(longer).data.shape
    else:
        with pytest.raises(RunDirError, match=rf"summary.json has .*--resume {d}$"):
            run_data(d)
    assert train("--resume", str(d)) == 0
    for name in ("summary.json", "metrics.csv", "seeds.csv"):
        assert (d / name).read_bytes() == (longer / name).read_bytes(), name
    assert verify(d)["period"] == 60


def test_a_loop_seed_count_change_is_refused_naming_the_key(loop_runs, tmp_path, capsys):
    # Bug caught: the refusal blamed seeds.csv's rows ("repeated or out of order").
    base, _ = loop_runs
    d = tmp_path / "run"
    shutil.copytree(base, d)
    rc = train("--resume", str(d), "--allow-config-change", "train.num_seeds",
               "train.num_seeds=3")
    line = one_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith("config error: train.num_seeds: got 3; allowed: 2, ")
    assert "seeds.csv" not in line
