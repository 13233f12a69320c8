"""Runs across machines: a session-engine design's sessions as Ray blocks
(jaxmarket.cluster.blocks) on a real multi-process Ray cluster of this machine
(jaxmarket/cluster/local.py: its own network namespace, loopback only), the head that does not
answer, and a distributed start whose peers never come."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxmarket.cluster.blocks import plan_blocks

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["configs/calvano.yaml", "train.num_seeds=256",
         "learners.sellers.exploration_decay=1e-4",
         "learners.sellers.convergence_window=10000", "train.chunk_size=5000"]


@pytest.mark.parametrize("sessions,cpus", [(1000, 2), (1000, 1), (256, 2), (100, 8), (64, 3)])
def test_blocks_cover_the_rows_in_multiples_of_the_width(sessions, cpus):
    blocks = plan_blocks(sessions, cpus, width=64, per_cpu=2)
    rows = [r for lo, hi in blocks for r in range(lo, hi)]
    assert rows == list(range(sessions))   # every row once, in order
    sizes = [hi - lo for lo, hi in blocks]
    assert all(size % 64 == 0 for size in sizes[:-1])
    assert len(blocks) <= max(1, 2 * cpus)   # about two per CPU, never more
    want = -(-sessions // (2 * cpus))
    assert sizes[0] == max(64, -(-want // 64) * 64)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_head_that_does_not_answer_is_one_line_and_exit_1(tmp_path):
    port = _closed_port()
    started = time.time()
    out = subprocess.run([sys.executable, "-m", "jaxmarket.train", *SMALL, "--run-dir",
                          str(tmp_path / "run"), "--ray", f"127.0.0.1:{port}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "head" in lines[0]
    assert time.time() - started < 30 + 20   # the probe's 10 s and the start-up
    assert not (tmp_path / "run").exists()   # refused before anything is written


def test_a_distributed_start_whose_peers_never_come_says_what_it_waits_for(tmp_path):
    port = _closed_port()
    out = subprocess.run([sys.executable, "-m", "jaxmarket.train", "configs/calvano.yaml",
                          "--distributed", "--coordinator-address", f"127.0.0.1:{port}",
                          "--num-processes", "2", "--process-id", "0", "--run-dir",
                          str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ,
                                           "JAXMARKET_DISTRIBUTED_TIMEOUT": "4"})
    assert out.returncode == 1
    assert f"waiting up to 4 s for the others at 127.0.0.1:{port}" in out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "waited 4 s" in lines[0] and "processes [1]" in lines[0]


FILES = ("sessions.csv", "summary.json", "strategies.npz")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """SMALL played by a single process (no Ray): the run every cluster run must equal."""
    run_dir = tmp_path_factory.mktemp("local") / "run"
    out = subprocess.run([sys.executable, "-m", "jaxmarket.train", *SMALL, "--run-dir",
                          str(run_dir)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return run_dir


def _cluster(workers: int = 2):
    from jaxmarket.cluster.local import LocalCluster
    return LocalCluster(workers=workers, cpus=1)


def _same_files(a: Path, b: Path, names=FILES) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _wait_for(log: Path, proc: subprocess.Popen, text: str, timeout: float = 300) -> str:
    """The driver's output once it holds ``text`` (the driver still running)."""
    end = time.time() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"ended before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.time() < end, f"no {text!r} within {timeout} s"
        time.sleep(0.1)
    return log.read_text()


@pytest.mark.slow
def test_a_design_on_two_nodes_is_the_single_process_run(tmp_path, local):
    cluster = _cluster()
    try:
        out = cluster.run([sys.executable, "-m", "jaxmarket.train", *SMALL, "--run-dir",
                           str(tmp_path / "ray"), "--ray", cluster.address], cwd=ROOT)
    finally:
        cluster.stop()
    assert out.returncode == 0, out.stderr[-2000:]
    _same_files(tmp_path / "ray", local)
    record = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert record["command"].startswith("python -m jaxmarket.train configs/calvano.yaml")
    nodes = record["segments"][-1]["cluster"]["nodes"]
    assert sorted(n["cpus"] for n in nodes) == [0.0, 1.0, 1.0]   # head + two workers
    ran_on = {r["node_id"] for b in record["segments"][-1]["cluster"]["blocks"]
              for r in b["runs"]}
    assert len(ran_on) == 2   # both worker nodes played blocks
    assert "block 4/4" in out.stdout
    assert out.stderr.strip() == ""   # Ray's own output went to ray.log
    assert (tmp_path / "ray" / "ray.log").is_file()


