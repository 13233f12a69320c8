"""A published average impulse response beside a run's, period by period.

    python -m jaxmarket.analysis.impulse_compare RUN [--figure calvano2020_figure4]
                                                 [--deviation D] [--out FILE.json]

Calvano et al. (AER 2020, Figure 4) plot the average over sessions of the prices of the
deviating and the non-deviating agent in the periods tau = 0 .. 15 around a one-period
deviation in tau = 1 (tau = 0: the price before it). This module replays a run's
strategies with :func:`jaxmarket.analysis.impulse_response` once per deviating agent,
averages each session's paths over the deviating agents (as the published code does),
and sets the mean over sessions, its 95% percentile bootstrap interval over sessions
(2,000 resamples) and the published value side by side for every period shown.

The run's period ``t`` of :func:`impulse_response` (0: the deviation) is the figure's
``tau = t + 1``; ``tau = 0`` is each session's mean price over its limit cycle.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from jaxmarket.analysis.impulse import impulse_response, load_strategies

#: published average impulse responses: tau = 0 .. len - 1 (tau = 1: the deviation)
FIGURES = {
    "calvano2020_figure4": {
        "source": ("Calvano, Calzolari, Denicolo & Pastorello (AER 2020), Figure 4, read off "
                   "the vector drawing of the authors' replication package "
                   "(AER_paper_Rscripts/figure_4/figure_4.pdf: point coordinates to "
                   "0.01 pt, y axis calibrated on its ticks 1.5 and 1.9, so to +-0.0001; "
                   "the Nash and monopoly lines read 1.47294 and 1.92499 against the "
                   "published 1.47293 and 1.92498)"),
        "deviation": "best_response_lowest",
        "deviating": [1.7914, 1.5046, 1.5588, 1.5782, 1.6383, 1.6924, 1.7323, 1.7611,
                      1.7759, 1.7842, 1.7885, 1.7890, 1.7916, 1.7911, 1.7919, 1.7903],
        "nondeviating": [1.7914, 1.7914, 1.5475, 1.5888, 1.6347, 1.6910, 1.7337, 1.7621,
                         1.7762, 1.7818, 1.7891, 1.7903, 1.7917, 1.7909, 1.7918, 1.7903],
    },
    "calvano2020_figure6": {
        "source": ("Calvano, Calzolari, Denicolo & Pastorello (AER 2020), Figure 6 (a smaller "
                   "price cut: every session's deviation to the 8th grid price, 1.69896, "
                   "DevPrice = 8 in the package's figure_6.R), read off the vector drawing "
                   "of the authors' replication package "
                   "(AER_paper_Rscripts/figure_6/figure_6.pdf, the axes of Figure 4: to "
                   "+-0.0001)"),
        "deviation": 1.69896,
        "deviating": [1.7914, 1.6990, 1.5916, 1.5976, 1.6503, 1.6950, 1.7406, 1.7621,
                      1.7797, 1.7849, 1.7914, 1.7868, 1.7948, 1.7893, 1.7935, 1.7886],
        "nondeviating": [1.7914, 1.7914, 1.5844, 1.5993, 1.6461, 1.7015, 1.7377, 1.7646,
                         1.7783, 1.7862, 1.7900, 1.7896, 1.7916, 1.7919, 1.7911, 1.7911],
    },
}

RESAMPLES = 2000


def bootstrap_paths(paths: np.ndarray, seed: int = 0) -> np.ndarray:
    """``[T, 2]`` the 95% percentile bootstrap interval of the mean over sessions of
    ``paths [N, T]`` (2,000 resamples of the sessions, the same for every period)."""
    rng = np.random.default_rng(seed)
    n = paths.shape[0]
    means = np.stack([paths[rng.integers(0, n, n)].mean(0) for _ in range(RESAMPLES)])
    return np.percentile(means, [2.5, 97.5], axis=0).T


def session_paths(run, deviation: str | float, periods: int) -> tuple[np.ndarray, np.ndarray]:
    """``(deviating [N, periods + 1], nondeviating [N, periods + 1])``: each session's
    prices at tau = 0 .. periods, the mean over the deviating agents (the non-deviating
    side: the mean over the other agents)."""
    strategies = load_strategies(run)
    n = strategies.agents
    dev, non = [], []
    for agent in range(n):   # the deviating agents: a handful, each one replay
        r = impulse_response(strategies, agent=agent, deviation=deviation,
                             periods=periods)
        pre = r.session_pre_deviation                                      # [N, n]
        path = np.concatenate([pre[:, None, :], r.session_price], axis=1)   # [N, T+1, n]
        rivals = [j for j in range(n) if j != agent]
        dev.append(path[:, :, agent])
        non.append(path[:, :, rivals].mean(-1))
    return np.mean(dev, axis=0), np.mean(non, axis=0)


def compare(run, figure: str = "calvano2020_figure4",
            deviation: str | float | None = None) -> dict:
    """The published figure beside the run's, period by period (module docstring);
    ``deviation``: the run's deviation (default: the one the figure plots)."""
    published = FIGURES[figure]
    periods = len(published["deviating"]) - 1
    deviation = published["deviation"] if deviation is None else deviation
    dev, non = session_paths(run, deviation, periods)
    rows = []
    for side, ours in (("deviating", dev), ("nondeviating", non)):
        ci = bootstrap_paths(ours)
        mean = ours.mean(0)
        for tau in range(periods + 1):
            pub = published[side][tau]
            rows.append({"agent": side, "tau": tau, "published": pub,
                         "ours": float(mean[tau]), "ci95": [float(x) for x in ci[tau]],
                         "difference": float(mean[tau] - pub),
                         "inside_ci": bool(ci[tau][0] <= pub <= ci[tau][1])})
    diffs = np.array([abs(r["difference"]) for r in rows])
    return {"figure": figure, "source": published["source"],
            "deviation": deviation, "published_deviation": published["deviation"],
            "sessions": int(dev.shape[0]),
            "run": str(run), "max_abs_difference": float(diffs.max()),
            "mean_abs_difference": float(diffs.mean()),
            "share_inside_ci": float(np.mean([r["inside_ci"] for r in rows])),
            "rows": rows}


