"""Shared kernel of the budget-constrained softmax distributors (``logit``, ``proportional``)
and the numeric guards every distributor uses.

Problem, for every product ``p`` independently: consumer ``c`` (budget ``b_c``, queries
``q_c``) splits its queries among the sellers it can afford (quoted price ``p_s <= b_c``,
the *eligible* sellers) with weights ``exp(u_s)``, plus an optional outside option of
weight ``exp(o)`` whose share goes unserved::

    share_cs = [p_s <= b_c] exp(u_s) / D_c,   D_c = sum_{j: p_j <= b_c} exp(u_j) + exp(o)

    traffic_s = sum_c q_c share_cs,   spend_c = q_c sum_s share_cs p_s

Computing ``share`` densely costs ``C x S`` memory per product. Here the eligible set of a
consumer is a *prefix* of the sellers sorted by price, and the consumers a seller serves
are a *suffix* of the consumers sorted by budget, so everything is prefix sums in log
space:

1. sort sellers by price; ``L[k] = logsumexp(u_(1..k))`` (``L[0] = -inf``), likewise
   ``M[k] = logsumexp(u + log p)`` for money;
2. ``k_c = searchsorted(sorted prices, b_c, side='right')`` (ties all included),
   ``log D_c = logaddexp(L[k_c], o)``;
3. sort consumers by budget; ``R[j] = logsumexp(log q - log D)`` over the consumers from
   position ``j`` on (the richest ones); seller ``s`` serves the suffix starting at
   ``j_s = searchsorted(sorted budgets, p_s, side='left')`` so
   ``traffic_s = exp(u_s + R[j_s])`` (every term ``q_c exp(u_s - log D_c) <= q_c``);
4. ``unserved_c = q_c exp(o - log D_c)``, ``served_c = q_c exp(L[k_c] - log D_c)``,
   ``spend_c = q_c exp(M[k_c] - log D_c)``.

Implementation: both searchsorted lookups come from *one* stable sort of the
concatenation ``[prices, budgets]`` (a price sorts before an equal budget). A cumulative
log-sum-exp along that merged order, with ``-inf`` at the budget entries, read at a
budget's position is ``L[k_c]``. The reverse cumulative log-sum-exp of
``log q - log D`` (``-inf`` at the price entries), read at a price's position, is
``R[j_s]``. So the kernel is one argsort, two (two-channel) log-sum-exp associative scans
and a few gathers (the inverse permutation is a scatter, not a second sort).

Cost ``O((C + S) log(C + S))`` per product, memory ``O(C + S)``; products are vmapped.
Finally the per-seller traffic is rescaled by ``sum_c served_c / sum_s traffic_s`` (1 up
to rounding), which makes conservation exact to float rounding even where huge utilities
(``|u| >~ 1e6``) cost float32 precision in the log-space differences.

Small markets: when ``C * S <= DENSE_MAX_PAIRS`` (a constant, 1024) the same formula is
evaluated directly on the ``[C, S]`` eligibility mask of each product instead: on CPU a
sort and two scans of ~40 elements cost far more than a few hundred fused multiply-adds.
There the weight ``exp(u_s)`` depends on the seller only, so :func:`_dense_fast` takes one
shift per product (``S`` exponentials, not ``C x S``) and the mask only selects and adds,
inside multi-output reduces that XLA fuses with the compare (no ``[C, S]`` array is
written). Where one shift would underflow a consumer's eligible weights (its best
eligible utility ~45 below the product's best), the batch is recomputed with a
per-consumer shift (:func:`_dense_one_product`) behind one ``lax.cond`` for the whole
batch (:func:`_dense` is a ``custom_vmap``, so under ``vmap`` it still sees one flag).
The choice of kernel is static (shapes), the paths compute the same shares (tested
against each other and a float64 reference), and the cost stays
``O((C + S) log(C + S) P)`` for every market larger than that constant.

Precision: like any float32 softmax, the shares are accurate to about ``|u| * 2**-24``
in the exponent. Utilities are clipped to ``+-UTILITY_MAX``; money (fees, spend)
saturates at ``MONEY_MAX``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxmarket.combinators.saturate import (  # noqa: F401 - re-exported to the distributors
    LOG_MONEY_MAX,
    MONEY_MAX,
    PRICE_MAX,
    QUERY_MAX,
    money,
)
from jaxmarket.config.fields import REQUIRED, Field, check_mapping
from jaxmarket.market.distributors.base import Allocation

# PRICE_MAX: prices (and budgets) are clipped into [0, PRICE_MAX], NaN -> PRICE_MAX;
# QUERY_MAX: queries are clipped into [0, QUERY_MAX]; MONEY_MAX: fees and spend saturate
# there (q * p can exceed float32's range) -- jaxmarket.combinators.saturate, where the
# rewards and observations saturate at the same bounds
UTILITY_MAX = 1e30   # utilities are clipped into [-UTILITY_MAX, UTILITY_MAX]

NO_ELIGIBLE = Field(
    kind="choice", choices=("unserved", "withhold"), default="unserved",
    doc="a consumer with no eligible seller for a product (and no outside option): "
        "'unserved' sends its queries and they go unserved; 'withhold' sends nothing "
        "(sent = 0 there)")


# --------------------------------------------------------------------------- guards

def resolve_options(spec: Mapping[str, Field], given: Mapping[str, Any] | None,
                    kind: str) -> dict:
    """Validate static ``options`` against ``spec`` (ConfigError on unknown keys or bad
    values) and fill in defaults."""
    return check_mapping(spec, given, f"distributor({kind})")


def with_defaults(spec: Mapping[str, Field], given: Mapping[str, Any] | None) -> dict:
    """``given`` with any missing key of ``spec`` filled by its default."""
    given = {} if given is None else given
    out = {}
    for name, field in spec.items():
        if name in given:
            out[name] = given[name]
        elif field.default is not REQUIRED:
            out[name] = field.default
        else:  # pragma: no cover - every distributor field has a default
            raise KeyError(name)
    return out


def f32(x) -> jax.Array:
    """``x`` as a floating array: float32 normally; float64 inputs stay float64 (x64 mode)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x
    return x.astype(jnp.float32)


