"""The market side of the algorithmic-pricing lab: quantity-setting (Cournot) sellers and
the ``cournot`` distributor (with demand shocks), the ``market_price`` observation,
alternating moves, ``cheapest``'s linear demand and the ``mixed_price`` auction rule.

Every expected number is derived here from the formula (linear inverse demand, Cournot
first-order conditions, the auction payment rules), never taken from the code."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmarket
from jaxmarket.market import economics
from jaxmarket.market.distributors import DISTRIBUTORS, Quotes
from jaxmarket.market.state import current_actions

KEY = jax.random.key(0)


def cournot_market(n=2, a=1.0, b=1.0, c=0.0, high=2.0, queries=1.0, consumers=1,
                   P=1, observation=None, **distributor):
    return {"market": {
        "num_products": P,
        "consumers": [{"name": "c", "count": consumers, "queries": queries}],
        "sellers": [{"name": "s", "count": n, "action": "quantity", "low": 0.0, "high": high,
                     "cost": c, "observation": observation or []}],
        "distributor": {"kind": "cournot", "intercept": a, "slope": b, **distributor}}}


def profits_on_grid(env, params, grid, rivals):
    """Firm 0's quantity over ``grid`` [G], the others at ``rivals`` [n-1]: rewards [G, n]."""
    _, state = env.reset(KEY, params)

    def one(q0):
        q = jnp.concatenate([q0[None], jnp.asarray(rivals, jnp.float32)])[:, None]
        return env.step_env(KEY, state, {"s": q}, params)[2]["s"]

    return np.asarray(jax.vmap(one)(jnp.asarray(grid, jnp.float32)), np.float64)


# ------------------------------------------------------------------ Cournot: closed forms

def test_best_response_to_nash_rivals_is_the_nash_quantity():
    """Catches: a wrong clearing price (slope or intercept dropped, Q not the sum over
    sellers), fees not P q, the cost not charged per unit sold."""
    n, a, b, c = 3, 2.0, 0.5, 0.2
    q_star = (a - c) / (b * (n + 1))          # FOC: a - b Q - b q_i - c = 0 at q_i = q
    assert economics.cournot_nash_quantity(n, a, b, c) == pytest.approx(q_star)
    env, params = jaxmarket.make(cournot_market(n, a, b, c))
    grid = np.round(np.arange(0.0, 2.0 + 1e-9, 0.01), 2)
    profit = profits_on_grid(env, params, grid, [q_star] * (n - 1))[:, 0]
    assert grid[np.argmax(profit)] == pytest.approx(q_star, abs=1e-9)
    # profit on the grid is (a - b (q + (n-1) q*) - c) q
    expected = (a - b * (grid + (n - 1) * q_star) - c) * grid
    np.testing.assert_allclose(profit, expected, rtol=1e-5, atol=1e-6)
    price = a - b * n * q_star
    assert economics.cournot_nash_price(n, a, b, c) == pytest.approx(price)
    assert economics.cournot_nash_price(n, a, b, c) == pytest.approx((a + n * c) / (n + 1))
    assert economics.cournot_nash_profit(n, a, b, c) == pytest.approx((price - c) * q_star)
    assert economics.cournot_nash_profit(n, a, b, c) == pytest.approx(
        (a - c) ** 2 / (b * (n + 1) ** 2))


def test_joint_profit_peaks_at_the_monopoly_total():
    """Symmetric quantities q each: total profit (a - b n q - c) n q is largest at
    n q = (a - c) / (2 b)."""
    n, a, b, c = 2, 1.0, 1.0, 0.1
    q_mono = (a - c) / (2 * b * n)
    assert economics.cournot_monopoly_quantity(n, a, b, c) == pytest.approx(q_mono)
    assert economics.cournot_monopoly_price(n, a, b, c) == pytest.approx((a + c) / 2)
    assert economics.cournot_monopoly_profit(n, a, b, c) == pytest.approx(
        ((a + c) / 2 - c) * q_mono)
    env, params = jaxmarket.make(cournot_market(n, a, b, c))
    _, state = env.reset(KEY, params)
    grid = np.round(np.arange(0.0, 0.6 + 1e-9, 0.0025), 4)
    joint = jax.vmap(lambda q: env.step_env(KEY, state, {"s": jnp.full((n, 1), q)}, params)[2]
                     ["s"].sum())(jnp.asarray(grid, jnp.float32))
    assert grid[int(np.argmax(np.asarray(joint)))] == pytest.approx(q_mono, abs=1e-9)
    # and the Nash quantity is larger than the monopoly share (more output, lower price)
    assert economics.cournot_nash_quantity(n, a, b, c) > q_mono


