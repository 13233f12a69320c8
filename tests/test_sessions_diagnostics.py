"""The authors' diagnostics of learned strategies (jaxmarket.sessions.diagnostics) on hand
examples whose answers are known: the prisoner's dilemma of prices L < H with grim
trigger (subgame perfect), always-Nash (an equilibrium), a pair that does not punish
(not one, with the gap worked out here), and the Bellman identity of the values on
random strategies."""

from __future__ import annotations

import numpy as np
import pytest

from jaxmarket.sessions.diagnostics import diagnose, limit_cycle, profile_values

DELTA = 0.9
L, H = 0, 1
# profile j = 2 a_0 + a_1: (L,L), (L,H), (H,L), (H,H)
REWARD = np.array([[1.0, 1.0], [4.0, 0.0], [0.0, 4.0], [3.0, 3.0]])
STATE = np.repeat(np.arange(4)[:, None], 2, axis=1)   # memory 1: the profile itself
HH = 3


def strategies(*rules) -> np.ndarray:
    """``[S, 2, 4]``: one session per rule, the same rule for both firms."""
    return np.array([[[rule(j) for j in range(4)]] * 2 for rule in rules])


GRIM = lambda j: H if j == HH else L          # noqa: E731
ALWAYS_NASH = lambda j: L                     # noqa: E731
NO_PUNISHMENT = lambda j: H                   # noqa: E731


def test_grim_trigger_is_subgame_perfect_always_nash_too_no_punishment_is_not():
    d = diagnose(REWARD, STATE, strategies(GRIM, ALWAYS_NASH, NO_PUNISHMENT), m=2,
                 delta=DELTA, start=np.array([HH, HH, HH]))
    np.testing.assert_array_equal(d.spe, [True, True, False])
    np.testing.assert_array_equal(d.nash_on_path, [True, True, False])
    np.testing.assert_array_equal(d.br_all[:2], 1.0)
    # the cycles: (H,H) for grim trigger and no punishment, (L,L) for always-Nash
    np.testing.assert_array_equal(d.on_path, [[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1]])
    # no punishment: deviating to L in (H,H) earns 4 now and cooperation after it,
    # 4 + delta 3 / (1 - delta) = 31, against 3 / (1 - delta) = 30
    cooperate, deviate = 3 / (1 - DELTA), 4 + DELTA * 3 / (1 - DELTA)
    np.testing.assert_allclose(d.gap_path[2], (deviate - cooperate) / deviate, rtol=1e-12)
    np.testing.assert_array_equal(d.br_path[2], [0.0, 0.0])
    # every state leads to (H,H) forever, so in each a one-shot L is worth 31 against
    # H's 30: the non-punisher best-replies nowhere
    np.testing.assert_array_equal(d.br_all[2], [0.0, 0.0])
    assert np.all(d.gap_all[:2] == 0.0)


def test_a_grim_trigger_below_the_critical_discount_is_not_an_equilibrium():
    # cooperation pays 3 / (1 - delta); a deviation 4 + delta / (1 - delta): it holds iff
    # delta >= 1/3 (the folk-theorem threshold of this game)
    for delta, holds in ((0.34, True), (0.32, False)):
        d = diagnose(REWARD, STATE, strategies(GRIM), m=2, delta=delta, start=np.array([HH]))
        assert bool(d.spe[0]) is holds and bool(d.nash_on_path[0]) is holds


def test_values_satisfy_bellman_and_the_learned_q_error_is_zero_at_the_true_q():
    rng = np.random.default_rng(0)
    m, n = 3, 2
    J = m ** n
    reward = rng.uniform(0, 1, (J, n))
    state = np.repeat(np.arange(J)[:, None], n, axis=1)
    greedy = rng.integers(0, m, (5, n, J))
    radix = m ** np.arange(n - 1, -1, -1)
    actions = greedy[:, np.arange(n), state]
    nxt = (actions * radix).sum(-1)
    V = profile_values(reward, nxt, 0.95)
    rows = np.arange(5)[:, None]
    np.testing.assert_allclose(V, reward[nxt] + 0.95 * V[rows, nxt], rtol=1e-12)
    from jaxmarket.sessions.diagnostics import true_q
    Q = true_q(reward, actions, V, m, 0.95)                   # [S, J, n, m]
    learned = np.transpose(Q, (0, 2, 1, 3))                   # [S, n, J(states), m]
    d = diagnose(reward, state, greedy, m, 0.95, start=np.zeros(5, int), q=learned)
    np.testing.assert_allclose(d.q_error, 0.0, atol=1e-15)
    d2 = diagnose(reward, state, greedy, m, 0.95, start=np.zeros(5, int), q=learned * 1.1)
    np.testing.assert_allclose(d2.q_error, 0.1, rtol=1e-9)
    # a firm's own Q at its played action is the profile's value
    played = np.take_along_axis(Q, actions[..., None], -1)[..., 0]
    np.testing.assert_allclose(played, reward[nxt] + 0.95 * V[rows, nxt], rtol=1e-12)


