"""Banchio & Skrzypacz (EC 2022) on the session engine: the auctions' tie rule
(``market.distributor.ties``: split, random, order) against its closed forms, the
outcome tables it gives the session engine, its config errors, and reduced runs of the
designs banchio2022_first / banchio2022_second (jaxmarket/designs/), whose bidders end at
the lowest bid when a tie splits the good and spread over collusive bids when a tie goes
to one bidder at random (docs/reproductions.md)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.market.distributors.auctions import (
    allocate_first_price,
    allocate_mixed_price,
    allocate_second_price,
)
from jaxmarket.market.distributors.base import Quotes
from jaxmarket.sessions.engine import run_sessions
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.reproduce import find_design
from jaxmarket.train.plan import resolve

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
BIDS = np.arange(1, 20) / 20          # the paper's grid k / 20, k = 1..19
RESERVE = {"reserve": np.float32(0.0)}


def quotes(bids, queries=1.0) -> Quotes:
    price = np.asarray(bids, np.float32).reshape(-1, 1)
    S = price.shape[0]
    return Quotes(price=price, is_multiplier=np.zeros(S, bool),
                  budget=np.full((1, 1), 1000.0, np.float32),
                  queries=np.full((1, 1), queries, np.float32),
                  base_price=np.ones((1, 1), np.float32),
                  quality=np.zeros((S, 1), np.float32), reliability=np.ones((S, 1), np.float32),
                  latency=np.zeros((S, 1), np.float32), freshness=np.zeros((S, 1), np.float32),
                  stake=np.ones((S, 1), np.float32))


def first_price_payoff(own, rival, tie_share):
    """A bidder's payoff with value 1: win at the higher bid and pay it, lose below; a tie
    pays ``tie_share * (1 - b)``."""
    return np.where(own > rival, 1 - own, np.where(own == rival, tie_share * (1 - own), 0.0))


def test_split_ties_share_and_order_ties_give_all_to_the_first_in_order():
    q = quotes([0.4, 0.7, 0.7])
    split = allocate_first_price(jax.random.key(0), q, RESERVE, {})
    np.testing.assert_allclose(np.asarray(split.traffic[:, 0]), [0.0, 0.5, 0.5])
    order = allocate_first_price(jax.random.key(0), q, RESERVE,
                                 {"ties": "order", "tie_order": [2, 1]})
    np.testing.assert_allclose(np.asarray(order.traffic[:, 0]), [0.0, 0.0, 1.0])
    np.testing.assert_allclose(np.asarray(order.fees[:, 0]), [0.0, 0.0, 0.7])
    # unlisted sellers follow in index order: seller 1 before seller 2
    rest = allocate_first_price(jax.random.key(0), q, RESERVE,
                                {"ties": "order", "tie_order": [0]})
    np.testing.assert_allclose(np.asarray(rest.traffic[:, 0]), [0.0, 1.0, 0.0])
    # no tie_order: index order, the lowest tied index wins
    plain = allocate_first_price(jax.random.key(0), q, RESERVE, {"ties": "order"})
    np.testing.assert_allclose(np.asarray(plain.traffic[:, 0]), [0.0, 1.0, 0.0])
    # second price: a tie at the top pays the tied bid, whoever wins it
    second = allocate_second_price(jax.random.key(0), q, RESERVE,
                                   {"ties": "order", "tie_order": [2]})
    np.testing.assert_allclose(np.asarray(second.fees[:, 0]), [0.0, 0.0, 0.7])
    mixed = allocate_mixed_price(jax.random.key(0), quotes([0.4, 0.7]),
                                 {**RESERVE, "a": np.float32(1.5)},
                                 {"ties": "order", "tie_order": [1]})
    np.testing.assert_allclose(np.asarray(mixed.fees[:, 0]), [0.0, 0.5 * 0.7 + 0.5 * 0.4],
                               rtol=1e-6)


def test_random_ties_give_all_to_one_tied_bidder_both_ways_across_keys():
    q = quotes([0.3, 0.3, 0.1])
    winners = set()
    for k in range(16):
        alloc = allocate_first_price(jax.random.key(k), q, RESERVE, {"ties": "random"})
        traffic = np.asarray(alloc.traffic[:, 0])
        assert sorted(traffic.tolist()) == [0.0, 0.0, 1.0] and traffic[2] == 0.0
        np.testing.assert_allclose(float(alloc.fees.sum()), 0.3, rtol=1e-6)
        winners.add(int(np.argmax(traffic)))
    assert winners == {0, 1}


def test_random_ties_are_two_outcome_tables_whose_mean_is_the_split_table():
    """The session engine plays ``ties: random`` as its declared outcomes (each priority
    order of the two bidders, probability 1/2): outcome k gives a tie to bidder k."""
    game = make_game(resolve(str(CONFIGS / "banchio2022_first.yaml"),
                             ["market.distributor.ties=random"]))
    assert game.probs == (0.5, 0.5)
    reward = np.asarray(game.reward, np.float64).reshape(2, 19, 19, 2)
    own, rival = BIDS[:, None], BIDS[None, :]
    for k in (0, 1):   # outcome k: bidder k first in the priority order
        np.testing.assert_allclose(reward[k, ..., 0],
                                   first_price_payoff(own, rival, 1.0 if k == 0 else 0.0),
                                   atol=1e-6)
        np.testing.assert_allclose(reward[k, ..., 1],
                                   first_price_payoff(rival, own, 1.0 if k == 1 else 0.0),
                                   atol=1e-6)
    expected = np.asarray(game.expected_reward, np.float64).reshape(19, 19, 2)
    np.testing.assert_allclose(expected[..., 0], first_price_payoff(own, rival, 0.5),
                               atol=1e-6)
    split = make_game(resolve(str(CONFIGS / "banchio2022_first.yaml")))
    assert split.probs is None
    np.testing.assert_allclose(np.asarray(split.reward, np.float64).reshape(19, 19, 2),
                               expected, atol=1e-6)


@pytest.mark.parametrize("changes,field,needle", [
    (["market.distributor.tie_order=[1, 0]"], "tie_order", "unless ties: order"),
    (["market.distributor.ties=order", "market.distributor.tie_order=[1, 1]"], "tie_order",
     "distinct"),
    (["market.distributor.ties=coin"], "ties", "split"),
])
def test_tie_rule_errors_name_the_field(changes, field, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        resolve(str(CONFIGS / "banchio2022_first.yaml"), changes)
    assert field in str(err.value)


def test_the_designs_play_random_ties():
    for name in ("banchio2022_first", "banchio2022_second"):
        assert "market.distributor.ties=random" in find_design(name).overrides


def reduced(ties: str, name: str = "banchio2022_first") -> np.ndarray:
    """``[8, 2]`` final greedy bids of 8 sessions of 100,000 periods (exploration
    0.025 exp(-0.0002 t) is below 1e-10 after them; the greedy bids no longer move)."""
    plan = resolve(str(CONFIGS / f"{name}.yaml"), [f"market.distributor.ties={ties}"])
    result = run_sessions(plan, sessions=8, periods=100_000, key=jax.random.key(0),
                          chunk=50_000)
    return np.asarray(result.greedy_price, np.float64)


def test_first_price_with_split_ties_ends_at_the_lowest_bid():
    """A tie split pays each bidder 0.5 (1 - b) for sure: the most at the lowest bid, and
    no noise moves the pair once exploration has died out."""
    bids = reduced("split")
    np.testing.assert_allclose(bids, BIDS[0], atol=1e-6)


def test_first_price_with_random_ties_ends_at_collusive_bids_above_the_lowest():
    """A tie won or lost at random perturbs the Q value of the tied bid; the bidders end
    on a common bid between the lowest and the one-shot equilibria (0.90, 0.95), as in
    Figure 1 of the paper (every session on the diagonal, 0.10-0.45)."""
    bids = reduced("random")
    assert np.all(bids[:, 0] == bids[:, 1])
    assert np.all(bids > BIDS[0] + 1e-6) and np.all(bids < 0.5)


def test_second_price_random_tie_tables_pay_the_losing_or_the_tied_bid():
    game = make_game(resolve(str(CONFIGS / "banchio2022_second.yaml"),
                             ["market.distributor.ties=random"]))
    assert game.probs == (0.5, 0.5)
    own, rival = BIDS[:, None], BIDS[None, :]
    reward = np.asarray(game.reward, np.float64).reshape(2, 19, 19, 2)
    win = np.where(own > rival, 1 - rival, 0.0)
    np.testing.assert_allclose(reward[0, ..., 0], np.where(own == rival, 1 - own, win),
                               atol=1e-6)
    np.testing.assert_allclose(reward[1, ..., 0], np.where(own == rival, 0.0, win), atol=1e-6)
