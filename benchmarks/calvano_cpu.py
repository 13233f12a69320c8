"""CPU seconds of Calvano et al.'s 1000 sessions as a user runs them, ``python -m
jaxmarket.train configs/calvano.yaml``, start-up included, beside a plain C session loop
(``--yardstick``: ``benchmarks/yardsticks/calvano_period.c``, built here with ``cc -O3
-march=native -fopenmp``; ``--yardstick BINARY``: a program of your own), and the first
run on a fresh machine beside a second one (``--cold``).

Each command runs as a child process; its CPU time is the user + system time the
operating system charges to it and its threads (``os.wait4``), its wall time from start
to exit. The work is the periods the sessions learn for: each session's
``convergence_period`` in ``sessions.csv`` (the period at which its strategies had been
unchanged for ``convergence_window`` periods), summed. A session stopped at its
convergence is the yardstick's count too (it prints ``session_periods``), so
``session_periods_per_cpu_s`` compares the same work per CPU-second:
``ratio = product / yardstick`` (target 1.0).

The yardstick is any program that takes the number of sessions as its one argument and
prints one JSON line with ``session_periods``; a plain C loop of Calvano et al.'s
baseline (float64 Q tables, a cached greedy action per state, one xorshift generator per
session, OpenMP threads) is the one the team compares with. It runs with
``OMP_NUM_THREADS`` = the number of CPUs.

``--cold``: the command once with empty caches (JAX's compilation cache and the kernel's
rounding in ``JAXMARKET_COMPILE_CACHE``, numba's in ``NUMBA_CACHE_DIR``, both fresh
temporary folders: a fresh clone after ``pip install``, which leaves the installed
packages' bytecode compiled), then again with the caches the first run left (target: the
first at most 1.3x the second, wall time). ``--pairs N``: N such pairs, each with caches
of its own; the figure is the median pair's, and every pair is reported.

    python benchmarks/calvano_cpu.py --yardstick --cold --pairs 3 --json --write
    python benchmarks/calvano_cpu.py --yardstick ./my_loop --sessions 100
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/calvano.yaml"
SOURCE = ROOT / "benchmarks" / "yardsticks" / "calvano_period.c"
#: the product's session-periods per CPU-second over the yardstick's, at least
RATIO_TARGET = 1.0
#: the first run's wall time over the second's, at most
COLD_TARGET = 1.3


def timed(command: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """``(wall_s, cpu_s, stdout)`` of a child process (its CPU time: ``os.wait4``)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {child.returncode}:\n{out[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, out


def product(sessions: int, run_dir: Path, env: dict | None = None) -> dict:
    """``python -m jaxmarket.train configs/calvano.yaml`` with ``sessions`` sessions."""
    command = [sys.executable, "-m", "jaxmarket.train", CONFIG, "--run-dir", str(run_dir),
               f"train.num_seeds={sessions}"]
    wall, cpu, _ = timed(command, env)
    with open(run_dir / "sessions.csv") as handle:
        rows = list(csv.DictReader(handle))
    summary = json.loads((run_dir / "summary.json").read_text())
    work = sum(int(r["convergence_period"]) for r in rows)
    return {"command": "python -m jaxmarket.train " + " ".join(command[3:]).replace(
                str(run_dir), "RUN"),
            "sessions": len(rows), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "session_periods": work, "session_periods_per_cpu_s": work / cpu,
            "converged": sum(r["converged"] in ("True", "true", "1") for r in rows),
            "profit_gain": summary["profit_gain"]["sellers"]}


def build(where: Path) -> str:
    """``benchmarks/yardsticks/calvano_period.c`` built with ``cc`` into ``where``."""
    binary = where / "calvano_period"
    command = ["cc", "-O3", "-march=native", "-fopenmp", str(SOURCE), "-o", str(binary),
               "-lm"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"--yardstick: {' '.join(command[:4])} {SOURCE.name} failed "
                         f"(a C compiler with OpenMP is needed):\n{done.stderr[-1000:]}")
    return str(binary)


def yardstick(binary: str, sessions: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()))
    wall, cpu, out = timed([binary, str(sessions)], env)
    printed = json.loads(out.strip().splitlines()[-1])
    work = int(printed["session_periods"])
    return {"binary": Path(binary).name, "sessions": sessions, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "session_periods": work,
            "session_periods_per_cpu_s": work / cpu, "profit_gain": printed.get("profit_gain")}


def cold_and_warm(sessions: int, where: Path, pairs: int = 1) -> dict:
    """The command with fresh caches, then again with what the first run left; ``pairs``
    times, each pair with caches of its own. The figure is the median pair's ratio (this
    host is shared: one pair's second run alone varies by several seconds); every pair
    is kept."""
    done = []
    for k in range(pairs):
        env = dict(os.environ, JAXMARKET_COMPILE_CACHE=str(where / f"xla{k}"),
                   NUMBA_CACHE_DIR=str(where / f"numba{k}"))
        cold = product(sessions, where / f"cold{k}", env)
        warm = product(sessions, where / f"warm{k}", env)
        done.append({"cold": cold, "warm": warm,
                     "cold_over_warm": round(cold["wall_s"] / warm["wall_s"], 3)})
        print(f"pair {k + 1}: first run {cold['wall_s']:.1f} s, second {warm['wall_s']:.1f} s: "
              f"{done[-1]['cold_over_warm']:.2f}x", flush=True)
    median = sorted(done, key=lambda p: p["cold_over_warm"])[(len(done) - 1) // 2]
    return {**median, "pairs": done, "target": COLD_TARGET,
            "target_met": median["cold_over_warm"] <= COLD_TARGET}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="calvano_cpu.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--yardstick", nargs="?", const="", default=None, metavar="BINARY",
                        help="the C loop of benchmarks/yardsticks/ (built with cc), or a "
                             "program: BINARY SESSIONS prints JSON with session_periods")
    parser.add_argument("--cold", action="store_true",
                        help="also the first run with empty caches, then a second")
    parser.add_argument("--pairs", type=int, default=1, metavar="N",
                        help="--cold: N pairs of runs, each with fresh caches (the median "
                             "pair's ratio is the figure)")
    parser.add_argument("--json", action="store_true", help="print a JSON object last")
    record.add_arguments(parser, "calvano_cpu")
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error(f"--sessions: got {args.sessions}; allowed: >= 1")
    if args.pairs < 1:
        parser.error(f"--pairs: got {args.pairs}; allowed: >= 1")
    if args.yardstick and not os.access(args.yardstick, os.X_OK):
        parser.error(f"--yardstick: got {args.yardstick!r}; allowed: an executable file")
    result = {"sessions": args.sessions, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="calvano-cpu-") as tmp:
        where = Path(tmp)
        if args.yardstick == "":
            args.yardstick = build(where)
        if args.yardstick:
            result["yardstick"] = yardstick(args.yardstick, args.sessions)
            print(f"yardstick: {result['yardstick']['cpu_s']:.1f} CPU-s, "
                  f"{result['yardstick']['session_periods_per_cpu_s']:,.0f} session-periods "
                  f"per CPU-s", flush=True)
        result["product"] = product(args.sessions, where / "run")
        print(f"python -m jaxmarket.train {CONFIG}: {result['product']['cpu_s']:.1f} CPU-s, "
              f"{result['product']['wall_s']:.1f} s wall, "
              f"{result['product']['session_periods_per_cpu_s']:,.0f} session-periods per "
              f"CPU-s", flush=True)
        if args.yardstick:
            ratio = result["product"]["session_periods_per_cpu_s"] / \
                result["yardstick"]["session_periods_per_cpu_s"]
            result["ratio"] = {"product_over_yardstick": round(ratio, 3),
                               "target": RATIO_TARGET, "target_met": ratio >= RATIO_TARGET}
            print(f"per CPU-second: {ratio:.2f}x the yardstick (target {RATIO_TARGET}x)")
        if args.cold:
            result["start"] = cold_and_warm(args.sessions, where, args.pairs)
            s = result["start"]
            print(f"first run {s['cold']['wall_s']:.1f} s, second {s['warm']['wall_s']:.1f} s: "
                  f"{s['cold_over_warm']:.2f}x (median of {args.pairs}; target at most "
                  f"{COLD_TARGET}x)")
    if args.json:
        print(json.dumps(result))
    shown = None if argv is None else [   # no path of this machine
        "BINARY" if a == args.yardstick else a for a in argv]
    record.write(args, result, __file__, shown, "calvano_cpu")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
