"""Reproduce a published result of the algorithmic-pricing literature from its shipped config.

    python benchmarks/reproduce.py NAME [--sessions N] [--firms N] [--periods T] [--json]

NAME is one of :data:`DESIGNS` (``calvano2020``, ``klein2021``, ``asker2022_async``,
``asker2022_sync``, ``banchio2022_first``, ``banchio2022_second``). Each design is a
config in ``configs/`` with the paper's parameters; its sessions run as one compiled
program (:func:`jaxmarket.train.sessions.run_sessions`; Calvano's through
``benchmarks/calvano.py``, which adds the convergence-time compaction), and the
figure the paper reports is computed per session. The last line with ``--json`` is::

    {"name", "figure", "value", "ci95": [low, high], "published", "sessions",
     "converged_share", "wall_s", ...}

``converged_share``: the sessions that met the learner's convergence rule, or whose
sellers' greedy strategies did not change over the last 10% of the periods (the
designs other than Calvano's run a fixed number of periods). ``ci95`` is a percentile bootstrap over sessions (2,000 resamples of the statistic:
the mean, or the median where the paper reports a median). docs/reproductions.md
records each design's parameters, the published figure, ours and the command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __name__ == "__main__" and "jax" not in sys.modules:
    # calvano2020 splits its sessions over one XLA CPU device per core (as
    # benchmarks/calvano.py does); set before JAX starts, an explicit count wins
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = (f"{_flags} --xla_force_host_platform_device_count="
                                   f"{os.cpu_count() or 1}").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jaxmarket.train.plan import resolve  # noqa: E402
from jaxmarket.train.sessions import SessionResult, make_game, pure_nash, run_sessions  # noqa: E402


@dataclass(frozen=True)
class Design:
    """One reproduction: its config, the paper's figure and how to compute it."""

    config: str                 # configs/<config>.yaml
    figure: str                 # what ``value`` measures
    published: float
    statistic: str              # "mean" | "median" over sessions
    per_session: Callable[[SessionResult], np.ndarray] | None   # [S] values
    periods: int                # the paper's periods per session
    sessions: int               # default sessions
    source: str


def _mean_tail_profit(result: SessionResult) -> np.ndarray:
    return result.tail_reward.mean(axis=1)


def _mean_final_price(result: SessionResult) -> np.ndarray:
    return result.greedy_price.mean(axis=1)


def _revenue(result: SessionResult) -> np.ndarray:
    return result.greedy_fees.sum(axis=1)


DESIGNS: dict[str, Design] = {
    "calvano2020": Design(
        "calvano", "average profit gain Delta = (pi - pi_N) / (pi_M - pi_N) of the "
        "converged greedy play", math.nan, "mean", None, 0, 1000,
        "Calvano, Calzolari, Denicolo & Pastorello (AER 2020), Table 1 and Section V.B"),
    "klein2021": Design(
        "klein2021", "mean profit per firm per period over the last 1,000 periods",
        0.108, "mean", _mean_tail_profit, 500_000, 100,
        "Klein (RAND 2021), k = 6 price grid"),
    "asker2022_async": Design(
        "asker2022_async", "median over sessions of the final price (mean of the two "
        "sellers' greedy prices)", 8.4, "median", _mean_final_price, 100_000, 100,
        "Asker, Fershtman & Pakes (AEA P&P 2022), asynchronous updating"),
    "asker2022_sync": Design(
        "asker2022_sync", "median over sessions of the final price (mean of the two "
        "sellers' greedy prices)", 2.13, "median", _mean_final_price, 100_000, 100,
        "Asker, Fershtman & Pakes (AEA P&P 2022), synchronous updating"),
    "banchio2022_first": Design(
        "banchio2022_first", "mean revenue of the final greedy bids (first price)",
        0.24, "mean", _revenue, 1_000_000, 100,
        "Banchio & Skrzypacz (EC 2022), first-price auction"),
    "banchio2022_second": Design(
        "banchio2022_second", "mean revenue of the final greedy bids (second price)",
        0.95, "mean", _revenue, 1_000_000, 100,
        "Banchio & Skrzypacz (EC 2022), second-price auction"),
}
#: Calvano et al.'s average profit gain by number of firms
CALVANO_PUBLISHED = {2: 0.85, 3: 0.64, 4: 0.56}
#: the paper's cap on a session's periods
CALVANO_MAX_PERIODS = 1_000_000_000


