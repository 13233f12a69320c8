"""Runs across machines: a session-engine design's sessions as Ray blocks
(jaxmarket.cluster.blocks) on a real multi-process Ray cluster of this machine
(tests/raycluster.py: its own network namespace, loopback only), the head that does not
answer, and a distributed start whose peers never come."""

from __future__ import annotations

import json
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


@pytest.mark.slow
def test_a_design_on_two_nodes_is_the_single_process_run(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from raycluster import Cluster
    local = subprocess.run([sys.executable, "-m", "jaxmarket.train", *SMALL, "--run-dir",
                            str(tmp_path / "local")], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-2000:]
    cluster = Cluster(workers=2, cpus=1)
    try:
        out = cluster.run([sys.executable, "-m", "jaxmarket.train", *SMALL, "--run-dir",
                           str(tmp_path / "ray"), "--ray", cluster.address], cwd=ROOT)
    finally:
        cluster.stop()
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ("sessions.csv", "summary.json", "strategies.npz"):
        assert (tmp_path / "ray" / name).read_bytes() == \
            (tmp_path / "local" / name).read_bytes(), name
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
