"""The run directory's guarantees (docs/reliability.md): one writer per directory,
storage faults as one line, integrity checks on --resume, corrupt checkpoints fall back.
Every run is the tiny legacy scenario (40 iterations in chunks of 10)."""

import errno
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from conftest import CONFIGS, ROOT

from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main as train_main
from jaxmarket.train import run as run_module
from jaxmarket.train.rundir import LOCK_NAME, write_config_record
from jaxmarket.train.tracking import CsvMetrics

LEGACY = str(CONFIGS / "budget_monopoly.yaml")
TINY = ["train.num_iterations=40", "train.chunk_size=10", "train.checkpoint_every=1",
        "train.num_seeds=2", "train.num_envs=2"]
FILES = ("metrics.csv", "seeds.csv", "summary.json")


def train(capsys, *args):
    code = run_cli(train_main, list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run (checkpoints 30 and 40 kept: max_to_keep=2), and the same run
    as a kill during its last save leaves it: checkpoint 40 and summary.json gone, the
    rows of iterations 31-40 already appended (resume drops and recomputes them)."""
    base = tmp_path_factory.mktemp("ref")
    full, half = base / "full", base / "half"
    assert run_cli(train_main, [LEGACY, "--run-dir", str(full), *TINY]) == 0
    shutil.copytree(full, half)
    shutil.rmtree(half / "checkpoints" / "40")
    (half / "summary.json").unlink()
    return full, half


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def assert_same_as(full, d):
    for name in FILES:
        assert (d / name).read_bytes() == (full / name).read_bytes(), name


# ----------------------------------------------------------------- 1. one writer

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_writer_stops_at_once_naming_the_process_holding_the_lock(reference, tmp_path):
    d = copy(reference[1], tmp_path / "r")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d / LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "jaxmarket.train", "--resume", str(d)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        line = one_line(out.stderr)
        assert out.returncode == 1
        assert f"in use by process {holder.pid}" in line and str(d) in line
        assert time.monotonic() - t0 < 60          # stopped at once, did not wait
        assert "resuming" not in out.stdout
        # nothing was trained or rewritten
        assert not (d / "summary.json").exists()
        assert (d / "metrics.csv").read_bytes() == (reference[1] / "metrics.csv").read_bytes()
    finally:
        holder.kill()
        holder.wait()
    # the holder died: the OS dropped its lock, the stale file blocks nobody
    assert run_cli(train_main, ["--resume", str(d)]) == 0
    assert_same_as(reference[0], d)


def test_a_new_run_into_a_locked_directory_stops_too(tmp_path, capsys):
    d = tmp_path / "r"
    d.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d / LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
        assert code == 1 and f"in use by process {holder.pid}" in one_line(err)
        assert sorted(p.name for p in d.iterdir()) == [LOCK_NAME]   # no config.yaml
    finally:
        holder.kill()
        holder.wait()


def test_sweep_and_collect_take_the_lock_of_their_output(tmp_path, capsys):
    from jaxmarket.cli.collect import main as collect_main
    from jaxmarket.cli.sweep.main import main as sweep_main
    d = tmp_path / "sweep"
    d.mkdir()
    out = tmp_path / "data"
    holders = [subprocess.Popen([sys.executable, "-c", HOLD, str(p)], stdout=subprocess.PIPE,
                                text=True)
               for p in (d / LOCK_NAME, tmp_path / "data.lock")]
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["held", "held"]
        code = run_cli(sweep_main, [LEGACY, "--grid", "seed=[0, 1]", "--run-dir", str(d),
                                    *TINY])
        assert code == 1 and f"in use by process {holders[0].pid}" in one_line(
            capsys.readouterr().err)
        assert not (d / "cells").exists() and not (d / "sweep.yaml").exists()
        code = run_cli(collect_main, ["--config", LEGACY, "--steps", "2", "--out", str(out)])
        assert code == 1 and f"in use by process {holders[1].pid}" in one_line(
            capsys.readouterr().err)
        assert not out.exists()
    finally:
        for h in holders:
            h.kill()
            h.wait()


# ----------------------------------------------------------------- 2. storage faults

@pytest.mark.parametrize("code, where", [(errno.ENOSPC, "checkpoint"), (errno.EROFS, "rows"),
                                         (errno.EACCES, "checkpoint")])
def test_a_storage_fault_is_one_line_and_keeps_the_last_checkpoint_and_its_rows(
        reference, tmp_path, capsys, monkeypatch, code, where):
    d = tmp_path / "r"
    save, append = run_module.Trainer.save, CsvMetrics.append

    def failing_save(self, runner, iteration):
        if iteration > 20:
            raise OSError(code, os.strerror(code), str(self.run_dir / "checkpoints"))
        return save(self, runner, iteration)

    def failing_append(self, rows):
        if rows and rows[0]["iteration"] > 30:
            raise OSError(code, os.strerror(code), str(self.path))
        return append(self, rows)

    if where == "checkpoint":
        monkeypatch.setattr(run_module.Trainer, "save", failing_save)
    else:
        monkeypatch.setattr(CsvMetrics, "append", failing_append)
    rc, _, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
    line = one_line(err)
    kept = 20 if where == "checkpoint" else 30
    assert rc == 1
    assert line.startswith("storage error while ")
    assert os.strerror(code) in line and errno.errorcode[code] in line
    assert f"kept: the checkpoint at iteration {kept}" in line
    assert line.endswith(f"resume with python -m jaxmarket.train --resume {d}")
    assert not (d / "summary.json").exists()
    # every row up to the kept checkpoint is there, as the uninterrupted run wrote it
    full = (reference[0] / "metrics.csv").read_text().splitlines(keepends=True)
    mine = (d / "metrics.csv").read_text().splitlines(keepends=True)
    assert mine[:kept + 1] == full[:kept + 1]
    monkeypatch.undo()
    assert run_cli(train_main, ["--resume", str(d)]) == 0   # the command it names works
    assert_same_as(reference[0], d)


# ----------------------------------------------------------------- 3. integrity on --resume

def test_a_row_cut_by_a_crash_is_dropped_and_the_result_is_unchanged(reference, tmp_path):
    d = copy(reference[1], tmp_path / "r")
    for name in ("metrics.csv", "seeds.csv"):   # the rows up to 30 and half of the next
        lines = (reference[0] / name).read_bytes().splitlines(keepends=True)
        keep = 1 + 30 * (1 if name == "metrics.csv" else 2)
        (d / name).write_bytes(b"".join(lines[:keep]) + lines[keep][:len(lines[keep]) // 2])
    assert run_cli(train_main, ["--resume", str(d)]) == 0
    assert_same_as(reference[0], d)


@pytest.mark.parametrize("damage", ["deleted", "emptied", "rows_lost"])
def test_missing_rows_before_the_checkpoint_are_refused(reference, tmp_path, capsys, damage):
    d = copy(reference[1], tmp_path / "r")
    path = d / "metrics.csv"
    if damage == "deleted":
        path.unlink()
    elif damage == "emptied":
        path.write_text("")
    else:   # the header and iterations 1..12 only
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:13]))
    before = path.read_bytes() if path.exists() else None
    code, out, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and str(path) in line
    assert "oldest checkpoint is at iteration 30" in line
    if damage == "rows_lost":
        assert "holds rows up to iteration 12 only" in line
    assert not (d / "summary.json").exists() and "resuming" not in out
    assert (path.read_bytes() if path.exists() else None) == before   # left as it was


@pytest.mark.parametrize("junk", [b"\x00\x00\x00\x00\r\n", b"hello,world\r\n"])
def test_junk_lines_are_one_line_naming_the_file_and_line(reference, tmp_path, capsys, junk):
    d = copy(reference[1], tmp_path / "r")
    lines = (d / "seeds.csv").read_bytes().splitlines(keepends=True)
    (d / "seeds.csv").write_bytes(b"".join(lines[:5] + [junk] + lines[5:]))
    code, _, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and f"{d / 'seeds.csv'} line 6 is damaged" in line
    assert ("NUL bytes" in line) == (b"\x00" in junk)


def test_an_edited_config_is_refused_listing_the_changed_keys(reference, tmp_path, capsys):
    d = copy(reference[1], tmp_path / "r")
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["seed"] = cfg.get("seed", 0) + 1
    cfg["market"]["sellers"][0]["high"] = 99.0
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    code, out, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 2 and line.startswith(f"config error: {d / 'config.yaml'}: got 'changed ")
    assert "seed" in line and "market.sellers[0].high" in line
    assert "train.num_iterations" in line   # what may change
    assert "resuming" not in out and not (d / "summary.json").exists()


def test_extending_on_the_command_line_or_in_config_yaml_still_works(reference, tmp_path, capsys):
    def as_30_iterations(d):   # a finished 30-iteration run (its rows: the first 30)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["train"]["num_iterations"] = 30
        (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        write_config_record(d, cfg)   # the run's identity: started with 30
        for name, n in (("metrics.csv", 30), ("seeds.csv", 60)):
            lines = (d / name).read_bytes().splitlines(keepends=True)
            (d / name).write_bytes(b"".join(lines[:n + 1]))
        return d

    d = as_30_iterations(copy(reference[1], tmp_path / "cli"))
    code, out, _ = train(capsys, "--resume", str(d), "train.num_iterations=40")
    assert code == 0 and "from iteration 30" in out
    assert_same_as(reference[0], d)
    d = as_30_iterations(copy(reference[1], tmp_path / "edited"))
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["train"]["num_iterations"] = 40          # edited by hand: an extendable setting
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    code, out, _ = train(capsys, "--resume", str(d))
    assert code == 0 and "changed train.num_iterations" in out
    assert_same_as(reference[0], d)


def test_an_undecodable_config_and_a_run_that_never_started(tmp_path, capsys, reference):
    d = copy(reference[1], tmp_path / "r")
    (d / "config.yaml").write_bytes(b"\xff\xfe\x00binary\x89PNG")
    code, _, err = train(capsys, "--resume", str(d))
    assert code == 2 and "undecodable bytes" in one_line(err) and "config.yaml" in err
    never = tmp_path / "never"
    never.mkdir()
    (never / LOCK_NAME).write_text("123\n")   # killed before it wrote config.yaml
    code, _, err = train(capsys, "--resume", str(never))
    line = one_line(err)
    assert code == 2 and "the run never started" in line
    assert f"python -m jaxmarket.train CONFIG --run-dir {never}" in line
    # and that command is accepted: a directory holding only the lock file is empty
    code, _, _ = train(capsys, LEGACY, "--run-dir", str(never), *TINY)
    assert code == 0
    assert_same_as(reference[0], never)


# ----------------------------------------------------------------- 4. corrupt checkpoints

def truncate_data(step_dir):
    data = max((p for p in (step_dir / "default" / "d").iterdir()), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def delete_manifest(step_dir):
    (step_dir / "default" / "manifest.ocdbt").unlink()


def empty_dir(step_dir):
    shutil.rmtree(step_dir)
    step_dir.mkdir()


@pytest.mark.parametrize("damage", [truncate_data, delete_manifest, empty_dir])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(reference, tmp_path,
                                                                    capsys, damage):
    d = copy(reference[0], tmp_path / "r")
    (d / "summary.json").unlink()
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["30", "40"]  # two kept
    damage(d / "checkpoints" / "40")
    code, out, err = train(capsys, "--resume", str(d))
    assert code == 0, err
    assert "checkpoint at iteration 40 cannot be restored" in out
    assert "resuming from the one at iteration 30" in out
    assert f"resuming {d} from iteration 30" in out
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["30", "40"]  # saved anew
    assert_same_as(reference[0], d)


def test_no_restorable_checkpoint_is_one_line(reference, tmp_path, capsys):
    d = copy(reference[0], tmp_path / "r")
    for step in ("30", "40"):
        empty_dir(d / "checkpoints" / step)
    code, _, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and "no checkpoint in" in line and "can be restored" in line
    assert "start the run again" in line
