"""python -m jaxmarket.impulse RUN [--agent I]
[--deviation best_response|best_response_lowest|nash|all|PRICE] [--discount D]
[--periods T] [--group G] [--json] [--check]: the impulse response of a trained run's greedy
Q-learning strategies to a one-period deviation by agent I (Calvano et al. 2020),
averaged over each session's limit cycle and over the sessions (seeds x markets). RUN is
a run directory (its last checkpoint is restored) or a directory written by
a session-engine run (its strategies.npz). Prints the mean prices per period beside the
undeviated cycle, the share of sessions that punish, the punishment length and the
periods until play is back on the cycle; --json prints the whole result as one JSON line
last (jaxmarket.analysis.impulse_response). --deviation all prints instead one row per
grid price the deviator may deviate to: the rivals' and the deviator's mean price in
period 1, the deviation's one-period gain and its discounted gain over the infinite
horizon (discount D, default the run's learners'), with 95% bootstrap intervals over
sessions, the shares of sessions where it pays and that punish, the punishment length and
the periods until play is back on the cycle (jaxmarket.analysis.impulse_response_all).
--check prints instead the equilibrium check
of a session-engine run's strategies (best replies on path and in all states, the shares
of sessions in Nash equilibrium on path and subgame perfect, the Q-gaps:
jaxmarket.sessions.diagnostics), as its summary.json holds it."""

from __future__ import annotations

import json

import numpy as np

from jaxmarket.analysis.equilibrium_check import equilibrium_check
from jaxmarket.analysis.impulse import (DEVIATIONS, AllPricesResponse, ImpulseResponse,
                                       impulse_response, impulse_response_all)
from jaxmarket.cli import parser as make_parser


#: ``--deviation all``: every grid price (:func:`impulse_response_all`)
ALL = "all"


def _deviation(text: str) -> str | float:
    if text in DEVIATIONS or text == ALL:
        return text
    try:
        return float(text)
    except ValueError:
        raise SystemExit(f"--deviation: got {text!r}; allowed: {', '.join(DEVIATIONS)}, "
                         f"{ALL} or a price") from None


def table(result: ImpulseResponse) -> str:
    """The mean price path (deviator, rivals' mean) beside the undeviated cycle's."""
    i, n = result.agent, result.price.shape[1]
    rivals = [j for j in range(n) if j != i]
    lines = [f"impulse response: agent {i} deviates ({result.deviation}) in period 0; "
             f"{result.punishes.shape[0]} sessions ({result.source})",
             f"{'period':>6} {'deviator':>9} {'rivals':>9} {'cycle dev.':>10} {'cycle riv.':>10}"]
    for t in range(result.price.shape[0]):
        lines.append(f"{t:>6d} {result.price[t, i]:>9.4f} {result.price[t, rivals].mean():>9.4f}"
                     f" {result.counterfactual[t, i]:>10.4f}"
                     f" {result.counterfactual[t, rivals].mean():>10.4f}")
    d = result.as_dict()
    back = d["mean_return_periods"]
    lines += [f"share of sessions that punish  {d['share_punish']:.3f}",
              f"mean punishment length         {d['mean_punishment_length']:.2f} periods",
              f"back on the cycle              {d['share_returned']:.3f} of the deviations, "
              + (f"after {back:.2f} periods" if back is not None else "none")]
    return "\n".join(lines)


