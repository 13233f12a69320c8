"""``cheapest``: all of a product's queries go to the sellers at the lowest quoted price."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
OPTIONS = {"no_eligible": NO_ELIGIBLE}


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
    """
    del key, params
    opt = resolve_options(OPTIONS, options, "cheapest")
    return _allocate(quotes, np.bool_(opt["no_eligible"] == "withhold"))


@jax.jit
def _allocate(quotes: Quotes, withhold) -> Allocation:
    price = clean_price(quotes.quoted_price_shared())            # [S, P]
    budget = clean_price(quotes.budget)                          # [C, P]
    queries = clean_nonneg(quotes.queries, QUERY_MAX)
    m = jnp.min(price, axis=0)                                   # [P]
    winner = price == m[None, :]                                 # [S, P]
    n_win = jnp.sum(winner, axis=0).astype(price.dtype)            # [P] >= 1
    served = budget >= m[None, :]                                # [C, P]
    sent = jnp.where(withhold & ~served, 0.0, queries)
    total = jnp.sum(jnp.where(served, sent, 0.0), axis=0)        # [P]
    traffic = jnp.where(winner, (total / n_win)[None, :], 0.0)
    fees = money(traffic * m[None, :])
    spend = money(jnp.where(served, sent * m[None, :], 0.0))
    unserved = jnp.where(served, 0.0, sent)
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=sent)


CHEAPEST = DISTRIBUTORS.register(DistributorDef(kind="cheapest", allocate=allocate,
                                                params=PARAMS, options=OPTIONS, dense=False))