def test_clearing_price_is_clipped_at_zero():
    """Total quantity beyond a / b: the price is 0 (not negative), so fees are 0 and the
    profit is -c q."""
    a, b, c = 1.0, 2.0, 0.1
    env, params = jaxmarket.make(cournot_market(2, a, b, c, high=5.0))
    _, state = env.reset(KEY, params)
    q = jnp.array([[0.4], [0.3]])                       # Q = 0.7 > a / b = 0.5
    _, state, rewards, _, info = env.step_env(KEY, state, {"s": q}, params)
    np.testing.assert_array_equal(info["fees"]["s"], 0.0)
    np.testing.assert_allclose(rewards["s"], [-c * 0.4, -c * 0.3], rtol=1e-6)
    q = jnp.array([[0.1], [0.15]])                      # Q = 0.25: P = a - b Q = 0.5
    _, state, rewards, _, info = env.step_env(KEY, state, {"s": q}, params)
    np.testing.assert_allclose(info["fees"]["s"][:, 0], [0.05, 0.075], rtol=1e-6)
    np.testing.assert_allclose(rewards["s"], [(0.5 - c) * 0.1, (0.5 - c) * 0.15], rtol=1e-6)


def test_consumers_share_the_quantity_by_queries_and_conservation_holds():
    env, params = jaxmarket.make({"market": {
        "num_products": 2,
        "consumers": [{"name": "c", "count": 2, "queries": [[1.0, 0.0], [3.0, 0.0]]}],
        "sellers": [{"name": "s", "count": 3, "action": "quantity", "high": 1.0}],
        "distributor": {"kind": "cournot", "intercept": 2.0, "slope": 1.0}}})
    _, state = env.reset(KEY, params)
    q = jnp.array([[0.2, 0.1], [0.3, 0.2], [0.1, 0.6]])
    _, state, _, _, info = env.step_env(KEY, state, {"s": q}, params)
    Q = np.array([0.6, 0.9])
    price = 2.0 - Q
    sent = np.asarray(info["queries"]["c"])
    # product 0 by queries 1 : 3, product 1 (no queries) equally
    np.testing.assert_allclose(sent, [[0.25 * Q[0], 0.5 * Q[1]], [0.75 * Q[0], 0.5 * Q[1]]],
                               rtol=1e-6)
    np.testing.assert_allclose(info["spend"]["c"], sent * price[None], rtol=1e-6)
    np.testing.assert_array_equal(info["unserved"]["c"], 0.0)
    np.testing.assert_allclose(info["traffic"]["s"], q, rtol=0)
    np.testing.assert_allclose(np.asarray(info["traffic"]["s"]).sum(0)
                               + np.asarray(info["unserved"]["c"]).sum(0), sent.sum(0),
                               rtol=1e-6)
    # money paid = money received
    np.testing.assert_allclose(np.asarray(info["fees"]["s"]).sum(0), sent.sum(0) * price,
                               rtol=1e-6)


