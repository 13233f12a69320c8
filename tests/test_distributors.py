"""Hand-computed cases for every distributor, the legacy rule, ground truths, and the
check that the non-dense kinds never build a consumer x seller array."""

from __future__ import annotations

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

from jaxmarket.config.fields import check_value
from jaxmarket.market.distributors import DISTRIBUTORS, Allocation, Quotes

KEY = jax.random.PRNGKey(0)


def enable_x64():
    """Context manager enabling float64 (``jax.experimental.enable_x64`` moved to
    ``jax.enable_x64(True)`` in recent JAX)."""
    try:
        from jax.experimental import enable_x64 as legacy
        return legacy()
    except ImportError:
        return jax.enable_x64(True)
S_GOLD = (math.sqrt(5.0) - 1.0) / 2.0
DOCS = Path(__file__).resolve().parents[1] / "docs" / "distributors.md"


# --------------------------------------------------------------------------- helpers

def make_quotes(price, budget, queries, *, is_multiplier=None, base_price=None, quality=0.0,
                reliability=1.0, latency=0.0, freshness=0.0, stake=1.0, dtype=np.float32):
    """Quotes from [S, P] prices and [C, P] budgets/queries; scalars broadcast; the seller
    attributes default to quality 0, reliability 1, latency 0, freshness 0, stake 1.
    numpy arrays (no per-op dispatch), or jax arrays when ``price`` is traced."""
    xp = jnp if isinstance(price, jax.Array) else np
    price = xp.asarray(price, dtype)
    budget = np.asarray(budget, dtype)
    S, P = price.shape
    C = budget.shape[0]

    def seller(x):
        return np.broadcast_to(np.asarray(x, dtype), (S, P))

    def consumer(x):
        return np.broadcast_to(np.asarray(x, dtype), (C, P))

    mult = np.zeros((S,), bool) if is_multiplier is None else np.asarray(is_multiplier, bool)
    return Quotes(price=price, is_multiplier=mult, budget=budget, queries=consumer(queries),
                  base_price=consumer(1.0 if base_price is None else base_price),
                  quality=seller(quality), reliability=seller(reliability),
                  latency=seller(latency), freshness=seller(freshness), stake=seller(stake))


def run(kind, quotes, key=KEY, **settings) -> Allocation:
    """Call ``kind``'s allocate (jitted inside) with its defaults overridden by
    ``settings``."""
    d = DISTRIBUTORS[kind]
    params = {}
    for n, f in d.params.items():
        v = settings.pop(n, f.default)
        params[n] = v if isinstance(v, jax.Array) else np.asarray(v, quotes.price.dtype)
    options = {n: settings.pop(n, f.default) for n, f in d.options.items()}
    assert not settings, f"unknown settings {settings}"
    return d.allocate(key, quotes, params, options)


def close(actual, expected, rtol=2e-6, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=rtol, atol=atol)


def conserved(a: Allocation, rtol=1e-5):
    lhs = np.asarray(a.traffic, np.float64).sum(0) + np.asarray(a.unserved, np.float64).sum(0)
    close(lhs, np.asarray(a.sent, np.float64).sum(0), rtol=rtol, atol=1e-6)


# --------------------------------------------------------------------------- registry

def test_registry_has_every_kind_with_valid_defaults():
    expected = {"logit": False, "proportional": False, "cheapest": False, "first_price": False,
                "second_price": False, "isa_2022": True, "isa_greedy": True}
    assert {k: DISTRIBUTORS[k].dense for k in expected} == expected
    for kind in expected:
        d = DISTRIBUTORS[kind]
        assert d.kind == kind and (d.allocate.__doc__ or "").strip()
        for name, field in {**d.params, **d.options}.items():
            assert check_value(field, field.default, f"{kind}.{name}") == field.default


# --------------------------------------------------------------------------- logit

def test_logit_hand_case_with_outside_option():
    # sellers: quality (1, 2), prices (1, 2); mu = 0.5, beta = 1, a0 = 0.3
    # consumer 0: budget 1.5 (only seller 0 eligible), 4 queries
    # consumer 1: budget 3 (both), 6 queries
    q = make_quotes([[1.0], [2.0]], [[1.5], [3.0]], [[4.0], [6.0]], quality=[[1.0], [2.0]])
    a = run("logit", q, temperature=0.5, price_sensitivity=1.0, outside_quality=0.3)
    e0, e1, eo = math.exp((1 - 1) / 0.5), math.exp((2 - 2) / 0.5), math.exp(0.3 / 0.5)
    d0, d1 = e0 + eo, e0 + e1 + eo
    close(a.traffic[:, 0], [4 * e0 / d0 + 6 * e0 / d1, 6 * e1 / d1])
    close(a.unserved[:, 0], [4 * eo / d0, 6 * eo / d1])
    close(a.spend[:, 0], [4 * e0 / d0 * 1.0, 6 * (e0 * 1.0 + e1 * 2.0) / d1])
    close(a.fees[:, 0], [(4 * e0 / d0 + 6 * e0 / d1) * 1.0, 6 * e1 / d1 * 2.0])
    close(a.sent, [[4.0], [6.0]])
    conserved(a)


