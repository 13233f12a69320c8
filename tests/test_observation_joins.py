"""Observation components as the *environment* produces them after real steps.

test_combinators.py checks each component on a hand-made ``GroupView``; these tests
check the join: config -> env.step -> state -> view -> observation. One small market
(4 sellers in 3 groups, 3 consumers in 2 groups, 2 products, ``cheapest``
distributor, episode_length 3) is stepped once per module with scripted actions, and
every component is compared with values computed here from those actions and the
documented semantics of docs/configuration.md (cheapest: docs/distributors.md).
Every product-1 number differs from product 0 and the minimum sits on different
sellers per product, so a wrong product axis shows up as a wrong value.
"""

import jax
import numpy as np
import pytest

import jaxmarket

P = 2
EPISODE = 3
PERIOD = 4.0
BASE = np.array([2.0, 3.0])          # every consumer's base_price (per product)
COST = 0.25                          # cost of the "posted" sellers
SCALE = 2.0                          # posted reward: [profit, scale 2]

# flat market order: sellers posted0, posted1 | mult | late ; consumers buyers | fixed0, fixed1
POSTED_OBS = [
    {"kind": "history", "k": 3},
    {"kind": "competitor_prices", "summary": "all"},
    {"kind": "competitor_prices", "summary": ["max", "min", "mean"]},   # non-default order
    {"kind": "own_price"},
    {"kind": "own_traffic"},
    {"kind": "own_reward"},
    {"kind": "budgets"},                                                # summary: mean
    {"kind": "budgets", "summary": "all"},
    {"kind": "time", "period": PERIOD},
]
S, C = 4, 3
# documented widths, in list order
POSTED_WIDTHS = {"history": 3 * S * P, "comp_all": (S - 1) * P, "comp_summary": 3 * P,
                 "own_price": P, "own_traffic": P, "own_reward": 1, "budgets_mean": P,
                 "budgets_all": C * P, "time": 3}

CONFIG = {"market": {
    "num_products": P,
    "episode_length": EPISODE,
    "consumers": [
        {"name": "buyers", "count": 1, "agent": True, "budget": 4.5, "budget_low": 0.0,
         "budget_high": 4.0, "queries": [1.0, 2.0], "base_price": BASE.tolist(),
         "observation": [{"kind": "own_price"}, {"kind": "own_traffic"},
                         {"kind": "competitor_prices", "summary": ["min", "mean", "max"]},
                         {"kind": "competitor_prices", "summary": "all"}]},
        {"name": "fixed", "count": 2, "budget": [[5.0, 6.0], [7.0, 8.0]],
         "queries": [[3.0, 4.0], [5.0, 6.0]], "base_price": BASE.tolist()},
    ],
    "sellers": [
        {"name": "posted", "count": 2, "low": 0.0, "high": 10.0,
         "initial": [[1.0, 2.0], [3.0, 4.0]], "cost": COST,
         "reward": [{"kind": "profit"}, {"kind": "scale", "factor": SCALE}],
         "observation": POSTED_OBS},
        {"name": "mult", "count": 1, "action": "multiplier", "low": 0.0, "high": 5.0,
         "initial": 1.5,
         "observation": [{"kind": "own_price"}, {"kind": "history", "k": 1},
                         {"kind": "competitor_prices", "summary": "all"}]},
        {"name": "late", "count": 1, "low": 0.0, "high": 8.0,     # initial null: midpoint 4
         "observation": [{"kind": "competitor_prices", "summary": ["min", "max"]}]},
    ],
    "distributor": {"kind": "cheapest"},
}}

FIXED_BUDGETS = np.array([[5.0, 6.0], [7.0, 8.0]])
QUERIES = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])   # buyers, fixed0, fixed1
RESET_BUYER_BUDGET = np.array([[4.0, 4.0]])                # 4.5 clipped to budget_high 4
# quoted prices at reset: posted initial, mult 1.5 x base, late midpoint (0 + 8) / 2
Q0 = np.array([[1.0, 2.0], [3.0, 4.0], [1.5 * 2.0, 1.5 * 3.0], [4.0, 4.0]])

