"""Reliability, second pass (docs/reliability.md): a lock a removed lock file cannot
defeat, the run's identity checked on --resume, row files checked against the checkpoint
both ways, storage faults (orbax's too) as one line, and a way forward from every
half-started run directory. Every run is the tiny legacy scenario (40 iterations in
chunks of 10, checkpoints 30 and 40 kept)."""

import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml
from conftest import CONFIGS, ROOT

from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main as train_main
from jaxmarket.train import checkpoints as checkpoints_module
from jaxmarket.train import run as run_module
from jaxmarket.train import rundir
from jaxmarket.train import trainer as trainer_module
from jaxmarket.train.rundir import CONFIG_RECORD, LOCK_NAME
from test_reliability_rundir import FILES, LEGACY, TINY, one_line, train  # the same tiny runs

BUDGET = "market.consumers[0].budget"


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An uninterrupted run: checkpoints 30 and 40, rows 1..40."""
    d = tmp_path_factory.mktemp("ref") / "full"
    assert run_cli(train_main, [LEGACY, "--run-dir", str(d), *TINY]) == 0
    return d


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def same_as(full, d):
    return all((d / name).read_bytes() == (full / name).read_bytes() for name in FILES)


def lines_of(path):
    return path.read_bytes().splitlines(keepends=True)


# ----------------------------------------------------------------- 1. a real lock

HOLD_DIR = """
import sys, time
from jaxmarket.train.rundir import lock_dir
lock_dir(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_removed_lock_file_does_not_let_a_second_writer_in(full, tmp_path, capsys):
    d = copy(full, tmp_path / "r")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_DIR, str(d)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (d / LOCK_NAME).unlink()              # the lock file removed by hand
        before = (d / "metrics.csv").read_bytes()
        code, out, err = train(capsys, "--resume", str(d))
        line = one_line(err)
        assert code == 1 and f"run directory {d} is in use by process" in line
        assert "resuming" not in out
        assert (d / "metrics.csv").read_bytes() == before   # nothing written
        code, _, err = train(capsys, LEGACY, "--run-dir", str(tmp_path / "r"), *TINY)
        assert code != 0
    finally:
        holder.kill()
        holder.wait()
    assert run_cli(train_main, ["--resume", str(d)]) == 0   # the holder gone: free again
    assert same_as(full, d)


# ----------------------------------------------------------------- 1. the run's identity

def test_a_missing_identity_record_is_refused_unless_accepted(full, tmp_path, capsys):
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    (d / CONFIG_RECORD).unlink()
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["market"]["consumers"][0]["budget"] = 99.0          # the economy changed
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    code, out, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and f"{d / CONFIG_RECORD}" in line and "is missing" in line
    assert "--allow-config-change all" in line
    assert "resuming" not in out and not (d / "summary.json").exists()
    code, out, err = train(capsys, "--resume", str(d), "--allow-config-change", "all")
    assert code == 0, err
    assert (d / CONFIG_RECORD).is_file()


def test_a_changed_field_is_refused_naming_it_and_accepted_when_listed(full, tmp_path, capsys):
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["market"]["consumers"][0]["budget"] = 99.0
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    code, out, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 2 and f"changed {BUDGET}" in line
    assert f"--allow-config-change {BUDGET}" in line
    assert not (d / "summary.json").exists()
    code, _, err = train(capsys, "--resume", str(d), "--allow-config-change", "seed")
    assert code == 2 and BUDGET in one_line(err)        # another field listed: still refused
    code, out, err = train(capsys, "--resume", str(d), "--allow-config-change",
                           "market.consumers")
    assert code == 0, err
    assert f"changed {BUDGET}" in out
    # the record now holds the accepted config: a plain resume passes
    assert train(capsys, "--resume", str(d))[0] == 0


def test_an_edited_record_or_another_package_version_is_refused(full, tmp_path, capsys,
                                                                 monkeypatch):
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    record = yaml.safe_load((d / CONFIG_RECORD).read_text())
    assert set(record) == {"identity", "config"}
    assert record["identity"]["config_sha256"] == rundir.config_hash(record["config"])
    assert record["identity"]["seed"] == record["config"]["seed"]
    edited = {**record, "config": {**record["config"], "seed": 7}}
    (d / CONFIG_RECORD).write_text(yaml.safe_dump(edited, sort_keys=False))
    code, _, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and "does not match its hash" in line
    (d / CONFIG_RECORD).write_text(yaml.safe_dump(record, sort_keys=False))
    monkeypatch.setattr(rundir, "package_version", lambda: "999.0")
    code, _, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 2 and "jaxmarket_version" in line and "999.0" in line
    code, _, err = train(capsys, "--resume", str(d), "--allow-config-change",
                         "jaxmarket_version")
    assert code == 0, err
    assert same_as(full, d)


def test_allow_config_change_is_only_for_resume(capsys):
    code, _, err = train(capsys, LEGACY, "--allow-config-change", "seed")
    assert code == 2 and "--allow-config-change" in one_line(err)


# ----------------------------------------------------------------- 2. rows vs checkpoint

@pytest.mark.parametrize("name", ["metrics.csv", "seeds.csv"])
def test_duplicated_last_rows_are_dropped_and_the_summary_is_unchanged(full, tmp_path,
                                                                       capsys, name):
    d = copy(full, tmp_path / "r")
    lines = lines_of(d / name)
    (d / name).write_bytes(b"".join(lines + lines[-4:]))   # the last rows again
    code, _, err = train(capsys, "--resume", str(d))
    assert code == 0, err
    assert same_as(full, d)


@pytest.mark.parametrize("damage", ["repeated", "reordered", "gap"])
def test_rows_repeated_reordered_or_missing_before_the_checkpoint_are_refused(
        full, tmp_path, capsys, damage):
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    path = d / "metrics.csv"
    lines = lines_of(path)
    if damage == "repeated":
        lines.insert(11, lines[10])
    elif damage == "reordered":
        lines[10], lines[11] = lines[11], lines[10]
    else:
        del lines[10]
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()
    code, out, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and str(path) in line and "line 1" in line
    assert {"repeated": "repeated or out of order", "reordered": "out of order",
            "gap": "are missing"}[damage] in line
    assert "resuming" not in out and not (d / "summary.json").exists()
    assert path.read_bytes() == before                      # left as it was


@pytest.mark.parametrize("name", ["metrics.csv", "seeds.csv"])
def test_a_cut_last_row_of_a_finished_run_falls_back_one_checkpoint(full, tmp_path, capsys,
                                                                    name):
    d = copy(full, tmp_path / "r")
    lines = lines_of(d / name)
    (d / name).write_bytes(b"".join(lines[:-1]) + lines[-1][:len(lines[-1]) // 2])
    code, out, err = train(capsys, "--resume", str(d))
    assert code == 0, err
    assert "resuming from the checkpoint at iteration 30" in out
    assert "removed the one at iteration 40" in out
    assert same_as(full, d)


@pytest.mark.parametrize("name", ["metrics.csv", "seeds.csv"])
def test_a_header_not_the_runs_columns_is_refused(full, tmp_path, capsys, name):
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    lines = lines_of(d / name)
    lines[0] = lines[0].replace(b"reward/", b"rewardX/", 1)
    (d / name).write_bytes(b"".join(lines))
    code, _, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 1 and f"{d / name} line 1 (the header) does not match" in line
    assert "rewardX/" in line


def test_row_files_are_synced_before_the_checkpoint_that_covers_them(tmp_path, capsys,
                                                                     monkeypatch):
    events = []
    fsync, save = os.fsync, checkpoints_module.Checkpoints.save

    def logged_fsync(fd):
        try:
            events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        except OSError:
            pass
        return fsync(fd)

    def logged_save(self, runner, iteration):
        events.append(("save", iteration))
        return save(self, runner, iteration)

    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(checkpoints_module.Checkpoints, "save", logged_save)
    d = tmp_path / "r"
    assert train(capsys, LEGACY, "--run-dir", str(d), *TINY)[0] == 0
    saves = [i for i, e in enumerate(events) if e[0] == "save"]
    assert [events[i][1] for i in saves] == [10, 20, 30, 40]
    previous = 0
    for i in saves:   # both row files synced since the previous save
        synced = {name for kind, name in events[previous:i] if kind == "fsync"}
        assert {"metrics.csv", "seeds.csv"} <= synced, events[previous:i]
        previous = i


# ----------------------------------------------------------------- 3. storage faults

ORBAX_ENOSPC = ('RESOURCE_EXHAUSTED: Error writing "leaf00000/0.0.0" in OCDBT database at '
                'local file "{d}/checkpoints/30.orbax-checkpoint-tmp/default/": Failed to '
                "write 513 bytes to file 19: No space left on device [os_error_code='28']")
ORBAX_EACCES = ('PERMISSION_DENIED: Error opening local file "{d}/checkpoints/30.orbax-'
                'checkpoint-tmp/default/manifest.ocdbt"')


@pytest.mark.parametrize("message, code", [(ORBAX_ENOSPC, errno.ENOSPC),
                                           (ORBAX_EACCES, errno.EACCES)])
def test_an_orbax_storage_error_is_one_line_naming_the_path(full, tmp_path, capsys,
                                                             monkeypatch, message, code):
    d = tmp_path / "r"
    save = checkpoints_module.Checkpoints.save

    def failing(self, runner, iteration):
        if iteration > 20:
            raise ValueError(message.format(d=d))
        return save(self, runner, iteration)

    monkeypatch.setattr(checkpoints_module.Checkpoints, "save", failing)
    rc, _, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
    line = one_line(err)
    assert rc == 1 and line.startswith("storage error while saving the checkpoint at "
                                       "iteration 30: ")
    assert errno.errorcode[code] in line and f"{d}/checkpoints/30.orbax-checkpoint-tmp" in line
    assert "kept: the checkpoint at iteration 20" in line
    monkeypatch.undo()
    assert run_cli(train_main, ["--resume", str(d)]) == 0
    assert same_as(full, d)


@pytest.mark.parametrize("target", ["summary", "run.json"])
def test_summary_and_run_json_storage_faults_are_one_line(full, tmp_path, capsys, monkeypatch,
                                                          target):
    d = tmp_path / "r"
    if target == "summary":
        def failing(run_dir, *args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(run_dir / "summary.json"))
        monkeypatch.setattr(trainer_module, "write_summary", failing)
    else:
        def failing(run_dir, segments):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir / "run.json"))
        monkeypatch.setattr(run_module, "write_record", failing)
    rc, _, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
    line = one_line(err)
    assert rc == 1
    if target == "summary":
        assert line.startswith("storage error while writing summary.json: Read-only")
        assert f"{d}/summary.json" in line and "kept: the checkpoint at iteration 40" in line
        monkeypatch.undo()
        assert run_cli(train_main, ["--resume", str(d)]) == 0
    else:   # a full disk at the start: nothing trained; the same command works once freed
        assert "No space left on device" in line and "nothing was trained" in line
        assert "run the same command again" in line
        monkeypatch.undo()
        code, out, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
        assert code == 0, err
        assert "starting it again in place" in out
    assert same_as(full, d)


QUIET_FALLBACK = """
import sys
from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main
sys.exit(run_cli(main, ["--resume", sys.argv[1]]))
"""


def test_a_checkpoint_fallback_leaves_stderr_empty(full, tmp_path):
    """orbax's abandoned reads of a damaged checkpoint used to echo "Event loop is
    closed" tracebacks; the fallback is now silent on stderr (two damaged copies)."""
    for k in range(2):
        d = copy(full, tmp_path / f"r{k}")
        (d / "summary.json").unlink()
        data = max((d / "checkpoints" / "40" / "default" / "d").iterdir(),
                   key=lambda p: p.stat().st_size)
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
        out = subprocess.run([sys.executable, "-c", QUIET_FALLBACK, str(d)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "resuming from the one at iteration 30" in out.stdout
        assert out.stderr.strip() == "", out.stderr
        assert same_as(full, d)


def test_a_checkpoint_of_another_shape_falls_back_with_nothing_on_stderr(full, tmp_path):
    """The newest checkpoint made with another ``train.num_envs`` (a run of another
    shape): ``python -m jaxmarket.train --resume`` says so in one line, falls back to the
    previous checkpoint and finishes the run byte-identical to an uninterrupted one,
    stderr empty; with every checkpoint of another shape it is one line, exit 1. Before:
    orbax's reads of the arrays of the right shape, abandoned when one of another shape
    failed the restore and closed by the garbage collector, echoed "Exception ignored in:
    <coroutine object _read_array_index_and_device_put>" with a TensorStore spec (2,425
    lines; in about one resume in three: whether reads are still pending when the
    restore fails is up to tensorstore's threads; the test below makes it certain)."""
    other = tmp_path / "other"
    assert run_cli(train_main, [LEGACY, "--run-dir", str(other), *TINY,
                                "train.num_envs=4"]) == 0
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    shutil.rmtree(d / "checkpoints" / "40")
    shutil.copytree(other / "checkpoints" / "40", d / "checkpoints" / "40")
    resume = [sys.executable, "-m", "jaxmarket.train", "--resume", str(d)]
    out = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, \
        out.stderr[:3000]
    assert out.stderr == "", out.stderr[:3000]
    fallback = [ln for ln in out.stdout.splitlines() if "cannot be restored" in ln]
    assert len(fallback) == 1 and "checkpoint at iteration 40" in fallback[0] \
        and fallback[0].endswith("resuming from the one at iteration 30"), out.stdout
    assert "finished 40 iterations" in out.stdout
    assert same_as(full, d)   # rows 1..40: the resumed results are the uninterrupted run's
    # no checkpoint of the run's shape: one line (the run directory error), exit 1
    for step in ("30", "40"):
        shutil.rmtree(d / "checkpoints" / step, ignore_errors=True)
        shutil.copytree(other / "checkpoints" / step, d / "checkpoints" / step)
    (d / "summary.json").unlink()
    out = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, \
        out.stderr[:3000]
    assert one_line(out.stderr).startswith("run directory error: no checkpoint in ")


ABANDONED_READ = """
import asyncio, gc, sys
import jax, numpy as np, tensorstore as ts
from orbax.checkpoint._src.serialization import limits, serialization
from jaxmarket.train.checkpoints import _quiet_orbax_echo
if sys.argv[1] == "quiet":
    _quiet_orbax_echo()
loop = asyncio.new_event_loop()
async def pending_read(t, **kw):   # a read tensorstore has not finished
    await loop.create_future()
serialization._read_shard = pending_read
coro = serialization._read_array_index_and_device_put(
    jax.devices(), (slice(0, 2, 1),), ts.array(np.zeros(2, np.float32)), global_shape=(2,),
    new_shard_shape=(2,), dtype=None, byte_limiter=limits.get_byte_limiter(), strict=True,
    dll=None, memory_kind=None)
coro.send(None)   # suspended in its read, as a failed restore leaves the others
del coro
gc.collect()      # closed by the garbage collector: orbax raises from the GeneratorExit
async def elsewhere():
    try:
        await loop.create_future()
    except BaseException as err:
        raise Exception("a coroutine of ours") from err
coro = elsewhere()
coro.send(None)
del coro
gc.collect()
"""


def test_an_abandoned_orbax_read_closed_by_the_garbage_collector_is_not_echoed():
    """The echo of the test above, made certain: orbax's own reader coroutine, suspended
    in a read and closed by the garbage collector, raises ``Exception: Encountered error
    while reading array index`` from the GeneratorExit; Python reports it as "Exception
    ignored in: <coroutine object _read_array_index_and_device_put>" unless the
    checkpoints' hook is installed, and the hook passes on any other coroutine's."""
    runs = {mode: subprocess.run([sys.executable, "-c", ABANDONED_READ, mode], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            for mode in ("loud", "quiet")}
    for out in runs.values():
        assert out.returncode == 0, out.stderr[-3000:]
    loud, quiet = runs["loud"].stderr, runs["quiet"].stderr
    assert "Exception ignored in: <coroutine object _read_array_index_and_device_put" in loud
    assert loud.count("Exception ignored") == 2 and "a coroutine of ours" in loud
    assert quiet.count("Exception ignored") == 1 and "a coroutine of ours" in quiet, quiet
    assert "_read_array_index_and_device_put" not in quiet and "TensorStore" not in quiet


NEVER_STARTED = """
import gc, sys
from orbax.checkpoint._src.serialization import serialization
from jaxmarket.train import checkpoints
if sys.argv[1] == "quiet":
    checkpoints._quiet_orbax_echo()
async def ours():
    return None
pending = [serialization._read_shard(None, new_shard_shape=None, dtype=None,
                                     requested_domain=None, restricted_domain=None), ours()]
del pending   # never awaited: collected as a failed restore's loop leaves them
gc.collect()
"""


def test_an_orbax_read_never_started_is_not_warned_about():
    # Bug caught: the other-shape fallback's stderr held "RuntimeWarning: coroutine
    # '_read_array_index_and_device_put' was never awaited" (reads the closed loop never
    # started); a coroutine of ours still warns.
    runs = {mode: subprocess.run([sys.executable, "-c", NEVER_STARTED, mode], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            for mode in ("loud", "quiet")}
    loud, quiet = runs["loud"].stderr, runs["quiet"].stderr
    assert "coroutine '_read_shard' was never awaited" in loud and "'ours'" in loud
    assert "_read_shard" not in quiet and "coroutine 'ours' was never awaited" in quiet


def test_storage_cause_reads_tensorstore_messages():
    err = ValueError(ORBAX_ENOSPC.format(d="/x"))
    cause = rundir.storage_cause(err)
    assert cause.errno == errno.ENOSPC and cause.filename.startswith("/x/checkpoints/30")
    assert rundir.storage_cause(ValueError("DATA_LOSS: bad checksum")) is None


# ----------------------------------------------------------------- 4. half-states

def test_a_start_that_failed_writing_its_config_is_restarted_in_place(full, tmp_path, capsys):
    d = tmp_path / "r"
    d.mkdir()
    (d / LOCK_NAME).write_text("123\n")
    (d / "config.yaml.tmp").write_bytes(b"name: half")   # the disk filled here
    code, _, err = train(capsys, "--resume", str(d))
    line = one_line(err)
    assert code == 2 and f"python -m jaxmarket.train CONFIG --run-dir {d}" in line
    code, out, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
    assert code == 0, err
    assert not (d / "config.yaml.tmp").exists()
    assert same_as(full, d)


@pytest.mark.parametrize("how", ["resume", "start"])
def test_a_start_that_failed_before_its_first_checkpoint_has_a_way_forward(full, tmp_path,
                                                                          capsys, how):
    d = copy(full, tmp_path / "r")   # as a first save failing on a full disk leaves it
    shutil.rmtree(d / "checkpoints")
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "10.orbax-checkpoint-tmp").mkdir()
    (d / "summary.json").unlink()
    (d / "published.json").unlink()   # a start that failed published nothing
    for name, keep in (("metrics.csv", 11), ("seeds.csv", 21)):
        (d / name).write_bytes(b"".join(lines_of(d / name)[:keep]))
    if how == "resume":
        code, out, err = train(capsys, "--resume", str(d))
        assert "starting it from iteration 0" in out
    else:
        code, out, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
    assert code == 0, err
    assert same_as(full, d)


def test_a_directory_with_a_checkpoint_is_not_taken_for_a_failed_start(full, tmp_path, capsys):
    d = copy(full, tmp_path / "r")
    (d / "summary.json").unlink()
    code, _, err = train(capsys, LEGACY, "--run-dir", str(d), *TINY)
    assert code == 2 and "--resume" in one_line(err)
    assert (d / "checkpoints" / "40").is_dir()


SESSIONS = [str(CONFIGS / "calvano.yaml"), "train.num_seeds=2", "train.chunk_size=500",
            "train.num_iterations=2000", "train.checkpoint_every=1",
            "train.session_backend=xla"]


def test_a_sessions_run_storage_fault_is_one_line_and_resumes(tmp_path, capsys, monkeypatch):
    from jaxmarket.sessions import run as session_run
    d = tmp_path / "s"
    save = session_run.SessionRun.save

    def failing(self, sessions, done):
        if done > 1000:
            raise ValueError(ORBAX_ENOSPC.format(d=self.run_dir))
        return save(self, sessions, done)

    monkeypatch.setattr(session_run.SessionRun, "save", failing)
    rc, out, err = train(capsys, *SESSIONS, "--run-dir", str(d))
    line = one_line(err)
    assert rc == 1 and "engine: sessions" in out
    assert line.startswith("storage error while saving the checkpoint at period 1500: No "
                           "space left on device (errno ENOSPC)")
    assert "kept: the checkpoint at period 1000" in line
    assert line.endswith(f"resume with python -m jaxmarket.train --resume {d}")
    monkeypatch.undo()
    code, out, err = train(capsys, "--resume", str(d))
    assert code == 0, err
    assert f"resuming {d} from period 1000" in out
    assert (d / "summary.json").is_file()


def test_a_sessions_runs_last_checkpoint_fails_before_its_files_are_published(
        tmp_path, capsys, monkeypatch):
    # Bug caught: the last checkpoint, saved beside the run's files, whose failure is
    # lost (a finished-looking run directory without its final checkpoint) or reported
    # as a failure of the files rather than of the checkpoint.
    from jaxmarket.sessions import run as session_run
    d = tmp_path / "s"
    save = session_run.SessionRun.save

    def failing(self, sessions, done):
        if done == 2000:
            raise ValueError(ORBAX_ENOSPC.format(d=self.run_dir))
        return save(self, sessions, done)

    monkeypatch.setattr(session_run.SessionRun, "save", failing)
    rc, _, err = train(capsys, *SESSIONS, "--run-dir", str(d))
    line = one_line(err)
    assert rc == 1 and line.startswith("storage error while saving the checkpoint at period "
                                       "2000: No space left on device (errno ENOSPC)")
    assert "kept: the checkpoint at period 1500" in line
    assert not (d / "summary.json").exists() and not (d / "strategies.npz").exists()
    monkeypatch.undo()
    code, out, err = train(capsys, "--resume", str(d))
    assert code == 0, err
    assert f"resuming {d} from period 1500" in out
    assert (d / "summary.json").is_file() and (d / "checkpoints" / "2000").is_dir()


def test_a_checkpoint_stores_large_arrays_in_chunks_and_restores_them_exactly(
        tmp_path, monkeypatch):
    """Chunks of at most CHUNK_BYTES (compressed on every core at once), written from the
    runner's own arrays without orbax's copy, read back bit for bit; the arrays saved are
    left as they were."""
    monkeypatch.setattr(checkpoints_module, "CHUNK_BYTES", 4096)
    rng = np.random.default_rng(3)
    tree = {"q": rng.normal(size=(30, 1000)).astype(np.float32),
            "index": rng.integers(0, 15, size=(30, 2)).astype(np.int32)}
    before = {k: v.copy() for k, v in tree.items()}
    store = checkpoints_module.Checkpoints(tmp_path)
    store.save(tree, 7)
    reader = ocp.CheckpointManager((tmp_path / "checkpoints").absolute(),
                                   item_handlers=ocp.StandardCheckpointHandler())
    chunk = reader.item_metadata(7)["leaf00001"].storage.chunk_shape   # leaves sorted: q 2nd
    reader.close()
    assert int(np.prod(chunk)) * 4 <= 4096 and tuple(chunk) != (30, 1000)
    like = {k: np.zeros_like(v) for k, v in tree.items()}
    got, step = store.restore(like)
    store.close()
    assert step == 7
    for k in tree:
        assert type(tree[k]) is np.ndarray and np.array_equal(tree[k], before[k])
        assert np.asarray(got[k]).dtype == tree[k].dtype
        assert np.array_equal(np.asarray(got[k]), before[k])


def test_a_checkpoint_is_stored_uncompressed_and_a_compressed_one_still_restores(tmp_path):
    """Chunks stored as they are (zstd would cost seconds of CPU per large save), and a
    checkpoint written with orbax's default handler (compressed: an older jaxmarket's)
    restored bit for bit, its step kept."""
    tree = {"q": np.zeros((64, 4096), np.float32),   # 1 MiB that zstd shrinks to ~nothing
            "index": np.arange(64, dtype=np.int32)}
    store = checkpoints_module.Checkpoints(tmp_path / "new")
    store.save(tree, 3)
    store.close()
    stored = sum(f.stat().st_size for f in (tmp_path / "new").rglob("*") if f.is_file())
    assert stored >= tree["q"].nbytes
    rng = np.random.default_rng(4)
    old = {"leaf00000": rng.normal(size=(64, 300)).astype(np.float32),
           "leaf00001": rng.integers(0, 9, size=(64,)).astype(np.int32)}
    path = (tmp_path / "old" / checkpoints_module.CHECKPOINTS_DIR).absolute()
    writer = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=True))
    writer.save(5, args=ocp.args.StandardSave(old))
    writer.wait_until_finished()
    writer.close()
    compressed = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    store = checkpoints_module.Checkpoints(tmp_path / "old")
    got, step = store.restore({"a": np.zeros((64, 300), np.float32),
                               "b": np.zeros(64, np.int32)}, report=pytest.fail)
    store.close()
    assert step == 5 and np.array_equal(got["a"], old["leaf00000"])
    assert np.array_equal(got["b"], old["leaf00001"])
    # the old writer compressed (random floats: their exponents' bytes)
    assert compressed < old["leaf00000"].nbytes