def test_a_sessions_numbers_are_its_own_however_the_sessions_are_blocked(monkeypatch):
    # Bugs caught: a session's numbers depending on the sessions computed beside it (the
    # blocks of sessions, the threads that compute them), or the per-firm shares over
    # all states laid out otherwise than the means over sessions of summary.json were
    # summed from (sessions innermost; C order where each block held one session).
    from jaxmarket.sessions import diagnostics
    rng = np.random.default_rng(1)
    m, n, S = 3, 2, 9
    J = m ** n
    reward = rng.uniform(-1, 1, (J, n))
    state = np.repeat(np.arange(J)[:, None], n, axis=1)
    greedy = rng.integers(0, m, (S, n, J))
    q = rng.uniform(-1, 1, (S, n, J, m)).astype(np.float32)
    start = rng.integers(0, J, S)
    together = diagnose(reward, state, greedy, m, 0.9, start, q)
    assert together.br_all.flags.f_contiguous and together.gap_all.flags.f_contiguous
    alone = [diagnose(reward, state, greedy[s:s + 1], m, 0.9, start[s:s + 1], q[s:s + 1])
             for s in range(S)]
    monkeypatch.setattr(diagnostics, "SUB_ENTRIES", 2 * J * n * m)   # float blocks of 2
    monkeypatch.setattr(diagnostics, "MAX_ENTRIES", 4 * J * n)        # blocks of 4
    blocked = diagnose(reward, state, greedy, m, 0.9, start, q)
    monkeypatch.setattr(diagnostics, "MAX_ENTRIES", 1)                # one session each
    single = diagnose(reward, state, greedy, m, 0.9, start, q)
    assert single.br_all.flags.c_contiguous and single.gap_all.flags.c_contiguous
    for field in diagnostics.Diagnostics.__dataclass_fields__:
        want = getattr(together, field)
        for got in (blocked, single):
            np.testing.assert_array_equal(getattr(got, field), want)
        np.testing.assert_array_equal(np.concatenate([getattr(a, field) for a in alone]), want)


def test_a_rows_sum_is_numpys_pairwise_sum_to_the_bit():
    # Bugs caught: an accumulator, block or remainder of numpy's pairwise sum added in
    # another order (the learned-Q error's last bits would differ from numpy's sum).
    from jaxmarket.sessions.diagnostics import PAIRWISE_BLOCK, _row_sum
    rng = np.random.default_rng(5)
    for m in range(1, PAIRWISE_BLOCK + 1):
        v = rng.normal(size=m) * 10.0 ** rng.uniform(-8, 8, m)
        assert _row_sum(v, m) == np.add.reduce(v), m


@pytest.mark.parametrize("m, n, memory", [(2, 2, 1), (3, 3, 1), (7, 2, 1), (8, 2, 1),
                                          (9, 3, 1), (17, 2, 1), (3, 2, 2), (100, 2, 1)])