# scripted actions for steps 1..4 (step 3 reaches episode_length: auto-reset after it)
ACTIONS = [
    {"posted": [[1.0, 4.0], [2.0, 0.5]], "mult": [[0.75, 1.0]], "late": [[3.0, 2.5]],
     "buyers": [[2.0, 0.25]]},
    {"posted": [[2.5, 1.5], [0.8, 3.5]], "mult": [[1.0, 0.4]], "late": [[1.2, 0.9]],
     "buyers": [[9.0, 3.0]]},                    # 9 is clipped to budget_high 4
    {"posted": [[0.6, 2.0], [1.1, 1.9]], "mult": [[0.5, 0.5]], "late": [[5.0, 0.7]],
     "buyers": [[0.5, 0.6]]},
    {"posted": [[3.3, 0.2], [1.7, 2.2]], "mult": [[2.0, 0.1]], "late": [[0.9, 6.0]],
     "buyers": [[1.0, 1.0]]},
]


def quoted(a):
    """[S, P] quoted prices of an action dict: multiplier x the first consumer's base."""
    return np.concatenate([np.asarray(a["posted"]), np.asarray(a["mult"]) * BASE,
                           np.asarray(a["late"])])


def budgets_of(a):
    """[C, P] budgets after an action: buyers clipped to [0, 4], fixed unchanged."""
    return np.concatenate([np.clip(np.asarray(a["buyers"]), 0.0, 4.0), FIXED_BUDGETS])


def cheapest(prices, budgets, queries):
    """docs/distributors.md, cheapest: all of a product's queries go to the lowest price
    (ties split), a consumer is served iff b_c >= m; fees = m traffic."""
    m = prices.min(0)                                        # [P]
    at_min = prices == m                                     # [S, P]
    served = budgets >= m                                    # [C, P]
    total = (queries * served).sum(0)                        # [P]
    traffic = at_min / at_min.sum(0) * total
    return traffic, m * traffic, queries * ~served           # traffic, fees, unserved


def split(row, widths):
    out, at = {}, 0
    for name, w in widths.items():
        out[name] = row[..., at:at + w]
        at += w
    assert at == row.shape[-1], (at, row.shape)
    return out


@pytest.fixture(scope="module")
def run():
    """Reset, then 4 steps with ACTIONS; one compilation of env.step."""
    env, params = jaxmarket.make(CONFIG)
    obs0, state = env.reset(jax.random.key(0), params)
    steps = []
    for t, a in enumerate(ACTIONS):
        acts = {g: np.asarray(v, np.float32) for g, v in a.items()}
        obs, state, rewards, term, trunc, info = env.step(jax.random.key(t), state, acts, params)
        steps.append(jax.tree.map(np.asarray, dict(obs=obs, rewards=rewards, trunc=trunc,
                                                   info=info, time=state.time)))
    return dict(obs0=jax.tree.map(np.asarray, obs0), steps=steps)


def posted(obs):
    return split(obs["posted"], POSTED_WIDTHS)


def others(prices, i):
    return np.delete(prices, i, axis=0)


# --------------------------------------------------------------------------- layout

def test_observation_widths_match_documented_shapes(run):
    """Catches a component whose output width disagrees with the table (e.g. history
    k*P instead of k*S*P, budgets all giving [n, P])."""
    assert run["obs0"]["posted"].shape == (2, sum(POSTED_WIDTHS.values()))
    assert run["obs0"]["mult"].shape == (1, P + S * P + (S - 1) * P)
    assert run["obs0"]["late"].shape == (1, 2 * P)
    assert run["obs0"]["buyers"].shape == (1, P + P + 3 * P + S * P)   # consumer: all S sellers
    assert [bool(s["trunc"]) for s in run["steps"]] == [False, False, True, False]


# --------------------------------------------------------------------------- history

def test_history_right_after_reset_is_the_reset_prices_k_times(run):
    """Catches a zero-filled history at reset (or a null ``initial`` not at the midpoint)."""
    h = posted(run["obs0"])["history"]
    np.testing.assert_allclose(h, np.tile(np.stack([Q0] * 3).ravel(), (2, 1)))