def bootstrap_ci(values: np.ndarray, statistic: str, resamples: int = 2000,
                 seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of the mean / median of ``values``."""
    values = np.asarray(values, np.float64)
    rng = np.random.default_rng(seed)
    draws = values[rng.integers(0, values.size, (resamples, values.size))]
    stats = np.median(draws, axis=1) if statistic == "median" else draws.mean(axis=1)
    low, high = np.percentile(stats, [2.5, 97.5])
    return [float(low), float(high)]


def summarize(name: str, values: np.ndarray, converged: np.ndarray, wall_s: float,
              published: float, **extra) -> dict:
    design = DESIGNS[name]
    value = np.median(values) if design.statistic == "median" else np.mean(values)
    return {"name": name, "figure": design.figure, "value": float(value),
            "ci95": bootstrap_ci(values, design.statistic), "published": published,
            "sessions": int(values.size), "converged_share": float(np.mean(converged)),
            "wall_s": wall_s, "statistic": design.statistic, "source": design.source,
            **extra}


def reproduce_calvano(sessions: int, firms: int, seed: int, **calvano_kwargs) -> dict:
    import calvano   # benchmarks/calvano.py (next to this script)

    result = calvano.run(sessions=sessions, firms=firms, seed=seed, progress=True,
                         **calvano_kwargs)
    return summarize("calvano2020", np.asarray(result["profit_gains"]),
                     np.asarray(result["converged"]), result["wall_s"],
                     CALVANO_PUBLISHED.get(firms, math.nan), firms=firms,
                     periods=result["periods_simulated"],
                     mean_convergence_period=result["mean_convergence_period"],
                     sessions_per_s=sessions / result["wall_s"])


def game_extras(name: str, result: SessionResult) -> dict:
    """Design-specific reference numbers, computed from the market's own tables."""
    game = result.game
    prices = np.asarray(game.grid.prices, np.float64)
    nash = pure_nash(game)
    extras = {"grid_size": int(prices.size),
              "static_nash_prices": sorted({float(prices[j].mean()) for j in nash})}
    if name.startswith("asker"):
        highest_nash = max(extras["static_nash_prices"]) if nash.size else math.nan
        final = _mean_final_price(result)
        extras.update(share_above_static_nash=float(np.mean(final > highest_nash + 1e-6)),
                      market_price_median=float(np.median(result.greedy_price.min(axis=1))))
    if name == "klein2021":
        reward = np.asarray(game.reward, np.float64)
        extras["joint_profit_benchmark"] = float(reward.mean(axis=1).max())
    if name.startswith("banchio"):
        extras["bid_median"] = float(np.median(result.greedy_price))
    return extras


def reproduce_game(name: str, sessions: int, periods: int, seed: int) -> dict:
    design = DESIGNS[name]
    start = time.perf_counter()
    plan = resolve(str(ROOT / "configs" / f"{design.config}.yaml"))
    game = make_game(plan)
    result = run_sessions(plan, sessions, periods, jax.random.key(seed), game=game)
    wall = time.perf_counter() - start
    values = design.per_session(result)
    # converged: the learner's own rule, or no greedy change in the last 10% of periods
    converged = result.converged | (result.stable_periods >= max(1, periods // 10))
    return summarize(name, values, converged, wall, design.published,
                     periods=periods, sessions_per_s=sessions / wall,
                     session_periods_per_s=sessions * periods / wall,
                     **game_extras(name, result))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> dict:
    parser = _Parser(prog="reproduce.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(DESIGNS), metavar="NAME",
                        help="one of " + ", ".join(DESIGNS))
    parser.add_argument("--sessions", type=int, default=None,
                        help="independent sessions (default: the design's)")
    parser.add_argument("--firms", type=int, default=2,
                        help="calvano2020 only: number of sellers (2, 3 or 4)")
    parser.add_argument("--periods", type=int, default=None,
                        help="periods per session (default: the paper's; calvano2020: "
                             "--max-periods of calvano.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    design = DESIGNS[args.name]
    sessions = design.sessions if args.sessions is None else args.sessions
    if sessions < 1:
        parser.error(f"--sessions: got {sessions}; need at least 1")
    if args.periods is not None and args.periods < 1:
        parser.error(f"--periods: got {args.periods}; need at least 1")
    if args.firms != 2 and args.name != "calvano2020":
        parser.error(f"--firms: {args.name} is a two-player design; only calvano2020 "
                     f"takes --firms")
    if args.name == "calvano2020":
        if args.firms < 2:
            parser.error(f"--firms: got {args.firms}; need at least 2")
        # the paper's cap of 10^9 periods (sessions stop when they converge): four
        # firms need up to ~2 * 10^7 periods, beyond calvano.py's default cap of 10^7
        extra = {"max_periods": CALVANO_MAX_PERIODS if args.periods is None else args.periods}
        result = reproduce_calvano(sessions, args.firms, args.seed, **extra)
    else:
        periods = design.periods if args.periods is None else args.periods
        result = reproduce_game(args.name, sessions, periods, args.seed)
    print(f"{args.name}: {result['figure']}")
    print(f"  ours {result['value']:.4f}  95% CI [{result['ci95'][0]:.4f}, "
          f"{result['ci95'][1]:.4f}]  published {result['published']}  "
          f"({result['sessions']} sessions, converged {result['converged_share']:.0%}, "
          f"{result['wall_s']:.1f} s)", flush=True)
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