@pytest.mark.slow
def test_a_node_lost_mid_design_changes_nothing(tmp_path, local):
    """One worker node's raylet SIGKILLed once the first block is kept: its block in
    flight runs again on the other node; the run's files are the single process's."""
    cluster = _cluster()
    log = tmp_path / "driver.log"
    try:
        with log.open("w") as out:
            driver = cluster.popen([sys.executable, "-m", "jaxmarket.train", *SMALL,
                                    "--run-dir", str(tmp_path / "ray"), "--ray",
                                    cluster.address], cwd=ROOT, stdout=out)
            _wait_for(log, driver, " played on ")
            cluster.kill_node(2)   # the second worker node
            assert driver.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        cluster.stop()
    _same_files(tmp_path / "ray", local)
    text = log.read_text()
    assert "(raylet)" not in text and "retries remaining" not in text   # Ray's, in ray.log
    assert "will be retried" in (tmp_path / "ray" / "ray.log").read_text()
    record = json.loads((tmp_path / "ray" / "run.json").read_text())
    blocks = record["segments"][-1]["cluster"]["blocks"]
    assert [b["sessions"] for b in blocks] == [[0, 64], [64, 128], [128, 192], [192, 256]]
    assert all(b["runs"] for b in blocks)   # every block played to the end somewhere


@pytest.mark.slow
def test_a_killed_driver_resumes_only_the_blocks_not_kept(tmp_path, local):
    cluster = _cluster()
    log = tmp_path / "driver.log"
    run_dir = tmp_path / "ray"
    try:
        with log.open("w") as out:
            driver = cluster.popen([sys.executable, "-m", "jaxmarket.train", *SMALL,
                                    "--run-dir", str(run_dir), "--ray", cluster.address],
                                   cwd=ROOT, stdout=out)
            _wait_for(log, driver, " played on ")
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=60)
        kept = len(list((run_dir / "blocks").glob("*.npz")))
        assert 1 <= kept < 4   # the driver died with blocks still in flight
        assert not (run_dir / "summary.json").exists()
        out = cluster.run([sys.executable, "-m", "jaxmarket.train", "--resume", str(run_dir),
                           "--ray", cluster.address], cwd=ROOT)
    finally:
        cluster.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"blocks kept from before: {kept} of 4" in out.stdout
    first = re.findall(r"^block \d/4 played on (?!to period)", out.stdout, re.M)
    assert len(first) == 4 - kept   # only the blocks not kept are played (then played on)
    _same_files(run_dir, local)


SWEEP = ["configs/calvano.yaml", "--grid", "learners.sellers.learning_rate=[0.1, 0.15, 0.2]",
         "train.num_seeds=64", "learners.sellers.exploration_decay=1e-4",
         "learners.sellers.convergence_window=10000", "train.chunk_size=5000"]


@pytest.mark.slow
def test_a_node_lost_mid_sweep_changes_no_cell(tmp_path):
    local = subprocess.run([sys.executable, "-m", "jaxmarket.sweep", *SWEEP, "--run-dir",
                            str(tmp_path / "local")], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-2000:]
    cluster = _cluster()
    log = tmp_path / "driver.log"
    try:
        with log.open("w") as out:
            driver = cluster.popen([sys.executable, "-m", "jaxmarket.sweep", *SWEEP,
                                    "--run-dir", str(tmp_path / "ray"), "--ray",
                                    cluster.address], cwd=ROOT, stdout=out)
            _wait_for(log, driver, "sweep cell ")
            cluster.kill_node(2)
            assert driver.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        cluster.stop()
    assert "3/3 cells" in log.read_text() and "(raylet)" not in log.read_text()
    for cell in ("0", "1", "2"):
        _same_files(tmp_path / "ray" / "cells" / cell, tmp_path / "local" / "cells" / cell)
    record = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert sorted(record["cells"]) == ["0", "1", "2"]
    assert record["command"].startswith("python -m jaxmarket.sweep configs/calvano.yaml")


def test_reproduce_ray_refuses_a_loop_design_before_anything_runs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "jaxmarket.reproduce", "calvano_ppo", "--ray",
                          "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert "--ray" in out.stderr and "loop engine" in out.stderr
    assert not (tmp_path / "run").exists()


REPRODUCE = ["calvano2020", "--sessions", "128", "--periods", "200000",
             "learners.sellers.exploration_decay=1e-4",
             "learners.sellers.convergence_window=10000", "train.chunk_size=5000"]


@pytest.mark.slow
def test_reproduce_on_a_cluster_is_the_local_reproduction(tmp_path):
    here = subprocess.run([sys.executable, "-m", "jaxmarket.reproduce", *REPRODUCE,
                           "--run-dir", str(tmp_path / "local"), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert here.returncode == 0, here.stderr[-2000:]
    cluster = _cluster()
    try:
        out = cluster.run([sys.executable, "-m", "jaxmarket.reproduce", *REPRODUCE,
                           "--run-dir", str(tmp_path / "ray"), "--json", "--ray",
                           cluster.address], cwd=ROOT)
    finally:
        cluster.stop()
    assert out.returncode == 0, out.stderr[-2000:]
    _same_files(tmp_path / "ray", tmp_path / "local")
    mine, theirs = (json.loads(o.stdout.strip().splitlines()[-1]) for o in (out, here))
    for key in ("value", "ci95", "verdict", "sessions", "periods", "converged_share"):
        assert mine[key] == theirs[key], key
    assert "--ray" in mine["command"] and "played on" in out.stdout