def _logit_reference(price, budget, queries, quality, mu, beta, a0, outside, withhold):
    """Naive dense float64 logit (C x S per product)."""
    S, P = price.shape
    C = budget.shape[0]
    traffic, fees = np.zeros((S, P)), np.zeros((S, P))
    unserved, spend, sent = np.zeros((C, P)), np.zeros((C, P)), np.zeros((C, P))
    for p in range(P):
        u = (quality[:, p] - beta * price[:, p]) / mu
        for c in range(C):
            elig = price[:, p] <= budget[c, p]
            if not elig.any() and not outside:
                sent[c, p] = 0.0 if withhold else queries[c, p]
                unserved[c, p] = sent[c, p]
                continue
            sent[c, p] = queries[c, p]
            weights = np.where(elig, np.exp(u), 0.0)
            denom = weights.sum() + (math.exp(a0 / mu) if outside else 0.0)
            share = weights / denom
            traffic[:, p] += queries[c, p] * share
            fees[:, p] += queries[c, p] * share * price[:, p]
            spend[c, p] = queries[c, p] * (share * price[:, p]).sum()
            unserved[c, p] = queries[c, p] * (1.0 - share.sum())
    return traffic, fees, unserved, spend, sent


@pytest.mark.parametrize("outside,withhold", [(True, False), (False, False), (False, True)])
def test_logit_matches_dense_reference(outside, withhold):
    rng = np.random.default_rng(1)
    S, C, P = 7, 5, 2
    price = rng.uniform(0.0, 3.0, (S, P))
    price[2, 0] = price[4, 0]                      # an exact tie
    budget = rng.uniform(0.0, 3.0, (C, P))
    budget[0, 1] = 0.01                            # nobody eligible
    budget[1, 0] = price[4, 0]                     # budget exactly at a price: eligible
    queries = rng.uniform(0.5, 5.0, (C, P))
    quality = rng.uniform(0.0, 2.0, (S, P))
    mu, beta, a0 = 0.4, 1.3, 0.7
    price, budget, queries, quality = (x.astype(np.float32).astype(np.float64)
                                       for x in (price, budget, queries, quality))
    ref = _logit_reference(price, budget, queries, quality, mu, beta, a0, outside, withhold)
    a = run("logit", make_quotes(price, budget, queries, quality=quality), temperature=mu,
            price_sensitivity=beta, outside_quality=a0, outside_option=outside,
            no_eligible="withhold" if withhold else "unserved")
    for got, want in zip((a.traffic, a.fees, a.unserved, a.spend, a.sent), ref):
        close(got, want, rtol=2e-5, atol=2e-6)
    conserved(a)


def test_logit_legacy_rule():
    # legacy: share ~ exp(+price) among sellers priced <= budget; no eligible: send nothing
    legacy = {"price_sensitivity": -1.0, "temperature": 1.0, "outside_option": False,
              "no_eligible": "withhold"}
    q = make_quotes([[0.2], [0.4], [0.9]], [[0.5], [0.1]], [[10.0], [5.0]])
    a = run("logit", q, **legacy)
    w0, w1 = math.exp(0.2), math.exp(0.4)
    close(a.traffic[:, 0], [10 * w0 / (w0 + w1), 10 * w1 / (w0 + w1), 0.0])
    close(a.fees[:, 0], [10 * w0 / (w0 + w1) * 0.2, 10 * w1 / (w0 + w1) * 0.4, 0.0])
    close(a.spend[:, 0], [10 * (0.2 * w0 + 0.4 * w1) / (w0 + w1), 0.0])
    close(a.sent[:, 0], [10.0, 0.0])               # consumer 1 (budget 0.1) sends nothing
    close(a.unserved[:, 0], [0.0, 0.0])
    # the legacy default market: one seller, budget 0.5 -> revenue p for p <= 0.5, else 0
    for p, revenue in [(0.3, 0.3), (0.5, 0.5), (0.51, 0.0)]:
        one = run("logit", make_quotes([[p]], [[0.5]], [[1.0]]), **legacy)
        close(one.fees[0, 0], revenue)
        close(one.sent[0, 0], 1.0 if p <= 0.5 else 0.0)


def test_logit_without_outside_no_eligible_rules():
    q = make_quotes([[1.0], [2.0]], [[0.5], [2.0]], [[3.0], [4.0]])
    unserved = run("logit", q, outside_option=False, no_eligible="unserved")
    close(unserved.sent[:, 0], [3.0, 4.0])
    close(unserved.unserved[:, 0], [3.0, 0.0])
    close(unserved.traffic.sum(), 4.0)
    withheld = run("logit", q, outside_option=False, no_eligible="withhold")
    close(withheld.sent[:, 0], [0.0, 4.0])
    close(withheld.unserved[:, 0], [0.0, 0.0])
    close(withheld.traffic, unserved.traffic)
    # with the outside option on, the outside option absorbs consumer 0's queries
    outside = run("logit", q, outside_option=True, no_eligible="withhold")
    close(outside.sent[:, 0], [3.0, 4.0])
    e = [math.exp(-1.0), math.exp(-2.0), 1.0]
    close(outside.unserved[:, 0], [3.0, 4.0 * e[2] / sum(e)])


