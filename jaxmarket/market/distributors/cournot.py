"""``cournot``: quantity-setting sellers and a linear inverse demand per product."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.prefix_softmax import (
    QUERY_MAX,
    clean_nonneg,
    f32,
    money,
    resolve_options,
    with_defaults,
)

PARAMS = {
    "intercept": Field(kind="float", default=1.0, low=0.0,
                       doc="a: the price at zero total quantity (without shocks)"),
    "slope": Field(kind="float", default=1.0, low=0.0, low_open=True,
                   doc="b: the price falls by b per unit of total quantity"),
}
OPTIONS = {
    "shock_values": Field(kind="floats", default=None, low=0.0, optional=True,
                          doc="demand shock: the intercept's possible values (null: none, "
                              "the intercept param is used)"),
    "shock_probs": Field(kind="floats", default=None, low=0.0, high=1.0, optional=True,
                         doc="their probabilities (same length, summing to 1)"),
}
PROB_TOLERANCE = 1e-6


def check(values: Mapping[str, Any], where: str) -> None:
    """``shock_values`` and ``shock_probs`` come together, with one probability per
    value, the probabilities summing to 1."""
    vals, probs = values.get("shock_values"), values.get("shock_probs")
    if vals is None and probs is None:
        return
    if vals is None:
        raise ConfigError(f"{where}.shock_values", None,
                          f"a list of {len(probs)} shock values (shock_probs is given)")
    if probs is None:
        raise ConfigError(f"{where}.shock_probs", None,
                          f"a list of {len(vals)} probabilities (shock_values is given)")
    if len(probs) != len(vals):
        raise ConfigError(f"{where}.shock_probs", list(probs),
                          f"a list of {len(vals)} probabilities, one per shock value")
    if not math.isclose(math.fsum(probs), 1.0, rel_tol=0.0, abs_tol=PROB_TOLERANCE):
        raise ConfigError(f"{where}.shock_probs", list(probs),
                          "probabilities >= 0 summing to 1")


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """Cournot competition: a seller's action is the quantity it sells.

    Per product, with ``q_s`` the sellers' quantities (``quotes.price``) and ``Q`` their
    sum, the market clears at the linear inverse demand (clipped at 0)::

        P = max(a - b Q, 0)
        traffic_s = q_s,   fees_s = P q_s
        sent_c = Q w_c,    spend_c = P sent_c,   unserved_c = 0

    ``w_c = queries_c / sum_j queries_j`` (``1 / C`` where no consumer sends queries):
    the consumers' queries only say how the quantity sold is split among them. ``a`` is
    the ``intercept`` param, or with a demand shock (options ``shock_values``,
    ``shock_probs``) a draw from that distribution, independent per product and period
    (from the step's key). ``b`` is the ``slope``. Budgets are not used. ``O(C + S)``.
    """
    opt = resolve_options(OPTIONS, options, "cournot")
    values = None if opt["shock_values"] is None else tuple(opt["shock_values"])
    probs = None if opt["shock_probs"] is None else tuple(opt["shock_probs"])
    prm = with_defaults(PARAMS, params)
    intercept = draw_shock(key, prm, values, probs, quotes.price.shape[1])
    return _clear(quotes, intercept, f32(prm["slope"]))


def draw_shock(key, prm, values, probs, num_products: int) -> jax.Array:
    """[P] each product's shocked value this period: one of ``values`` with probabilities
    ``probs`` (inverse CDF of one uniform per product), or without a shock the
    ``intercept`` param (logit draws its outside quality with it, ``prm`` None)."""
    if values is None:
        return jnp.broadcast_to(f32(prm["intercept"]), (num_products,))
    cum = jnp.asarray(np.cumsum(np.asarray(probs, np.float64)), jnp.float32)
    u = jax.random.uniform(key, (num_products,), jnp.float32)
    index = jnp.minimum(jnp.sum(u[:, None] >= cum[None, :-1], axis=1), len(values) - 1)
    return jnp.asarray(np.asarray(values, np.float32))[index]


@jax.jit
def _clear(quotes: Quotes, intercept: jax.Array, slope: jax.Array) -> Allocation:
    quantity = clean_nonneg(quotes.price, QUERY_MAX)                   # [S, P]
    weights = clean_nonneg(quotes.queries, QUERY_MAX)                  # [C, P]
    total = jnp.sum(quantity, axis=0)                                  # [P]
    price = jnp.maximum(intercept - slope * total, 0.0)                # [P]
    wsum = jnp.sum(weights, axis=0)                                    # [P]
    share = jnp.where(wsum[None, :] > 0, weights / jnp.where(wsum > 0, wsum, 1.0)[None, :],
                      1.0 / weights.shape[0])
    sent = share * total[None, :]
    return Allocation(traffic=quantity, fees=money(quantity * price[None, :]),
                      unserved=jnp.zeros_like(sent), spend=money(sent * price[None, :]),
                      sent=sent)


def deterministic(options: Mapping[str, Any]) -> bool:
    """Random only with a demand shock of more than one value (Cournot's and logit's)."""
    values = options.get("shock_values")
    return values is None or len(values) == 1


def outcomes(options: Mapping[str, Any], num_sellers: int | None = None):
    """A demand shock's outcomes: each shock value (Cournot's intercept, logit's outside
    quality) with its probability, for any number of sellers."""
    del num_sellers
    values, probs = options.get("shock_values"), options.get("shock_probs")
    if values is None:
        return None
    return tuple((p, {"shock_values": [v], "shock_probs": [1.0]})
                 for v, p in zip(values, probs) if p > 0)


COURNOT = DISTRIBUTORS.register(DistributorDef(
    kind="cournot", allocate=allocate, params=PARAMS, options=OPTIONS, dense=False,
    actions=("quantity",), deterministic=deterministic, check=check, outcomes=outcomes))