def markdown(result: dict) -> str:
    """The comparison as a Markdown table: tau, then per agent published | ours [CI]."""
    by = {(r["agent"], r["tau"]): r for r in result["rows"]}
    taus = sorted({r["tau"] for r in result["rows"]})
    out = [("| tau | deviating: published | ours (95% CI) | non-deviating: published | "
            "ours (95% CI) |"), "|---|---|---|---|---|"]
    for t in taus:
        cells = []
        for side in ("deviating", "nondeviating"):
            r = by[(side, t)]
            cells += [f"{r['published']:.4f}",
                      f"{r['ours']:.4f} [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]"]
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.analysis.impulse_compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a session-engine run directory (strategies.npz) or "
                        "any run impulse_response reads")
    parser.add_argument("--figure", default="calvano2020_figure4", choices=sorted(FIGURES))
    parser.add_argument("--deviation", default=None,
                        help="the run's deviation (default: the figure's, "
                             "best_response_lowest for calvano2020_figure4)")
    parser.add_argument("--out", default=None, help="write the comparison as JSON here")
    args = parser.parse_args(argv)
    result = compare(args.run, args.figure, args.deviation)
    print(markdown(result))
    print(f"max |ours - published| {result['max_abs_difference']:.4f}, mean "
          f"{result['mean_abs_difference']:.4f}; published inside our 95% CI in "
          f"{result['share_inside_ci']:.0%} of the {len(result['rows'])} points "
          f"({result['sessions']} sessions)")
    if args.out:
        result["command"] = " ".join(["python -m jaxmarket.analysis.impulse_compare",
                                      *(argv if argv is not None else sys.argv[1:])])
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