def test_logit_multiplier_sellers_quote_multiple_of_base():
    # base price 0.5: multipliers 2 and 3 quote 1.0 and 1.5; seller 1 posts 0.8
    q = make_quotes([[2.0], [0.8], [3.0]], [[1.2], [2.0]], [[1.0], [2.0]],
                    is_multiplier=[True, False, True], base_price=0.5)
    a = run("logit", q, temperature=0.5)
    prices = [1.0, 0.8, 1.5]
    e = [math.exp(-p / 0.5) for p in prices]
    d0 = e[0] + e[1] + 1.0                     # consumer 0 (budget 1.2): sellers 0, 1
    d1 = sum(e) + 1.0                          # consumer 1 (budget 2): all three
    traffic = [1.0 * e[0] / d0 + 2.0 * e[0] / d1, 1.0 * e[1] / d0 + 2.0 * e[1] / d1,
               2.0 * e[2] / d1]
    close(a.traffic[:, 0], traffic)
    close(a.fees[:, 0], [t * p for t, p in zip(traffic, prices)])


def test_logit_vmaps_over_params():
    q = make_quotes([[1.0], [2.0]], [[3.0]], [[1.0]])
    d = DISTRIBUTORS["logit"]
    temps = jnp.asarray([0.5, 1.0, 2.0])
    batched = jax.vmap(lambda t: d.allocate(KEY, q, {"temperature": t,
                                                     "price_sensitivity": jnp.float32(1.0),
                                                     "outside_quality": jnp.float32(0.0)},
                                            {"outside_option": True,
                                             "no_eligible": "unserved"}).traffic)(temps)
    for i, t in enumerate([0.5, 1.0, 2.0]):
        e = [math.exp(-1 / t), math.exp(-2 / t), 1.0]
        close(batched[i, :, 0], [e[0] / sum(e), e[1] / sum(e)])


def test_logit_extreme_values_stay_finite_and_conserve():
    price = [[0.0, 1e30], [1e-30, 1.0], [1e30, 1e-3]]
    budget = [[1e30, 0.0], [1e-30, 1e30], [0.5, 1e-30]]
    queries = [[1e30, 1e-30], [0.0, 1e30], [1e-30, 1.0]]
    for settings in [{"temperature": 1e-3}, {"temperature": 1.0, "price_sensitivity": -1.0},
                     {"temperature": 1e3, "outside_option": False, "no_eligible": "withhold"}]:
        a = run("logit", make_quotes(price, budget, queries), **settings)
        for x in (a.traffic, a.fees, a.unserved, a.spend, a.sent):
            assert np.all(np.isfinite(np.asarray(x))) and np.all(np.asarray(x) >= 0)
        conserved(a)


# --------------------------------------------------------------------------- proportional

def test_proportional_hand_case():
    # prices 1, 2, 4; exponent 1; budget 3 -> sellers 0, 1 with weights 1, 1/2
    # consumer 1 budget 0.5: nobody eligible
    q = make_quotes([[1.0], [2.0], [4.0]], [[3.0], [0.5]], [[6.0], [2.0]])
    a = run("proportional", q)
    close(a.traffic[:, 0], [4.0, 2.0, 0.0])
    close(a.fees[:, 0], [4.0, 4.0, 0.0])
    close(a.spend[:, 0], [8.0, 0.0])
    close(a.unserved[:, 0], [0.0, 2.0])
    b = run("proportional", q, exponent=2.0, no_eligible="withhold")   # weights 1, 1/4
    close(b.traffic[:, 0], [6.0 * 0.8, 6.0 * 0.2, 0.0])
    close(b.sent[:, 0], [6.0, 0.0])
    close(b.unserved[:, 0], [0.0, 0.0])


# --------------------------------------------------------------------------- cheapest

def test_cheapest_hand_case():
    # product 0: prices 1, 1, 2 -> sellers 0 and 1 tie at the minimum
    # product 1: prices 3, 0.5, 0.7 -> seller 1 alone
    q = make_quotes([[1.0, 3.0], [1.0, 0.5], [2.0, 0.7]], [[0.5, 1.0], [1.5, 0.4]],
                    [[3.0, 1.0], [4.0, 2.0]])
    a = run("cheapest", q)
    close(a.traffic, [[2.0, 0.0], [2.0, 1.0], [0.0, 0.0]])
    close(a.fees, [[2.0, 0.0], [2.0, 0.5], [0.0, 0.0]])
    close(a.spend, [[0.0, 0.5], [4.0, 0.0]])
    close(a.unserved, [[3.0, 0.0], [0.0, 2.0]])
    close(a.sent, [[3.0, 1.0], [4.0, 2.0]])
    b = run("cheapest", q, no_eligible="withhold")
    close(b.sent, [[0.0, 1.0], [4.0, 0.0]])
    close(b.unserved, np.zeros((2, 2)))
    close(b.traffic, a.traffic)