def clean_price(x) -> jax.Array:
    """Prices and budgets: NaN and +inf -> PRICE_MAX, negatives -> 0."""
    x = f32(x)
    x = jnp.where(jnp.isnan(x), PRICE_MAX, x)
    x = jnp.clip(x, 0.0, PRICE_MAX)
    return jnp.where(x == 0, jnp.zeros_like(x), x)     # -0.0 -> 0.0 (sorts as equal)


def clean_nonneg(x, high: float) -> jax.Array:
    """Queries, stake, latency...: NaN -> 0, clipped into [0, high]."""
    x = f32(x)
    x = jnp.where(jnp.isnan(x), 0.0, x)
    return jnp.clip(x, 0.0, high)


def clip_utility(u) -> jax.Array:
    u = f32(u)
    u = jnp.where(jnp.isnan(u), -UTILITY_MAX, u)
    return jnp.clip(u, -UTILITY_MAX, UTILITY_MAX)


def safe_log(x) -> jax.Array:
    """log(x) for x > 0, -inf for x <= 0 (no NaN, finite gradients where x > 0)."""
    pos = x > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, x, 1.0)), -jnp.inf)


def safe_exp_diff(a, b) -> jax.Array:
    """exp(a - b), 0 where a = -inf (``b`` finite or -inf: -inf - -inf gives 0, not NaN)."""
    ok = a > -jnp.inf
    return jnp.where(ok, jnp.exp(jnp.where(ok, a - jnp.where(ok, b, 0.0), -jnp.inf)), 0.0)


DENSE_MAX_PAIRS = 1024  # C * S at or below which the [C, S] mask path is used


def _cumlse(x: jax.Array, reverse: bool = False) -> jax.Array:
    """Cumulative log-sum-exp along axis 0 (``-inf`` entries allowed)."""
    # lax.cumlogsumexp lowers to a non-vectorised reduce_window on CPU (~100x slower)
    return lax.associative_scan(jnp.logaddexp, x, axis=0, reverse=reverse)


# --------------------------------------------------------------------------- kernel

