"""``linear``: price-setting sellers and linear differentiated demand (Singh & Vives 1984)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.prefix_softmax import (
    PRICE_MAX,
    QUERY_MAX,
    clean_nonneg,
    clean_price,
    f32,
    money,
    resolve_options,
    with_defaults,
)

PARAMS = {
    "intercept": Field(kind="float", default=1.0, low=0.0,
                       doc="a: a seller's demand when every price is 0"),
    "own_slope": Field(kind="float", default=1.0, low=0.0, low_open=True,
                       doc="b: a seller's demand falls by b per unit of its own price"),
    "cross_slope": Field(kind="float", default=0.5, low=0.0,
                         doc="g: a seller's demand rises by g per unit of each rival's price "
                             "(substitutes; 0: independent products)"),
}
OPTIONS: dict[str, Field] = {}
# each demand term is saturated here before they are added, so that a + own + cross stays
# finite in float32 (at most 3 TERM_MAX < 3.4e38) and no inf - inf arises
TERM_MAX = 1e37


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """Linear differentiated demand: a seller's action is its price.

    Per product, with ``p_s`` the quoted prices (``quotes.quoted_price_shared()``: a
    multiplier seller quotes ``m_s * base``), each seller sells the quantity its linear
    demand gives (clipped at 0)::

        q_s = max(a - b p_s + g sum_{j != s} p_j, 0)
        traffic_s = q_s,   fees_s = p_s q_s
        sent_c = w_c sum_s q_s,   spend_c = w_c sum_s fees_s,   unserved_c = 0

    ``w_c = queries_c / sum_j queries_j`` (``1 / C`` where no consumer sends queries):
    the consumers' queries only say how what is sold is split among them. ``a`` is the
    ``intercept``, ``b`` the ``own_slope`` (> 0), ``g`` the ``cross_slope`` (>= 0:
    substitutes). Budgets are not used; the key is not used (deterministic). Each of
    the three demand terms saturates at ``TERM_MAX`` and ``q_s`` at ``QUERY_MAX``, so
    extreme prices or params give finite outputs. ``O(C + S)``.
    """
    del key
    resolve_options(OPTIONS, options, "linear")
    prm = with_defaults(PARAMS, params)
    return _clear(quotes, f32(prm["intercept"]), f32(prm["own_slope"]),
                  f32(prm["cross_slope"]))


def demand(price: jax.Array, intercept: jax.Array, own_slope: jax.Array,
           cross_slope: jax.Array) -> jax.Array:
    """[S, P] ``q_s = max(a - b p_s + g sum_{j != s} p_j, 0)`` of clean prices ``[S, P]``,
    each term saturated at ``TERM_MAX`` (then ``q_s`` clipped into ``[0, QUERY_MAX]``)."""
    a = clean_nonneg(intercept, TERM_MAX)
    b = clean_nonneg(own_slope, TERM_MAX)
    g = clean_nonneg(cross_slope, TERM_MAX)
    # the rivals' prices: the column sum (may overflow to inf) less one's own, <= PRICE_MAX
    # times S in exact arithmetic, saturated at PRICE_MAX (inf - finite stays inf)
    rivals = jnp.minimum(jnp.sum(price, axis=0)[None, :] - price, PRICE_MAX)
    rivals = jnp.maximum(rivals, 0.0)                 # float rounding of the difference
    own = jnp.minimum(b * price, TERM_MAX)
    cross = jnp.minimum(g * rivals, TERM_MAX)
    return jnp.clip(a - own + cross, 0.0, QUERY_MAX)


@jax.jit
def _clear(quotes: Quotes, intercept: jax.Array, own_slope: jax.Array,
           cross_slope: jax.Array) -> Allocation:
    price = clean_price(quotes.quoted_price_shared())                  # [S, P]
    quantity = demand(price, intercept, own_slope, cross_slope)        # [S, P]
    weights = clean_nonneg(quotes.queries, QUERY_MAX)                  # [C, P]
    total = jnp.sum(quantity, axis=0)                                  # [P]
    fees = money(quantity * price)                                     # [S, P]
    wsum = jnp.sum(weights, axis=0)                                    # [P]
    share = jnp.where(wsum[None, :] > 0, weights / jnp.where(wsum > 0, wsum, 1.0)[None, :],
                      1.0 / weights.shape[0])
    sent = share * total[None, :]
    return Allocation(traffic=quantity, fees=fees, unserved=jnp.zeros_like(sent),
                      spend=money(share * jnp.sum(fees, axis=0)[None, :]), sent=sent)


LINEAR = DISTRIBUTORS.register(DistributorDef(
    kind="linear", allocate=allocate, params=PARAMS, options=OPTIONS, dense=False,
    actions=("price", "multiplier"), deterministic=True))
