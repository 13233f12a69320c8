"""Time Calvano et al. (AER 2020) as a user runs it: ``configs/calvano.yaml`` on the
package's session engine (``jaxmarket.sessions.run.start``, what
``python -m jaxmarket.train configs/calvano.yaml`` runs).

This script holds no simulation of its own. It loads the shipped config with overrides
for its flags, runs it with :func:`jaxmarket.sessions.run.start` into a temporary run
directory (``--run-dir DIR`` keeps it), times that call and prints the published
experiment's numbers from the run's ``summary.json`` and ``sessions.csv``:

* ``--firms N``: ``market.sellers[0].count = N``, ``low``/``high`` = the bounds of
  :func:`jaxmarket.market.economics.calvano_grid` for ``N`` sellers (``p_N - xi (p_M - p_N)``,
  ``p_M + xi (p_M - p_N)``, xi = 0.1);
* ``--alpha``, ``--beta``, ``--window``: ``learners.sellers.learning_rate``,
  ``exploration_decay``, ``convergence_window``;
* ``--sessions``, ``--max-periods``, ``--chunk``, ``--seed``: ``train.num_seeds``,
  ``train.num_iterations`` (every session stops at its convergence, or there),
  ``train.chunk_size``, ``seed``;
* ``--step``: ``kernel`` -> ``train.session_backend=kernel`` (numba, every core);
  ``fast`` and ``learner`` -> ``train.session_backend=xla``: both are the XLA backend
  now (the learner's own ``act``/``update``; the benchmark's hand-restated XLA step is
  gone); without ``--step`` the engine chooses (``auto``: the kernel on a CPU with numba).
  The two backends give the same sessions bit for bit (``tests/test_sessions_engine.py``).
* ``--devices``: accepted for old command lines, and only as 1 (the session run uses one
  device; the kernel backend spreads the sessions over the cores by itself).

Published for n = 2 (1000 sessions, alpha = 0.15, beta = 4e-6): average profit gain
0.849 (sd 0.112), nearly all sessions converge.

What the JSON reports (``--json``, the last line): the keys of the former stand-alone
script, now read from the run:

* ``profit_gain``: ``summary.json``'s Delta of the converged greedy cycle (mean over
  sessions), ``profit_gain_sd`` the standard deviation (ddof 0) and ``profit_gains`` /
  ``converged`` the per-session values of ``sessions.csv``; ``mean_convergence_period``
  / ``max_convergence_period`` from ``summary.json``'s convergence;
* ``p_nash``, ``p_monopoly``, ``pi_nash``, ``pi_monopoly``: ``summary.json``'s
  benchmarks (the package's static Nash and joint optimum of the market's reward);
* ``wall_s``: the whole ``start()`` call (tables, compilation, the sessions, the
  greedy cycles, the equilibrium, the run directory's files; not loading the config);
* ``compile_s``: JAX's own compile events inside that call (tracing, lowering and XLA
  compilation, ``compile_timer.CompileTimer``; programs loaded from a persistent
  compilation cache count only their tracing and lowering) plus the numba compilation
  (or cache load) of the kernel backend, the ``compile_s`` the kernel's chunk carries
  (read by wrapping ``jaxmarket.sessions.kernel.make_kernel_chunk`` in this process);
* ``periods_simulated``: ``summary.json``'s periods (the last chunk is shorter, so it
  never exceeds ``--max-periods``); ``session_periods = sessions x periods_simulated``
  (``run.json``'s segments hold start and end periods, not the engine's count of
  stepped slots; with the XLA backend the engine compacts converged sessions out of the
  batch, so it steps fewer slots than this);
* ``ns_per_session_period = 1e9 wall_s / session_periods`` (compilation included);
* ``target_met``: at least 1000 sessions in at most 60 s of ``wall_s``.

Grid mode (``--grid-alpha A1,A2,.. --grid-beta B1,B2,..``): a coarse version of the
paper's alpha x beta heat map: one ``start()`` per (alpha, beta) cell of ``--sessions``
sessions (default 32 in grid mode), one after the other; a table (and with ``--json`` a
JSON summary with one row per cell) is printed.

    python benchmarks/calvano.py                       # 1000 sessions, n = 2, beta = 4e-6
    python benchmarks/calvano.py --sessions 64 --beta 2e-4 --window 10000 --json
    python benchmarks/calvano.py --firms 3 --sessions 100
    python benchmarks/calvano.py --grid-alpha 0.05,0.1,0.15,0.2 --grid-beta 4e-6,1e-5,2e-5
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_timer import CompileTimer
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

from jaxmarket.market import economics
from jaxmarket.config.loader import load_config
from jaxmarket.sessions import run as session_run
from jaxmarket.sessions.game import MAX_PROFILES

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "calvano.yaml"
GROUP = "sellers"
#: Published average profit gain of the baseline (n = 2, alpha = 0.15, beta = 4e-6).
PUBLISHED_PROFIT_GAIN = 0.849
BASELINE = {"firms": 2, "alpha": 0.15, "beta": 4e-6}
#: ``--step`` -> ``train.session_backend`` (fast and learner are both the XLA backend)
STEPS = {"kernel": "kernel", "fast": "xla", "learner": "xla"}


def _shipped() -> dict:
    """``configs/calvano.yaml`` as shipped (the flags' defaults)."""
    config = load_config(CONFIG)
    return {"learner": config["learners"][GROUP], "train": config["train"],
            "seller": config["market"]["sellers"][0], "seed": config.get("seed", 0)}


def _yaml_number(x: float) -> str:
    """``x`` as a YAML 1.1 float (PyYAML reads ``1e-05`` as a string; ``1.0e-05`` is a
    float)."""
    text = repr(float(x))
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


def q_table_bytes(firms: int, sessions: int, m: int = 15) -> int:
    """Bytes of the Q tables of ``sessions`` sessions of ``firms`` sellers (``firms``
    tables of ``m^firms`` rows of ``m + 1`` float32 each per session: the learner's
    ``rows``)."""
    return sessions * firms * m ** firms * (m + 1) * 4


def check_arguments(firms: int, alpha: float, beta: float, sessions: int = 1,
                    m: int = 15) -> None:
    """``ValueError`` (one line, naming the flag) for settings outside the experiment:
    fewer than 2 firms, alpha outside (0, 1], beta <= 0, fewer than 1 session, more
    joint prices than the session engine's tables hold, or Q tables that cannot fit in
    this machine's memory."""
    if firms < 2:
        raise ValueError(f"--firms: got {firms}; Calvano's experiment needs at least 2 firms")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"--alpha: got {alpha:g}; the learning rate must be in (0, 1]")
    if not beta > 0.0:
        raise ValueError(f"--beta: got {beta:g}; the exploration decay must be > 0")
    if sessions < 1:
        raise ValueError(f"--sessions: got {sessions}; need at least 1")
    if m ** firms > MAX_PROFILES:
        raise ValueError(f"--firms {firms}: {m}^{firms} joint prices are more than the "
                         f"session engine's tables hold ({MAX_PROFILES})")
    need = 3 * q_table_bytes(firms, sessions, m)  # the sessions, a chunk's copy, the result
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        have = None
    if have is not None and need > have:
        raise ValueError(f"--firms {firms} --sessions {sessions}: the Q tables need about "
                         f"{need / 2**30:.1f} GiB, more than this machine's "
                         f"{have / 2**30:.1f} GiB; use fewer sessions")