def test_history_is_most_recent_first(run):
    """Catches an off-by-one / reversed history (oldest first, or the previous step's
    prices in slot 0)."""
    Q1, Q2 = quoted(ACTIONS[0]), quoted(ACTIONS[1])
    h1 = posted(run["steps"][0]["obs"])["history"][0]
    h2 = posted(run["steps"][1]["obs"])["history"][0]
    np.testing.assert_allclose(h1, np.stack([Q1, Q0, Q0]).ravel(), rtol=1e-6)
    np.testing.assert_allclose(h2, np.stack([Q2, Q1, Q0]).ravel(), rtol=1e-6)


def test_history_of_multiplier_sellers_is_in_quoted_prices(run):
    """Catches the history holding the raw multiplier (0.75) instead of 0.75 x base."""
    h = posted(run["steps"][0]["obs"])["history"][0].reshape(3, S, P)
    np.testing.assert_allclose(h[0, 2], [0.75 * 2.0, 1.0 * 3.0], rtol=1e-6)


def test_history_k1_group_sees_only_the_latest_profile(run):
    """The market keeps the largest k (3); a k=1 group must get the newest profile, not
    the oldest (catches price_history[-k:])."""
    mult = run["steps"][1]["obs"]["mult"][0]
    np.testing.assert_allclose(mult[P:P + S * P], quoted(ACTIONS[1]).ravel(), rtol=1e-6)


def test_history_after_auto_reset_is_refilled_with_reset_prices(run):
    """At episode_length the returned observation is the reset one (history = reset
    prices k times) and final_observation keeps the pre-reset history; the next step
    pushes onto the reset fill. Catches a history that survives the auto-reset."""
    Q1, Q2, Q3, Q4 = (quoted(a) for a in ACTIONS)
    st3, st4 = run["steps"][2], run["steps"][3]
    np.testing.assert_allclose(posted(st3["obs"])["history"][0], np.stack([Q0] * 3).ravel())
    final = split(st3["info"]["final_observation"]["posted"], POSTED_WIDTHS)["history"][0]
    np.testing.assert_allclose(final, np.stack([Q3, Q2, Q1]).ravel(), rtol=1e-6)
    np.testing.assert_allclose(posted(st4["obs"])["history"][0], np.stack([Q4, Q0, Q0]).ravel(),
                               rtol=1e-6)


# --------------------------------------------------------------------------- own_*

def test_own_price_is_the_clipped_action_not_the_quote(run):
    """Posted: the price; multiplier: the multiplier itself (catches own_price = quoted
    price m x base); consumer agent: its budget, clipped (9 -> 4)."""
    st = run["steps"][1]
    np.testing.assert_allclose(posted(st["obs"])["own_price"], ACTIONS[1]["posted"], rtol=1e-6)
    np.testing.assert_allclose(st["obs"]["mult"][:, :P], ACTIONS[1]["mult"], rtol=1e-6)
    np.testing.assert_allclose(st["obs"]["buyers"][:, :P], [[4.0, 3.0]], rtol=1e-6)


def test_own_price_after_auto_reset_is_the_initial_action(run):
    """Catches an auto-reset that keeps the last action."""
    obs = run["steps"][2]["obs"]
    np.testing.assert_allclose(posted(obs)["own_price"], Q0[:2])
    np.testing.assert_allclose(obs["mult"][:, :P], [[1.5, 1.5]])
    np.testing.assert_allclose(obs["buyers"][:, :P], RESET_BUYER_BUDGET)


def test_own_traffic_is_the_queries_served_this_step(run):
    """Step 1 by hand: product 0 min 1.0 at seller 0, everyone affordable -> 1+3+5 = 9;
    product 1 min 0.5 at seller 1, buyers' budget 0.25 < 0.5 -> 4+6 = 10. Catches the
    traffic of the wrong seller / product, or last step's traffic one step late."""
    st = run["steps"][0]
    np.testing.assert_allclose(posted(st["obs"])["own_traffic"], [[9.0, 0.0], [0.0, 10.0]])
    np.testing.assert_allclose(st["info"]["traffic"]["posted"], [[9.0, 0.0], [0.0, 10.0]])
    for t in (1, 3):
        a = ACTIONS[t]
        traffic, _, _ = cheapest(quoted(a), budgets_of(a), QUERIES)
        np.testing.assert_allclose(posted(run["steps"][t]["obs"])["own_traffic"], traffic[:2],
                                   rtol=1e-6)


