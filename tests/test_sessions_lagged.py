"""A platform rule on last period's prices (``steering: lowest_price_dynamic``), from the
distributor through the market, the session engine's pair tables, both backends and the
authors' diagnostics.

The rule, with ``u_s = (a_s - p_s) / mu``, the lowest price ``m``, the tied sellers ``T =
{s: p_s = m}`` and their previous prices ``prev_s``: only ``T' = {s in T: prev_s =
min_{j in T} prev_j}`` are shown, each with probability ``1 / |T'|``, and a shown seller
sells ``e^{u_s} / (e^{u_s} + e^{a_0 / mu})`` to the consumer.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT

from jaxmarket.config.loader import load_config
from jaxmarket.market.distributors import Quotes
from jaxmarket.market.distributors.logit import allocate
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.diagnostics import diagnose
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.run import session_plan

KEY = jax.random.PRNGKey(0)
CALVANO = {"temperature": np.float32(0.25), "price_sensitivity": np.float32(1.0),
           "outside_quality": np.float32(0.0)}
DYNAMIC = ["market.distributor.steering=lowest_price_dynamic"]


def alone(p, a=2.0, mu=0.25):
    """A seller facing the consumer alone against the outside good (a_0 = 0)."""
    return np.exp((a - p) / mu) / (np.exp((a - p) / mu) + 1.0)


def quotes(price, previous) -> Quotes:
    S = len(price)
    col = lambda x: np.asarray(x, np.float32).reshape(-1, 1)  # noqa: E731
    return Quotes(price=col(price), is_multiplier=np.zeros(S, bool), budget=col([1000.0]),
                  queries=col([1.0]), base_price=col([1.0]), quality=col([2.0] * S),
                  reliability=np.ones((S, 1), np.float32), latency=np.zeros((S, 1), np.float32),
                  freshness=np.zeros((S, 1), np.float32), stake=np.ones((S, 1), np.float32),
                  previous=None if previous is None else col(previous))


@pytest.mark.parametrize("price, previous, shown", [
    ([1.6, 1.6, 1.8], [1.7, 1.5, 1.5], [1]),        # tie: seller 1 was cheaper before
    ([1.6, 1.6, 1.8], [1.6, 1.6, 1.4], [0, 1]),     # tie then too: both, 1/2 each (2 ignored)
    ([1.6, 1.5, 1.9], [1.0, 1.9, 1.9], [1]),        # no tie: the cheapest, whatever before
    ([1.5, 1.5, 1.5], [1.9, 1.6, 1.6], [1, 2]),     # three tied, two of them cheaper before
])
def test_dynamic_steering_shows_the_tied_sellers_cheapest_before(price, previous, shown):
    alloc = allocate(KEY, quotes(price, previous), CALVANO, {"steering": "lowest_price_dynamic"})
    m = min(price)
    want = np.zeros(len(price))
    want[shown] = alone(m) / len(shown)
    np.testing.assert_allclose(np.asarray(alloc.traffic[:, 0]), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(alloc.fees[:, 0]), want * m, atol=1e-6)
    total = float(alloc.traffic.sum() + alloc.unserved.sum())
    assert total == pytest.approx(float(alloc.sent.sum()), rel=1e-6)


def test_dynamic_steering_without_previous_prices_is_an_error():
    with pytest.raises(ValueError, match="previous"):
        allocate(KEY, quotes([1.6, 1.6], None), CALVANO, {"steering": "lowest_price_dynamic"})


@pytest.fixture(scope="module")
def plan():
    return session_plan(load_config(ROOT / "configs" / "johnson2023.yaml", DYNAMIC))


@pytest.fixture(scope="module")
def game(plan):
    return make_game(plan)


def test_market_steps_reward_the_seller_that_cut_first(plan):
    """The loop market's own steps: a tie goes to the seller that was cheaper last period,
    a tie after a tie is split."""
    env, params = plan.env, plan.params
    assert env.lagged
    _, state = env.reset_env(KEY, params)
    got = []
    for prices in ([1.8, 1.6], [1.6, 1.6], [1.6, 1.6], [1.5, 1.7], [1.6, 1.6]):
        act = {"sellers": jnp.asarray(prices, jnp.float32)[:, None]}
        _, state, reward, _, _ = env.step_env(KEY, state, act, params)
        got.append(np.asarray(reward["sellers"]))
    profit = lambda p: (p - 1.0) * alone(p)  # noqa: E731  (cost 1)
    want = [[0, profit(1.6)], [0, profit(1.6)], [profit(1.6) / 2] * 2, [profit(1.5), 0],
            [profit(1.6), 0]]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)


def test_pair_tables_are_the_market_step_after_the_previous_profile(plan, game):
    """Row ``p J + j`` of the session game is the loop market's reward of profile ``j``
    played the period after ``p``; a profile's one-shot row is ``j`` held."""
    env, params = plan.env, plan.params
    J, m = game.profiles, game.grid.size
    assert game.lagged and game.reward.shape == (J * J, 2)
    prices = np.asarray(game.grid.prices, np.float32)
    rng = np.random.default_rng(0)
    pairs = [((3, 7), (7, 7)), ((7, 3), (7, 7)), ((7, 7), (7, 7)), ((2, 9), (5, 1))]
    pairs += [(tuple(rng.integers(0, m, 2)), tuple(rng.integers(0, m, 2))) for _ in range(4)]
    for before, now in pairs:
        _, state = env.reset_env(KEY, params)
        for a in (before, now):
            act = {"sellers": jnp.asarray(prices[list(a)])[:, None]}
            _, state, reward, _, _ = env.step_env(KEY, state, act, params)
        row = (before[0] * m + before[1]) * J + now[0] * m + now[1]
        np.testing.assert_array_equal(np.asarray(game.reward[row]), np.asarray(reward["sellers"]))
    held = np.asarray(game.expected_reward)
    j = np.arange(J)
    np.testing.assert_array_equal(held, np.asarray(game.reward)[j * J + j])