# --------------------------------------------------------------------------- auctions

def test_auctions_hand_cases():
    q = make_quotes([[0.9], [0.6], [0.3]], [[0.0], [0.0]], [[1.0], [2.0]])  # budgets unused
    fp = run("first_price", q)
    close(fp.traffic[:, 0], [3.0, 0.0, 0.0])
    close(fp.fees[:, 0], [2.7, 0.0, 0.0])
    close(fp.spend[:, 0], [0.9, 1.8])
    sp = run("second_price", q)
    close(sp.traffic[:, 0], [3.0, 0.0, 0.0])
    close(sp.fees[:, 0], [1.8, 0.0, 0.0])
    close(sp.spend[:, 0], [0.6, 1.2])
    close(run("second_price", q, reserve=0.7).fees[:, 0], [2.1, 0.0, 0.0])  # reserve binds
    close(run("first_price", q, reserve=0.7).fees[:, 0], [2.7, 0.0, 0.0])
    none = run("second_price", q, reserve=0.95)                             # nobody eligible
    close(none.traffic, np.zeros((3, 1)))
    close(none.unserved[:, 0], [1.0, 2.0])
    close(none.spend, np.zeros((2, 1)))
    # only one eligible bid: the second price is the reserve
    close(run("second_price", make_quotes([[0.9], [0.3], [0.1]], [[0.0]], [[1.0]]),
              reserve=0.5).fees[:, 0], [0.5, 0.0, 0.0])
    # a tie at the top splits the queries; the second price is the tied bid
    tie = make_quotes([[0.9], [0.9], [0.3]], [[0.0], [0.0]], [[1.0], [2.0]])
    for kind in ("first_price", "second_price"):
        a = run(kind, tie)
        close(a.traffic[:, 0], [1.5, 1.5, 0.0])
        close(a.fees[:, 0], [1.35, 1.35, 0.0])
        conserved(a)


@pytest.mark.parametrize("kind", ["first_price", "second_price"])
def test_revenue_equivalence(kind):
    # n = 3 bidders, values U[0, 1]; second price bids = value, first price bids 2/3 value
    # (the symmetric equilibrium (n-1)/n v); expected revenue (n-1)/(n+1) = 1/2 for both
    n, draws = 3, 20000
    values = jax.random.uniform(jax.random.PRNGKey(7), (draws, n))
    bids = values * ((n - 1) / n if kind == "first_price" else 1.0)

    def revenue(b):
        return run(kind, make_quotes(b[:, None], [[0.0]], [[1.0]])).fees.sum()

    rev = np.asarray(jax.jit(jax.vmap(revenue))(bids), np.float64)
    # sanity: per draw, second price = second-highest value, first price = 2/3 max
    v = np.sort(np.asarray(values, np.float64), axis=1)
    close(rev, v[:, -2] if kind == "second_price" else v[:, -1] * 2 / 3, rtol=1e-5)
    se = rev.std() / math.sqrt(draws)
    assert abs(rev.mean() - (n - 1) / (n + 1)) < 4 * se, (rev.mean(), se)


# --------------------------------------------------------------------------- isa_2022

def _u(x):
    return 1.0 / (x + S_GOLD) - S_GOLD


def test_isa_price_efficiency_endpoints():
    assert abs(_u(0.0) - 1.0) < 1e-12 and abs(_u(1.0)) < 1e-12


# All isa tests use S=3 sellers, C=2 consumers, P=1 product (one compilation per mode).

def test_isa_2022_expected_hand_case():
    # consumer 0: budget 1, 8 queries. seller 0: fee 0 (u = 1), stake 1;
    # seller 1: fee 0.5, reliability 0.8, stake 3; seller 2: fee 2 > budget (excluded).
    # consumer 1: budget 0, 3 queries: only the free seller 0 is eligible
    q = make_quotes([[0.0], [0.5], [2.0]], [[1.0], [0.0]], [[8.0], [3.0]],
                    reliability=[[1.0], [0.8], [1.0]], stake=[[1.0], [3.0], [5.0]])
    a = run("isa_2022", q, mode="expected", weight=0.5, stake_scale=1.0)
    v0 = 1.0 * 1.0 * (1 / 2)                       # u(0)^0.5 * rel * stake term
    v1 = math.sqrt(_u(0.5)) * 0.8 * (3 / 4)
    assert v1 < v0                                 # seller 0 is the top
    f1 = 1 - (1 - v1 / v0) ** (1 / 1.1)            # P(cutoff <= v1): both are candidates
    share0 = (1 - f1) + f1 * 1 / 4                 # stake-weighted pick among {0, 1}
    share1 = f1 * 3 / 4
    # consumer 1: seller 0 alone (u(0) = 1) -> all 3 queries to it
    close(a.traffic[:, 0], [8 * share0 + 3.0, 8 * share1, 0.0], rtol=1e-5)
    close(a.fees[:, 0], [0.0, 8 * share1 * 0.5, 0.0], rtol=1e-5)
    close(a.spend[:, 0], [8 * share1 * 0.5, 0.0], rtol=1e-5)
    close(a.unserved, [[0.0], [0.0]])
    close(a.sent, [[8.0], [3.0]])


