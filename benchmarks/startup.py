"""How fast the commands start: each command below run as a fresh subprocess ``--runs``
times (median wall seconds), then once more under ``python -X importtime`` for the
modules it imported (the top-level imports with the most cumulative time, and which of
the heavy libraries were imported at all)::

    python benchmarks/startup.py                 # 5 runs of each command
    python benchmarks/startup.py --runs 9 --json --write

Commands: a config error (``check`` of the default with a bad learning rate), ``--help``
of ``python -m jaxmarket.check`` and ``python -m jaxmarket.train``, ``jaxmarket --help``,
and a good ``check`` of the default (which resolves the plan: jax and the learners).
``--json``: the last line is JSON; ``--write``: benchmarks/results/startup.json."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "configs/budget_monopoly.yaml"
COMMANDS = {
    "check_config_error": ["-m", "jaxmarket.check", DEFAULT, "learners.seller.learning_rate=-1"],
    "check_help": ["-m", "jaxmarket.check", "--help"],
    "train_help": ["-m", "jaxmarket.train", "--help"],
    "jaxmarket_help": ["-m", "jaxmarket.cli.main", "--help"],
    "check_good": ["-m", "jaxmarket.check", DEFAULT],
}
HEAVY = ("jax", "flax", "optax", "orbax", "distrax", "rich", "pandas", "matplotlib", "numba")


def wall(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, check=False)
    return time.perf_counter() - start


def imports(args: list[str], top: int) -> dict:
    """The ``top`` top-level imports by cumulative time, and the heavy ones imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if cumulative.strip().isdigit() and not name.startswith("  "):   # a top-level import
            rows.append((int(cumulative), name.strip()))
    names = {name.strip().split(".")[0] for _, name in rows} | {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in out.stderr.splitlines() if line.startswith("import time:") and "|" in line}
    rows.sort(reverse=True)
    return {"top_imports_s": {name: round(us / 1e6, 3) for us, name in rows[:top]},
            "heavy_imported": sorted(set(HEAVY) & names), "exit_code": out.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each command (median)")
    ap.add_argument("--top", type=int, default=6, help="top-level imports listed per command")
    ap.add_argument("--json", action="store_true", help="the last line is JSON")
    record.add_arguments(ap, "startup")
    args = ap.parse_args(argv)
    results = {"runs": args.runs}
    for name, cmd in COMMANDS.items():
        times = [wall(cmd) for _ in range(args.runs)]
        results[name] = {"command": "python " + " ".join(cmd),
                         "median_s": round(statistics.median(times), 3),
                         "min_s": round(min(times), 3), **imports(cmd, args.top)}
        print(f"{name:20s} median {results[name]['median_s']:.2f} s (min "
              f"{results[name]['min_s']:.2f} s); heavy imported: "
              f"{', '.join(results[name]['heavy_imported']) or 'none'}")
    record.write(args, results, __file__, argv, "startup")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