def test_demand_shock_frequencies_and_their_prices():
    """The intercept is drawn per period and product from the configured distribution:
    with Q = 0.1 and b = 1 the price is a - 0.1, so fees / q recovers the draw."""
    values, probs = [0.5, 1.0, 2.0], [0.2, 0.5, 0.3]
    env, params = jaxmarket.make(cournot_market(
        1, high=1.0, P=2, shock_values=values, shock_probs=probs))
    assert not DISTRIBUTORS["cournot"].is_deterministic(dict(env._options))
    _, state = env.reset(KEY, params)
    q = jnp.full((1, 2), 0.1)
    N = 3000
    keys = jax.random.split(jax.random.key(7), N)
    fees = jax.vmap(lambda k: env.step_env(k, state, {"s": q}, params)[4]["fees"]["s"])(keys)
    intercept = np.asarray(fees, np.float64)[:, 0, :] / 0.1 + 0.1        # [N, P]
    nearest = np.abs(intercept[..., None] - np.asarray(values)).argmin(-1)
    np.testing.assert_allclose(intercept, np.asarray(values)[nearest], atol=1e-5)
    for p in range(2):
        freq = np.bincount(nearest[:, p], minlength=3) / N
        sigma = np.sqrt(np.asarray(probs) * (1 - np.asarray(probs)) / N)
        assert np.all(np.abs(freq - probs) < 5 * sigma), (p, freq)
    # the two products draw separately (not one draw shared by both)
    assert np.mean(nearest[:, 0] == nearest[:, 1]) < 0.9
    # a probability of 0 is never drawn
    q0 = quotes([[0.1]], [[1.0]], 1.0)
    f0 = np.array([allocate("cournot", q0, k, shock_values=(3.0, 1.0), shock_probs=(0.0, 1.0),
                            intercept=1.0, slope=1.0).fees[0, 0] for k in keys[:50]])
    np.testing.assert_allclose(f0, (1.0 - 0.1) * 0.1, rtol=1e-6)


def test_market_price_observation_and_quantity_history():
    """market_price: sum of spend / sum of served queries (0 at reset and where nothing
    is served); the history of a quantity market shows quantities."""
    a, b = 1.5, 1.0
    env, params = jaxmarket.make(cournot_market(
        2, a, b, consumers=2, queries=[[1.0], [2.0]],
        observation=[{"kind": "market_price"}, {"kind": "history", "k": 1}]))
    obs, state = env.reset(KEY, params)
    np.testing.assert_array_equal(obs["s"][:, 0], 0.0)
    np.testing.assert_allclose(obs["s"][:, 1:], [[1.0, 1.0]] * 2)      # midpoints of [0, 2]
    q = jnp.array([[0.2], [0.5]])
    obs, state, _, _, _, _ = env.step(KEY, state, {"s": q}, params)
    np.testing.assert_allclose(obs["s"][:, 0], a - b * 0.7, rtol=1e-6)
    np.testing.assert_array_equal(obs["s"][:, 1:], np.float32([[0.2, 0.5]] * 2))
    np.testing.assert_array_equal(current_actions(env.spec, state)["s"], q)
    # a price market: consumer 1 cannot afford the cheapest price, so only consumer 0's
    # queries count: the market price is what was paid per query served
    env2, params2 = jaxmarket.make({"market": {
        "num_products": 1,
        "consumers": [{"name": "c", "count": 2, "budget": [[1.0], [0.1]], "queries": [[2.0], [5.0]]}],
        "sellers": [{"name": "s", "count": 2, "high": 1.0,
                     "observation": [{"kind": "market_price"}]}],
        "distributor": {"kind": "cheapest"}}})
    _, st2 = env2.reset(KEY, params2)
    obs2, st2, _, _, _ = env2.step_env(KEY, st2, {"s": jnp.array([[0.4], [0.6]])}, params2)
    np.testing.assert_allclose(obs2["s"], [[0.4 * 2.0 / 2.0]] * 2, rtol=1e-6)
    obs2, st2, _, _, _ = env2.step_env(KEY, st2, {"s": jnp.array([[1.0], [1.0]])}, params2)
    np.testing.assert_allclose(obs2["s"], [[1.0]] * 2, rtol=1e-6)
    # nobody can afford either price: nothing served, market price 0 (not 0 / 0)
    params3 = params2.replace(consumers={"c": params2.consumers["c"].replace(
        budget=np.array([[0.05], [0.05]], np.float32))})
    _, st3 = env2.reset(KEY, params3)
    obs3, *_ = env2.step_env(KEY, st3, {"s": jnp.array([[0.4], [0.6]])}, params3)
    np.testing.assert_array_equal(obs3["s"], 0.0)