def check_step(step: str | None) -> None:
    """``ValueError`` naming the flag for an unknown ``--step``, or ``kernel`` without
    numba."""
    if step is None:
        return
    if step not in STEPS:
        raise ValueError(f"--step: got {step!r}; allowed: {', '.join(STEPS)}")
    if step == "kernel" and importlib.util.find_spec("numba") is None:
        raise ValueError("--step kernel needs numba (pip install numba); or use --step fast")


def overrides(firms: int = 2, alpha: float = 0.15, beta: float = 4e-6,
              window: int = 100_000, sessions: int = 1000, max_periods: int = 10_000_000,
              chunk: int = 20_000, seed: int = 0, step: str | None = None) -> list[str]:
    """The ``key=value`` overrides of ``configs/calvano.yaml`` for these flags."""
    grid = economics.calvano_grid(n=firms)
    items = [f"market.sellers[0].count={firms}",
             f"market.sellers[0].low={_yaml_number(grid[0])}",
             f"market.sellers[0].high={_yaml_number(grid[-1])}",
             f"learners.{GROUP}.learning_rate={_yaml_number(alpha)}",
             f"learners.{GROUP}.exploration_decay={_yaml_number(beta)}",
             f"learners.{GROUP}.convergence_window={int(window)}",
             f"train.num_seeds={int(sessions)}", f"train.num_iterations={int(max_periods)}",
             f"train.chunk_size={int(chunk)}", f"seed={int(seed)}"]
    if step is not None:
        items.append(f"train.session_backend={STEPS[step]}")
    return items


