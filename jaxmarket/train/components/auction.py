"""Auction metrics: the auctioneer's revenue, the winning bid and each bidder's share of
the wins, per iteration (``metrics.csv``, ``seeds.csv``) and in ``summary.json``, for
the sealed-bid auctions (the distributors whose definition declares ``auction``).

Per product ``p``, in each market and period (every seller group bids in the one
auction; a seller's quoted price is its bid)::

    auction/revenue          sum_s fees_s                 what the winners pay in all
    auction/winning_bid      max_{s: traffic_s > 0} bid_s  the top bid (0: nothing sold)
    auction/win_share/<g>/<j> traffic_j / sum_s traffic_s  agent j of group g's share of
                                                          the queries (a tie of n winners:
                                                          1/n each; 0 when nothing sold)

each a mean over the rollout's periods and the markets (``per_seed/``: over a seed's
markets). The component draws no random numbers and changes no other metric: a market
whose distributor is not an auction has no such component and writes the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.train.components.base import COMPONENTS, Component, Step
from jaxmarket.train.metrics import PER_SEED

PREFIX = "auction/"


@dataclass(frozen=True)
class Auction(Component):
    """The auction metrics of a market with a sealed-bid distributor."""

    sellers: tuple[tuple[str, int], ...]   # (group, agents per market), market order
    num_seeds: int
    name = "auction"

    def step_metrics(self, step: Step) -> tuple[dict, Any]:
        info, S = step.info, self.num_seeds
        names = [g for g, _ in self.sellers]
        traffic = jnp.concatenate([info["traffic"][g] for g in names], axis=1)   # [E, N, P]
        bids = jnp.concatenate([info["prices"][g] for g in names], axis=1)
        fees = jnp.concatenate([info["fees"][g] for g in names], axis=1)
        total = traffic.sum(1, keepdims=True)                                   # [E, 1, P]
        won = traffic > 0
        values = {
            "revenue": fees.sum(1),                                             # [E, P]
            "winning_bid": jnp.max(jnp.where(won, bids, 0.0), axis=1),
        }
        share = jnp.where(total > 0, traffic / jnp.where(total > 0, total, 1.0), 0.0)
        by_seed_share = share.reshape((S, -1) + share.shape[1:]).mean(1)        # [S, N, P]
        metrics = {}
        for name, v in values.items():
            by_seed = v.reshape((S, -1) + v.shape[1:]).mean(1)                  # [S, P]
            metrics[PREFIX + name] = by_seed.mean(0)
            metrics[PER_SEED + PREFIX + name] = by_seed
        offset = 0
        for g, n in self.sellers:   # static: names the columns of one [S, N, P] array
            for j in range(n):
                key = f"{PREFIX}win_share/{g}/{j}"
                metrics[key] = by_seed_share[:, offset + j].mean(0)
                metrics[PER_SEED + key] = by_seed_share[:, offset + j]
            offset += n
        return metrics, None


@COMPONENTS.register("auction")
def from_plan(plan) -> Auction | None:
    spec = plan.env.spec
    if not DISTRIBUTORS[spec.distributor].auction:
        return None
    return Auction(tuple((g.name, g.count) for g in spec.sellers), plan.train.num_seeds)


def _window(header: list[str], rows: np.ndarray, prefix: str) -> dict:
    """Means over ``rows`` of the auction columns: ``revenue [P]``, ``winning_bid [P]``,
    ``win_share {group: [agents][P]}``."""
    col = {h: i for i, h in enumerate(header)}
    out: dict = {}
    for name in ("revenue", "winning_bid"):
        cols = sorted((int(h.rsplit("/p", 1)[1]), i) for h, i in col.items()
                      if h.startswith(f"{prefix}{name}/p"))
        out[name] = [float(rows[:, i].mean()) for _, i in cols]
    shares: dict = {}
    for h, i in col.items():
        if h.startswith(prefix + "win_share/"):
            g, agent, product = h[len(prefix + "win_share/"):].rsplit("/", 2)
            shares.setdefault(g, {}).setdefault(int(agent), {})[int(product[1:])] = \
                float(rows[:, i].mean())
    out["win_share"] = {g: [[a[p] for p in sorted(a)] for _, a in sorted(agents.items())]
                        for g, agents in shares.items()}
    return out


def auction_summary(header: list[str], tail: np.ndarray,
                    seeds: tuple[list[str], np.ndarray] | None = None) -> dict:
    """``summary.json``'s ``auction`` section (empty where the run has no auction
    metrics): the means over the summary's window of ``revenue [P]``, ``winning_bid
    [P]`` and ``win_share[group] [agents][P]``, and, given the per-seed rows of that
    window (``(header, rows)`` with a ``seed`` column), ``per_seed``: the same for each
    seed, as lists indexed by seed."""
    if not any(h.startswith(PREFIX) for h in header):
        return {}
    out = _window(header, tail, PREFIX)
    if seeds is not None:
        s_header, s_rows = seeds
        seed = s_rows[:, s_header.index("seed")]
        per = [_window(s_header, s_rows[seed == s], PREFIX) for s in np.unique(seed)]
        out["per_seed"] = {k: [p[k] for p in per] for k in ("revenue", "winning_bid",
                                                           "win_share")}
    return {"auction": out}


__all__ = ["Auction", "auction_summary"]