def test_quantities_are_clipped_to_the_bounds_and_held_in_state():
    env, params = jaxmarket.make(cournot_market(2, high=0.5))
    _, state = env.reset(KEY, params)
    assert set(state.quantities) == {"s"} and state.prices == {} and state.multipliers == {}
    np.testing.assert_array_equal(state.quantities["s"], 0.25)
    _, state, _, _, info = env.step_env(KEY, state, {"s": jnp.array([[0.9], [-1.0]])}, params)
    np.testing.assert_array_equal(state.quantities["s"], [[0.5], [0.0]])
    np.testing.assert_array_equal(info["prices"]["s"], [[0.5], [0.0]])   # quotes: quantities


# ------------------------------------------------------------------ alternating moves

def alternating_market(episode_length=None, move_order="alternating"):
    return {"market": {
        "num_products": 2, "episode_length": episode_length, "move_order": move_order,
        "consumers": [{"name": "buyers", "count": 1, "agent": True, "budget": 1.0,
                       "budget_low": 0.0, "budget_high": 2.0},
                      {"name": "c", "count": 2, "budget": 5.0}],
        "sellers": [{"name": "a", "count": 2, "high": 3.0, "initial": 1.0,
                     "observation": [{"kind": "history", "k": 1}]},
                    {"name": "b", "count": 1, "high": 3.0, "initial": 2.0}],
        "distributor": {"kind": "logit"}}}


def test_alternating_moves_keep_the_idle_sellers_action():
    """Seller s (flat index over groups a = [0, 1], b = [2]) moves when time % 3 == s;
    the other sellers keep their action; the consumer agent acts every period. Catches:
    the turn read per group (not the flat index), the time after the increment, the
    idle action taken from the reset instead of the one in force."""
    env, params = jaxmarket.make(alternating_market())
    assert env.spec.move_order == "alternating"
    obs, state = env.reset(KEY, params)
    held = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])        # flat [S, P]
    rng = np.random.default_rng(0)
    for t in range(7):
        acts = {"a": rng.uniform(-0.5, 3.5, (2, 2)).astype(np.float32),
                "b": rng.uniform(-0.5, 3.5, (1, 2)).astype(np.float32),
                "buyers": rng.uniform(0.0, 2.0, (1, 2)).astype(np.float32)}
        flat = np.clip(np.concatenate([acts["a"], acts["b"]]), 0.0, 3.0)
        held[t % 3] = flat[t % 3]
        obs, state, _, _, _, info = env.step(jax.random.key(t), state, acts, params)
        np.testing.assert_array_equal(state.prices["a"], held[:2])
        np.testing.assert_array_equal(state.prices["b"], held[2:])
        np.testing.assert_array_equal(state.budgets["buyers"], acts["buyers"])
        np.testing.assert_array_equal(info["prices"]["a"], held[:2])
        np.testing.assert_array_equal(obs["a"], np.broadcast_to(held.reshape(-1), (2, 6)))
        assert int(state.time) == t + 1