def build_config(**flags) -> dict:
    """``configs/calvano.yaml`` with :func:`overrides` (``load_config``)."""
    return load_config(CONFIG, overrides(**flags))


@contextlib.contextmanager
def _kernel_compile_seconds(seconds: list[float]):
    """Sum into ``seconds`` the numba compile (or cache load) time that each chunk of the
    kernel backend carries (``make_kernel_chunk(...).compile_s``), by wrapping the
    kernel's factory in this process for the duration of the block."""
    from jaxmarket.sessions import kernel
    made = kernel.make_kernel_chunk

    def counting(*args, **kwargs):
        chunk = made(*args, **kwargs)
        seconds.append(float(getattr(chunk, "compile_s", 0.0)))
        return chunk

    kernel.make_kernel_chunk = counting
    try:
        yield seconds
    finally:
        kernel.make_kernel_chunk = made


def _read_sessions(path: Path) -> tuple[list[float], list[bool]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [float(r["profit_gain"]) for r in rows], [r["converged"] == "1" for r in rows]


def run(sessions: int = 1000, beta: float = 4e-6, window: int = 100_000,
        max_periods: int = 10_000_000, chunk: int = 20_000, seed: int = 0,
        progress: bool = True, devices: int | None = None, firms: int = 2,
        alpha: float = 0.15, step: str | None = None, run_dir: str | None = None,
        save_strategies: str | None = None) -> dict:
    """One sessions run of ``configs/calvano.yaml`` with these settings, timed; the
    summary the JSON prints (module docstring). ``progress=False`` silences the run's
    own lines; ``run_dir`` keeps the run directory (default: a temporary one, removed);
    ``save_strategies`` copies its ``strategies.npz`` into that directory."""
    check_arguments(firms, alpha, beta, sessions)
    check_step(step)
    if devices not in (None, 1):
        raise ValueError(f"--devices: got {devices}; only 1 (the session run uses one "
                         f"device; the kernel backend uses every core by itself)")
    config = build_config(firms=firms, alpha=alpha, beta=beta, window=window,
                          sessions=sessions, max_periods=max_periods, chunk=chunk,
                          seed=seed, step=step)
    engine, reason, plan = session_run.choose_engine(config)
    if engine != "sessions":
        raise RuntimeError(f"{CONFIG.name} did not resolve to the session engine: {reason}")
    learner = config["learners"][GROUP]
    seller = config["market"]["sellers"][0]
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="calvano-")))
            where = where / "run"
        else:
            where = Path(run_dir)
        kernel_s: list[float] = []
        with contextlib.ExitStack() as timing:
            if not progress:
                timing.enter_context(contextlib.redirect_stdout(io.StringIO()))
            timing.enter_context(_kernel_compile_seconds(kernel_s))
            compiled = timing.enter_context(CompileTimer())
            started = time.perf_counter()
            summary = session_run.start(config, plan, where,
                                        command="benchmarks/calvano.py")
            wall = time.perf_counter() - started
        gains, converged = _read_sessions(where / session_run.SESSIONS_FILE)
        if save_strategies is not None:
            os.makedirs(save_strategies, exist_ok=True)
            shutil.copyfile(where / session_run.STRATEGIES_FILE,
                            os.path.join(save_strategies, session_run.STRATEGIES_FILE))
    bench = summary["benchmarks"][GROUP]
    conv = summary["convergence"]
    periods = int(summary["periods"])
    session_periods = int(summary["sessions"]) * periods
    grid_size = int(learner["grid_size"])
    gain = np.asarray(gains, np.float64)
    result = {
        "profit_gain": float(summary["profit_gain"][GROUP]),
        "profit_gain_sd": float(gain.std()),
        "converged_share": float(conv["share"]),
        "mean_convergence_period": conv["mean_period"],
        "max_convergence_period": conv["max_period"],
        "periods_simulated": periods,
        "session_periods": session_periods,
        "sessions": int(summary["sessions"]),
        "devices": 1,
        "beta": float(learner["exploration_decay"]),
        "convergence_window": int(learner["convergence_window"]),
        "wall_s": wall,
        "compile_s": compiled.seconds + sum(kernel_s),
        "firms": int(seller["count"]),
        "alpha": float(learner["learning_rate"]),
        "delta": float(learner["discount"]),
        "grid_size": grid_size,
        "states": grid_size ** int(seller["count"]),
        "grid_low": float(seller["low"]),
        "grid_high": float(seller["high"]),
        "p_nash": bench["nash_price"],
        "p_monopoly": bench["joint_price"],
        "pi_nash": bench["nash_profit"],
        "pi_monopoly": bench["joint_profit"],
        "profit_gains": [float(x) for x in gain],
        "converged": converged,
        "step": step if step is not None else summary["backend"],
        "backend": summary["backend"],
        "ns_per_session_period": 1e9 * wall / max(session_periods, 1),
        "target_met": bool(summary["sessions"] >= 1000 and wall <= 60.0),
    }
    if run_dir is not None:
        result["run_dir"] = str(where)
    return result


