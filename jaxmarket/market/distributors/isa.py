"""``isa_2022``: The Graph's 2022 indexer-selection rule (utility cutoff + stake-weighted pick)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
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

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0   # s: 1/(x + s) - s passes through (0, 1) and (1, 0)
CUTOFF_EXPONENT = 1.1                   # cutoff = M (1 - U^1.1)

SCALE_PARAMS = {
    "latency_scale": Field(kind="float", default=1.0, low=0.0, low_open=True,
                           doc="latency term 1 / (1 + latency / latency_scale) (seconds)"),
    "freshness_scale": Field(kind="float", default=10.0, low=0.0, low_open=True,
                             doc="freshness term 1 / (1 + freshness / freshness_scale) "
                                 "(blocks behind)"),
    "stake_scale": Field(kind="float", default=100.0, low=0.0, low_open=True,
                         doc="stake term stake / (stake + stake_scale) (stake units)"),
}
PARAMS = {
    "weight": Field(kind="float", default=0.5, low=0.5, high=1.0,
                    doc="w: price-efficiency weight, utility uses u(fee/budget)^w"),
    **SCALE_PARAMS,
}
OPTIONS = {
    "mode": Field(kind="choice", choices=("sampled", "expected"), default="sampled",
                  doc="'sampled': draw the cutoff and the pick (uses the key); 'expected': "
                      "the exact expectation over both"),
}


def price_efficiency(p_hat: jax.Array) -> jax.Array:
    """u(x) = 1/(x + s) - s with s = (sqrt 5 - 1)/2: u(0) = 1, u(1) = 0; clipped to [0, 1]."""
    return jnp.clip(1.0 / (p_hat + GOLDEN) - GOLDEN, 0.0, 1.0)


def quality_factors(quotes: Quotes, prm: Mapping[str, Any]) -> tuple[jax.Array, jax.Array]:
    """(latency term x freshness term x stake term [S, P], cleaned stake [S, P])."""
    latency = clean_nonneg(quotes.latency, PRICE_MAX)
    freshness = clean_nonneg(quotes.freshness, PRICE_MAX)
    stake = clean_nonneg(quotes.stake, PRICE_MAX)
    lat = 1.0 / (1.0 + latency / f32(prm["latency_scale"]))
    fresh = 1.0 / (1.0 + freshness / f32(prm["freshness_scale"]))
    stk = stake / (stake + f32(prm["stake_scale"]))
    return lat * fresh * stk, stake


def clean_reliability(quotes: Quotes) -> jax.Array:
    return jnp.clip(jnp.nan_to_num(f32(quotes.reliability), nan=0.0), 0.0, 1.0)


def _expected_shares(util: jax.Array, stake: jax.Array, top: jax.Array) -> jax.Array:
    """Exact P(seller picked) [C, S, P] for utilities ``util`` (0 = not selectable),
    stakes [.., S, ..] and per-consumer maximum ``top`` [C, P] > 0 where anything is
    selectable."""
    order = jnp.argsort(-util, axis=1, stable=True)                      # descending
    us = jnp.take_along_axis(util, order, axis=1)
    st = jnp.take_along_axis(jnp.broadcast_to(stake, util.shape), order, axis=1)
    st = jnp.where(us > 0, st, 0.0)
    ratio = jnp.clip(us / jnp.where(top > 0, top, 1.0)[:, None, :], 0.0, 1.0)
    # F(v) = P(cutoff <= v) = 1 - (1 - v/M)^(1/1.1); F(0) = 0 (cutoff > 0 a.s.)
    below = ratio < 1.0
    f = -jnp.expm1(jnp.log1p(-jnp.where(below, ratio, 0.0)) / CUTOFF_EXPONENT)
    f = jnp.where(us > 0, jnp.where(below, f, 1.0), 0.0)
    f_next = jnp.concatenate([f[:, 1:], jnp.zeros_like(f[:, :1])], axis=1)
    prob_set = jnp.maximum(f - f_next, 0.0)        # P(candidate set = top k); 0 inside ties
    cum = jnp.cumsum(st, axis=1)
    g = jnp.where(cum > 0, prob_set / jnp.where(cum > 0, cum, 1.0), 0.0)
    tail = jnp.flip(jnp.cumsum(jnp.flip(g, axis=1), axis=1), axis=1)     # sum_{k >= r}
    share_sorted = st * tail
    inv = jnp.argsort(order, axis=1)
    return jnp.take_along_axis(share_sorted, inv, axis=1)


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """The 2022 indexer-selection algorithm (ISA), one seller per consumer and product.

    Quoted fees ``f_cs`` are per consumer (``quoted_price_dense``: multiplier sellers
    quote ``m_s x base_c``). Fees above the budget ``b_c`` are excluded. With the
    normalised price ``x = f_cs / b_c``, ``s = (sqrt 5 - 1)/2`` and
    ``u(x) = 1/(x + s) - s`` (``u(0) = 1``, ``u(1) = 0``)::

        utility_cs = [f_cs <= b_c] u(x)^w * reliability_s * 1/(1 + latency_s/latency_scale)
                     * 1/(1 + freshness_s/freshness_scale) * stake_s/(stake_s + stake_scale)

    (``w`` = ``weight`` in [0.5, 1], default 0.5 as in the 2022 gateway). Selection per
    consumer and product: ``M = max_s utility_cs``, a cutoff ``M (1 - U^1.1)`` with
    ``U ~ Uniform(0, 1)``, then one seller drawn among those with
    ``utility >= cutoff`` with probability proportional to its stake; all the consumer's
    queries for the product go to it and it is paid its fee per query. Sellers with
    utility 0 (fee = budget, reliability 0, stake 0) are never picked; a consumer with no
    seller of positive utility leaves its queries unserved.

    ``mode="expected"`` returns the exact expectation over ``U`` and the pick: sort
    utilities descending ``u_(1) >= u_(2) >= ...``; ``F(v) = P(cutoff <= v) =
    1 - (1 - v/M)^(1/1.1)``; the candidate set is the top ``k`` with probability
    ``F(u_(k)) - F(u_(k+1))`` (zero inside ties, so tied sellers enter together);
    ``E share_j = stake_j sum_{k >= rank j} P(top k) / sum_{l <= k} stake_(l)``.

    ``traffic_s = sum_c q_c share_cs``, ``fees_s = sum_c f_cs q_c share_cs``,
    ``spend_c = sum_s f_cs q_c share_cs``. Dense: builds ``[C, S, P]`` arrays.
    """
    opt = resolve_options(OPTIONS, options, "isa_2022")
    if opt["mode"] == "sampled" and key is None:
        raise ValueError("isa_2022 with mode='sampled' needs a PRNG key")
    return _allocate(key if opt["mode"] == "sampled" else None, quotes,
                     with_defaults(PARAMS, params), mode=opt["mode"])


@partial(jax.jit, static_argnames=("mode",))
def _allocate(key, quotes: Quotes, prm: Mapping[str, jax.Array], mode: str) -> Allocation:
    fee = clean_price(quotes.quoted_price_dense())                       # [C, S, P]
    budget = clean_price(quotes.budget)[:, None, :]                      # [C, 1, P]
    queries = clean_nonneg(quotes.queries, QUERY_MAX)                    # [C, P]
    eligible = fee <= budget
    p_hat = jnp.where(eligible & (budget > 0), fee / jnp.where(budget > 0, budget, 1.0), 0.0)
    p_hat = jnp.where(eligible, p_hat, 1.0)
    w = f32(prm["weight"])
    eff = price_efficiency(p_hat)
    eff_w = jnp.where(eff > 0, jnp.power(jnp.where(eff > 0, eff, 1.0), w), 0.0)
    factors, stake = quality_factors(quotes, prm)
    util = jnp.where(eligible, eff_w * (clean_reliability(quotes) * factors)[None], 0.0)
    top = jnp.max(util, axis=1)                                          # [C, P]
    has = top > 0

    if mode == "expected":
        share = _expected_shares(util, stake[None], top)
        total = jnp.sum(share, axis=1, keepdims=True)
        share = jnp.where(total > 0, share / jnp.where(total > 0, total, 1.0), 0.0)
    else:
        # one draw: U for the cutoff (row 0) and Gumbel noise for the pick (rows 1..S)
        C, S, P = util.shape
        tiny = jnp.finfo(util.dtype).tiny
        draw = jax.random.uniform(key, (C, S + 1, P), util.dtype, minval=tiny, maxval=1.0)
        cutoff = top * (1.0 - draw[:, 0, :] ** CUTOFF_EXPONENT)
        cand = (util > 0) & (util >= cutoff[:, None, :])
        gumbel = -jnp.log(-jnp.log(draw[:, 1:, :]))
        logits = jnp.where(cand, jnp.log(jnp.where(cand, stake[None], 1.0)) + gumbel, -jnp.inf)
        pick = jnp.argmax(logits, axis=1)                                # [C, P]
        share = (jnp.arange(util.shape[1])[None, :, None] == pick[:, None, :]) & cand
        share = share.astype(util.dtype)
    share = jnp.where(has[:, None, :], share, 0.0)

    flow = queries[:, None, :] * share                                   # [C, S, P]
    money_flow = money(fee * flow)
    traffic = jnp.sum(flow, axis=0)
    fees = money(jnp.sum(money_flow, axis=0))
    spend = money(jnp.sum(money_flow, axis=1))
    unserved = jnp.where(has, 0.0, queries)
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=queries)


ISA_2022 = DISTRIBUTORS.register(DistributorDef(
    kind="isa_2022", allocate=allocate, params=PARAMS, options=OPTIONS, dense=True,
    deterministic=lambda opt: opt["mode"] != "sampled"))   # 'sampled' draws with the key