def test_alternating_turns_restart_at_reset_and_simultaneous_is_the_default():
    env, params = jaxmarket.make(alternating_market(episode_length=3))
    _, state = env.reset(KEY, params)
    acts = lambda x: {"a": jnp.full((2, 2), x), "b": jnp.full((1, 2), x),
                      "buyers": jnp.ones((1, 2))}
    for t in range(3):
        _, state, _, _, truncated, _ = env.step(KEY, state, acts(0.5 + t), params)
    assert bool(truncated) and int(state.time) == 0
    np.testing.assert_array_equal(state.prices["a"], 1.0)        # reset prices
    _, state, _, _, _, _ = env.step(KEY, state, acts(2.75), params)
    np.testing.assert_array_equal(state.prices["a"], [[2.75, 2.75], [1.0, 1.0]])  # seller 0 moved
    np.testing.assert_array_equal(state.prices["b"], 2.0)
    # simultaneous (the default): everyone moves at once
    cfg = alternating_market()
    del cfg["market"]["move_order"]
    env_s, params_s = jaxmarket.make(cfg)
    assert env_s.spec.move_order == "simultaneous"
    _, st = env_s.reset(KEY, params_s)
    _, st, _, _, _, _ = env_s.step(KEY, st, acts(2.75), params_s)
    np.testing.assert_array_equal(st.prices["a"], 2.75)
    np.testing.assert_array_equal(st.prices["b"], 2.75)


# ------------------------------------------------------------------ cheapest: linear demand

def quotes(price, budget, queries):
    price = np.asarray(price, np.float32)
    budget = np.asarray(budget, np.float32)
    S, P = price.shape
    C = budget.shape[0]
    s = lambda x: np.full((S, P), x, np.float32)
    return Quotes(price=price, is_multiplier=np.zeros(S, bool), budget=budget,
                  queries=np.broadcast_to(np.asarray(queries, np.float32), (C, P)),
                  base_price=np.ones((C, P), np.float32), quality=s(0.0), reliability=s(1.0),
                  latency=s(0.0), freshness=s(0.0), stake=s(1.0))


def allocate(kind, q, key=KEY, **settings):
    d = DISTRIBUTORS[kind]
    params = {k: np.float32(v) for k, v in settings.items() if k in d.params}
    options = {k: v for k, v in settings.items() if k in d.options}
    return d.allocate(key, q, params, options)