def _one_product(u, price, budget, queries, log_outside, outside, withhold):
    """The kernel for one product: u, price [S]; budget, queries [C]; log_outside [];
    ``outside``/``withhold``: bool scalars (traced, so every option shares one compile)."""
    S, C = price.shape[0], budget.shape[0]
    neg_s = jnp.full((S,), -jnp.inf, u.dtype)
    neg_c = jnp.full((C,), -jnp.inf, u.dtype)

    # One stable sort of prices and budgets together; a price sorts before an equal
    # budget, so "at or before a budget" = "p_s <= b_c" and "after a price" = "b_c >= p_s".
    order = jnp.argsort(jnp.concatenate([price, budget]), stable=True)     # [N]
    position = jnp.zeros_like(order).at[order].set(                         # inverse
        jnp.arange(order.shape[0], dtype=order.dtype))
    pos_s, pos_c = position[:S], position[S:]

    # 1-2. prefix log-sum-exps over the sellers at or below each budget:
    #      L = logsumexp(u), M = logsumexp(u + log p) over the eligible sellers
    fwd = jnp.stack([jnp.concatenate([u, neg_c]),
                     jnp.concatenate([u + safe_log(price), neg_c])], axis=1)[order]
    fwd = _cumlse(fwd)                                                    # [N, 2]
    lse_elig, lse_money = fwd[pos_c, 0], fwd[pos_c, 1]                    # [C]
    has_seller = lse_elig > -jnp.inf                                      # u is finite
    # with the outside option: log D = logaddexp(L, o) (finite), its share goes unserved;
    # without: log D = L where some seller is eligible (0 is a placeholder elsewhere)
    log_d = jnp.where(outside, jnp.logaddexp(lse_elig, log_outside),
                      jnp.where(has_seller, lse_elig, 0.0))
    has_any = has_seller | outside
    unserved_share = jnp.where(outside, jnp.minimum(jnp.exp(log_outside - log_d), 1.0),
                               jnp.where(has_seller, 0.0, 1.0))
    sent = jnp.where(withhold & ~has_any, 0.0, queries)
    log_q = safe_log(sent)
    served_c = sent * jnp.minimum(safe_exp_diff(lse_elig, log_d), 1.0)    # 0 if no seller
    unserved = sent * unserved_share

    # spend_c = q_c exp(M - log D_c) <= q_c b_c
    live = has_seller & (sent > 0)
    spend_arg = jnp.minimum(log_q + lse_money - log_d, log_q + safe_log(budget))
    spend_arg = jnp.minimum(jnp.where(live, spend_arg, -jnp.inf), LOG_MONEY_MAX)
    spend = jnp.where(live, jnp.exp(spend_arg), 0.0)

    # 3. suffix log-sum-exps over the consumers whose budget is >= each price:
    #    R = logsumexp(log q - log D), Q = logsumexp(log q)
    w = jnp.where(live, log_q - log_d, -jnp.inf)
    bwd = jnp.stack([jnp.concatenate([neg_s, w]),
                     jnp.concatenate([neg_s, log_q])], axis=1)[order]
    bwd = _cumlse(bwd, reverse=True)                                      # [N, 2]
    r, rq = bwd[pos_s, 0], bwd[pos_s, 1]                                  # [S]
    # u_s + R_s <= log(queries of the consumers s can serve), up to rounding: cap there
    t_arg = jnp.minimum(u + r, rq)
    alive = t_arg > -jnp.inf
    traffic = jnp.where(alive, jnp.exp(jnp.where(alive, t_arg, 0.0)), 0.0)

    # 4. rescale so that sum_s traffic == sum_c served (conservation to float rounding)
    total_t = jnp.sum(traffic)
    ok = total_t > 0
    traffic = traffic * jnp.where(ok, jnp.sum(served_c) / jnp.where(ok, total_t, 1.0), 0.0)
    # nothing reached any seller (e.g. every share underflowed): all of it is unserved
    unserved = jnp.where(ok, unserved, sent)
    spend = jnp.where(ok, spend, 0.0)
    fees = money(traffic * price)
    return traffic, fees, unserved, money(spend), sent