def test_consumer_own_traffic_is_sent_minus_unserved(run):
    """Buyers at step 1: product 0 served (1 query), product 1 unserved (budget 0.25 <
    min 0.5) -> [1, 0]. Catches own_traffic = sent (or = unserved) for consumers."""
    np.testing.assert_allclose(run["steps"][0]["obs"]["buyers"][:, P:2 * P], [[1.0, 0.0]])
    a = ACTIONS[2]          # budgets [0.5, 0.6] < min prices [0.6, 0.7]: nothing served
    _, _, unserved = cheapest(quoted(a), budgets_of(a), QUERIES)
    np.testing.assert_allclose(unserved[0], [1.0, 2.0])
    np.testing.assert_allclose(run["steps"][2]["info"]["final_observation"]["buyers"][:, P:2 * P],
                               QUERIES[:1] - unserved[:1])


def test_own_traffic_and_reward_are_zero_after_reset(run):
    """Catches a reset that keeps the previous episode's traffic / reward."""
    for obs in (run["obs0"], run["steps"][2]["obs"]):
        o = posted(obs)
        np.testing.assert_allclose(o["own_traffic"], 0.0)
        np.testing.assert_allclose(o["own_reward"], 0.0)


def test_own_reward_is_this_steps_reward_after_the_whole_chain(run):
    """Step 1: seller 0 profit 9 x 1.0 - 0.25 x 9 = 6.75, seller 1 10 x 0.5 - 0.25 x 10
    = 2.5, scaled by 2 -> [13.5, 5]. Catches the scale applied twice / not at all, or
    own_reward lagging one step behind the returned reward."""
    st = run["steps"][0]
    np.testing.assert_allclose(posted(st["obs"])["own_reward"][:, 0], [13.5, 5.0], rtol=1e-6)
    np.testing.assert_allclose(st["rewards"]["posted"], [13.5, 5.0], rtol=1e-6)
    a = ACTIONS[1]
    traffic, fees, _ = cheapest(quoted(a), budgets_of(a), QUERIES)
    want = SCALE * (fees[:2] - COST * traffic[:2]).sum(-1)
    np.testing.assert_allclose(posted(run["steps"][1]["obs"])["own_reward"][:, 0], want,
                               rtol=1e-6)


# --------------------------------------------------------------------------- competitors

def test_competitor_prices_all_are_the_other_sellers_in_market_order(run):
    """Catches the own price included (or another seller dropped) and a shuffled order;
    seller 2 (mult, in the middle) must see 0, 1, 3 in quoted prices."""
    for t in (0, 1, 3):
        Q = quoted(ACTIONS[t])
        obs = run["steps"][t]["obs"]
        comp = posted(obs)["comp_all"]
        for i in range(2):
            np.testing.assert_allclose(comp[i], others(Q, i).ravel(), rtol=1e-6)
        np.testing.assert_allclose(obs["mult"][0, P + S * P:], others(Q, 2).ravel(), rtol=1e-6)


@pytest.mark.parametrize("stat", ["max", "min", "mean"])
def test_competitor_summary_over_the_other_sellers(run, stat):
    """Each statistic in its list position, per product, over the other sellers only.
    Step 1: seller 0 is the product-0 minimum and seller 1 the product-1 minimum, so
    including the own price, swapping min/max or reducing over the wrong axis all fail."""
    fn = {"max": np.max, "min": np.min, "mean": np.mean}[stat]
    pos = ["max", "min", "mean"].index(stat)
    for t in (0, 1, 3):
        Q = quoted(ACTIONS[t])
        comp = posted(run["steps"][t]["obs"])["comp_summary"]
        for i in range(2):
            np.testing.assert_allclose(comp[i, pos * P:(pos + 1) * P], fn(others(Q, i), axis=0),
                                       rtol=1e-6)
    # by hand, step 1, seller 0: others' product-0 prices 2, 1.5, 3; product-1 0.5, 3, 2.5
    want = {"max": [3.0, 3.0], "min": [1.5, 0.5], "mean": [6.5 / 3, 2.0]}[stat]
    np.testing.assert_allclose(posted(run["steps"][0]["obs"])["comp_summary"][0, pos * P:(pos + 1) * P],
                               want, rtol=1e-6)


