"""The training loop: resume after a hard kill is bit-identical, summary, stops,
config errors, trackers (real sacred and tensorboardX)."""

import json
import os
import signal
import struct as pystruct
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import CONFIGS, ROOT

from jaxmarket.train.run import final_learner_state, start_run
from jaxmarket.train.tracking import read_metrics

SMALL = ["train.num_iterations=300", "train.chunk_size=50", "train.checkpoint_every=2",
         "train.num_seeds=2"]


def run_main(capsys, *args):
    """The CLI in-process (same code path as ``python -m jaxmarket.train``)."""
    from jaxmarket.cli import run_cli
    from jaxmarket.train.__main__ import main
    code = run_cli(main, list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "jaxmarket.train", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def kill_after_rows(proc: subprocess.Popen, metrics: Path, rows: int, timeout: float = 300):
    """SIGKILL ``proc`` as soon as ``metrics`` holds ``rows`` data rows (polled every
    20 ms; a chunk takes far longer, so the kill lands before the next one ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count("\n") - 1 >= rows:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)


def test_resume_after_kill_is_bit_identical(tmp_path):
    full, broken = tmp_path / "full", tmp_path / "broken"
    config = str(CONFIGS / "budget_monopoly.yaml")
    out = cli("--config", config, "--run-dir", str(full), *SMALL)
    assert out.returncode == 0, out.stderr
    # killed from outside with SIGKILL once chunk 5 (iteration 250) is in metrics.csv: the
    # last checkpoint is at iteration 200 (every 2 chunks), so one chunk of work is lost
    proc = subprocess.Popen([sys.executable, "-m", "jaxmarket.train", "--config", config,
                             "--run-dir", str(broken), *SMALL], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_after_rows(proc, broken / "metrics.csv", 250)
    assert proc.returncode == -9
    steps = sorted(int(p.name) for p in (broken / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == 200
    out = cli("--resume", str(broken))
    assert out.returncode == 0, out.stderr
    assert "resuming" in out.stdout and "from iteration 200" in out.stdout
    a, b = final_learner_state(full), final_learner_state(broken)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert (full / "metrics.csv").read_text() == (broken / "metrics.csv").read_text()
    assert json.loads((full / "summary.json").read_text()) == json.loads((broken / "summary.json").read_text())


def test_summary_is_mean_of_last_tenth_of_metrics(tmp_path):
    summary = start_run(str(CONFIGS / "budget_monopoly.yaml"), SMALL, str(tmp_path / "run"))
    header, data = read_metrics(tmp_path / "run" / "metrics.csv")
    assert data.shape[0] == 300
    np.testing.assert_array_equal(data[:, 0], np.arange(1, 301))
    tail = data[-30:]
    final = summary["final"]["seller"]
    np.testing.assert_allclose(final["mean_price"], [tail[:, header.index("price/seller/p0")].mean()])
    np.testing.assert_allclose(final["mean_reward"], tail[:, header.index("reward/seller")].mean())
    np.testing.assert_allclose(final["mean_traffic"], [tail[:, header.index("traffic/seller/p0")].mean()])
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["final"] == summary["final"]
    assert (tmp_path / "run" / "config.yaml").read_text().count("num_iterations: 300") == 1


def test_early_stop_rule_stops_after_the_chunk_that_meets_it(tmp_path):
    summary = start_run(str(CONFIGS / "budget_monopoly.yaml"),
                        SMALL + ["train.early_stop={metric: reward/seller, above: -1.0}"],
                        str(tmp_path / "run"))
    assert summary["iterations"] == 50
    assert summary["stopped"].startswith("early stop: reward/seller=")


def test_nan_metrics_stop_training(tmp_path):
    from jaxmarket.config.loader import load_config
    from jaxmarket.train.plan import resolve
    from jaxmarket.train.trainer import Trainer
    trainer = Trainer(resolve(load_config(CONFIGS / "budget_monopoly.yaml", SMALL)), tmp_path)
    assert trainer._stop_reason([{"iteration": 7, "reward/seller": float("nan")}]).startswith(
        "non-finite metric reward/seller at iteration 7")
    assert trainer._stop_reason([{"iteration": 7, "reward/seller": 1.0}]) is None


@pytest.mark.parametrize("override, message", [
    ("learners.nobody={kind: constant, value: 1}", "learners.nobody: got"),
    ("learners.seller.kind=genius", "learners.seller.kind: got 'genius'; allowed: one of"),
    ("learners.seller.learning_rate=-1", "learners.seller.learning_rate: got -1"),
    ("train.num_seeds=0", "train.num_seeds: got 0; allowed: an integer >= 1"),
    ("train.chunk_sise=5", "train.chunk_sise: got 5; allowed: known keys are"),
    ("seed=-3", "seed: got -3; allowed: an integer >= 0"),
])
def test_training_config_errors_are_one_line_exit_2(tmp_path, capsys, override, message):
    out = run_main(capsys, "--config", str(CONFIGS / "budget_monopoly.yaml"), "--run-dir",
                   str(tmp_path / "r"), override)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "r").exists()  # nothing written before validation


def test_missing_learner_for_an_agent_group_exits_2_from_the_shell(tmp_path):
    import yaml
    cfg = yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())
    cfg["learners"] = {}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = cli("--config", str(path), "--run-dir", str(tmp_path / "r"), timeout=120)
    assert out.returncode == 2
    assert "learners.seller: got '<missing>'" in out.stderr


def read_tfevents(path):
    """Minimal TFRecord reader -> {tag: [(step, value)]} (no TensorFlow needed)."""
    from tensorboardX.proto import event_pb2
    out = {}
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        (length,) = pystruct.unpack("<Q", data[pos:pos + 8])
        record = data[pos + 12:pos + 12 + length]
        pos += 12 + length + 4
        event = event_pb2.Event.FromString(record)
        for v in event.summary.value:
            out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_tensorboard_tracker_writes_metrics(tmp_path, capsys):
    out = run_main(capsys, "--config", str(CONFIGS / "budget_monopoly.yaml"), "--run-dir", str(tmp_path / "r"),
              "--tracker", "tensorboard", *SMALL)
    assert out.returncode == 0, out.stderr
    events = list((tmp_path / "r" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    scalars = read_tfevents(events[0])
    header, data = read_metrics(tmp_path / "r" / "metrics.csv")
    logged = dict(scalars["reward/seller"])
    assert sorted(logged) == [50, 100, 150, 200, 250, 300]   # last iteration of each chunk
    for step, value in logged.items():
        np.testing.assert_allclose(value, data[step - 1, header.index("reward/seller")], rtol=1e-6)


def test_sacred_tracker_records_config_metrics_and_artifacts(tmp_path, capsys):
    out = run_main(capsys, "--config", str(CONFIGS / "budget_monopoly.yaml"), "--run-dir", str(tmp_path / "r"),
              "--tracker", "sacred", *SMALL)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "r" / "sacred" / "1"
    config = json.loads((run / "config.json").read_text())
    assert config["scenario"]["train"]["num_iterations"] == 300
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["reward/seller"]["steps"] == [50, 100, 150, 200, 250, 300]
    assert json.loads((run / "run.json").read_text())["status"] == "COMPLETED"
    assert (run / "summary.json").is_file() and (run / "metrics.csv").is_file()