def _dense_one_product(u, price, budget, queries, log_outside, outside, withhold):
    """Same contract and formula as :func:`_one_product`, on the ``[C, S]`` eligibility
    mask (for small markets). Each consumer's weights are shifted by the largest eligible
    utility (or the outside option's), so nothing overflows or underflows spuriously.

    The ``[C, S]`` weights are the only pairwise array: every output is one reduction
    of them (``sum_s w``, ``sum_s w p`` per consumer; ``sum_c (q_c / D_c) w_cs`` per
    seller) instead of materialising the shares ``w / D`` and reducing those
    (the allocation of 1024 bench_b markets: 12.7 ms -> 10.3 ms on the 2-core CPU)."""
    elig = price[None, :] <= budget[:, None]                               # [C, S]
    top = jnp.max(jnp.where(elig, u[None, :], -jnp.inf), axis=1)           # [C]
    has_seller = top > -jnp.inf
    shift = jnp.where(outside, jnp.maximum(top, log_outside), jnp.where(has_seller, top, 0.0))
    # eligible pairs have u_s <= top_c <= shift_c; the minimum only keeps the exp of the
    # ineligible ones (discarded) finite
    w = jnp.where(elig, jnp.exp(jnp.minimum(u[None, :] - shift[:, None], 0.0)), 0.0)
    w_out = jnp.where(outside, jnp.exp(log_outside - shift), 0.0)
    sum_w = jnp.sum(w, axis=1)                                             # [C]
    sum_wp = jnp.sum(w * price[None, :], axis=1)                           # [C]
    denom = sum_w + w_out
    has_any = has_seller | outside
    sent = jnp.where(withhold & ~has_any, 0.0, queries)
    inv_d = jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)
    served_c = sent * jnp.minimum(sum_w * inv_d, 1.0)
    unserved = sent - served_c
    traffic = jnp.sum(w * (sent * inv_d)[:, None], axis=0)                 # [S]
    spend = jnp.minimum(sent * (sum_wp * inv_d), sent * budget)
    return traffic, money(traffic * price), unserved, money(spend), sent


def _add3(a, b):
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def _add2(a, b):
    return a[0] + b[0], a[1] + b[1]


SHARE_FLOOR = 1e-20  # the fast mask kernel's sum of eligible weights must stay above this


def _dense_fast(u, price, budget, queries, log_outside, outside, withhold):
    """The mask kernel's formula with *one* shift per product: ``C x S`` selects and adds
    instead of ``C x S`` exponentials. Any leading batch dims; ``u, price [..., S, P]``,
    ``budget, queries [..., C, P]``, ``log_outside [..., P]``, ``outside, withhold [...]``.

    With ``m_p = max(max_s u_s, o)`` every weight is ``e_s = exp(u_s - m_p) <= 1`` (one
    exponential per seller and product), and per consumer::

        W_c = sum_s [p_s <= b_c] e_s,   D_c = W_c + [outside] exp(o - m_p)
        served_c = q_c W_c / D_c,  spend_c = q_c sum_s [p_s <= b_c] e_s p_s / D_c
        traffic_s = e_s sum_c [p_s <= b_c] q_c / D_c   (capped at sum_c [p_s <= b_c] q_c)

    -- the same shares as :func:`_dense_one_product`, whose per-consumer shift differs by
    a common factor that cancels. The one shift is exact to float rounding unless a
    consumer's eligible weights underflow (its best eligible utility ~45 below the
    product's best): ``ok`` is False for such a market, and the caller recomputes it
    with the per-consumer shift. The two reductions over the ``[C, S]`` pairs are each
    one multi-output reduce (XLA fuses the select into it: no ``[C, S]`` array is
    written)."""
    f = u.dtype
    outside = jnp.asarray(outside, bool)[..., None, None]
    withhold = jnp.asarray(withhold, bool)[..., None, None]
    lo = log_outside[..., None, :]                                          # [..., 1, P]
    top = jnp.max(u, axis=-2, keepdims=True)                                # [..., 1, P]
    m = jnp.where(outside, jnp.maximum(top, lo), top)
    e = jnp.exp(u - m)                                                      # [..., S, P]
    e_out = jnp.where(outside, jnp.exp(jnp.minimum(lo - m, 0.0)), 0.0)     # [..., 1, P]
    elig = price[..., None, :, :] <= budget[..., :, None, :]                # [..., C, S, P]
    zero = jnp.zeros((), f)
    w_sum, wp_sum, n_elig = jax.lax.reduce(
        (jnp.where(elig, e[..., None, :, :], zero),
         jnp.where(elig, (e * price)[..., None, :, :], zero),
         jnp.where(elig, jnp.ones((), f), zero)),
        (zero, zero, zero), _add3, (elig.ndim - 2,))                        # [..., C, P]
    has_seller = n_elig > 0
    denom = w_sum + e_out
    sent = jnp.where(withhold & ~(has_seller | outside), 0.0, queries)
    inv_d = jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)
    served = sent * jnp.minimum(w_sum * inv_d, 1.0)
    unserved = sent - served
    spend = jnp.minimum(sent * (wp_sum * inv_d), sent * budget)
    per_query, reach = jax.lax.reduce(
        (jnp.where(elig, (sent * inv_d)[..., :, None, :], zero),
         jnp.where(elig, sent[..., :, None, :], zero)),
        (zero, zero), _add2, (elig.ndim - 3,))                              # [..., S, P]
    traffic = jnp.minimum(e * per_query, reach)
    ok = jnp.all(~has_seller | (sent == 0) | (w_sum >= SHARE_FLOOR))
    return (traffic, money(traffic * price), unserved, money(spend), sent), ok


