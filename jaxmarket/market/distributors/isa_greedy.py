"""``isa_greedy``: greedy multi-seller indexer selection (score per unit of price)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.isa import SCALE_PARAMS, clean_reliability, quality_factors
from jaxmarket.market.distributors.prefix_softmax import (
    QUERY_MAX,
    clean_nonneg,
    clean_price,
    f32,
    money,
    resolve_options,
    with_defaults,
)

RELIABILITY_POWER = 7

PARAMS = {
    **SCALE_PARAMS,
    "min_price_ratio": Field(kind="float", default=0.01, low=0.0, low_open=True,
                             doc="floor of fee/budget in the score-per-price ratio"),
}
OPTIONS = {
    "max_sellers": Field(kind="int", default=3, low=1,
                         doc="most sellers selected per consumer and product"),
}


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """Greedy selection of up to ``max_sellers`` sellers per consumer and product.

    Score (probability a seller answers usefully)::

        score_s = reliability_s^7 * 1/(1 + latency_s/latency_scale)
                  * 1/(1 + freshness_s/freshness_scale) * stake_s/(stake_s + stake_scale)

    Fees are clamped to the budget, ``f_cs = min(quoted fee, b_c)`` (an over-budget
    seller can still be selected, and is paid the budget). A set's score is
    ``1 - prod_i (1 - score_i)``; greedily add the seller with the highest
    ``score_s prod_{selected}(1 - score_j) / max(f_cs / b_c, min_price_ratio)``, skipping
    sellers of score 0. The product factor is common to all candidates, so the picks are
    the top ``max_sellers`` sellers by ``score_s / max(f_cs / b_c, min_price_ratio)``
    (exact ties: lower seller index first), in that order. Queries go to the selected
    sellers in order, the k-th serving what the earlier ones failed::

        traffic_k = q score_k prod_{j<k} (1 - score_j),   unserved = q prod_k (1 - score_k)

    ``fees_s = sum_c f_cs traffic_cs``, ``spend_c = sum_s f_cs traffic_cs``. Key unused.
    Dense: builds ``[C, S, P]`` arrays.
    """
    del key
    opt = resolve_options(OPTIONS, options, "isa_greedy")
    return _allocate(quotes, with_defaults(PARAMS, params), max_sellers=int(opt["max_sellers"]))


@partial(jax.jit, static_argnames=("max_sellers",))
def _allocate(quotes: Quotes, prm: Mapping[str, jax.Array], max_sellers: int) -> Allocation:
    fee = clean_price(quotes.quoted_price_dense())                        # [C, S, P]
    budget = clean_price(quotes.budget)[:, None, :]                       # [C, 1, P]
    queries = clean_nonneg(quotes.queries, QUERY_MAX)                     # [C, P]
    fee = jnp.minimum(fee, budget)
    ratio = jnp.where(budget > 0, fee / jnp.where(budget > 0, budget, 1.0), 0.0)
    ratio = jnp.maximum(ratio, f32(prm["min_price_ratio"]))
    factors, _ = quality_factors(quotes, prm)
    score = clean_reliability(quotes) ** RELIABILITY_POWER * factors      # [S, P]
    score = jnp.clip(score, 0.0, 1.0)
    value = jnp.where(score[None] > 0, score[None] / ratio, -1.0)         # [C, S, P]

    C, S, P = fee.shape
    k = min(max_sellers, S)
    _, idx = lax.top_k(jnp.transpose(value, (0, 2, 1)), k)               # [C, P, k]
    sel_score = jnp.take_along_axis(jnp.broadcast_to(score.T[None], (C, P, S)), idx, axis=2)
    sel_fee = jnp.take_along_axis(jnp.transpose(fee, (0, 2, 1)), idx, axis=2)
    sel_score = jnp.where(sel_score > 0, sel_score, 0.0)                  # skipped: score 0
    miss = jnp.cumprod(1.0 - sel_score, axis=2)                           # [C, P, k]
    before = jnp.concatenate([jnp.ones_like(miss[..., :1]), miss[..., :-1]], axis=2)
    served = queries[..., None] * sel_score * before                     # [C, P, k]
    unserved = queries * miss[..., -1]

    onehot = (idx[..., None] == jnp.arange(S)).astype(served.dtype)        # [C, P, k, S]
    traffic = jnp.einsum("cpk,cpks->sp", served, onehot)
    paid = money(sel_fee * served)
    fees = money(jnp.einsum("cpk,cpks->sp", paid, onehot))
    spend = money(jnp.sum(paid, axis=2))
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=queries)


ISA_GREEDY = DISTRIBUTORS.register(DistributorDef(kind="isa_greedy", allocate=allocate,
                                                  params=PARAMS, options=OPTIONS, dense=True))
