"""ISA quality factors (latency, freshness, stake; reliability) through the environment.

test_distributors.py calls ``allocate`` directly, mostly with default scales. Here the
factors come from seller-group config arrays and the scales from the distributor
mapping, go through ``jaxmarket.make`` -> ``env.step`` (config -> params -> Quotes ->
distributor) and the resulting traffic / fees / spend are compared with the formulas
of docs/distributors.md written out below in numpy (float64, loops). Each test also
checks that a plausible wrong formula would have given a clearly different result, so
the comparison is known to be sensitive to the bug it names.
"""

import math

import jax
import numpy as np
import pytest

import jaxmarket

GOLD = (math.sqrt(5.0) - 1.0) / 2.0      # s in u(x) = 1/(x + s) - s
RTOL = 2e-5                              # float32 env against float64 reference

# non-default scales everywhere (defaults: 1, 10, 100; weight 0.5; min_price_ratio 0.01)
LS, FS, SS, W, MPR = 0.4, 6.0, 250.0, 0.7, 0.2


# --------------------------------------------------------------------------- references

def quality(lat, fresh, stake, ls, fs, ss):
    """docs: 1/(1 + latency/latency_scale) * 1/(1 + freshness/freshness_scale)
    * stake/(stake + stake_scale)."""
    return 1.0 / (1.0 + lat / ls) * 1.0 / (1.0 + fresh / fs) * stake / (stake + ss)


def isa_2022_expected(fee, budget, queries, reliability, latency, freshness, stake, w=W, ls=LS,
                      fs=FS, ss=SS, pick_weight=None):
    """docs/distributors.md, isa_2022 with mode: expected. fee [C, S], budget/queries [C],
    seller arrays [S]. Returns traffic [S], fees [S], spend [C], unserved [C]."""
    fee, budget, queries, rel, lat, fresh, stake = (np.asarray(a, np.float64) for a in (
        fee, budget, queries, reliability, latency, freshness, stake))
    C, S = fee.shape
    pick_weight = stake if pick_weight is None else pick_weight
    share = np.zeros((C, S))
    for c in range(C):
        util = np.zeros(S)
        for s in range(S):
            if fee[c, s] <= budget[c]:
                x = fee[c, s] / budget[c]
                u = min(max(1.0 / (x + GOLD) - GOLD, 0.0), 1.0)
                util[s] = u ** w * rel[s] * quality(lat[s], fresh[s], stake[s], ls, fs, ss)
        order = sorted(range(S), key=lambda s: -util[s])
        M = util[order[0]]
        if M <= 0:
            continue
        F = [1.0 - (1.0 - util[s] / M) ** (1 / 1.1) if util[s] > 0 else 0.0 for s in order]
        F.append(0.0)
        for k in range(S):                                   # candidate set = top k + 1
            p_set = F[k] - F[k + 1]
            if p_set <= 0:
                continue
            top = order[:k + 1]
            total = sum(pick_weight[j] for j in top)
            for j in top:
                share[c, j] += p_set * pick_weight[j] / total
    flow = queries[:, None] * share
    unserved = queries * (share.sum(1) == 0)
    return flow.sum(0), (fee * flow).sum(0), (fee * flow).sum(1), unserved


def isa_greedy(fee, budget, queries, reliability, latency, freshness, stake, max_sellers, ls=LS,
               fs=FS, ss=SS, mpr=MPR, power=7):
    """docs/distributors.md, isa_greedy: score = reliability^7 * quality; fee clamped to
    the budget; picks = top max_sellers by score / max(fee / budget, min_price_ratio)
    (ties: lower index), skipping score 0; queries cascade through the picks."""
    fee, budget, queries, rel, lat, fresh, stake = (np.asarray(a, np.float64) for a in (
        fee, budget, queries, reliability, latency, freshness, stake))
    C, S = fee.shape
    score = rel ** power * quality(lat, fresh, stake, ls, fs, ss)
    traffic, fees = np.zeros(S), np.zeros(S)
    spend, unserved = np.zeros(C), np.zeros(C)
    for c in range(C):
        f = np.minimum(fee[c], budget[c])
        value = [score[s] / max(f[s] / budget[c], mpr) for s in range(S)]
        picks = sorted((s for s in range(S) if score[s] > 0), key=lambda s: (-value[s], s))
        left = queries[c]
        for s in picks[:max_sellers]:
            served = left * score[s]
            traffic[s] += served
            fees[s] += f[s] * served
            spend[c] += f[s] * served
            left -= served
        unserved[c] = left
    return traffic, fees, spend, unserved


