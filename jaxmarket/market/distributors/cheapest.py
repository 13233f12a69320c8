"""``cheapest``: all of a product's queries go to the sellers at the lowest quoted price."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.prefix_softmax import (
    NO_ELIGIBLE,
    QUERY_MAX,
    clean_nonneg,
    clean_price,
    money,
    resolve_options,
)

PARAMS: dict = {}
OPTIONS = {
    "no_eligible": NO_ELIGIBLE,
    "demand": Field(kind="choice", choices=("unit", "linear"), default="unit",
                    doc="'unit': a consumer with b_c >= m buys all its queries; 'linear': "
                        "it buys q_c max(0, 1 - m / b_c) (b_c is its choke price), the rest "
                        "of its queries go unserved"),
}


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """Bertrand-style: lowest price takes all.

    Per product, ``m = min_s p_s`` over all sellers; the sellers quoting exactly ``m``
    split the served queries equally. Consumer ``c`` is served iff ``b_c >= m``::

        traffic_s = [p_s = m] / #{j: p_j = m} * sum_c [b_c >= m] q_c,   fees_s = m traffic_s
        spend_c = [b_c >= m] q_c m

    A consumer with ``b_c < m`` follows ``no_eligible``: its queries go unserved
    ("unserved") or are not sent ("withhold"). (Consumers never fall back to a dearer
    seller they could afford: with ``b_c >= m`` someone is always affordable.) ``O(C + S)``.

    ``demand: linear`` (option; default ``unit``, the rule above): consumer ``c`` buys
    only part of its queries at the lowest price, its budget being its choke price::

        bought_c = q_c max(0, 1 - m / b_c)   (0 where b_c = 0),   unserved_c = q_c - bought_c
        traffic_s = [p_s = m] / #{j: p_j = m} * sum_c bought_c,   spend_c = m bought_c

    (``b_c = q_c = 1``: the linear demand ``D(m) = 1 - m`` of Klein 2021); ``no_eligible``
    applies to the consumers with ``b_c < m`` as above.
    """
    del key, params
    opt = resolve_options(OPTIONS, options, "cheapest")
    withhold = np.bool_(opt["no_eligible"] == "withhold")
    if opt["demand"] == "linear":
        return _allocate_linear(quotes, withhold)
    return _allocate(quotes, withhold)


def _lowest(quotes: Quotes, withhold):
    """The lowest price per product, its sellers, who can afford it and what is sent."""
    price = clean_price(quotes.quoted_price_shared())            # [S, P]
    budget = clean_price(quotes.budget)                          # [C, P]
    queries = clean_nonneg(quotes.queries, QUERY_MAX)
    m = jnp.min(price, axis=0)                                   # [P]
    winner = price == m[None, :]                                 # [S, P]
    n_win = jnp.sum(winner, axis=0).astype(price.dtype)            # [P] >= 1
    served = budget >= m[None, :]                                # [C, P]
    sent = jnp.where(withhold & ~served, 0.0, queries)
    return budget, m, winner, n_win, served, sent


@jax.jit
def _allocate(quotes: Quotes, withhold) -> Allocation:
    budget, m, winner, n_win, served, sent = _lowest(quotes, withhold)
    total = jnp.sum(jnp.where(served, sent, 0.0), axis=0)        # [P]
    traffic = jnp.where(winner, (total / n_win)[None, :], 0.0)
    fees = money(traffic * m[None, :])
    spend = money(jnp.where(served, sent * m[None, :], 0.0))
    unserved = jnp.where(served, 0.0, sent)
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=sent)


@jax.jit
def _allocate_linear(quotes: Quotes, withhold) -> Allocation:
    budget, m, winner, n_win, served, sent = _lowest(quotes, withhold)
    positive = budget > 0
    frac = 1.0 - m[None, :] / jnp.where(positive, budget, 1.0)
    frac = jnp.where(positive, jnp.clip(frac, 0.0, 1.0), 0.0)    # [C, P]
    bought = sent * frac
    total = jnp.sum(bought, axis=0)                              # [P]
    traffic = jnp.where(winner, (total / n_win)[None, :], 0.0)
    fees = money(traffic * m[None, :])
    spend = money(bought * m[None, :])
    unserved = sent - bought
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=sent)


CHEAPEST = DISTRIBUTORS.register(DistributorDef(kind="cheapest", allocate=allocate,
                                                params=PARAMS, options=OPTIONS, dense=False))
