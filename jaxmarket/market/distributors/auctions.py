"""``first_price``, ``second_price`` and their mixture ``mixed_price``: sealed-bid auctions
of each product's queries."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

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
OPTIONS: dict = {}
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


@partial(jax.jit, static_argnames=("second",))
def _auction(quotes: Quotes, prm: Mapping[str, jax.Array], second: bool) -> Allocation:
    reserve = jnp.maximum(f32(prm["reserve"]), 0.0)
    bid, queries, eligible, winner, n_win, top, any_bid = _bids(quotes, reserve)
    pay = _second_payment(bid, eligible, winner, n_win, top, reserve) if second else top
    return _settle(queries, winner, n_win, any_bid, pay)


@jax.jit
def _mixed_auction(quotes: Quotes, prm: Mapping[str, jax.Array]) -> Allocation:
    reserve = jnp.maximum(f32(prm["reserve"]), 0.0)
    a = f32(prm["a"])
    bid, queries, eligible, winner, n_win, top, any_bid = _bids(quotes, reserve)
    second = _second_payment(bid, eligible, winner, n_win, top, reserve)
    return _settle(queries, winner, n_win, any_bid, (2.0 - a) * top + (a - 1.0) * second)


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
    """
    del key
    resolve_options(OPTIONS, options, "first_price")
    return _auction(quotes, with_defaults(PARAMS, params), second=False)


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

    Budgets are not used. ``O(C + S)``.
    """
    del key
    resolve_options(OPTIONS, options, "second_price")
    return _auction(quotes, with_defaults(PARAMS, params), second=True)


def allocate_mixed_price(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
                         options: Mapping[str, Any]) -> Allocation:
    """A mixture of the first- and second-price payment rules, ``a`` in ``[1, 2]``.

    Eligibility, winners, ties, the reserve and unserved queries as ``first_price``; the
    price per query interpolates the two payments::

        pay = (2 - a) B + (a - 1) pay_2nd,   pay_2nd = B (tie at the top), else
                                             max(second eligible bid, reserve)
        fees_s = pay traffic_s,   spend_c = pay q_c

    ``a = 1`` gives ``first_price`` and ``a = 2`` ``second_price`` (bit for bit: the other
    term is multiplied by an exact 0). Budgets are not used. ``O(C + S)``.
    """
    del key
    resolve_options(OPTIONS, options, "mixed_price")
    return _mixed_auction(quotes, with_defaults(MIXED_PARAMS, params))


FIRST_PRICE = DISTRIBUTORS.register(DistributorDef(
    kind="first_price", allocate=allocate_first_price, params=PARAMS, options=OPTIONS,
    dense=False, auction=True))
SECOND_PRICE = DISTRIBUTORS.register(DistributorDef(
    kind="second_price", allocate=allocate_second_price, params=PARAMS, options=OPTIONS,
    dense=False, auction=True))
MIXED_PRICE = DISTRIBUTORS.register(DistributorDef(
    kind="mixed_price", allocate=allocate_mixed_price, params=MIXED_PARAMS, options=OPTIONS,
    dense=False, auction=True))