# --------------------------------------------------------------------------- markets

def market(distributor, sellers, budgets, queries, base_price=1.0, extra_sellers=()):
    """P = 1; one consumer group 'gateways' (C rows), one seller group 'indexers' with
    the per-seller columns given in ``sellers`` (latency, freshness, stake, reliability)."""
    col = lambda xs: [[float(x)] for x in xs]  # noqa: E731
    group = {"name": "indexers", "count": len(sellers["stake"]), "low": 0.0, "high": 10.0,
             **{k: col(v) for k, v in sellers.items()}}
    return {"market": {
        "num_products": 1,
        "consumers": [{"name": "gateways", "count": len(budgets), "budget": col(budgets),
                       "queries": col(queries), "base_price": col(np.broadcast_to(
                           base_price, (len(budgets),)))}],
        "sellers": [group, *extra_sellers],
        "distributor": distributor,
    }}


def step(config, actions):
    env, params = jaxmarket.make(config)
    _, state = env.reset(jax.random.key(0), params)
    acts = {g: np.asarray([[float(a)] for a in v], np.float32) for g, v in actions.items()}
    _, _, _, _, _, info = env.step(jax.random.key(1), state, acts, params)
    return jax.tree.map(lambda x: np.asarray(x, np.float64), info)


ISA_2022 = {"kind": "isa_2022", "mode": "expected", "weight": W, "latency_scale": LS,
            "freshness_scale": FS, "stake_scale": SS}
ISA_GREEDY = {"kind": "isa_greedy", "max_sellers": 2, "latency_scale": LS,
              "freshness_scale": FS, "stake_scale": SS, "min_price_ratio": MPR}
BUDGETS, QUERIES = [1.0, 2.0], [10.0, 20.0]


