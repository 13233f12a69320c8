"""Session engine throughput: session-periods per second per design and per backend, each
timed through what a user runs, :func:`jaxmarket.sessions.run.start` (``python -m
jaxmarket.train CONFIG`` on the session engine), into a temporary run directory.

Every run is the shipped config with ``train.num_seeds = --sessions``,
``train.num_iterations = --periods`` and ``train.session_stop = periods`` (every
session plays every period: a fixed amount of work, no convergence, no compaction),
``train.chunk_size = min(--chunk, --periods)`` and ``train.session_backend`` the
backend of the row:

* ``xla-cpu``: the XLA backend on the CPU (the learner's ``act``/``update``, vmapped);
* ``kernel-cpu``: the numba kernel (every core), where the design is one it plays
  (``jaxmarket.sessions.game.kernel_reason``; otherwise the row is skipped with the
  reason);
* ``xla-gpu``: the XLA backend on the GPU, when ``jax.default_backend() == "gpu"``.

Designs (``--designs``, the first three by default): ``calvano`` (the duopoly of Calvano
et al.: the kernel's plain loop), ``klein2021`` (alternating moves, Klein's sequential
target), ``asker2022_sync`` (100 prices, full feedback, epsilon from 0), and on request
``calvano2021`` (random period outcomes, an observation grid of its own),
``banchio2022_first`` (random period outcomes, a stateless learner), ``waltman2008``
(Boltzmann exploration) and ``calvano2020_boltzmann`` (the shipped design
``jaxmarket/designs/calvano2020_boltzmann.yaml``: Calvano's duopoly with Boltzmann
exploration, its config with the design's ``learners.*`` overrides): all but ``calvano``
on the kernel's general loop.

``wall_s`` is the whole ``start()`` call: the outcome tables, compilation, the periods,
the greedy cycles, the equilibrium and the run directory's files (what a user waits
for), and ``session_periods_per_s = sessions x periods / wall_s``; ``compile_s`` is
JAX's compile events inside that call (``compile_timer.CompileTimer``). Give enough
periods that the periods dominate.

    python benchmarks/sessions_throughput.py --json                 # 100 x 20,000 each
    python benchmarks/sessions_throughput.py --sessions 1000 --periods 100000
    python benchmarks/sessions_throughput.py --designs calvano --backends kernel-cpu

With ``--json`` the last printed line is ``{"designs": [{"design", "backend",
"sessions", "periods", "wall_s", "session_periods_per_s", ...}, ...], "skipped":
[...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_timer import CompileTimer
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

from jaxmarket.config.loader import load_config
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions import run as session_run
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.reproduce import find_design

ROOT = Path(__file__).resolve().parents[1]
DESIGNS = ("calvano", "klein2021", "asker2022_sync", "calvano2021", "banchio2022_first",
           "waltman2008", "calvano2020_boltzmann")
#: designs of jaxmarket/designs: their config with their learner overrides
SHIPPED_DESIGNS = ("calvano2020_boltzmann",)
DEFAULT_DESIGNS = DESIGNS[:3]
BACKENDS = ("xla-cpu", "kernel-cpu", "xla-gpu")


def config_of(design: str, sessions: int, periods: int, chunk: int, backend: str) -> dict:
    path, extra = ROOT / "configs" / f"{design}.yaml", []
    if design in SHIPPED_DESIGNS:
        shipped = find_design(design)
        path = shipped.config
        extra = [o for o in shipped.overrides if o.startswith("learners.")]
    return load_config(path, extra + [
        f"train.num_seeds={sessions}", f"train.num_iterations={periods}",
        f"train.chunk_size={min(chunk, periods)}", "train.session_stop=periods",
        f"train.session_backend={backend}"])


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


def time_one(design: str, backend: str, sessions: int, periods: int, chunk: int) -> dict:
    """One ``start()`` of ``design`` on ``backend`` (a row label), timed."""
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
        compiled = stack.enter_context(CompileTimer())
        started = time.perf_counter()
        summary = session_run.start(config, plan, where / "run",
                                    command="benchmarks/sessions_throughput.py")
        wall = time.perf_counter() - started
    if summary["backend"] != engine_backend or summary["periods"] != periods:
        raise RuntimeError(f"{design}: ran backend {summary['backend']} for "
                           f"{summary['periods']} periods, not {engine_backend} for {periods}")
    return {"design": design, "backend": backend, "sessions": int(summary["sessions"]),
            "periods": int(summary["periods"]), "wall_s": round(wall, 3),
            "compile_s": round(compiled.seconds, 3),
            "session_periods_per_s": summary["sessions"] * summary["periods"] / wall}


def table(rows: list[dict]) -> str:
    head = (f"{'design':<16}{'backend':<12}{'sessions':>9}{'periods':>10}{'wall s':>9}"
            f"{'compile s':>11}{'session-periods/s':>20}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['design']:<16}{r['backend']:<12}{r['sessions']:>9,d}"
                     f"{r['periods']:>10,d}{r['wall_s']:>9.2f}{r['compile_s']:>11.2f}"
                     f"{r['session_periods_per_s']:>20,.0f}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> dict:
    parser = _Parser(prog="sessions_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--periods", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=20_000, help="periods per chunk")
    parser.add_argument("--designs", default=",".join(DEFAULT_DESIGNS),
                        help=f"comma-separated, of {', '.join(DESIGNS)}")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--json", action="store_true", help="print a JSON object last")
    record.add_arguments(parser, "sessions_throughput")
    args = parser.parse_args(argv)
    designs = [d for d in args.designs.split(",") if d]
    backends = [b for b in args.backends.split(",") if b]
    if args.sessions < 1 or args.periods < 1 or args.chunk < 1:
        parser.error("--sessions, --periods and --chunk must be >= 1")
    for name, given, allowed in (("--designs", designs, DESIGNS),
                                 ("--backends", backends, BACKENDS)):
        bad = [x for x in given if x not in allowed]
        if bad or not given:
            parser.error(f"{name}: got {','.join(given)}; allowed: {', '.join(allowed)}")
    print(f"session engine throughput: {args.sessions} sessions x {args.periods:,d} periods, "
          f"JAX default backend {jax.default_backend()}, {os.cpu_count()} CPUs", flush=True)
    rows, skipped = [], []
    for design in designs:
        for backend in backends:
            _, _, plan = session_run.choose_engine(config_of(design, 1, 1, 1, "xla"))
            why = skip_reason(plan, backend)
            if why is not None:
                skipped.append({"design": design, "backend": backend, "reason": why})
                print(f"  {design} {backend}: skipped ({why})", flush=True)
                continue
            row = time_one(design, backend, args.sessions, args.periods, args.chunk)
            rows.append(row)
            print(f"  {design} {backend}: {row['session_periods_per_s']:,.0f} session-periods/s "
                  f"({row['wall_s']:.1f} s)", flush=True)
    print(table(rows))
    result = {"designs": rows, "skipped": skipped, "platform": jax.default_backend(),
              "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result))
    record.write(args, result, __file__, argv, "sessions_throughput")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
