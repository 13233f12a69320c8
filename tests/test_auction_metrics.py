"""Auction metrics (``auction/revenue``, ``auction/winning_bid``,
``auction/win_share/<g>/<j>``) from a real training run whose bidders follow a scripted
schedule of bids, against the payments worked out by hand from the auction rules; and a
market that is not an auction gets none of them."""

from __future__ import annotations

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.train.components.auction import Auction
from jaxmarket.train.components.base import Step
from jaxmarket.train.plan import resolve
from jaxmarket.train.run import start_run

Q, RESERVE, A_MIX = 2.0, 0.45, 1.5
# three phases of two periods each (iterations 1-2, 3-4, 5-6): group a has two bidders,
# group b one; each phase's bids [a0, a1, b0]
PHASES = [(0.9, 0.6, 0.3),     # a0 wins alone
          (0.4, 0.1, 0.0),     # every bid below the reserve: nothing sold
          (0.5, 0.2, 0.5)]     # a0 and b0 tie at the top


def by_hand(bids: tuple[float, ...]) -> dict:
    """mixed_price with a = 1.5: pay = (2 - a) top + (a - 1) second payment, where the
    second payment is the tied bid under a tie, else max(second eligible bid, reserve)."""
    eligible = [b for b in bids if b >= RESERVE]
    if not eligible:
        return {"revenue": 0.0, "winning_bid": 0.0, "share": [0.0, 0.0, 0.0]}
    top = max(eligible)
    winners = [i for i, b in enumerate(bids) if b == top]
    rest = sorted(eligible)[:-1]
    second = top if len(winners) > 1 else max(rest + [RESERVE])
    pay = (2 - A_MIX) * top + (A_MIX - 1) * second
    share = [1.0 / len(winners) if i in winners else 0.0 for i in range(3)]
    return {"revenue": pay * Q, "winning_bid": top, "share": share}


def config(distributor: str = "mixed_price") -> dict:
    stamps = [0, 2, 4]
    seller = {"action": "price", "low": 0.0, "high": 1.0, "value": 1.0,
              "reward": [{"kind": "surplus"}], "observation": []}
    dist = {"kind": distributor, "reserve": RESERVE}
    if distributor == "mixed_price":
        dist["a"] = A_MIX
    return {
        "market": {"num_products": 1,
                   "consumers": [{"name": "auctioneer", "count": 1, "queries": Q}],
                   "sellers": [{"name": "a", "count": 2, **seller},
                               {"name": "b", "count": 1, **seller}],
                   "distributor": dist},
        "learners": {
            "a": {"kind": "schedule", "timestamps": stamps,
                  "values": [[[p[0]], [p[1]]] for p in PHASES]},
            "b": {"kind": "schedule", "timestamps": stamps, "values": [[[p[2]]] for p in PHASES]},
        },
        "train": {"num_iterations": 6, "rollout_length": 1, "num_envs": 2, "num_seeds": 2,
                  "chunk_size": 6},
        "seed": 0,
    }


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("auction") / "run"
    start_run(config(), [], str(run_dir), command="test")
    return run_dir


def test_metrics_are_the_hand_computed_payments(run):
    rows = read_csv(run / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:
        want = by_hand(PHASES[(int(r["iteration"]) - 1) // 2])
        assert float(r["auction/revenue/p0"]) == pytest.approx(want["revenue"], abs=1e-6)
        assert float(r["auction/winning_bid/p0"]) == pytest.approx(want["winning_bid"], abs=1e-6)
        got = [float(r[c]) for c in ("auction/win_share/a/0/p0", "auction/win_share/a/1/p0",
                                     "auction/win_share/b/0/p0")]
        np.testing.assert_allclose(got, want["share"], atol=1e-6)
        # the market's own columns: group a's traffic is its bidders' mean share of Q
        assert float(r["traffic/a/p0"]) == pytest.approx(
            Q * (want["share"][0] + want["share"][1]) / 2, abs=1e-6)


def test_per_seed_rows_and_summary(run):
    rows = read_csv(run / "seeds.csv")
    assert {int(r["seed"]) for r in rows} == {0, 1}
    for r in rows:   # every seed plays the same script
        want = by_hand(PHASES[(int(r["iteration"]) - 1) // 2])
        assert float(r["auction/revenue/p0"]) == pytest.approx(want["revenue"], abs=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    last = by_hand(PHASES[2])   # the window: the last 10% of 6 rows = iteration 6
    auction = summary["auction"]
    assert auction["revenue"] == pytest.approx([last["revenue"]], abs=1e-6)
    assert auction["winning_bid"] == pytest.approx([last["winning_bid"]], abs=1e-6)
    assert auction["win_share"] == {"a": [[0.5], [0.0]], "b": [[0.5]]}
    np.testing.assert_allclose(auction["per_seed"]["revenue"], [[last["revenue"]]] * 2, atol=1e-6)


def test_second_price_and_first_price_by_hand():
    """One real market step under each pure rule (a0 bids 0.9 alone above the reserve;
    second price pays the runner-up's 0.6), through the component's step hook."""
    for kind, pay in (("first_price", 0.9), ("second_price", 0.6)):
        plan = resolve(config(kind))
        env, params = plan.env, plan.params
        _, state = env.reset(jax.random.key(0), params)
        bids = {"a": jnp.asarray([[0.9], [0.6]]), "b": jnp.asarray([[0.3]])}
        *_, info = env.step(jax.random.key(1), state, bids, params)
        info = jax.tree.map(lambda x: x[None], info)   # one market
        step = Step(*([None] * 4), info, *([None] * 5))
        metrics, _ = Auction((("a", 2), ("b", 1)), num_seeds=1).step_metrics(step)
        assert float(metrics["auction/revenue"][0]) == pytest.approx(pay * Q, abs=1e-6)
        assert float(metrics["auction/winning_bid"][0]) == pytest.approx(0.9, abs=1e-6)
        assert float(metrics["auction/win_share/a/0"][0]) == 1.0
        assert float(metrics["auction/win_share/b/0"][0]) == 0.0


def test_markets_that_are_not_auctions_have_no_auction_metrics():
    cfg = config()
    cfg["market"]["distributor"] = {"kind": "logit", "temperature": 0.5}
    cols = resolve(cfg).metric_columns
    assert not [c for c in cols if c.startswith("auction/")]
    assert [c for c in resolve(config()).metric_columns if c.startswith("auction/")]