def test_competitor_summary_of_the_last_seller_group(run):
    """Seller 3 (group 'late', offset 3): min/max over sellers 0..2. Catches a
    self_index that ignores the group offset (would drop seller 0 instead)."""
    for t in (0, 1, 3):
        Q = quoted(ACTIONS[t])
        np.testing.assert_allclose(run["steps"][t]["obs"]["late"][0],
                                   np.concatenate([Q[:3].min(0), Q[:3].max(0)]), rtol=1e-6)


def test_consumer_competitor_summary_is_over_every_seller(run):
    """A consumer agent is no seller: 'every other seller' is every seller. Step 1's
    product-0 minimum is seller 0 (1.0); catches a consumer treated as seller 0
    (min 1.5, mean over sellers 1..3)."""
    for t in (0, 1, 3):
        Q = quoted(ACTIONS[t])
        got = run["steps"][t]["obs"]["buyers"][0, 2 * P:5 * P]
        np.testing.assert_allclose(got, np.concatenate([Q.min(0), Q.mean(0), Q.max(0)]),
                                   rtol=1e-6)


def test_consumer_competitor_prices_all_is_every_seller_in_market_order(run):
    """[n, S P] for a consumer agent; catches seller 0 dropped as if it were the
    consumer's own price."""
    for t in (0, 1, 3):
        np.testing.assert_allclose(run["steps"][t]["obs"]["buyers"][0, 5 * P:],
                                   quoted(ACTIONS[t]).ravel(), rtol=1e-6)


# --------------------------------------------------------------------------- budgets, time

def test_budgets_mean_is_over_all_consumers_after_the_action(run):
    """Mean over the 3 consumers of both groups, per product, with the buyers' new
    (clipped) budget. Step 2 by hand: ([4, 3] + [5, 6] + [7, 8]) / 3 = [16/3, 17/3].
    Catches the mean over the agent group only, over products, or the pre-action budget."""
    np.testing.assert_allclose(posted(run["steps"][1]["obs"])["budgets_mean"],
                               [[16 / 3, 17 / 3]] * 2, rtol=1e-6)
    np.testing.assert_allclose(posted(run["obs0"])["budgets_mean"],
                               np.tile(np.concatenate([RESET_BUYER_BUDGET, FIXED_BUDGETS]).mean(0),
                                       (2, 1)), rtol=1e-6)


def test_budgets_all_is_every_consumer_budget_in_market_order(run):
    """[n, C P]: buyers then fixed0, fixed1, each with its P budgets. Catches a
    product-major flattening or a missing entity group."""
    for t in (0, 1, 3):
        np.testing.assert_allclose(posted(run["steps"][t]["obs"])["budgets_all"],
                                   np.tile(budgets_of(ACTIONS[t]).ravel(), (2, 1)), rtol=1e-6)


def test_time_is_steps_over_episode_length_and_phase_uses_period(run):
    """t / episode_length (3), then sin/cos(2 pi t / period) with period 4: t = 1 ->
    [1/3, 1, 0], t = 2 -> [2/3, 0, -1], auto-reset -> [0, 0, 1]. Catches the phase
    computed from t / episode_length, sin and cos swapped, or time not reset."""
    want = {0: [1 / 3, 1.0, 0.0], 1: [2 / 3, 0.0, -1.0], 2: [0.0, 0.0, 1.0], 3: [1 / 3, 1.0, 0.0]}
    for t, w in want.items():
        np.testing.assert_allclose(posted(run["steps"][t]["obs"])["time"], [w, w], atol=1e-6)
    np.testing.assert_allclose(posted(run["obs0"])["time"], [[0.0, 0.0, 1.0]] * 2, atol=1e-6)
    # the pre-reset observation of the truncating step has t = episode_length
    final = split(run["steps"][2]["info"]["final_observation"]["posted"], POSTED_WIDTHS)["time"]
    np.testing.assert_allclose(final, [[1.0, -1.0, 0.0]] * 2, atol=1e-6)