def test_the_learned_q_error_row_by_row_is_numpys_sum_over_the_tables(monkeypatch, m, n,
                                                                      memory):
    # Bugs caught: the row-by-row learned-Q error reading another firm's, state's or
    # price's entry of the learned or true tables, or adding its rows in another order
    # than numpy's sum over the [S, Z, n, m] tables (its figures would move in their last
    # bits); a learned table that is a strided slice (the learners' rows) read wrongly.
    from jaxmarket.sessions import diagnostics
    rng = np.random.default_rng(m * 10 + n)
    J = m ** n
    Z, S = J ** memory, 3
    reward = rng.normal(size=(J, n)) * 10.0 ** rng.uniform(-3, 3, (J, n))
    state = np.repeat(np.arange(Z)[:, None], n, axis=1)
    rows = (rng.normal(size=(S, n, Z, m + 1)) * 50).astype(np.float32)
    q = rows[..., :m]                                         # a strided view
    greedy = q.argmax(-1)
    start = rng.integers(0, Z, S)
    assert diagnostics._fused_sums(False, n, m)
    fused = diagnose(reward, state, greedy, m, 0.9, start, q, memory=memory)
    monkeypatch.setattr(diagnostics, "_fused_sums", lambda *a: False)
    tables = diagnose(reward, state, greedy, m, 0.9, start, q, memory=memory)
    assert fused.q_error.tobytes() == tables.q_error.tobytes()
    assert np.all(fused.q_error > 0)


def test_the_limit_cycle_is_the_set_of_states_the_path_returns_to():
    nxt = np.array([[1, 2, 3, 1]])          # 0 -> 1 -> 2 -> 3 -> 1: the cycle {1, 2, 3}
    np.testing.assert_array_equal(limit_cycle(nxt, np.array([0])), [[False, True, True, True]])
    with pytest.raises(IndexError):
        limit_cycle(nxt, np.array([7]))


# ------------------------------------------------- the join: a real run, checked naively

def naive_q(reward, greedy, m, delta, j, i, a, horizon=1500) -> float:
    """Firm i plays grid index a once in state j (the last profile), then everyone the
    greedy strategies: the discounted profit summed period by period (memory 1, n = 2)."""
    profile = [greedy[0, j], greedy[1, j]]
    profile[i] = a
    total, weight = 0.0, 1.0
    for _ in range(horizon):   # plain periods, no doubling, no tables of Q
        row = profile[0] * m + profile[1]
        total += weight * reward[row, i]
        weight *= delta
        profile = [greedy[0, row], greedy[1, row]]
    return total


def test_a_runs_check_is_the_naive_one_on_its_limit_cycle(tmp_path):
    # Bugs caught: the summary's check computed on other strategies than the run's, the
    # CSV columns out of order, a doubling or gather error in the values.
    import json

    import pandas as pd

    from jaxmarket.analysis.equilibrium_check import equilibrium_check
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.train import main as train_main
    run = tmp_path / "run"
    assert run_cli(train_main, ["configs/calvano.yaml", "--run-dir", str(run),
                                "train.num_seeds=3", "train.num_iterations=4000",
                                "train.chunk_size=2000", "train.session_stop=periods"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert equilibrium_check(run) == summary["equilibrium_check"]
    rows = pd.read_csv(run / "sessions.csv")
    with np.load(run / "strategies.npz") as f:
        greedy, last, reward = f["greedy"], f["last"], f["profit_table"]
    m, delta = 15, 0.95
    for s in range(3):
        g = greedy[s]
        j, seen = int(last[s, 0] * m + last[s, 1]), []
        while j not in seen:   # the limit cycle, followed by hand
            seen.append(j)
            j = int(g[0, j] * m + g[1, j])
        cycle = seen[seen.index(j):]
        br, gaps = np.zeros(2), np.zeros(2)
        for i in (0, 1):
            for state in cycle:
                q = np.array([naive_q(reward, g, m, delta, state, i, a) for a in range(m)])
                own = q[g[i, state]]
                br[i] += own >= q.max() - 1e-9 * max(abs(q.max()), 1.0)
                gaps[i] += (q.max() - own) / abs(q.max())
        br, gaps = br / len(cycle), gaps / len(cycle)
        np.testing.assert_allclose(rows.loc[s, ["best_reply_on_path_0", "best_reply_on_path_1"]],
                                   br, atol=1e-12)
        np.testing.assert_allclose(rows.loc[s, ["q_gap_on_path_0", "q_gap_on_path_1"]], gaps,
                                   rtol=1e-6, atol=1e-12)
        assert rows.loc[s, "nash_on_path"] == int(br.min() == 1.0)
    assert summary["equilibrium_check"]["nash_on_path"]["mean"] == \
        pytest.approx(rows["nash_on_path"].mean())
