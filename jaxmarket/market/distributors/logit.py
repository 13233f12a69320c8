"""``logit``: multinomial-logit choice among the sellers a consumer can afford."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.cournot import check as check_shock
from jaxmarket.market.distributors.cournot import deterministic as shock_deterministic
from jaxmarket.market.distributors.cournot import draw_shock
from jaxmarket.market.distributors.cournot import outcomes as shock_outcomes
from jaxmarket.market.distributors.prefix_softmax import (
    NO_ELIGIBLE,
    QUERY_MAX,
    UTILITY_MAX,
    _prefix_softmax,
    clean_nonneg,
    clean_price,
    clip_utility,
    f32,
    money,
    resolve_options,
    with_defaults,
)

#: the platform's steering rules (``steering``)
STEERING = ("none", "lowest_price", "lowest_price_all", "lowest_price_dynamic")

PARAMS = {
    "temperature": Field(kind="float", default=1.0, low=0.0, low_open=True,
                         doc="mu: logit temperature (> 0); smaller = choosier consumers"),
    "price_sensitivity": Field(kind="float", default=1.0,
                               doc="beta in u = (a - beta p) / mu; -1 gives the legacy "
                                   "exp(+price) rule"),
    "outside_quality": Field(kind="float", default=0.0,
                             doc="a_0: quality of the outside option (if enabled)"),
}
OPTIONS = {
    "outside_option": Field(kind="bool", default=True,
                            doc="add an outside good of utility a_0 / mu; its share goes "
                                "unserved"),
    "no_eligible": NO_ELIGIBLE,
    "shock_values": Field(kind="floats", default=None, optional=True,
                          doc="aggregate demand shock: the outside quality a_0's possible "
                              "values, one drawn per product and period (null: none, the "
                              "outside_quality param is used)"),
    "shock_probs": Field(kind="floats", default=None, low=0.0, high=1.0, optional=True,
                         doc="their probabilities (same length, summing to 1)"),
    "steering": Field(kind="choice", choices=STEERING, default="none",
                      doc="the platform's demand steering (price-directed prominence, "
                          "Johnson, Rhodes & Wildenbeest 2023): 'none', consumers consider "
                          "every seller they can afford; 'lowest_price', they see one seller "
                          "at the product's lowest price (at a tie each tied seller with "
                          "equal probability; the allocation is the expectation) and the "
                          "outside option; 'lowest_price_all', they see every seller at the "
                          "lowest price; 'lowest_price_dynamic', one seller at the lowest "
                          "price, a tie going to the tied sellers whose last-period price "
                          "was the lowest of theirs (equal probability among those)"),
}


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """Logit shares among eligible sellers.

    Per consumer ``c`` and product ``p``, seller ``s`` is *eligible* iff its quoted price
    ``p_s <= b_c`` (the consumer's budget). With ``u_s = (a_s - beta p_s) / mu`` (``a_s``
    = ``quotes.quality``, ``beta`` = ``price_sensitivity``, ``mu`` = ``temperature``)::

        share_cs = [p_s <= b_c] exp(u_s) / (sum_{j: p_j <= b_c} exp(u_j) + [outside] exp(a_0 / mu))

    ``traffic_s = sum_c q_c share_cs``, ``fees_s = p_s traffic_s``,
    ``spend_c = q_c sum_s share_cs p_s``; the outside option's share
    ``exp(a_0/mu) / D_c`` goes to ``unserved``. A consumer with no eligible seller and
    no outside option either sends its queries and they go unserved
    (``no_eligible="unserved"``) or sends nothing (``"withhold"``: ``sent = 0``); with the
    outside option on, the outside option absorbs them (unserved, ``sent = q``).

    The legacy simulator's rule -- share proportional to ``exp(+price)`` among sellers
    priced at or below the budget, a consumer with no eligible seller sends nothing -- is
    ``price_sensitivity=-1, temperature=1``, qualities 0, ``outside_option=False``,
    ``no_eligible="withhold"``.

    ``steering`` (price-directed prominence): the platform shows only sellers at the
    product's lowest quoted price ``m = min_s p_s`` (``T`` of them). ``"lowest_price"``
    shows one of them, each with probability ``1 / T``; the allocation is the expectation
    over that draw (deterministic), each shown seller facing the consumer alone::

        share_cs = [p_s = m] [m <= b_c] / T * exp(u_s) / (exp(u_s) + [outside] exp(a_0 / mu))

    ``"lowest_price_dynamic"`` rewards the seller that got to the lowest price first: of
    the tied sellers ``T`` only those whose price last period (``quotes.previous``, the
    prices in force before this step) was the lowest among ``T``'s, ``T' = {s in T:
    prev_s = min_{j in T} prev_j}``, are shown, each with probability ``1 / |T'|``::

        share_cs = [s in T'] [m <= b_c] / |T'| * exp(u_s) / (exp(u_s) + [outside] exp(a_0 / mu))

    (a seller that matches a rival's cut does not share its exposure that period; with no
    tie it is ``"lowest_price"``). The rule reads the last period's prices, so a market
    under it is not a function of the current prices alone (``DistributorDef.lagged``).

    ``"lowest_price_all"`` shows all of them (the others' ``u_s = -UTILITY_MAX``)::

        share_cs = [p_s = m] [m <= b_c] exp(u_s) / (sum_{j: p_j = m} exp(u_j) + [outside] exp(a_0 / mu))

    A consumer who can afford any seller can afford ``m``, so steering leaves nobody
    without an eligible seller who had one (``no_eligible`` applies as above).
    ``"none"`` (default) is the rule above, unchanged.

    ``shock_values`` (with ``shock_probs``): an aggregate demand shock (Calvano et al.
    2020, Section V.C): each period ``a_0`` is drawn from these values with these
    probabilities, independently per product (from the step's key), in place of the
    ``outside_quality`` param. Without it the rule is deterministic and ignores its key.

    Needs a base price shared by all consumers of a product (``quoted_price_shared``).
    Builds no consumer x seller array once ``C * S > DENSE_MAX_PAIRS`` (1024):
    ``O((C + S) log(C + S) P)`` via
    :func:`~jaxmarket.market.distributors.prefix_softmax.prefix_softmax`; smaller markets
    use the (faster there) ``[C, S]`` eligibility mask of each product.
    """
    opt = resolve_options(OPTIONS, options, "logit")
    prm = with_defaults(PARAMS, params)
    if opt["shock_values"] is not None:
        prm = {**prm, "outside_quality": draw_shock(key, None, tuple(opt["shock_values"]),
                                                    tuple(opt["shock_probs"]),
                                                    quotes.price.shape[1])}
    outside = np.bool_(opt["outside_option"])
    withhold = np.bool_(opt["no_eligible"] == "withhold")
    if opt["steering"] in ("lowest_price", "lowest_price_dynamic"):
        dynamic = opt["steering"] == "lowest_price_dynamic"
        if dynamic and quotes.previous is None:
            raise ValueError("logit steering 'lowest_price_dynamic' reads the last period's "
                             "prices (quotes.previous), which these quotes do not hold")
        return _allocate_one_shown(quotes, prm, outside, withhold, dynamic=dynamic)
    return _allocate(quotes, prm, outside, withhold,
                     steer=opt["steering"] == "lowest_price_all")


@functools.partial(jax.jit, static_argnames=("steer",))
def _allocate(quotes: Quotes, prm: Mapping[str, jax.Array], outside, withhold,
              steer: bool = False) -> Allocation:
    price = clean_price(quotes.quoted_price_shared())
    mu = f32(prm["temperature"])
    beta = f32(prm["price_sensitivity"])
    u = (f32(quotes.quality) - beta * price) / mu
    if steer:   # price-directed prominence: every seller at the lowest price is shown
        shown = price == jnp.min(price, axis=0, keepdims=True)          # [S, P]
        u = jnp.where(shown, u, -UTILITY_MAX)
    log_outside = f32(prm["outside_quality"]) / mu
    return _prefix_softmax(u, price, quotes.budget, quotes.queries, log_outside, outside,
                           withhold)


@functools.partial(jax.jit, static_argnames=("dynamic",))
def _allocate_one_shown(quotes: Quotes, prm: Mapping[str, jax.Array], outside,
                        withhold, dynamic: bool = False) -> Allocation:
    """``steering="lowest_price"``: one seller at the lowest price shown, each of the
    ``T`` tied ones with probability ``1 / T``, in expectation (``dynamic``:
    ``"lowest_price_dynamic"``, only the tied sellers of the lowest previous price).
    ``O(C + S)`` per product."""
    price = clean_price(quotes.quoted_price_shared())              # [S, P]
    budget = clean_price(quotes.budget)                           # [C, P]
    queries = clean_nonneg(quotes.queries, QUERY_MAX)
    mu = f32(prm["temperature"])
    beta = f32(prm["price_sensitivity"])
    u = clip_utility((f32(quotes.quality) - beta * price) / mu)   # [S, P]
    log_outside = f32(prm["outside_quality"]) / mu
    m = jnp.min(price, axis=0)                                    # [P]
    shown = price == m[None, :]                                   # [S, P]
    if dynamic:   # of the tied sellers, those whose last price was the lowest of theirs
        before = jnp.where(shown, clean_price(quotes.previous), jnp.inf)
        shown = shown & (before == jnp.min(before, axis=0, keepdims=True))
    tied = jnp.sum(shown, axis=0).astype(price.dtype)             # [P] >= 1
    # a seller facing the consumer alone: exp(u) / (exp(u) + exp(a_0 / mu)), or 1
    alone = jnp.where(outside, jax.nn.sigmoid(u - log_outside), 1.0)
    buy = jnp.where(shown, alone / tied[None, :], 0.0)            # [S, P] E[share]
    served = budget >= m[None, :]                                 # [C, P]
    sent = jnp.where(withhold & ~outside & ~served, 0.0, queries)
    reach = jnp.sum(jnp.where(served, sent, 0.0), axis=0)         # [P]
    traffic = buy * reach[None, :]
    bought = jnp.where(served, sent * jnp.sum(buy, axis=0)[None, :], 0.0)   # [C, P]
    fees = money(traffic * m[None, :])
    spend = money(bought * m[None, :])
    return Allocation(traffic=traffic, fees=fees, unserved=sent - bought, spend=spend,
                      sent=sent)


LOGIT = DISTRIBUTORS.register(DistributorDef(kind="logit", allocate=allocate, params=PARAMS,
                                             options=OPTIONS, dense=False,
                                             deterministic=shock_deterministic,
                                             check=check_shock,
                                             check_when=("shock_values", "shock_probs"),
                                             outcomes=shock_outcomes,
                                             lagged=lambda o: o["steering"]
                                             == "lowest_price_dynamic"))