def _dense_exact(u, price, budget, queries, log_outside, outside, withhold):
    """:func:`_dense_one_product` (per-consumer shift) over any leading batch dims."""
    fn = jax.vmap(_dense_one_product, in_axes=(1, 1, 1, 1, 0, None, None), out_axes=1)
    for _ in range(u.ndim - 2):
        fn = jax.vmap(fn)
    batch = u.shape[:-2]
    outside = jnp.broadcast_to(jnp.asarray(outside, bool), batch)
    withhold = jnp.broadcast_to(jnp.asarray(withhold, bool), batch)
    return fn(u, price, budget, queries, log_outside, outside, withhold)


@jax.custom_batching.custom_vmap
def _dense(u, price, budget, queries, log_outside, outside, withhold):
    """The small-market kernel: :func:`_dense_fast`, and the exact per-consumer shift
    (:func:`_dense_exact`) only if some market of the whole batch needs it (a
    ``lax.cond`` on one flag for the batch: under ``vmap`` this function sees the whole
    batch -- its vmap rule folds every batch axis into the leading dims -- so the slow
    path costs nothing unless it is taken)."""
    args = (u, price, budget, queries, log_outside, outside, withhold)
    fast, ok = _dense_fast(*args)
    return jax.lax.cond(ok, lambda a: fast, lambda a: tuple(_dense_exact(*a)), args)


@_dense.def_vmap
def _dense_vmap(axis_size, in_batched, *args):
    args = [a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a))
            for a, b in zip(args, in_batched)]
    out = _dense(*args)
    return out, jax.tree.map(lambda _: True, out)


@jax.custom_jvp
def _dense_differentiable(u, price, budget, queries, log_outside, outside, withhold):
    """:func:`_dense`, differentiable: ``custom_vmap`` has no autodiff rule, so
    derivatives (``jvp``, ``grad``) are those of the per-consumer-shift formula
    (:func:`_dense_exact`, plain ``jnp``), which computes the same shares."""
    return _dense(u, price, budget, queries, log_outside, outside, withhold)


@_dense_differentiable.defjvp
def _dense_jvp(primals, tangents):
    return jax.jvp(lambda *a: tuple(_dense_exact(*a)), primals, tangents)


@jax.jit
def _prefix_softmax(u, price, budget, queries, log_outside, outside, withhold):
    price = clean_price(price)
    budget = clean_price(budget)
    queries = clean_nonneg(queries, QUERY_MAX)
    u = clip_utility(u)
    P = price.shape[1]
    lo = clip_utility(jnp.broadcast_to(f32(log_outside), (P,)))
    outside = jnp.asarray(outside, bool)
    withhold = jnp.asarray(withhold, bool)
    if price.shape[0] * budget.shape[0] <= DENSE_MAX_PAIRS:
        traffic, fees, unserved, spend, sent = _dense_differentiable(
            u, price, budget, queries, lo, outside, withhold)
    else:
        fn = jax.vmap(_one_product, in_axes=(1, 1, 1, 1, 0, None, None), out_axes=1)
        traffic, fees, unserved, spend, sent = fn(u, price, budget, queries, lo, outside,
                                                  withhold)
    return Allocation(traffic=traffic, fees=fees, unserved=unserved, spend=spend, sent=sent)


def prefix_softmax(u, price, budget, queries, log_outside=None, withhold=False) -> Allocation:
    """Budget-constrained softmax allocation without any consumer x seller array.

    u, price: [S, P] utilities and quoted prices; budget, queries: [C, P];
    log_outside: scalar or [P] log-weight of the outside option, ``None`` for none;
    ``withhold`` (bool, may be traced): consumers with no eligible seller and no outside
    option send nothing (else their queries are counted unserved). Jitted; the flags are
    traced, so all option combinations share one compilation per shape.
    """
    outside = log_outside is not None
    return _prefix_softmax(u, price, budget, queries, 0.0 if log_outside is None else log_outside,
                           np.bool_(outside), withhold)