def test_cheapest_linear_demand_is_one_minus_price_with_ties_split():
    """b = q = 1: D(m) = 1 - m at the lowest price m, split equally by the tied sellers."""
    grid = np.linspace(0.0, 1.2, 13)
    for m in grid:
        a = allocate("cheapest", quotes([[m], [m], [m + 0.2]], [[1.0]], 1.0), demand="linear")
        d = max(0.0, 1.0 - m)
        np.testing.assert_allclose(a.traffic[:, 0], [d / 2, d / 2, 0.0], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(a.fees[:, 0], [m * d / 2, m * d / 2, 0.0], rtol=1e-5,
                                   atol=1e-7)
        np.testing.assert_allclose(a.spend[0, 0], m * d, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(a.unserved[0, 0], 1.0 - d, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(a.sent, 1.0)
    # consumers with their own choke prices and queries: q_c max(0, 1 - m / b_c)
    b, q, m = np.array([2.0, 0.5, 0.0]), np.array([3.0, 1.0, 4.0]), 0.8
    a = allocate("cheapest", quotes([[m], [1.5]], b[:, None], q[:, None]), demand="linear")
    bought = q * np.maximum(0.0, 1.0 - m / np.where(b > 0, b, 1.0)) * (b > 0)
    np.testing.assert_allclose(a.traffic[:, 0], [bought.sum(), 0.0], rtol=1e-6)
    np.testing.assert_allclose(a.unserved[:, 0], q - bought, rtol=1e-6)
    np.testing.assert_allclose(a.spend[:, 0], m * bought, rtol=1e-6)
    # unit demand (the default) serves every affordable query in full
    a = allocate("cheapest", quotes([[m], [1.5]], b[:, None], q[:, None]))
    np.testing.assert_allclose(a.traffic[:, 0], [3.0, 0.0], rtol=1e-6)


def test_cheapest_linear_demand_through_the_env():
    env, params = jaxmarket.make({"market": {
        "num_products": 1,
        "consumers": [{"name": "c", "count": 1}],
        "sellers": [{"name": "s", "count": 2, "high": 1.0, "cost": 0.1}],
        "distributor": {"kind": "cheapest", "demand": "linear"}}})
    _, state = env.reset(KEY, params)
    _, _, rewards, _, _ = env.step_env(KEY, state, {"s": jnp.array([[0.4], [0.7]])}, params)
    # seller 0 sells 1 - 0.4 = 0.6 at 0.4: profit (0.4 - 0.1) 0.6
    np.testing.assert_allclose(rewards["s"], [0.3 * 0.6, 0.0], rtol=1e-6)


# ------------------------------------------------------------------ mixed_price

def auction_reference(bids, queries, reserve, a):
    """float64 reference of the payment rule, per product."""
    S, P = bids.shape
    traffic, pay = np.zeros((S, P)), np.zeros(P)
    for p in range(P):
        elig = [s for s in range(S) if bids[s, p] >= reserve]
        if not elig:
            continue
        top = max(bids[s, p] for s in elig)
        win = [s for s in elig if bids[s, p] == top]
        losing = [bids[s, p] for s in elig if bids[s, p] < top]
        second = top if len(win) > 1 else max(losing + [reserve])
        pay[p] = (2 - a) * top + (a - 1) * second
        for s in win:
            traffic[s, p] = queries[:, p].sum() / len(win)
    return traffic, traffic * pay[None], pay


def test_mixed_price_endpoints_are_first_and_second_price_bit_for_bit():
    rng = np.random.default_rng(3)
    for trial in range(12):
        bids = rng.choice([0.0, 0.2, 0.5, 0.5, 0.9, 1.3], size=(4, 3))     # ties
        q = quotes(bids, np.ones((2, 3)), rng.uniform(0.0, 3.0, (2, 3)))
        reserve = [0.0, 0.5, 2.0][trial % 3]
        for a, kind in ((1.0, "first_price"), (2.0, "second_price")):
            mixed = allocate("mixed_price", q, a=a, reserve=reserve)
            pure = allocate(kind, q, reserve=reserve)
            for f in ("traffic", "fees", "unserved", "spend", "sent"):
                np.testing.assert_array_equal(getattr(mixed, f), getattr(pure, f), err_msg=f)


def test_mixed_price_between_the_endpoints_follows_the_formula():
    rng = np.random.default_rng(5)
    for trial in range(8):
        bids = rng.choice([0.1, 0.4, 0.4, 0.7, 1.0], size=(3, 2)).astype(np.float32)
        queries = rng.uniform(0.5, 2.0, (2, 2)).astype(np.float32)
        reserve, a = [0.0, 0.5][trial % 2], [1.5, 1.25][trial % 2]
        got = allocate("mixed_price", quotes(bids, np.ones((2, 2)), queries), a=a,
                       reserve=reserve)
        traffic, fees, pay = auction_reference(bids.astype(np.float64),
                                               queries.astype(np.float64), reserve, a)
        np.testing.assert_allclose(got.traffic, traffic, rtol=1e-6)
        np.testing.assert_allclose(got.fees, fees, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got.spend, queries * pay[None], rtol=1e-5, atol=1e-7)
    # by hand: bids 0.9, 0.6, 0.3, reserve 0.2, a = 1.5 -> 0.5 * 0.9 + 0.5 * 0.6 = 0.75
    got = allocate("mixed_price", quotes([[0.9], [0.6], [0.3]], [[1.0]], 1.0), a=1.5,
                   reserve=0.2)
    np.testing.assert_allclose(got.fees[:, 0], [0.75, 0.0, 0.0], rtol=1e-6)
    # reserve 0.7 above the runner-up: 0.5 * 0.9 + 0.5 * 0.7 = 0.8
    got = allocate("mixed_price", quotes([[0.9], [0.6], [0.3]], [[1.0]], 1.0), a=1.5,
                   reserve=0.7)
    np.testing.assert_allclose(got.fees[:, 0], [0.8, 0.0, 0.0], rtol=1e-6)


# ------------------------------------------------------------------ registry flags

def test_distributor_flags_actions_and_determinism():
    assert DISTRIBUTORS["cournot"].actions == ("quantity",)
    for kind in ("logit", "cheapest", "first_price", "second_price", "mixed_price",
                 "isa_greedy", "proportional"):
        assert DISTRIBUTORS[kind].actions == ("price", "multiplier")
        assert DISTRIBUTORS[kind].is_deterministic({})
    isa = DISTRIBUTORS["isa_2022"]
    assert not isa.is_deterministic({}) and not isa.is_deterministic({"mode": "sampled"})
    assert isa.is_deterministic({"mode": "expected"})
    cournot = DISTRIBUTORS["cournot"]
    assert cournot.is_deterministic({})
    # one shock value is one outcome: deterministic; two are a draw of two outcomes,
    # each the market of one value (the session engine's tables, exact expectations)
    assert cournot.is_deterministic({"shock_values": (1.0,), "shock_probs": (1.0,)})
    two = {"shock_values": (0.9, 1.1), "shock_probs": (0.25, 0.75)}
    assert not cournot.is_deterministic(two)
    outcomes = cournot.outcome_options(two)
    assert [p for p, _ in outcomes] == [0.25, 0.75]
    assert [o["shock_values"] for _, o in outcomes] == [[0.9], [1.1]]
    assert all(cournot.is_deterministic(o) for _, o in outcomes)


# ------------------------------------------------------------------ config errors

def error_of(config):
    with pytest.raises(jaxmarket.ConfigError) as info:
        jaxmarket.make(config)
    return info.value


def test_bad_inputs_are_config_errors_naming_the_field():
    # alternating: an episode length that is not a multiple of the sellers, one seller
    err = error_of(alternating_market(episode_length=4))
    assert err.field == "market.move_order" and err.value == "alternating"
    assert "multiple" in err.allowed and "3" in err.allowed
    err = error_of({"market": {**cournot_market(1)["market"], "move_order": "alternating"}})
    assert err.field == "market.move_order" and ">= 2 sellers" in err.allowed
    assert error_of(alternating_market(move_order="round_robin")).field == "market.move_order"
    jaxmarket.make(alternating_market(episode_length=6))          # a multiple: fine
    # quantity sellers with a price distributor, price sellers with cournot
    cfg = cournot_market(2)
    cfg["market"]["distributor"] = {"kind": "cheapest"}
    err = error_of(cfg)
    assert err.field == "market.sellers[0].action" and err.value == "quantity"
    assert "price" in err.allowed and "multiplier" in err.allowed
    cfg = cournot_market(2)
    cfg["market"]["sellers"].append({"name": "p", "count": 1, "action": "price"})
    err = error_of(cfg)
    assert err.field == "market.sellers[1].action" and err.value == "price"
    assert "quantity" in err.allowed and "cournot" in err.allowed
    # shocks
    err = error_of(cournot_market(shock_values=[1.0, 2.0], shock_probs=[1.0]))
    assert err.field == "market.distributor.shock_probs"
    err = error_of(cournot_market(shock_values=[1.0, 2.0], shock_probs=[0.5, 0.6]))
    assert err.field == "market.distributor.shock_probs" and "summing to 1" in err.allowed
    err = error_of(cournot_market(shock_values=[1.0, 2.0], shock_probs=[1.5, -0.5]))
    assert err.field.startswith("market.distributor.shock_probs")
    assert error_of(cournot_market(shock_values=[1.0])).field == "market.distributor.shock_probs"
    assert error_of(cournot_market(shock_probs=[1.0])).field == "market.distributor.shock_values"
    assert error_of(cournot_market(b=0.0)).field == "market.distributor.slope"
    # mixed_price's a in [1, 2]; cheapest's demand
    auction = {"market": {"num_products": 1, "consumers": [{"name": "c"}],
                          "sellers": [{"name": "s", "count": 2}],
                          "distributor": {"kind": "mixed_price", "a": 2.5}}}
    assert error_of(auction).field == "market.distributor.a"
    auction["market"]["distributor"] = {"kind": "cheapest", "demand": "quadratic"}
    assert error_of(auction).field == "market.distributor.demand"