def check(info, ref, group="indexers", consumers="gateways"):
    traffic, fees, spend, unserved = ref
    np.testing.assert_allclose(info["traffic"][group][:, 0], traffic, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(info["fees"][group][:, 0], fees, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(info["spend"][consumers][:, 0], spend, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(info["unserved"][consumers][:, 0], unserved, rtol=RTOL, atol=1e-6)


def differs(info, ref, group="indexers"):
    """The env's traffic is clearly not the (wrong) reference ``ref``."""
    return not np.allclose(info["traffic"][group][:, 0], ref[0], rtol=1e-3, atol=1e-4)


# --------------------------------------------------------------------------- isa_2022

ALL = {"latency": [0.2, 0.5, 0.05], "freshness": [3.0, 0.0, 12.0], "stake": [50.0, 400.0, 150.0],
       "reliability": [0.99, 0.9, 0.95]}
PRICES = [0.3, 0.6, 0.9]


def test_isa_2022_expected_allocation_matches_documented_formula():
    """Every factor non-trivial, weight 0.7, two budgets (consumer 1's normalised fees
    are half consumer 0's). Catches a wrong exponent (w = 0.5 default), reliability
    dropped, or anything else in the utility or the expected-share formula."""
    info = step(market(ISA_2022, ALL, BUDGETS, QUERIES), {"indexers": PRICES})
    fee = np.tile(PRICES, (2, 1))
    ref = isa_2022_expected(fee, BUDGETS, QUERIES, **ALL)
    check(info, ref)
    assert np.all(ref[0] > 0.5)                              # every seller really shares
    assert differs(info, isa_2022_expected(fee, BUDGETS, QUERIES, **ALL, w=0.5))
    assert differs(info, isa_2022_expected(fee, BUDGETS, QUERIES, **{**ALL, "reliability": np.ones(3)}))


def _only(attr, values):
    """Sellers identical (same price) except ``attr``; the others at non-zero values."""
    base = {"latency": [0.3] * 3, "freshness": [2.0] * 3, "stake": [120.0] * 3,
            "reliability": [0.95] * 3}
    return {**base, attr: values}


@pytest.mark.parametrize("attr, values, bugs", [
    # latency: scale ignored (default 1), the freshness scale used, latency * scale
    ("latency", [0.05, 0.4, 1.2], [dict(ls=1.0), dict(ls=FS), dict(ls=1 / LS)]),
    # freshness: default scale 10, the latency scale used, freshness * scale
    ("freshness", [0.0, 5.0, 20.0], [dict(fs=10.0), dict(fs=LS), dict(fs=1 / FS)]),
    # stake term: default scale 100, scale applied twice (stake / (stake + ss^2)),
    # and (below) the pick weighted by the stake term instead of the raw stake
    ("stake", [40.0, 300.0, 900.0], [dict(ss=100.0), dict(ss=SS ** 2)]),
])
def test_isa_2022_each_quality_factor_uses_its_configured_scale(attr, values, bugs):
    """Equal prices, sellers differing in one attribute only: the allocation follows
    that factor with its configured scale."""
    sellers = _only(attr, values)
    info = step(market(ISA_2022, sellers, BUDGETS, QUERIES), {"indexers": [0.5] * 3})
    fee = np.full((2, 3), 0.5)
    check(info, isa_2022_expected(fee, BUDGETS, QUERIES, **sellers))
    for bug in bugs:
        assert differs(info, isa_2022_expected(fee, BUDGETS, QUERIES, **sellers, **bug)), bug
    if attr == "stake":
        term = np.asarray(values) / (np.asarray(values) + SS)
        assert differs(info, isa_2022_expected(fee, BUDGETS, QUERIES, **sellers, pick_weight=term))


def test_isa_2022_stake_term_is_a_half_at_stake_scale():
    """Hand case: seller 0 has stake = stake_scale (term 1/2), seller 1 stake 3 x scale
    (term 3/4), one consumer, equal prices, no latency/freshness: M = u 3/4, seller 0's
    utility ratio is 2/3, so F = 1 - (1/3)^(1/1.1) and seller 0's share is
    F * SS / (SS + 3 SS) = F / 4. Catches stake/(stake + scale) written as
    scale/(stake + scale) (it would make seller 0 the top)."""
    sellers = {"latency": [0.0, 0.0], "freshness": [0.0, 0.0], "stake": [SS, 3 * SS],
               "reliability": [1.0, 1.0]}
    info = step(market(ISA_2022, sellers, [1.0], [8.0]), {"indexers": [0.25, 0.25]})
    f = 1 - (1 / 3) ** (1 / 1.1)
    np.testing.assert_allclose(info["traffic"]["indexers"][:, 0], [8 * f / 4, 8 * (1 - f / 4)],
                               rtol=RTOL)
    np.testing.assert_allclose(info["fees"]["indexers"][:, 0], [2 * f / 4, 2 * (1 - f / 4)],
                               rtol=RTOL)


def test_isa_2022_multiplier_fee_uses_each_consumers_base_price():
    """Dense join: a multiplier seller charges m x base_c per consumer (base 0.5 and 1.5,
    m = 0.8: fees 0.4 and 1.2; 1.2 > budget 1 excludes it for consumer 1). Catches the
    first consumer's base price used for every consumer (the non-dense shortcut)."""
    mult = {"name": "mult", "count": 1, "action": "multiplier", "low": 0.0, "high": 5.0,
            "latency": 0.1, "freshness": 1.0, "stake": 300.0, "reliability": 0.97}
    sellers = {k: v[:2] for k, v in ALL.items()}
    cfg = market(ISA_2022, sellers, [1.0, 1.0], QUERIES, base_price=[0.5, 1.5],
                 extra_sellers=[mult])
    info = step(cfg, {"indexers": PRICES[:2], "mult": [0.8]})
    fee = np.array([[0.3, 0.6, 0.8 * 0.5], [0.3, 0.6, 0.8 * 1.5]])
    seller = {k: np.array(v + [mult[k]]) for k, v in sellers.items()}
    traffic, fees, spend, unserved = isa_2022_expected(fee, [1.0, 1.0], QUERIES, **seller)
    np.testing.assert_allclose(info["traffic"]["indexers"][:, 0], traffic[:2], rtol=RTOL)
    np.testing.assert_allclose(info["traffic"]["mult"][:, 0], traffic[2:], rtol=RTOL)
    np.testing.assert_allclose(info["fees"]["mult"][:, 0], fees[2:], rtol=RTOL)
    np.testing.assert_allclose(info["spend"]["gateways"][:, 0], spend, rtol=RTOL)
    shared = isa_2022_expected(np.tile(fee[0], (2, 1)), [1.0, 1.0], QUERIES, **seller)
    assert not np.allclose(traffic, shared[0], rtol=1e-3)
    assert 0 < traffic[2] < QUERIES[0]                      # only consumer 0 can use it


# --------------------------------------------------------------------------- isa_greedy

GREEDY = {"latency": [0.3, 0.1, 0.0], "freshness": [0.0, 4.0, 2.0],
          "stake": [200.0, 600.0, 1000.0], "reliability": [0.9, 0.97, 1.0]}
GREEDY_PRICES = [0.0, 0.4, 1.5]            # free, cheap, over both budgets
GREEDY_BUDGETS, GREEDY_QUERIES = [1.0, 0.5], [10.0, 4.0]


@pytest.fixture(scope="module")
def greedy_info():
    return step(market(ISA_GREEDY, GREEDY, GREEDY_BUDGETS, GREEDY_QUERIES),
                {"indexers": GREEDY_PRICES})


def _greedy(**kw):
    fee = np.tile(GREEDY_PRICES, (2, 1))
    return isa_greedy(fee, GREEDY_BUDGETS, GREEDY_QUERIES, **{**GREEDY, **kw}, max_sellers=2)


def test_isa_greedy_allocation_matches_documented_formula(greedy_info):
    """Consumer 0 picks sellers 1 then 0, consumer 1 sellers 0 then 2 (by hand from the
    scores below); traffic cascades, fees at the clamped fee. Catches any change in the
    score, the ratio or the cascade."""
    check(greedy_info, _greedy())
    # scores by hand: rel^7 x latency x freshness x stake terms
    score = np.array([0.9 ** 7 / (1 + 0.3 / LS) * 200 / 450,
                      0.97 ** 7 / (1 + 0.1 / LS) / (1 + 4 / FS) * 600 / 850,
                      1.0 / (1 + 2 / FS) * 1000 / 1250])
    t = greedy_info["traffic"]["indexers"][:, 0]
    want = np.array([10 * (1 - score[1]) * score[0] + 4 * score[0],
                     10 * score[1],
                     4 * (1 - score[0]) * score[2]])
    np.testing.assert_allclose(t, want, rtol=RTOL)


@pytest.mark.parametrize("bug", [
    dict(ls=1.0), dict(ls=FS), dict(fs=10.0), dict(fs=LS), dict(ss=100.0), dict(ss=SS ** 2),
    dict(power=1),                        # reliability not raised to the 7th power
    dict(mpr=0.01),                       # min_price_ratio not plumbed (default)
], ids=lambda b: ",".join(f"{k}={v:g}" for k, v in b.items()))
def test_isa_greedy_is_sensitive_to_each_configured_factor(greedy_info, bug):
    """The market above is built so that each named wrong formula changes the
    allocation: the env must match the right one and not the wrong one."""
    np.testing.assert_allclose(greedy_info["traffic"]["indexers"][:, 0], _greedy()[0], rtol=RTOL)
    assert differs(greedy_info, _greedy(**bug)), bug


def test_isa_greedy_over_budget_seller_is_paid_the_budget(greedy_info):
    """Seller 2 quotes 1.5 > budget 0.5 of consumer 1, is picked second and paid 0.5
    per query (catches the fee not clamped, or the seller excluded instead)."""
    traffic = greedy_info["traffic"]["indexers"][2, 0]
    assert traffic > 0
    np.testing.assert_allclose(greedy_info["fees"]["indexers"][2, 0], 0.5 * traffic, rtol=RTOL)


def test_isa_greedy_free_seller_ratio_is_floored_by_min_price_ratio(greedy_info):
    """Seller 0 is free: its ratio is min_price_ratio (0.2), which puts it second for
    consumer 0 (0.607 < 0.685 of seller 1); with the default floor 0.01 it would be
    first. It earns nothing (fee 0)."""
    t = greedy_info["traffic"]["indexers"][:, 0]
    s1 = 0.97 ** 7 / (1 + 0.1 / LS) / (1 + 4 / FS) * 600 / 850
    np.testing.assert_allclose(t[1], 10 * s1, rtol=RTOL)     # seller 1 tried first
    np.testing.assert_allclose(greedy_info["fees"]["indexers"][0, 0], 0.0, atol=1e-7)