def test_kernel_plays_the_lagged_game_bit_for_bit_with_xla(game):
    out = {b: eng.run(game, eng.Settings(32, 12_000, 4_000, "periods", 500, b),
                      jax.random.key(5)) for b in ("xla", "kernel")}
    assert out["kernel"].backend == "kernel", "auto/kernel should play a lagged game"
    a, b = out["xla"], out["kernel"]
    for field in ("index", "tail"):
        np.testing.assert_array_equal(np.asarray(getattr(a.sessions, field)),
                                      np.asarray(getattr(b.sessions, field)))
    np.testing.assert_array_equal(np.asarray(a.sessions.learner.rows),
                                  np.asarray(b.sessions.learner.rows))
    np.testing.assert_array_equal(a.cycle_reward, b.cycle_reward)
    # the rule matters: the same sessions on the pair table's held rows alone differ
    import dataclasses
    J = game.profiles
    flat = dataclasses.replace(game, lagged=False, reward=game.expected_reward,
                               fees=game.expected(game.fees))
    plain = eng.run(flat, eng.Settings(32, 12_000, 4_000, "periods", 500, "xla"),
                    jax.random.key(5))
    assert not np.array_equal(np.asarray(plain.sessions.tail), np.asarray(a.sessions.tail))
    assert J == 225


