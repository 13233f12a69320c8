"""Session engine throughput: session-periods per second per design and per backend, each
timed through what a user runs, :func:`jaxmarket.sessions.run.start` (``python -m
jaxmarket.train CONFIG`` on the session engine), into a temporary run directory.

A row is a shipped design (``jaxmarket/designs/NAME.yaml``, what ``jaxmarket reproduce
NAME`` runs): its config and overrides, at the design's own number of sessions
(``--sessions`` overrides it) and its own periods (a design that stops at convergence:
its cap) but at most ``--work`` session-periods (``--periods`` overrides it), with
``train.session_stop = periods`` (every session plays every period: the same work on
both backends, no convergence, no compaction), ``train.chunk_size = min(--chunk,
periods)`` and ``train.session_backend`` the backend of the row. Each row is timed on
the second of two identical runs, as a user's second run of a design finds the
persistent compilation cache of ``python -m jaxmarket.train`` and the kernel's rounding
kept there (``--no-warmup``: the first run):

* ``xla-cpu``: the XLA backend on the CPU (the learner's ``act``/``update``, vmapped);
* ``kernel-cpu``: the numba kernel (every core), where the design is one it plays
  (``jaxmarket.sessions.game.kernel_reason``; otherwise the row is skipped with the
  reason);
* ``xla-gpu``: the XLA backend on the GPU, when ``jax.default_backend() == "gpu"``.

Designs (``--designs``; default :data:`DEFAULT_DESIGNS`, one for each way the kernel
plays a game): Calvano et al.'s duopoly (the kernel's plain loop), three firms, memory 0,
per-firm grids (asymmetric costs), Boltzmann exploration, Johnson et al.'s steering
and its dynamic variant (a rule on last period's prices: pair tables), Klein's
alternating moves and sequential target, Asker et al.'s full feedback (both move
orders), Banchio & Skrzypacz's auctions (random period outcomes, stateless
learners), Calvano et al. 2021 (random outcomes, an observation grid) and Waltman &
Kaymak's Cournot market; ``--designs all``: every shipped design the session engine
plays.

``wall_s`` is the whole ``start()`` call: the outcome tables, compilation, the periods,
the greedy cycles, the equilibrium check and the run directory's files (what a user
waits for), ``session_periods_per_s = sessions x periods / wall_s``, ``cpu_s`` the
process's user + system CPU seconds in that call (every thread) and
``session_periods_per_cpu_s`` the same work per CPU-second; ``compile_s`` is JAX's
compile events inside that call (``compile_timer.CompileTimer``). ``ratios`` holds, per
design, kernel over XLA session-periods per second (``target``: 3.0). What the two
backends share (the outcome tables, the greedy cycles or the long-run mean of random
outcomes, the equilibrium check, the files) bounds it.

    python benchmarks/sessions_throughput.py --json                  # the default designs
    python benchmarks/sessions_throughput.py --designs klein2021,calvano2020 --periods 500000
    python benchmarks/sessions_throughput.py --designs calvano2020 --backends kernel-cpu

With ``--json`` the last printed line is ``{"designs": [{"design", "backend",
"sessions", "periods", "wall_s", "cpu_s", "session_periods_per_s", ...}, ...],
"ratios": [{"design", "kernel_over_xla", "target_met"}, ...], "skipped": [...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_timer import CompileTimer
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

from jaxmarket.compile_cache import compilation_cache
from jaxmarket.compile_cache import default_dir as default_cache_dir
from jaxmarket.config.loader import load_config
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions import run as session_run
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.reproduce import find_design, list_designs

ROOT = Path(__file__).resolve().parents[1]
#: one design for each way the kernel plays a game (module docstring)
DEFAULT_DESIGNS = ("calvano2020", "calvano2020_n3", "calvano2020_memoryless",
                   "calvano2020_cost025", "calvano2020_boltzmann", "johnson2023_pdp",
                   "johnson2023_dynamic_pdp", "klein2021", "asker2022_sync",
                   "asker2022_async", "banchio2022_first", "banchio2022_second",
                   "calvano2021", "waltman2008_n2")
BACKENDS = ("xla-cpu", "kernel-cpu", "xla-gpu")
#: kernel over XLA session-periods per second that each design should reach
TARGET = 3.0


def config_of(design: str, sessions: int | None, periods: int, chunk: int,
              backend: str) -> dict:
    """The design's config and overrides, then the row's: its sessions (None: the
    design's own), ``periods`` periods for every session, the backend."""
    found = find_design(design)
    own = [] if sessions is None else [f"train.num_seeds={sessions}"]
    return load_config(found.config, [
        *found.overrides, *own, f"train.num_iterations={periods}",
        f"train.chunk_size={min(chunk, periods)}", "train.session_stop=periods",
        f"train.session_backend={backend}"])


def row_size(design: str, sessions: int | None, periods: int | None,
             work: int) -> tuple[int, int]:
    """``(sessions, periods)`` of a row: the given ones, else the design's own sessions
    and its own periods (its cap, for a design that stops at convergence), at most
    ``work / sessions``."""
    found = find_design(design)
    train = load_config(found.config, list(found.overrides))["train"]
    sessions = sessions or int(train["num_seeds"])
    if periods is None:
        periods = max(1, min(int(train["num_iterations"]), work // sessions))
    return sessions, periods


def session_designs() -> list[str]:
    """Every shipped design the session engine plays (``--designs all``)."""
    names = []
    for design in list_designs():
        config = load_config(design.config, list(design.overrides))
        if session_run.choose_engine(config)[0] == "sessions":
            names.append(design.name)
    return names


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def skip_reason(plan, backend: str) -> str | None:
    """Why ``backend`` (a row label) cannot run this design here (None: it can)."""
    if backend == "xla-gpu" and jax.default_backend() != "gpu":
        return f"the default JAX backend is {jax.default_backend()}, not gpu"
    if backend == "kernel-cpu":
        try:
            eng.choose_backend(make_game(plan), "kernel")
        except ValueError as err:
            return str(err)
    return None


def time_one(design: str, backend: str, sessions: int | None, periods: int,
             chunk: int, warmup: bool = True) -> dict:
    """One ``start()`` of ``design`` on ``backend`` (a row label), timed; with
    ``warmup`` after the same run once untimed, as a user's second run of a design finds
    JAX's compilation cache and the kernel's rounding kept
    (:mod:`jaxmarket.compile_cache`, the cache ``python -m jaxmarket.train`` uses)."""
    engine_backend, platform = backend.split("-")
    config = config_of(design, sessions, periods, chunk, engine_backend)
    engine, reason, plan = session_run.choose_engine(config)
    if engine != "sessions":
        raise RuntimeError(f"{design}: not a session design ({reason})")
    with contextlib.ExitStack() as stack:
        where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sessions-")))
        if platform == "cpu" and jax.default_backend() != "cpu":
            stack.enter_context(jax.default_device(jax.devices("cpu")[0]))
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        stack.enter_context(compilation_cache(default_cache_dir()))
        if warmup:   # the same run once, untimed: compiled programs and rounding kept
            session_run.start(config, plan, where / "warmup",
                              command="benchmarks/sessions_throughput.py")
        compiled = stack.enter_context(CompileTimer())
        cpu = cpu_seconds()
        started = time.perf_counter()
        summary = session_run.start(config, plan, where / "run",
                                    command="benchmarks/sessions_throughput.py")
        wall = time.perf_counter() - started
        cpu = cpu_seconds() - cpu
    if summary["backend"] != engine_backend or summary["periods"] != periods:
        raise RuntimeError(f"{design}: ran backend {summary['backend']} for "
                           f"{summary['periods']} periods, not {engine_backend} for {periods}")
    work = summary["sessions"] * summary["periods"]
    return {"design": design, "backend": backend, "sessions": int(summary["sessions"]),
            "periods": int(summary["periods"]), "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "compile_s": round(compiled.seconds, 3),
            "session_periods_per_s": work / wall, "session_periods_per_cpu_s": work / cpu}


def ratios(rows: list[dict]) -> list[dict]:
    """Per design with both CPU rows: kernel over XLA session-periods per second."""
    by = {(r["design"], r["backend"]): r for r in rows}
    out = []
    for design in dict.fromkeys(r["design"] for r in rows):
        xla, kernel = by.get((design, "xla-cpu")), by.get((design, "kernel-cpu"))
        if xla and kernel:
            ratio = kernel["session_periods_per_s"] / xla["session_periods_per_s"]
            out.append({"design": design, "kernel_over_xla": round(ratio, 2),
                        "target": TARGET, "target_met": ratio >= TARGET})
    return out


def table(rows: list[dict], kept: list[dict]) -> str:
    head = (f"{'design':<24}{'backend':<12}{'sessions':>9}{'periods':>10}{'wall s':>9}"
            f"{'cpu s':>9}{'compile s':>11}{'session-periods/s':>19}{'per cpu-s':>13}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['design']:<24}{r['backend']:<12}{r['sessions']:>9,d}"
                     f"{r['periods']:>10,d}{r['wall_s']:>9.2f}{r['cpu_s']:>9.2f}"
                     f"{r['compile_s']:>11.2f}{r['session_periods_per_s']:>19,.0f}"
                     f"{r['session_periods_per_cpu_s']:>13,.0f}")
    for r in kept:
        lines.append(f"{r['design']:<24}kernel / xla {r['kernel_over_xla']:.2f}x "
                     f"(target {r['target']:.0f}x: {'met' if r['target_met'] else 'NOT met'})")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> dict:
    parser = _Parser(prog="sessions_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=None,
                        help="sessions of every row (default: each design's own)")
    parser.add_argument("--periods", type=int, default=None,
                        help="periods of every row (default: each design's own, at most "
                             "--work / sessions)")
    parser.add_argument("--work", type=int, default=50_000_000,
                        help="session-periods of a row at most, where --periods is not "
                             "given")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="time each row's first run (cold caches where they are)")
    parser.add_argument("--chunk", type=int, default=20_000, help="periods per chunk")
    parser.add_argument("--designs", default=",".join(DEFAULT_DESIGNS),
                        help="comma-separated shipped design names (jaxmarket reproduce "
                             "--list), or all")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--json", action="store_true", help="print a JSON object last")
    record.add_arguments(parser, "sessions_throughput")
    args = parser.parse_args(argv)
    designs = [d for d in args.designs.split(",") if d]
    backends = [b for b in args.backends.split(",") if b]
    if any(x is not None and x < 1 for x in (args.sessions, args.periods, args.chunk,
                                              args.work)):
        parser.error("--sessions, --periods, --work and --chunk must be >= 1")
    if designs == ["all"]:
        designs = session_designs()
    known = {d.name for d in list_designs()}
    for name, given, allowed in (("--designs", designs, sorted(known)),
                                 ("--backends", backends, BACKENDS)):
        bad = [x for x in given if x not in allowed]
        if bad or not given:
            parser.error(f"{name}: got {','.join(given)}; allowed: {', '.join(allowed)}")
    sessions = "each design's own sessions" if args.sessions is None else \
        f"{args.sessions} sessions"
    periods = f"at most {args.work:,d} session-periods a row" if args.periods is None else \
        f"{args.periods:,d} periods"
    print(f"session engine throughput: {sessions}, {periods}, JAX default backend "
          f"{jax.default_backend()}, {os.cpu_count()} CPUs", flush=True)
    rows, skipped = [], []
    for design in designs:
        for backend in backends:
            _, _, plan = session_run.choose_engine(config_of(design, 1, 1, 1, "xla"))
            why = skip_reason(plan, backend)
            if why is not None:
                skipped.append({"design": design, "backend": backend, "reason": why})
                print(f"  {design} {backend}: skipped ({why})", flush=True)
                continue
            size = row_size(design, args.sessions, args.periods, args.work)
            row = time_one(design, backend, *size, args.chunk, args.warmup)
            rows.append(row)
            print(f"  {design} {backend}: {row['session_periods_per_s']:,.0f} session-periods/s "
                  f"({row['wall_s']:.1f} s, {row['cpu_s']:.1f} CPU-s)", flush=True)
    kept = ratios(rows)
    print(table(rows, kept))
    result = {"designs": rows, "ratios": kept, "skipped": skipped,
              "platform": jax.default_backend(), "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result))
    record.write(args, result, __file__, argv, "sessions_throughput")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
