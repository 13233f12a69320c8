"""``first_price``, ``second_price`` and their mixture ``mixed_price``: sealed-bid auctions
of each product's queries."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.prefix_softmax import (
    QUERY_MAX,
    clean_nonneg,
    clean_price,
    f32,
    money,
    resolve_options,
    with_defaults,
)

PARAMS = {
    "reserve": Field(kind="float", default=0.0, low=0.0,
                     doc="reserve price: bids below it are not eligible; the second-price "
                         "payment is at least this"),
}
OPTIONS: dict = {
    "ties": Field(kind="choice", default="split", choices=("split", "random", "order"),
                  doc="equal top bids: split (the tied bidders share the queries), random "
                      "(one tied bidder, uniformly at random each period, wins them all) or "
                      "order (the tied bidder first in tie_order, by default the lowest "
                      "seller index, wins them all)"),
    "tie_order": Field(kind="ints", default=None, low=0, optional=True,
                       doc="ties: order: seller indices (flat, over every seller group) "
                           "in priority order; sellers not listed follow in index order "
                           "(null: index order)"),
}
# ties: random declares its outcomes (every priority order) up to this many sellers
MAX_TIE_SELLERS = 5
MIXED_PARAMS = {
    **PARAMS,
    "a": Field(kind="float", default=1.5, low=1.0, high=2.0,
               doc="payment rule: pay = (2 - a) first-price payment + (a - 1) second-price "
                   "payment (1: first price, 2: second price)"),
}


def _bids(quotes: Quotes, reserve: jax.Array):
    """Eligible bids, the top bid per product and its winners (shared by every rule)."""
    bid = clean_price(quotes.quoted_price_shared())                    # [S, P]
    queries = clean_nonneg(quotes.queries, QUERY_MAX)                  # [C, P]
    eligible = bid >= reserve
    masked = jnp.where(eligible, bid, -jnp.inf)
    top = jnp.max(masked, axis=0)                                      # [P], -inf: no bid
    any_bid = top > -jnp.inf
    winner = eligible & (bid == top[None, :])                          # [S, P]
    n_win = jnp.maximum(jnp.sum(winner, axis=0), 1).astype(bid.dtype)
    top = jnp.where(any_bid, top, 0.0)
    return bid, queries, eligible, winner, n_win, top, any_bid


def _priority(key: jax.Array, num_sellers: int, ties: str,
              tie_order: tuple[int, ...]) -> jax.Array:
    """[S] each seller's tie priority (lowest wins): uniform draws for ``random``, the
    position in ``tie_order`` (unlisted sellers after it, in index order) for ``order``."""
    if ties == "random":
        return jax.random.uniform(key, (num_sellers,))
    rank = [len(tie_order) + s for s in range(num_sellers)]
    for pos, s in enumerate(tie_order):
        if s < num_sellers:
            rank[s] = pos
    return jnp.asarray(rank, jnp.float32)


def _one_winner(winner: jax.Array, priority: jax.Array) -> jax.Array:
    """[S, P] the tied winner of lowest ``priority`` [S] alone, per product."""
    masked = jnp.where(winner, priority[:, None], jnp.inf)
    first = jnp.argmin(masked, axis=0)                                 # [P]
    seller = jnp.arange(winner.shape[0])[:, None]
    return winner & (seller == first[None, :])


def _second_payment(bid, eligible, winner, n_win, top, reserve) -> jax.Array:
    """[P] the second-price payment: the tied bid, else max(highest losing bid, reserve)."""
    runner_up = jnp.max(jnp.where(eligible & ~winner, bid, -jnp.inf), axis=0)
    return jnp.where(n_win > 1, top, jnp.maximum(runner_up, reserve))


def _settle(queries, winner, n_win, any_bid, pay) -> Allocation:
    """The winners split every query and each pays ``pay`` [P] per query."""
    pay = jnp.where(any_bid, pay, 0.0)                                 # [P] per query
    total = jnp.sum(queries, axis=0)                                   # [P]
    traffic = jnp.where(winner, (total / n_win)[None, :], 0.0)
    fees = money(traffic * pay[None, :])
    spend = money(jnp.where(any_bid[None, :], queries * pay[None, :], 0.0))
    unserved = jnp.where(any_bid[None, :], 0.0, queries)
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=queries)


def _break_ties(key, winner, n_win, ties: str, tie_order: tuple[int, ...]):
    """``(winner, n_win)`` after the tie rule: unchanged for ``split``, else one winner."""
    if ties == "split":
        return winner, n_win
    winner = _one_winner(winner, _priority(key, winner.shape[0], ties, tie_order))
    return winner, jnp.ones_like(n_win)


@partial(jax.jit, static_argnames=("second", "ties", "tie_order"))
def _auction(key: jax.Array, quotes: Quotes, prm: Mapping[str, jax.Array], second: bool,
             ties: str = "split", tie_order: tuple[int, ...] = ()) -> Allocation:
    reserve = jnp.maximum(f32(prm["reserve"]), 0.0)
    bid, queries, eligible, winner, n_win, top, any_bid = _bids(quotes, reserve)
    pay = _second_payment(bid, eligible, winner, n_win, top, reserve) if second else top
    winner, n_win = _break_ties(key, winner, n_win, ties, tie_order)
    return _settle(queries, winner, n_win, any_bid, pay)


@partial(jax.jit, static_argnames=("ties", "tie_order"))
def _mixed_auction(key: jax.Array, quotes: Quotes, prm: Mapping[str, jax.Array],
                   ties: str = "split", tie_order: tuple[int, ...] = ()) -> Allocation:
    reserve = jnp.maximum(f32(prm["reserve"]), 0.0)
    a = f32(prm["a"])
    bid, queries, eligible, winner, n_win, top, any_bid = _bids(quotes, reserve)
    second = _second_payment(bid, eligible, winner, n_win, top, reserve)
    winner, n_win = _break_ties(key, winner, n_win, ties, tie_order)
    return _settle(queries, winner, n_win, any_bid, (2.0 - a) * top + (a - 1.0) * second)


def _tie_options(options: Mapping[str, Any] | None, kind: str) -> tuple[str, tuple[int, ...]]:
    opt = resolve_options(OPTIONS, options, kind)
    check_ties(opt, f"distributor({kind})")
    order = opt["tie_order"]
    return opt["ties"], tuple(int(s) for s in order) if order is not None else ()


def check_ties(values: Mapping[str, Any], where: str) -> None:
    """``tie_order`` goes with ``ties: order`` (without it: index order): a list of
    distinct seller indices (checked where the options are resolved, so the jax-free
    quick checks keep covering the auctions' other fields)."""
    ties, order = values.get("ties", "split"), values.get("tie_order")
    if ties != "order" and order is not None:
        raise ConfigError(f"{where}.tie_order", list(order),
                          f"null unless ties: order (ties is {ties!r})")
    if order is not None and len(set(order)) != len(order):
        raise ConfigError(f"{where}.tie_order", list(order), "distinct seller indices")


def deterministic(options: Mapping[str, Any]) -> bool:
    """Random only with ``ties: random``."""
    return options.get("ties", "split") != "random"


def outcomes(options: Mapping[str, Any], num_sellers: int | None = None):
    """``ties: random``'s outcomes: every priority order of the sellers, each with
    probability ``1 / S!`` (a uniformly random order makes each tied bidder the winner
    with the same probability); None above ``MAX_TIE_SELLERS`` sellers."""
    if options.get("ties", "split") != "random" or num_sellers is None \
            or num_sellers > MAX_TIE_SELLERS:
        return None
    p = 1.0 / math.factorial(num_sellers)
    return tuple((p, {"ties": "order", "tie_order": list(order)})
                 for order in itertools.permutations(range(num_sellers)))


def allocate_first_price(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
                         options: Mapping[str, Any]) -> Allocation:
    """First-price sealed-bid auction per product.

    A seller's quoted price is its bid per query. Eligible bids: ``bid >= reserve``. The
    highest eligible bid ``B`` wins all consumers' queries for the product (exact ties
    split them equally); with no eligible bid every query goes unserved. Each winner pays
    its own bid per query::

        traffic_s = [s wins] sum_c q_c / #winners,   fees_s = B traffic_s,   spend_c = B q_c

    ``fees`` is the money the auction raises from the winner (the auctioneer's revenue).
    Budgets are not used (the bid is the price; consumers never refuse). ``O(C + S)``.

    Option ``ties``: ``split`` (above), ``random`` (each period one uniformly random
    priority order of the sellers, the same for every product, gives all the tied
    queries to its first tied bidder: the key's only use) or ``order`` (the fixed
    priority ``tie_order``). A single winner pays as above.
    """
    ties, order = _tie_options(options, "first_price")
    return _auction(key, quotes, with_defaults(PARAMS, params), second=False, ties=ties,
                    tie_order=order)


def allocate_second_price(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
                          options: Mapping[str, Any]) -> Allocation:
    """Second-price (Vickrey) sealed-bid auction per product.

    As ``first_price`` (eligible bids ``>= reserve``, highest eligible bid wins all
    queries, exact ties split equally, no eligible bid: unserved), but the price per
    query is ``max(highest losing eligible bid, reserve)``; with a tie at the top the
    price is the tied bid::

        pay = B                               if two or more bids tie at B
        pay = max(second eligible bid, reserve) otherwise (reserve if no other eligible bid)
        fees_s = pay traffic_s,   spend_c = pay q_c

    Budgets are not used. Option ``ties`` as ``first_price`` (a tie at the top still pays
    the tied bid). ``O(C + S)``.
    """
    ties, order = _tie_options(options, "second_price")
    return _auction(key, quotes, with_defaults(PARAMS, params), second=True, ties=ties,
                    tie_order=order)


def allocate_mixed_price(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
                         options: Mapping[str, Any]) -> Allocation:
    """A mixture of the first- and second-price payment rules, ``a`` in ``[1, 2]``.

    Eligibility, winners, ties, the reserve and unserved queries as ``first_price``; the
    price per query interpolates the two payments::

        pay = (2 - a) B + (a - 1) pay_2nd,   pay_2nd = B (tie at the top), else
                                             max(second eligible bid, reserve)
        fees_s = pay traffic_s,   spend_c = pay q_c

    ``a = 1`` gives ``first_price`` and ``a = 2`` ``second_price`` (bit for bit: the other
    term is multiplied by an exact 0). Budgets are not used. Option ``ties`` as
    ``first_price``. ``O(C + S)``.
    """
    ties, order = _tie_options(options, "mixed_price")
    return _mixed_auction(key, quotes, with_defaults(MIXED_PARAMS, params), ties=ties,
                          tie_order=order)


FIRST_PRICE = DISTRIBUTORS.register(DistributorDef(
    kind="first_price", allocate=allocate_first_price, params=PARAMS, options=OPTIONS,
    dense=False, auction=True, deterministic=deterministic, outcomes=outcomes))
SECOND_PRICE = DISTRIBUTORS.register(DistributorDef(
    kind="second_price", allocate=allocate_second_price, params=PARAMS, options=OPTIONS,
    dense=False, auction=True, deterministic=deterministic, outcomes=outcomes))
MIXED_PRICE = DISTRIBUTORS.register(DistributorDef(
    kind="mixed_price", allocate=allocate_mixed_price, params=MIXED_PARAMS, options=OPTIONS,
    dense=False, auction=True, deterministic=deterministic, outcomes=outcomes))