def test_isa_2022_sampled_hand_case_and_exclusions():
    # only seller 1 is affordable to consumer 0: all its queries go to it whatever the draw;
    # consumer 1 (budget 0.2) can afford nobody
    q = make_quotes([[2.0], [0.5], [1.5]], [[1.0], [0.2]], [[4.0], [3.0]])
    for seed in range(3):
        a = run("isa_2022", q, key=jax.random.PRNGKey(seed))
        close(a.traffic[:, 0], [0.0, 4.0, 0.0])
        close(a.fees[:, 0], [0.0, 2.0, 0.0])
        close(a.unserved[:, 0], [0.0, 3.0])
        close(a.spend[:, 0], [2.0, 0.0])
    # utility 0 (reliability 0; fee = budget) is never picked
    z = make_quotes([[0.1], [1.0], [5.0]], [[1.0], [1.0]], [[2.0], [1.0]],
                    reliability=[[0.0], [1.0], [1.0]])
    for mode in ("sampled", "expected"):
        a = run("isa_2022", z, mode=mode)
        close(a.traffic[:, 0], [0.0, 0.0, 0.0])
        close(a.unserved, [[2.0], [1.0]])


def test_isa_2022_sampled_mean_matches_expected():
    q = make_quotes([[0.1], [0.4], [0.2]], [[1.0], [0.6]], [[1.0], [2.0]],
                    reliability=[[0.9], [1.0], [0.6]], latency=[[0.1], [0.3], [0.0]],
                    stake=[[100.0], [50.0], [200.0]], freshness=[[0.0], [2.0], [5.0]])
    expected = np.asarray(run("isa_2022", q, mode="expected").traffic, np.float64)
    n = 4000
    # any PRNG implementation works; "rbg" keys compile much faster under vmap on CPU
    keys = jax.random.split(jax.random.key(3, impl="rbg"), n)
    samples = jax.jit(jax.vmap(lambda k: run("isa_2022", q, key=k).traffic))(keys)
    samples = np.asarray(samples, np.float64)
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(n)
    assert np.all(np.abs(mean - expected) <= 4 * se + 1e-3), (mean, expected, se)
    # the expectation is not trivially flat: every seller gets a real share
    assert np.all(expected > 0.05)
    close(expected.sum(), 3.0, rtol=1e-5)


def _optimal_rate(w: float) -> float:
    """argmax_x x u(x)^w: d/dx log = 1/x - w/((x+s)^2 u) = 0 -> s y^2 + (w-1) y - w s = 0
    with y = x + s."""
    y = ((1 - w) + math.sqrt((1 - w) ** 2 + 4 * S_GOLD ** 2 * w)) / (2 * S_GOLD)
    return y - S_GOLD


REVENUE_BUDGET = 2.0


def _subject_revenue(fee, w):
    """Expected-mode fees of seller 0 (reliability 1e-3, quoting ``fee``) next to a
    competitor of utility 1 (fee 0); seller 2 is priced out."""
    q = make_quotes(jnp.stack([fee, jnp.zeros_like(fee), jnp.full_like(fee, 1e3)])[:, None],
                    [[REVENUE_BUDGET], [REVENUE_BUDGET]], [[1.0], [0.0]],
                    reliability=[[1e-3], [1.0], [1.0]], dtype=fee.dtype)
    return run("isa_2022", q, mode="expected", weight=w).fees[0, 0]


_revenue_curve = jax.jit(jax.vmap(_subject_revenue, in_axes=(0, None)))


@pytest.mark.parametrize("w", [0.5, 1.0])
def test_isa_2022_revenue_peak_ground_truth(w):
    from scipy.optimize import minimize_scalar

    x_star = _optimal_rate(w)
    numeric = minimize_scalar(lambda x: -x * _u(x) ** w, bounds=(0.0, 1.0), method="bounded",
                              options={"xatol": 1e-10}).x
    assert abs(numeric - x_star) < 1e-6
    if w == 1.0:
        assert abs(x_star - (1 - S_GOLD)) < 1e-12
    budget = REVENUE_BUDGET
    # The derivation assumes a seller's queries are proportional to its utility. Under the
    # cutoff rule that holds for a seller whose utility v is small next to the best
    # competitor's M: P(picked) = F(v) stake share, F(v) = 1 - (1 - v/M)^(1/1.1) ~ v/(1.1 M).
    fees = np.linspace(0.0, budget, 4001)
    with enable_x64():
        curve = np.asarray(_revenue_curve(jnp.asarray(fees, jnp.float64),
                                          jnp.asarray(w, jnp.float64)))
    peak = fees[int(np.argmax(curve))] / budget
    assert abs(peak - x_star) <= 2 * (fees[1] - fees[0]) / budget, (peak, x_star)
    assert curve[0] == 0.0 and curve[-1] < 1e-9 * curve.max()