def run_grid(alphas: list[float], betas: list[float], sessions: int = 32,
             progress: bool = True, **kwargs) -> dict:
    """The coarse alpha x beta heat map: :func:`run` for every cell (``sessions`` each,
    the other settings in ``kwargs`` shared), one cell after the other. Returns
    ``{"cells": [run summary per cell, alpha-major], "alphas", "betas", ...}``; each
    cell's ``alpha`` and ``beta`` are those of its run's config."""
    for alpha in alphas:
        for beta in betas:
            check_arguments(kwargs.get("firms", 2), alpha, beta, sessions)
    start = time.perf_counter()
    cells = []
    for alpha in alphas:
        for beta in betas:
            cell = run(sessions=sessions, beta=beta, alpha=alpha, progress=False, **kwargs)
            cells.append(cell)
            if progress:
                period = cell["mean_convergence_period"]
                print(f"  alpha {alpha:<6g} beta {beta:<8.2g} Delta {cell['profit_gain']:.3f} "
                      f"(sd {cell['profit_gain_sd']:.3f})  converged "
                      f"{cell['converged_share']:6.1%}  mean convergence "
                      f"{'n/a' if period is None else f'{period:,.0f}'}  "
                      f"{cell['wall_s']:6.1f} s", flush=True)
    return {"grid": True, "firms": cells[0]["firms"], "sessions": sessions,
            "alphas": list(alphas), "betas": list(betas), "cells": cells,
            "wall_s": time.perf_counter() - start}


