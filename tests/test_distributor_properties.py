"""Hypothesis properties every distributor must satisfy: conservation, finiteness and
nonnegativity at extreme magnitudes, budgets respected, equal treatment of exact ties.

All examples share one shape (S=3 sellers, C=2 consumers, P=2 products) so each kind
compiles once (options are traced or cached)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxmarket.market.distributors import DISTRIBUTORS, Allocation, Quotes

S, C, P = 3, 2, 2
EXTREMES = [0.0, 1e-30, 1e-3, 0.5, 1.0, 3.0, 1e30]

# (kind, options, {param: candidate values}) -- every kind and every option value
CONFIGS = [
    ("logit", {"outside_option": True, "no_eligible": "unserved"},
     {"temperature": [1e-3, 0.25, 1.0, 100.0], "price_sensitivity": [-1.0, 0.0, 1.0, 5.0],
      "outside_quality": [-2.0, 0.0, 3.0]}),
    ("logit", {"outside_option": False, "no_eligible": "unserved"},
     {"temperature": [1e-3, 1.0, 100.0], "price_sensitivity": [-1.0, 1.0, 5.0]}),
    ("logit", {"outside_option": False, "no_eligible": "withhold"},
     {"temperature": [1e-3, 1.0], "price_sensitivity": [-1.0, 1.0]}),
    ("logit", {"outside_option": True, "no_eligible": "withhold"}, {}),
    ("proportional", {"no_eligible": "unserved"}, {"exponent": [0.5, 1.0, 3.0]}),
    ("proportional", {"no_eligible": "withhold"}, {"exponent": [1.0, 20.0]}),
    ("cheapest", {"no_eligible": "unserved"}, {}),
    ("cheapest", {"no_eligible": "withhold"}, {}),
    ("cheapest", {"no_eligible": "unserved", "demand": "linear"}, {}),
    ("cheapest", {"no_eligible": "withhold", "demand": "linear"}, {}),
    ("first_price", {}, {"reserve": [0.0, 0.5, 1e30]}),
    ("second_price", {}, {"reserve": [0.0, 0.5, 1e30]}),
    ("mixed_price", {}, {"a": [1.0, 1.5, 2.0], "reserve": [0.0, 0.5, 1e30]}),
    ("cournot", {}, {"intercept": [0.0, 1.0, 1e30], "slope": [1e-3, 1.0, 1e30]}),
    ("linear", {}, {"intercept": [0.0, 1.0, 1e30], "own_slope": [1e-3, 1.0, 1e30],
                    "cross_slope": [0.0, 0.5, 1e30]}),
    ("isa_2022", {"mode": "sampled"}, {"weight": [0.5, 0.75, 1.0]}),
    ("isa_2022", {"mode": "expected"}, {"weight": [0.5, 1.0], "stake_scale": [1e-3, 100.0]}),
    ("isa_greedy", {"max_sellers": 2},
     {"min_price_ratio": [1e-3, 0.01, 1.0], "latency_scale": [0.1, 1.0]}),
    ("isa_greedy", {"max_sellers": 3}, {}),
]
IDS = [f"{k}-" + "-".join(str(v) for v in o.values()) for k, o, _ in CONFIGS]
# rules that exclude sellers priced above a consumer's budget
BUDGET_EXCLUDING = {"logit", "proportional", "cheapest", "isa_2022"}
# rules that sell what their demand says (queries only split it among consumers)
QUANTITY_LIKE = {"cournot", "linear"}


# (field, candidate values, shape); consumer-side shapes use C, seller-side S
FIELDS = [
    ("price", EXTREMES, (S, P)),
    ("budget", EXTREMES, (C, P)),
    ("queries", EXTREMES, (C, P)),
    ("base_price", EXTREMES, (C, P)),
    ("quality", [-1.0, 0.0, 2.0], (S, P)),
    ("reliability", [0.0, 0.3, 1.0], (S, P)),
    ("latency", [0.0, 0.5, 1e30], (S, P)),
    ("freshness", [0.0, 3.0, 1e30], (S, P)),
    ("stake", [0.0, 1e-30, 1.0, 1e30], (S, P)),
    ("is_multiplier", [False, True], (S,)),
]
N_BYTES = sum(int(np.prod(shape)) for _, _, shape in FIELDS)


@st.composite
def markets(draw, dense: bool):
    """A market with values drawn from EXTREMES (one byte per entry: cheap to draw, still
    shrinks towards the first candidate); base prices are shared across consumers unless
    the rule is dense."""
    raw = np.frombuffer(draw(st.binary(min_size=N_BYTES, max_size=N_BYTES)), np.uint8)
    out, at = {}, 0
    for name, values, shape in FIELDS:
        n = int(np.prod(shape))
        picks = raw[at:at + n] % len(values)
        at += n
        dtype = bool if name == "is_multiplier" else np.float32
        out[name] = np.asarray(values, dtype)[picks].reshape(shape)
    if not dense:
        out["base_price"] = np.broadcast_to(out["base_price"][:1], (C, P)).copy()
    return Quotes(**out)


@st.composite
def cases(draw, index: int):
    kind, options, choices = CONFIGS[index]
    d = DISTRIBUTORS[kind]
    params = {n: np.float32(draw(st.sampled_from(choices[n])) if n in choices else f.default)
              for n, f in d.params.items()}
    key = jax.random.PRNGKey(draw(st.integers(0, 2**16)))
    return kind, options, params, key, draw(markets(d.dense))


def allocate(kind, options, params, key, quotes) -> Allocation:
    return DISTRIBUTORS[kind].allocate(key, quotes, params, options)


def quoted(quotes: Quotes) -> np.ndarray:
    """[C, S, P] quoted prices, in float32 as the market computes them."""
    with np.errstate(over="ignore"):      # 1e30 x 1e30 overflows float32 to inf: above
        mult = np.asarray(quotes.price)[None] * np.asarray(quotes.base_price)[:, None]
    return np.where(np.asarray(quotes.is_multiplier)[None, :, None], mult,
                    np.asarray(quotes.price)[None])


SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=IDS)
@SETTINGS
@given(data=st.data())
def test_conservation_finite_nonnegative(index, data):
    kind, options, params, key, quotes = data.draw(cases(index))
    a = allocate(kind, options, params, key, quotes)
    fields = {f: np.asarray(getattr(a, f), np.float64)
              for f in ("traffic", "fees", "unserved", "spend", "sent")}
    assert fields["traffic"].shape == (S, P) and fields["fees"].shape == (S, P)
    for f in ("unserved", "spend", "sent"):
        assert fields[f].shape == (C, P)
    for name, x in fields.items():
        assert np.all(np.isfinite(x)), (name, x)
        assert np.all(x >= 0), (name, x)
    queries = np.asarray(quotes.queries, np.float64)
    if kind not in QUANTITY_LIKE:
        # a rule sends all of a consumer's queries or none of them
        assert np.all((fields["sent"] == queries) | (fields["sent"] == 0))
    else:
        # a quantity market sells what the sellers supply (linear: what its demand
        # says); queries only split it
        np.testing.assert_allclose(fields["sent"].sum(0), fields["traffic"].sum(0),
                                   rtol=1e-5, atol=1e-30)
    sent = fields["sent"].sum(0)
    lhs = fields["traffic"].sum(0) + fields["unserved"].sum(0)
    np.testing.assert_allclose(lhs, sent, rtol=1e-5, atol=1e-30)
    # nobody serves queries that were not sent, and unserved <= sent per consumer
    assert np.all(fields["unserved"] <= fields["sent"] * (1 + 1e-6))


@pytest.mark.parametrize("index", [i for i, c in enumerate(CONFIGS)
                                   if c[0] in BUDGET_EXCLUDING],
                         ids=[IDS[i] for i, c in enumerate(CONFIGS) if c[0] in BUDGET_EXCLUDING])
@SETTINGS
@given(data=st.data())
def test_no_seller_above_budget_serves(index, data):
    kind, options, params, key, quotes = data.draw(cases(index))
    # one consumer: zero out consumer 1's queries so all traffic comes from consumer 0
    queries = np.asarray(quotes.queries).copy()
    queries[1] = 0.0
    quotes = quotes.replace(queries=queries)
    a = allocate(kind, options, params, key, quotes)
    above = quoted(quotes)[0] > np.asarray(quotes.budget)[0][None, :]       # [S, P]
    assert np.all(np.asarray(a.traffic)[above] == 0.0)
    assert np.all(np.asarray(a.fees)[above] == 0.0)
    # and the consumer never pays more than its budget per query served
    served = np.asarray(a.traffic, np.float64).sum(0)          # all from consumer 0
    budget = np.asarray(quotes.budget, np.float64)[0]
    spend = np.asarray(a.spend, np.float64)[0]
    ok = served > 0
    assert np.all(spend[ok] <= budget[ok] * served[ok] * (1 + 1e-5) + 1e-30)


@SETTINGS
@given(data=st.data())
def test_isa_greedy_pays_at_most_the_budget(data):
    # fees are clamped to the budget: per seller, fees <= (largest budget) x traffic
    index = next(i for i, c in enumerate(CONFIGS) if c[0] == "isa_greedy")
    kind, options, params, key, quotes = data.draw(cases(index))
    a = allocate(kind, options, params, key, quotes)
    top_budget = np.asarray(quotes.budget, np.float64).max(0)[None, :]
    traffic = np.asarray(a.traffic, np.float64)
    assert np.all(np.asarray(a.fees, np.float64)
                  <= np.minimum(top_budget * traffic * (1 + 1e-5), 1e36) + 1e-30)
    sent = np.asarray(a.sent, np.float64)
    assert np.all(np.asarray(a.spend, np.float64)
                  <= np.minimum(np.asarray(quotes.budget, np.float64) * sent * (1 + 1e-5), 1e36)
                  + 1e-30)


def _tie(quotes: Quotes) -> Quotes:
    """Seller 1 becomes an exact copy of seller 0."""
    def copy01(x):
        x = np.asarray(x).copy()
        x[1] = x[0]
        return x

    return quotes.replace(**{f: copy01(getattr(quotes, f))
                             for f in ("price", "is_multiplier", "quality", "reliability",
                                       "latency", "freshness", "stake")})


TIE_SYMMETRIC = [i for i, c in enumerate(CONFIGS)
                 if not (c[0] == "isa_greedy" or c[1].get("mode") == "sampled")]


@pytest.mark.parametrize("index", TIE_SYMMETRIC, ids=[IDS[i] for i in TIE_SYMMETRIC])
@SETTINGS
@given(data=st.data())
def test_exact_ties_get_equal_traffic(index, data):
    kind, options, params, key, quotes = data.draw(cases(index))
    a = allocate(kind, options, params, key, _tie(quotes))
    traffic, fees = np.asarray(a.traffic), np.asarray(a.fees)
    np.testing.assert_allclose(traffic[0], traffic[1], rtol=1e-6, atol=0)
    np.testing.assert_allclose(fees[0], fees[1], rtol=1e-6, atol=0)


@SETTINGS
@given(data=st.data())
def test_isa_greedy_breaks_exact_ties_by_index(data):
    # documented deviation: the greedy order is sequential, ties go to the lower index
    index = next(i for i, c in enumerate(CONFIGS) if c[0] == "isa_greedy")
    kind, options, params, key, quotes = data.draw(cases(index))
    traffic = np.asarray(allocate(kind, options, params, key, _tie(quotes)).traffic)
    assert np.all(traffic[0] >= traffic[1])


@SETTINGS
@given(data=st.data())
def test_second_price_never_raises_more_than_first_price(data):
    i_first = next(i for i, c in enumerate(CONFIGS) if c[0] == "first_price")
    _, _, params, key, quotes = data.draw(cases(i_first))
    first = allocate("first_price", {}, params, key, quotes)
    second = allocate("second_price", {}, params, key, quotes)
    np.testing.assert_array_equal(np.asarray(first.traffic), np.asarray(second.traffic))
    assert np.all(np.asarray(second.fees) <= np.asarray(first.fees) * (1 + 1e-6))


@pytest.mark.parametrize("kernel", ["sorted", "mask"])
@SETTINGS
@given(data=st.data())
def test_both_softmax_kernels_conserve_and_respect_budgets(kernel, data):
    """The sorted prefix kernel (markets with C * S > DENSE_MAX_PAIRS) and the [C, S]
    mask kernel, called directly so that both see the extreme values."""
    from jaxmarket.market.distributors import prefix_softmax as ps
    values = [0.0, 1e-30, 1e-3, 0.5, 1.0, 3.0, 1e30]
    n_c, n_s = 3, 4
    pick = lambda n: np.asarray(data.draw(st.lists(st.sampled_from(values), min_size=n,  # noqa: E731
                                                   max_size=n)), np.float32)
    price, budget, queries = pick(n_s), pick(n_c), pick(n_c)
    u = np.asarray(data.draw(st.lists(st.sampled_from([-1e30, -50.0, 0.0, 2.0, 80.0, 1e30]),
                                       min_size=n_s, max_size=n_s)), np.float32)
    outside = data.draw(st.booleans())
    withhold = data.draw(st.booleans())
    fn = ps._one_product if kernel == "sorted" else ps._dense_one_product
    clean = (ps.clip_utility(u), ps.clean_price(price), ps.clean_price(budget),
             ps.clean_nonneg(queries, ps.QUERY_MAX))
    traffic, fees, unserved, spend, sent = (np.asarray(x, np.float64) for x in jax.jit(
        fn, static_argnums=())(*clean, np.float32(0.0), np.bool_(outside), np.bool_(withhold)))
    for x in (traffic, fees, unserved, spend, sent):
        assert np.all(np.isfinite(x)) and np.all(x >= 0)
    np.testing.assert_allclose(traffic.sum() + unserved.sum(), sent.sum(), rtol=1e-5, atol=1e-30)
    # a seller priced above every budget serves nobody
    above = np.asarray(clean[1]) > np.asarray(clean[2]).max()
    assert np.all(traffic[above] == 0)