def brute_force(reward, nxt, delta, J, steps=600):
    """``V [J, n]`` and ``Q [J, n, m]`` of one strategy profile by playing it out: the
    profit of profile ``p`` after state ``x`` is ``reward[x J + p]``."""
    n = reward.shape[1]
    m = round(J ** (1 / n))

    def value(x):
        v, w = np.zeros(n), 1.0
        for _ in range(steps):
            p = nxt[x]
            v += w * reward[x * J + p]
            w *= delta
            x = p
        return v
    V = np.array([value(x) for x in range(J)])
    Q = np.zeros((J, n, m))
    for x in range(J):
        digits = [(nxt[x] // m ** (n - 1 - i)) % m for i in range(n)]
        for i in range(n):
            for a in range(m):
                d = list(digits)
                d[i] = a
                p = sum(d[k] * m ** (n - 1 - k) for k in range(n))
                Q[x, i, a] = reward[x * J + p, i] + delta * V[p, i]
    return V, Q


def test_diagnostics_read_the_pair_of_state_and_profile():
    """The equilibrium check of a lagged game against the profile played out by hand, on a
    game where the profit of a profile depends on the one before it."""
    m, n = 2, 2
    J = m ** n
    rng = np.random.default_rng(3)
    reward = rng.uniform(0.0, 1.0, (J * J, n))
    delta = 0.9
    state = np.repeat(np.arange(J)[:, None], n, axis=1)            # memory 1
    greedy = rng.integers(0, m, (1, n, J))                          # one session
    radix = m ** np.arange(n - 1, -1, -1)
    nxt = (greedy[0].T * radix).sum(-1)                             # [J]
    _, Q = brute_force(reward, nxt, delta, J)
    best = Q.max(-1)
    played = np.take_along_axis(Q, greedy[0].T[..., None], -1)[..., 0]
    br = played >= best - 1e-9 * np.maximum(np.abs(best), 1.0)
    d = diagnose(reward, state, greedy, m, delta, np.zeros(1, np.int64), lagged=True)
    np.testing.assert_allclose(d.br_all[0], br.mean(0))
    np.testing.assert_allclose(d.gap_all[0], ((best - played) / np.abs(best)).mean(0),
                               rtol=1e-9)
    assert bool(d.spe[0]) == bool(br.all())
    # the same strategies judged on the current profile alone score differently
    held = reward[np.arange(J) * J + np.arange(J)]
    other = diagnose(held, state, greedy, m, delta, np.zeros(1, np.int64))
    assert not np.allclose(other.gap_all, d.gap_all)


@pytest.mark.parametrize("extra, field", [
    (["learners.sellers.feedback=full", "learners.sellers.memory=0",
      "market.sellers[0].observation=[]"], "feedback: full"),
    (["learners.sellers.memory=2",
      "market.sellers[0].observation=[{kind: history, k: 2}]"], "history k=2"),
    (["market.distributor.shock_values=[0.0, 0.5]",
      "market.distributor.shock_probs=[0.5, 0.5]"], "random period outcomes"),
])
def test_lagged_rule_refusals_name_the_setting(extra, field):
    config = load_config(ROOT / "configs" / "johnson2023.yaml", DYNAMIC + extra)
    with pytest.raises(ValueError, match=field) as err:
        make_game(session_plan(config))
    assert "last period's prices" in str(err.value)


@pytest.mark.slow   # a training command and three impulse commands: about 45 s
def test_a_lagged_run_replays_its_cycle_from_its_files(tmp_path):
    """``python -m jaxmarket.train`` on the rule: each session's greedy limit-cycle profit
    in ``sessions.csv`` is the pair table read along the cycle the saved strategies play,
    replayed here by hand; ``--check`` recomputes summary.json's equilibrium check and
    the impulse command replays the run with its profits."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "jaxmarket.train", str(ROOT / "configs" / "johnson2023.yaml"),
           "--run-dir", str(run), "train.num_seeds=4", "train.num_iterations=30000",
           "train.chunk_size=10000", *DYNAMIC]
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["engine"] == "sessions" and "equilibrium_check" in summary
    # the benchmarks say they are of a profile held (the rule reads last period's prices)
    assert "in force the period before" in summary["benchmarks"]["sellers"]["method"]
    s = np.load(run / "strategies.npz")
    assert bool(s["lagged"])
    table, greedy, last = s["profit_table"], s["greedy"], s["last"]
    m = s["grid"].shape[-1]
    J = m * m
    assert table.shape == (J * J, 2)
    import csv
    rows = list(csv.DictReader((run / "sessions.csv").open()))
    for i in range(4):
        x = int(last[i, 0]) * m + int(last[i, 1])
        nxt = lambda y: int(greedy[i, 0, y]) * m + int(greedy[i, 1, y])  # noqa: E731
        for _ in range(J):   # onto the cycle
            x = nxt(x)
        start, total, length = x, np.zeros(2), 0
        while True:
            p = nxt(x)
            total += table[x * J + p]
            length += 1
            x = p
            if x == start:
                break
        mean = total / length
        got = [float(rows[i][k]) for k in rows[i] if k.startswith("cycle_profit_")]
        np.testing.assert_allclose(got, mean, rtol=1e-5, atol=1e-7)
    check = subprocess.run([sys.executable, "-m", "jaxmarket.impulse", str(run), "--check",
                            "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout.strip().splitlines()[-1]) == summary["equilibrium_check"]
    out = subprocess.run([sys.executable, "-m", "jaxmarket.impulse", str(run), "--json"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["profit"] is not None and len(found["profit"]) == 15


def test_impulse_of_a_lagged_table_is_the_hand_replay():
    """Two prices, two agents who always play price 1 (the cycle: state (1, 1)); agent 0
    deviates to price 0 once. Its profits are the pair table's rows along the path
    ``(1,1) -> (0,1) -> (1,1) -> ...``, and its discounted gain (delta 0.9) is
    ``R[11,01] - R[11,11] + delta (V(01) - V(11))`` with ``V(01) = R[01,11] + delta
    V(11)`` and ``V(11) = R[11,11] / (1 - delta)``."""
    from jaxmarket.analysis.impulse import Strategies, impulse_response, impulse_response_all
    m, n, J, delta = 2, 2, 4, 0.9
    R = np.random.default_rng(7).uniform(0.0, 1.0, (J * J, n))

    def pair(before, now):
        return R[(before[0] * m + before[1]) * J + now[0] * m + now[1]]
    s = Strategies(greedy=np.ones((1, n, J), np.int64), last=np.array([[1, 1]]),
                   grid=np.array([1.0, 2.0]), memory=1, profit_table=R, discount=delta,
                   lagged=True)
    got = impulse_response(s, agent=0, deviation=1.0, periods=4)
    want = [pair((1, 1), (0, 1)), pair((0, 1), (1, 1)), pair((1, 1), (1, 1)),
            pair((1, 1), (1, 1))]
    np.testing.assert_allclose(got.profit, want)
    np.testing.assert_allclose(got.counterfactual_profit, [pair((1, 1), (1, 1))] * 4)
    v11 = pair((1, 1), (1, 1)) / (1 - delta)
    v01 = pair((0, 1), (1, 1)) + delta * v11
    gain = pair((1, 1), (0, 1)) - pair((1, 1), (1, 1)) + delta * (v01 - v11)
    every = impulse_response_all(s, agent=0, periods=4, resamples=10)
    np.testing.assert_allclose(every.discounted_gain[0, 0], gain[0], rtol=1e-9)
    np.testing.assert_allclose(every.discounted_gain[0, 1], 0.0, atol=1e-12)
    # the best response after state (1, 1) against the rival's price 1
    best = int(np.argmax([pair((1, 1), (a, 1))[0] for a in range(m)]))
    br = impulse_response(s, agent=0, deviation="best_response", periods=4)
    assert float(br.deviation_index[0]) == best