def grid_table(result: dict) -> str:
    """The heat map as text: one row per alpha, one column per beta, Delta (converged
    share) per cell."""
    betas = result["betas"]
    cells = {(c["alpha"], c["beta"]): c for c in result["cells"]}
    lines = ["alpha \\ beta " + "".join(f"{b:>16.2g}" for b in betas)]
    for alpha in result["alphas"]:
        row = "".join(f"{cells[alpha, b]['profit_gain']:>9.3f} "
                      f"({cells[alpha, b]['converged_share']:4.0%})" for b in betas)
        lines.append(f"{alpha:<13g}" + row)
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Bad flags: one line on stderr, exit status 2 (argparse's status)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def main(argv: list[str] | None = None) -> dict:
    shipped = _shipped()
    learner, train = shipped["learner"], shipped["train"]
    parser = _Parser(prog="calvano.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--firms", type=int, default=shipped["seller"]["count"],
                        help="number of sellers n (>= 2)")
    parser.add_argument("--alpha", type=float, default=learner["learning_rate"],
                        help="learning rate, in (0, 1]")
    parser.add_argument("--beta", type=float, default=learner["exploration_decay"],
                        help="exploration decay, > 0")
    parser.add_argument("--sessions", type=int, default=None,
                        help=f"sessions (default {train['num_seeds']}; per cell in grid "
                             f"mode: 32)")
    parser.add_argument("--window", type=int, default=learner["convergence_window"],
                        help="convergence window")
    parser.add_argument("--max-periods", type=int, default=train["num_iterations"],
                        help="stop every session after this many periods (published: 1e9; "
                             "1e7 keeps a stuck session from eating the time budget)")
    parser.add_argument("--chunk", type=int, default=train["chunk_size"],
                        help="periods per compiled chunk")
    parser.add_argument("--seed", type=int, default=shipped["seed"])
    parser.add_argument("--devices", type=int, default=None,
                        help="accepted as 1 only (the session run uses one device)")
    parser.add_argument("--grid-alpha", type=_float_list, default=None, metavar="A1,A2,..",
                        help="grid mode: these learning rates (default: --alpha)")
    parser.add_argument("--grid-beta", type=_float_list, default=None, metavar="B1,B2,..",
                        help="grid mode: these exploration decays (default: --beta)")
    parser.add_argument("--step", choices=tuple(STEPS), default=None,
                        help="the session backend: kernel (numba, every core; the engine's "
                             "choice on a CPU where numba is installed); fast and learner "
                             "are both the XLA backend now (the learner's act/update); "
                             "default: the engine chooses (train.session_backend: auto)")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help="write the run directory here (new or empty) and keep it "
                             "(default: a temporary directory, removed)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    parser.add_argument("--save-strategies", metavar="DIR", default=None,
                        help="copy the run's strategies.npz (every session's final Q "
                             "table, greedy strategy and last prices, with the grid and "
                             "the profit table) to DIR/strategies.npz, for "
                             "jaxmarket.analysis.impulse_response(DIR, ...)")
    record.add_arguments(parser, "calvano, or calvano_grid in grid mode")
    args = parser.parse_args(argv)
    grid_mode = args.grid_alpha is not None or args.grid_beta is not None
    sessions = (args.sessions if args.sessions is not None
                else (32 if grid_mode else train["num_seeds"]))
    alphas = args.grid_alpha or [args.alpha]
    betas = args.grid_beta or [args.beta]
    try:
        for alpha in alphas:
            for beta in betas:
                check_arguments(args.firms, alpha, beta, sessions)
        if args.window < 1 or args.chunk < 1 or args.max_periods < 1:
            raise ValueError("--window, --chunk and --max-periods must be >= 1")
        if args.devices not in (None, 1):
            raise ValueError(f"--devices: got {args.devices}; only 1 (the session run uses "
                             f"one device; the kernel backend uses every core by itself)")
        check_step(args.step)
        if grid_mode and (args.save_strategies is not None or args.run_dir is not None):
            raise ValueError("--save-strategies and --run-dir: one run only, not grid mode")
        if args.run_dir is not None and os.path.exists(args.run_dir) and (
                not os.path.isdir(args.run_dir) or os.listdir(args.run_dir)):
            raise ValueError(f"--run-dir: {args.run_dir} exists and is not an empty "
                             f"directory")
        # the config the flags make (a ConfigError names the key), on the session engine
        engine, reason, _ = session_run.choose_engine(build_config(
            firms=args.firms, alpha=alphas[0], beta=betas[0], window=args.window,
            sessions=sessions, max_periods=args.max_periods, chunk=args.chunk,
            seed=args.seed, step=args.step))
        if engine != "sessions":
            raise ValueError(f"{CONFIG.name} with these flags runs on the loop ({reason})")
    except ValueError as error:
        parser.error(str(error))
    shared = {"window": args.window, "max_periods": args.max_periods, "chunk": args.chunk,
              "seed": args.seed, "firms": args.firms, "step": args.step}
    print(f"Calvano et al. (2020) reproduction: {args.firms} firms, {sessions} sessions"
          f"{' per cell' if grid_mode else ''}, alpha={','.join(f'{a:g}' for a in alphas)}, "
          f"beta={','.join(f'{b:g}' for b in betas)}, window={args.window:,d}, "
          f"backend={jax.default_backend()}", flush=True)
    if grid_mode:
        result = run_grid(alphas, betas, sessions, **shared)
        print(grid_table(result))
        print(f"wall time          {result['wall_s']:.1f} s")
    else:
        result = run(sessions, args.beta, progress=True, alpha=args.alpha,
                     run_dir=args.run_dir, save_strategies=args.save_strategies, **shared)
        baseline = (args.firms, args.alpha, args.beta) == tuple(BASELINE.values())
        published = f"; published {PUBLISHED_PROFIT_GAIN}" if baseline else ""
        print(f"economics          p_N {result['p_nash']:.4f}  p_M {result['p_monopoly']:.4f}  "
              f"pi_N {result['pi_nash']:.4f}  pi_M {result['pi_monopoly']:.4f}")
        print(f"profit gain        {result['profit_gain']:.4f} (sd "
              f"{result['profit_gain_sd']:.3f}{published})")
        print(f"converged share    {result['converged_share']:.3f}")
        mean_period = result["mean_convergence_period"]
        print(f"mean convergence   {mean_period:,.0f} periods" if mean_period is not None
              else "mean convergence   n/a")
        print(f"periods simulated  {result['periods_simulated']:,d} "
              f"({result['session_periods']:,d} session-periods, backend "
              f"{result['backend']})")
        print(f"wall time          {result['wall_s']:.1f} s  (compile "
              f"{result['compile_s']:.1f} s; {result['ns_per_session_period']:.1f} ns per "
              f"session-period with compiling; target 1000 sessions in 60 s: "
              f"{'met' if result['target_met'] else 'not met'})")
        if args.save_strategies is not None:
            print(f"strategies         "
                  f"{os.path.join(args.save_strategies, session_run.STRATEGIES_FILE)}")
    if args.json:
        print(json.dumps(result))
    record.write(args, result, __file__, argv, "calvano_grid" if grid_mode else "calvano")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