def test_isa_2022_lone_seller_revenue_rises_to_the_budget():
    # A seller without a competitor is always the best candidate, so the cutoff rule gives
    # it every query up to the budget: its revenue is the fee itself (not fee * u^w).
    for fee in (0.2, 0.9, 0.99):
        q = make_quotes([[fee], [5.0], [5.0]], [[1.0], [1.0]], [[1.0], [0.0]])
        close(run("isa_2022", q, mode="expected").fees[:, 0], [fee, 0.0, 0.0], rtol=1e-6)


def test_isa_2022_is_dense_and_handles_per_consumer_base_prices():
    # multipliers against different base prices: seller 0 quotes 2 x base
    q = make_quotes([[2.0], [0.9], [5.0]], [[1.0], [1.0]], [[1.0], [1.0]],
                    is_multiplier=[True, False, False], base_price=[[0.3], [0.6]])
    a = run("isa_2022", q, mode="expected")
    # consumer 0: seller 0 quotes 0.6 (eligible), consumer 1: 1.2 > budget (excluded),
    # so seller 0's traffic comes from consumer 0 alone and is a strict fraction of 1
    assert 0.0 < float(a.traffic[0, 0]) < 1.0
    close(a.traffic.sum(), 2.0)
    assert float(a.traffic[2, 0]) == 0.0


# --------------------------------------------------------------------------- isa_greedy

def test_isa_greedy_hand_case():
    # stake 3 / (3 + stake_scale 1) = 0.75 for everyone; budget 1, 10 queries
    price = [[0.5], [2.0], [0.1], [0.2]]
    q = make_quotes(price, [[1.0]], [[10.0]], reliability=[[0.9], [1.0], [0.5], [0.0]],
                    latency=[[0.5], [0.0], [0.0], [0.0]], stake=3.0)
    score = [0.9 ** 7 / 1.5 * 0.75, 0.75, 0.5 ** 7 * 0.75, 0.0]
    # fees clamped to the budget: 0.5, 1 (seller 1 quotes 2), 0.1, 0.2
    # score / max(fee, 0.01): 0.2391/0.5 = 0.478, 0.75/1 = 0.75, 0.00586/0.1 = 0.0586, skip
    a = run("isa_greedy", q, stake_scale=1.0, latency_scale=1.0, max_sellers=2)
    t1 = 10 * score[1]                              # seller 1 first
    t0 = 10 * (1 - score[1]) * score[0]             # then seller 0
    close(a.traffic[:, 0], [t0, t1, 0.0, 0.0])
    close(a.unserved[:, 0], [10 * (1 - score[1]) * (1 - score[0])])
    close(a.fees[:, 0], [0.5 * t0, 1.0 * t1, 0.0, 0.0])
    close(a.spend[:, 0], [0.5 * t0 + t1])
    b = run("isa_greedy", q, stake_scale=1.0, latency_scale=1.0, max_sellers=3)
    t2 = 10 * (1 - score[1]) * (1 - score[0]) * score[2]
    close(b.traffic[:, 0], [t0, t1, t2, 0.0])
    close(b.fees[2, 0], 0.1 * t2)
    conserved(b)
    # a floor of 1 on the price ratio makes price irrelevant: order by score alone, so the
    # reliable but dear seller 1 goes first, then the cheap seller 0
    c = run("isa_greedy", make_quotes([[0.01], [0.9], [0.1], [0.1]], [[1.0]], [[1.0]],
                                      reliability=[[0.95], [1.0], [0.0], [0.0]], stake=3.0),
            stake_scale=1.0, max_sellers=2, min_price_ratio=1.0)
    s0, s1 = 0.95 ** 7 * 0.75, 0.75
    close(c.traffic[:, 0], [(1 - s1) * s0, s1, 0.0, 0.0])


# --------------------------------------------------------------------------- no dense arrays

def _all_shapes(jaxpr):
    def visit_vars(vs):
        for v in vs:
            aval = getattr(v, "aval", None)
            if aval is not None and hasattr(aval, "shape"):
                yield tuple(aval.shape)

    def walk(j):
        if isinstance(j, ClosedJaxpr):
            j = j.jaxpr
        yield from visit_vars(j.invars)
        yield from visit_vars(j.outvars)
        yield from visit_vars(j.constvars)
        for eqn in j.eqns:
            yield from visit_vars(eqn.invars)
            yield from visit_vars(eqn.outvars)
            for p in eqn.params.values():
                yield from sub(p)

    def sub(p):
        if isinstance(p, (ClosedJaxpr, Jaxpr)):
            yield from walk(p)
        elif isinstance(p, (tuple, list)):
            for x in p:
                yield from sub(x)

    return list(walk(jaxpr))


