"""A session-engine design's sessions on a Ray cluster of 1, 2, ... worker nodes: what
``python -m jaxmarket.train CONFIG --ray ADDRESS`` costs and gains per node.

Each row starts a real multi-process Ray cluster on this machine
(:class:`jaxmarket.cluster.local.LocalCluster`: a head without CPUs and ``W`` worker
nodes of one CPU each, in a network namespace of its own; needs root, ``unshare``,
``nsenter`` and ``ip``), then times the user's command on it, start-up included::

    python -m jaxmarket.train configs/calvano.yaml train.num_seeds=S --run-dir DIR --ray ADDRESS

From the run's ``run.json`` (``segments[-1].cluster``):

* ``wall_s``: the command, start to end (what the user waits for); ``speedup`` is the
  first row's ``wall_s`` over this row's;
* ``play_s``: the driver's time from the first block sent to the last one back;
  ``serial_s = wall_s - play_s`` is what one process does whatever the cluster (start-up,
  the outcome tables, the rounding calibration, the greedy cycles, the files);
* ``task_s``: the blocks' task time summed, ``setup_s`` of it making the runner and the
  block's sessions in the worker;
* ``idle_per_block_s = (W play_s - task_s) / tasks``: worker CPU time outside any block
  (Ray's scheduling and transfers, and the wait for the last block of a phase), per task;
* ``overhead_per_block_s = idle_per_block_s + setup_s / tasks``.

``projection``: the time of ``N`` worker CPUs from the one-node row's figures,
``serial_s + ceil(B_N / N) ((task_s - setup_s) / B_N + overhead_per_block_s)``, with
``B_N = len(plan_blocks(S, N))`` blocks (two per CPU, at least 64 sessions each: the
blocks, so the CPUs that help, stop growing at ``S / 64``); each measured row also gets
the projection for its own CPUs (``projected_wall_s``), to show how far the model is
from a measurement.

    python benchmarks/cluster.py --json                       # 1000 sessions, 1 and 2 nodes
    python benchmarks/cluster.py --sessions 256 --workers 1 2

With ``--json`` the last printed line is ``{"sessions", "config", "rows": [{"workers",
"wall_s", "speedup", ...}], "projection": [{"cpus", "blocks", "wall_s", "speedup"}]}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

from jaxmarket.cluster.blocks import plan_blocks
from jaxmarket.cluster.local import LocalCluster

ROOT = Path(__file__).resolve().parents[1]


def one_row(config: str, sessions: int, workers: int, overrides: list[str]) -> dict:
    """The command on a cluster of ``workers`` one-CPU nodes, and its run.json's figures."""
    cluster = LocalCluster(workers=workers, cpus=1)
    try:
        with tempfile.TemporaryDirectory(prefix="jm-cluster-") as tmp:
            run_dir = Path(tmp) / "run"
            started = time.perf_counter()
            out = cluster.run([sys.executable, "-m", "jaxmarket.train", config,
                               f"train.num_seeds={sessions}", *overrides, "--run-dir",
                               str(run_dir), "--ray", cluster.address], cwd=ROOT,
                              timeout=3600)
            wall = time.perf_counter() - started
            if out.returncode != 0:
                raise SystemExit(f"the run on {workers} node(s) failed:\n{out.stderr[-3000:]}")
            segment = json.loads((run_dir / "run.json").read_text())["segments"][-1]
            summary = json.loads((run_dir / "summary.json").read_text())
    finally:
        cluster.stop()
    info = segment["cluster"]
    runs = [r for b in info["blocks"] for r in b["runs"]]
    task = sum(r["wall_s"] for r in runs)
    setup = sum(r["setup_s"] for r in runs)
    idle = (workers * info["play_s"] - task) / len(runs)
    return {"workers": workers, "cpus": info["cpus"], "blocks": len(info["blocks"]),
            "tasks": len(runs), "wall_s": round(wall, 2), "play_s": info["play_s"],
            "serial_s": round(wall - info["play_s"], 2), "task_s": round(task, 2),
            "setup_s": round(setup, 2), "idle_per_block_s": round(idle, 3),
            "overhead_per_block_s": round(idle + setup / len(runs), 3),
            "session_periods": int(sum(r["session_periods"] for r in runs)),
            "periods": int(summary["periods"]),
            "profit_gain": summary["profit_gain"]["sellers"]}


def projection(rows: list[dict], sessions: int, cpus: list[int]) -> list[dict]:
    """Wall time on ``cpus`` worker CPUs from the one-node row (module docstring)."""
    one = rows[0]
    work = one["task_s"] - one["setup_s"]   # the blocks' playing, one CPU
    out = []
    for n in cpus:
        blocks = len(plan_blocks(sessions, n))
        rounds = math.ceil(blocks / n)
        wall = one["serial_s"] + rounds * (work / blocks + one["overhead_per_block_s"])
        out.append({"cpus": n, "blocks": blocks, "busy_cpus": min(n, blocks),
                    "wall_s": round(wall, 1), "speedup": round(one["wall_s"] / wall, 2)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/calvano.yaml")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", action="store_true", help="print the results as JSON last")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    record.add_arguments(ap, "cluster")
    args = ap.parse_args(argv)
    rows = []
    for w in args.workers:
        row = one_row(args.config, args.sessions, w, args.overrides)
        row["speedup"] = round(rows[0]["wall_s"] / row["wall_s"], 2) if rows else 1.0
        rows.append(row)
        print(f"{w} worker node(s): {row['wall_s']:.1f} s (play {row['play_s']:.1f} s, serial "
              f"{row['serial_s']:.1f} s), {row['blocks']} blocks, overhead "
              f"{row['overhead_per_block_s']:.2f} s per block, speedup {row['speedup']:.2f}x",
              flush=True)
    for row, p in zip(rows, projection(rows, args.sessions, [r["workers"] for r in rows])):
        row["projected_wall_s"] = p["wall_s"]
    results = {"config": args.config, "sessions": args.sessions, "overrides": args.overrides,
               "rows": rows,
               "projection": projection(rows, args.sessions, [1, 2, 4, 8, 10, 16, 100])}
    for p in results["projection"]:
        print(f"projected, {p['cpus']} worker CPUs: {p['blocks']} blocks, {p['wall_s']:.1f} s, "
              f"{p['speedup']:.2f}x")
    if args.json:
        print(json.dumps(results))
    record.write(args, results, __file__, argv, "cluster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