def all_table(result: AllPricesResponse) -> str:
    """One row per deviation price: the rivals' and the deviator's mean price in period 1,
    the one-period and the discounted gain (with its 95% interval), the shares of
    sessions where the deviation pays and that punish, the punishment length and the
    periods until play is back on the cycle."""
    i, n = result.agent, result.price.shape[2]
    rivals = [j for j in range(n) if j != i]
    pre = result.pre_deviation
    lines = [f"impulse response to every price: agent {i} deviates in period 0; "
             f"{result.cycle_length.shape[0]} sessions ({result.source}); "
             f"discount {result.discount:g}",
             f"cycle's mean prices: deviator {pre[i]:.4f}, rivals {pre[rivals].mean():.4f}",
             f"{'price':>8} {'riv t=1':>8} {'dev t=1':>8} {'gain t=0':>9} {'disc gain':>10} "
             f"{'95% CI':>21} {'pays':>5} {'punish':>6} {'length':>6} {'back':>5}"]
    one, gain = result.mean("one_period_gain"), result.mean("discounted_gain")
    pays, punish = result.mean("pays"), result.mean("punishes")
    length, back = result.mean("punishment_length"), result.mean("return_periods")
    for k, price in enumerate(result.grid):
        lo, hi = result.ci95["discounted_gain"][k]
        lines.append(f"{price:>8.4f} {result.price[k, 1, rivals].mean():>8.4f} "
                     f"{result.price[k, 1, i]:>8.4f} {one[k]:>9.4f} {gain[k]:>10.4f} "
                     f"{f'[{lo:.4f}, {hi:.4f}]':>21} {pays[k]:>5.3f} {punish[k]:>6.3f} "
                     f"{length[k]:>6.2f} " + ("    -" if np.isnan(back[k]) else
                                              f"{back[k]:>5.2f}"))
    return "\n".join(lines)


def check_table(found: dict) -> str:
    """The equilibrium check as text: the shares of sessions, then per firm."""
    def ci(st, i=None):
        lo, hi = st["ci95"] if i is None else st["ci95"][i]
        return f"[{lo:.3f}, {hi:.3f}]"

    lines = [f"sessions in Nash equilibrium on path  {found['nash_on_path']['mean']:.3f}  "
             f"95% CI {ci(found['nash_on_path'])}",
             f"sessions subgame perfect             {found['subgame_perfect']['mean']:.3f}  "
             f"95% CI {ci(found['subgame_perfect'])}",
             f"{'firm':>4} {'BR on path':>11} {'BR all':>8} {'Q-gap path':>11} "
             f"{'Q-gap all':>10} {'Q error':>8}"]
    keys = ("best_reply_on_path", "best_reply_all_states", "q_gap_on_path",
            "q_gap_all_states", "q_error")
    for i in range(len(found["best_reply_on_path"]["mean"])):
        v = [found[k]["mean"][i] for k in keys]
        lines.append(f"{i:>4d} {v[0]:>11.3f} {v[1]:>8.3f} {v[2]:>11.4f} {v[3]:>10.4f} "
                     f"{v[4]:>8.4f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = make_parser("python -m jaxmarket.impulse", __doc__)
    parser.add_argument("run", help="run directory (either engine)")
    parser.add_argument("--agent", type=int, default=0, help="the deviating agent (default 0)")
    parser.add_argument("--deviation", type=_deviation, default="best_response",
                        help="best_response (default), best_response_lowest, nash, all (every "
                        "grid price, one row each) or a price")
    parser.add_argument("--discount", type=float, default=None,
                        help="with --deviation all: the discount factor of the discounted "
                        "gain (default: the run's learners')")
    parser.add_argument("--periods", type=int, default=15,
                        help="periods from the deviation on (default 15)")
    parser.add_argument("--group", default=None,
                        help="the q_learning or discrete-head ppo group (default: the only one)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON last")
    parser.add_argument("--check", action="store_true",
                        help="the equilibrium check of a session-engine run's strategies")
    args = parser.parse_args(argv)
    if args.check:
        found = equilibrium_check(args.run)
        print(check_table(found))
        if args.json:
            print(json.dumps(found))
        return 0
    if args.deviation == ALL:
        every = impulse_response_all(args.run, agent=args.agent, periods=args.periods,
                                     group=args.group, discount=args.discount)
        print(all_table(every))
        if args.json:
            print(json.dumps(every.as_dict()))
        return 0
    if args.discount is not None:
        parser.error("--discount: only with --deviation all (the discounted gains)")
    result = impulse_response(args.run, agent=args.agent, deviation=args.deviation,
                              periods=args.periods, group=args.group)
    print(table(result))
    if args.json:
        print(json.dumps(result.as_dict()))
    return 0