def _jaxpr_of(kind, C=37, S=41, P=3):
    rng = np.random.default_rng(0)
    q = make_quotes(rng.uniform(0, 2, (S, P)), rng.uniform(0, 2, (C, P)), 1.0)
    d = DISTRIBUTORS[kind]
    params = {n: jnp.float32(f.default) for n, f in d.params.items()}
    options = {n: f.default for n, f in d.options.items()}
    return jax.make_jaxpr(lambda qq, pp: d.allocate(KEY, qq, pp, options))(q, params)


@pytest.mark.parametrize("kind", ["logit", "proportional", "cheapest", "first_price",
                                  "second_price"])
def test_no_consumer_by_seller_array(kind):
    assert not DISTRIBUTORS[kind].dense
    shapes = _all_shapes(_jaxpr_of(kind))
    assert len(shapes) > 20
    bad = [s for s in shapes if 37 in s and 41 in s]
    assert not bad, f"{kind} materialises {bad}"


@pytest.mark.parametrize("outside, withhold", [(True, False), (False, False), (False, True)])
def test_small_market_mask_path_equals_sorted_kernel(outside, withhold, monkeypatch):
    """Markets with C * S <= DENSE_MAX_PAIRS use the [C, S] mask; it must give the same
    allocation as the sorted prefix kernel (forced by setting the limit to 0)."""
    from jaxmarket.market.distributors import prefix_softmax as ps
    rng = np.random.default_rng(3)
    C, S, P = 6, 9, 4
    price = rng.choice([0.0, 0.5, 1.0, 1.5, 2.5], (S, P)).astype(np.float32)
    budget = rng.choice([0.0, 0.5, 1.2, 2.0, 3.0], (C, P)).astype(np.float32)
    u = rng.normal(0, 3, (S, P)).astype(np.float32)
    queries = rng.uniform(0, 5, (C, P)).astype(np.float32)
    args = (u, price, budget, queries, 0.3 if outside else None, withhold)
    assert C * S <= ps.DENSE_MAX_PAIRS
    small = ps.prefix_softmax(*args)
    shapes = _all_shapes(jax.make_jaxpr(lambda: ps.prefix_softmax(*args))())
    assert any(C in s and S in s for s in shapes)           # the mask path ran
    monkeypatch.setattr(ps, "DENSE_MAX_PAIRS", 0)
    ps._prefix_softmax.clear_cache()
    try:
        big = ps.prefix_softmax(*args)
        shapes = _all_shapes(jax.make_jaxpr(lambda: ps.prefix_softmax(*args))())
        assert not any(C in s and S in s for s in shapes)   # the sorted kernel ran
    finally:
        ps._prefix_softmax.clear_cache()
    for a, b in zip(jax.tree.leaves(small), jax.tree.leaves(big)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _softmax_reference(u, price, budget, queries, log_outside):
    """float64 numpy: share_cs = [p_s <= b_c] exp(u_s) / (sum_eligible exp(u_j) + exp(o))."""
    u, price, budget, queries = (np.asarray(x, np.float64) for x in (u, price, budget, queries))
    elig = price[None] <= budget[:, None]                                   # [C, S, P]
    shift = np.max(np.where(elig, u[None], -np.inf), axis=1)               # [C, P]
    shift = np.maximum(shift, log_outside)
    w = np.where(elig, np.exp(np.minimum(u[None] - shift[:, None], 0.0)), 0.0)
    denom = w.sum(1) + np.exp(log_outside - shift)
    traffic = np.einsum("csp,cp->sp", w, queries / denom)
    unserved = queries * np.exp(log_outside - shift) / denom
    return traffic, unserved


def test_fast_mask_kernel_one_shift_per_product_matches_reference():
    """The small-market kernel takes one shift per product (exp per seller, not per
    consumer x seller); on ordinary markets it gives the reference shares, and the
    guard that would send a market to the per-consumer shift stays off."""
    from jaxmarket.market.distributors import prefix_softmax as ps
    rng = np.random.default_rng(7)
    B, C, S, P = 5, 4, 6, 3
    u = rng.normal(0, 3, (B, S, P)).astype(np.float32)
    price = rng.uniform(0, 3, (B, S, P)).astype(np.float32)
    budget = rng.uniform(0.5, 3, (B, C, P)).astype(np.float32)
    queries = rng.uniform(0, 5, (B, C, P)).astype(np.float32)
    lo = np.float32(0.4)
    _, ok = ps._dense_fast(u, price, budget, queries, np.full((B, P), lo), True, False)
    assert bool(ok)
    out = jax.vmap(lambda *a: ps.prefix_softmax(*a, log_outside=lo))(u, price, budget, queries)
    for b in range(B):
        traffic, unserved = _softmax_reference(u[b], price[b], budget[b], queries[b], lo)
        np.testing.assert_allclose(out.traffic[b], traffic, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(out.unserved[b], unserved, rtol=2e-5, atol=1e-6)


def test_fast_mask_kernel_falls_back_when_a_consumer_would_underflow():
    """Consumer 0 can afford only sellers whose utilities are 200 below the product's
    best: one shift per product underflows its weights to 0. That market sends the whole
    batch to the per-consumer shift (vmapped, nested too), so every market -- the
    ill-conditioned one and an ordinary one beside it -- gets the reference shares."""
    from jaxmarket.market.distributors import prefix_softmax as ps
    price = np.array([[1.0], [1.0], [3.0]], np.float32)         # seller 2 is dear but best
    u_bad = np.array([[-200.0], [-201.0], [0.0]], np.float32)
    u_good = np.array([[-1.0], [-2.0], [0.0]], np.float32)
    budget = np.array([[1.5], [4.0]], np.float32)                # consumer 0 can't afford 2
    queries = np.array([[2.0], [3.0]], np.float32)
    lo = np.float32(-250.0)
    fast, ok = ps._dense_fast(u_bad, price, budget, queries, np.full((1,), lo), True, False)
    assert not bool(ok)
    assert float(fast[0][0, 0]) == 0.0        # the underflow the guard exists for
    u = np.stack([u_good, u_bad])
    args = (u, np.stack([price] * 2), np.stack([budget] * 2), np.stack([queries] * 2))
    flat = jax.vmap(lambda *a: ps.prefix_softmax(*a, log_outside=lo))(*args)
    nested = jax.vmap(jax.vmap(lambda *a: ps.prefix_softmax(*a, log_outside=lo)))(
        *(np.stack([x] * 3) for x in args))
    for b in range(2):
        traffic, unserved = _softmax_reference(u[b], price, budget, queries, lo)
        # consumer 0 splits its 2 queries e^0 : e^-1 between sellers 0 and 1
        if b == 1:
            np.testing.assert_allclose(traffic[:2, 0], [2 / (1 + math.exp(-1)),
                                                         2 * math.exp(-1) / (1 + math.exp(-1))],
                                       rtol=1e-6)
        np.testing.assert_allclose(flat.traffic[b], traffic, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(flat.unserved[b], unserved, rtol=2e-5, atol=1e-6)
        for k in range(3):
            np.testing.assert_array_equal(nested.traffic[k, b], flat.traffic[b])


def test_small_market_kernel_is_differentiable_and_its_gradient_matches_finite_differences():
    """Revenue's gradient in the prices through the (vmapped) small-market kernel equals
    central finite differences of the same function, in float64."""
    from jaxmarket.market.distributors import prefix_softmax as ps
    with enable_x64():
        rng = np.random.default_rng(11)
        price = jnp.asarray(rng.uniform(0.2, 2.0, (2, 4, 3)))
        budget = jnp.asarray(rng.uniform(0.5, 2.5, (2, 3, 3)))
        queries = jnp.asarray(rng.uniform(1.0, 3.0, (2, 3, 3)))

        def revenue(p):
            out = jax.vmap(lambda pp, b, q: ps.prefix_softmax(1.0 - 2.0 * pp, pp, b, q,
                                                              log_outside=0.0))(
                p, budget, queries)
            return out.fees.sum()

        grad = np.asarray(jax.grad(revenue)(price))
        h = 1e-6
        for idx in [(0, 0, 0), (0, 2, 1), (1, 3, 2), (1, 1, 0)]:
            step = np.zeros(price.shape)
            step[idx] = h
            numeric = (revenue(price + step) - revenue(price - step)) / (2 * h)
            np.testing.assert_allclose(grad[idx], numeric, rtol=1e-5, atol=1e-8)
        assert np.any(grad != 0)


def test_dense_detector_flags_dense_kinds():
    # positive control: the walker does see the [C, S, P] arrays of the dense kinds
    for kind in ("isa_2022", "isa_greedy"):
        assert any(37 in s and 41 in s for s in _all_shapes(_jaxpr_of(kind)))


def test_walker_enters_sub_jaxprs():
    # searchsorted's loop lives in a sub-jaxpr; the walker must see inside it
    def f(x, y):
        return jax.lax.fori_loop(0, 2, lambda i, c: c + jnp.outer(x, y).sum(), 0.0)

    shapes = _all_shapes(jax.make_jaxpr(f)(jnp.ones(7), jnp.ones(11)))
    assert (7, 11) in shapes


# --------------------------------------------------------------------------- docs

def test_docs_examples_run():
    text = DOCS.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    kinds = set(DISTRIBUTORS)
    assert all(f"`{k}`" in text for k in kinds)
    assert len(blocks) >= len(kinds) - 1          # the two auctions share one
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), {})  # noqa: S102  # noqa: S102
