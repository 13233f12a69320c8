"""The authors' diagnostics of learned strategies (Calvano et al. 2020's replication code):
is a session's greedy strategy profile an equilibrium of the repeated game, and how far
is each firm from its best reply.

The game a session plays (:mod:`jaxmarket.sessions.game`, simultaneous moves, one
outcome per period): the system's state is the last price profile ``j`` (``J = m^n``
of them; a firm's own state ``state[j, i]`` is what it observes of ``j``: the profile
itself under ``history k: 1``, one state under memory 0), firm ``i`` plays
``sigma_i(j) = greedy[i, state[j, i]]`` and the next state is the profile played,
``next(j) = sum_i sigma_i(j) m^(n-1-i)``; ``R[j, i]`` is firm ``i``'s profit of
profile ``j``. Everything below is exact (float64), computed from these tables for every
session at once.

Memory ``k > 1``: the system's state is the history of the last ``k`` profiles, ``y =
sum_l j_l J^(k-1-l)`` (``Z = J^k`` states, the most recent profile ``y // J^(k-1)``),
firm ``i``'s own state ``state[y, i]``, the next state ``next(y) = p J^(k-1) + y // J``
after profile ``p`` is played, and the reward of a state is that of its most recent
profile, ``R[y // J^(k-1)]``. Every formula below holds with ``j`` read as ``y``.

A rule on last period's prices (``lagged``, memory 1): a period's profit depends on the
state ``j`` (the profile in force before it) and the profile played ``p``, ``R[j J + p,
i]`` (the session game's pair rows); below, ``R[p]`` after state ``j`` reads that row.

* **Value of the profile**, ``V_i(j) = sum_{t>=0} delta^t R[next^{t+1}(j), i]`` (the
  path from ``j`` is deterministic and ends in a cycle), summed by doubling: with
  ``A_0 = R[next(.)]`` and ``N_0 = next``, ``A_{k+1} = A_k + delta^{2^k} A_k o N_k`` and
  ``N_{k+1} = N_k o N_k``, so ``A_k`` holds the first ``2^k`` terms. Where the firms'
  learners discount differently (``discount: [delta_1, ..., delta_n]``), ``delta`` in
  ``V_i`` and ``Q_i`` below is firm ``i``'s own ``delta_i``.
* **True Q of the profile**: firm ``i`` plays ``a`` once in state ``j``, then everyone
  follows the profile, ``Q_i(j, a) = R[p, i] + delta V_i(p)`` with ``p`` the profile of
  ``a`` and the others' ``sigma_k(j)``.
* **Best reply**: ``sigma_i(j)`` is a best reply in ``j`` when ``Q_i(j, sigma_i(j)) >=
  max_a Q_i(j, a)`` (to :data:`TOL` relative). By the one-shot deviation principle the
  profile is a **subgame perfect equilibrium** iff every firm best-replies in every
  state, and a **Nash equilibrium on path** iff every firm best-replies in every state of
  the limit cycle (the greedy play from the session's last profile).
* **Q-gap to the maximum** (the authors' ``QGapToMaximum``): ``(max_a Q_i(j, a) -
  Q_i(j, sigma_i(j))) / |max_a Q_i(j, a)|``, the share of the best value a firm forgoes by
  following its strategy, averaged over states (all, or the cycle's).
* **Learned-Q error**: ``sum_{j,a} |Qhat_i(state[j, i], a) - Q_i(j, a)| / sum_{j,a}
  |Q_i(j, a)|``, how far firm ``i``'s learned table is from the true Q of the profile it
  learned.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

#: a strategy's value counts as the maximum within this, relative
TOL = 1e-9


@dataclass(frozen=True)
class Diagnostics:
    """Per session (and firm): the shares of states where each firm best-replies
    (``br_all``, ``br_path`` ``[S, n]``), whether the profile is a Nash equilibrium on
    path and subgame perfect (``nash_on_path``, ``spe`` ``[S]``), the Q-gap to the maximum
    (``gap_all``, ``gap_path`` ``[S, n]``) and the learned-Q error (``q_error`` ``[S, n]``,
    NaN without learned tables), and the limit cycle's states (``on_path`` ``[S, J]``)."""

    br_all: np.ndarray
    br_path: np.ndarray
    nash_on_path: np.ndarray
    spe: np.ndarray
    gap_all: np.ndarray
    gap_path: np.ndarray
    q_error: np.ndarray
    on_path: np.ndarray


def profile_values(reward: np.ndarray, nxt: np.ndarray, delta: Any,
                   offset: np.ndarray | int = 0) -> np.ndarray:
    """``V [S, J, n]``: each firm's discounted profit from each state following the
    profile, ``reward [J, n]``, ``nxt [S, J]`` the next state (module docstring);
    ``delta`` one discount, or ``[n]`` each firm ``i``'s own ``delta_i`` (``V_i`` is
    then discounted by ``delta_i``); ``offset [J]``: the reward row of state ``j``'s
    step is ``offset[j] + nxt`` (a lagged game's ``j J``; 0: ``nxt``)."""
    R = np.asarray(reward, np.float64)
    S, J = nxt.shape
    n = R.shape[1]
    acc = np.take(R, nxt + offset if np.ndim(offset) else nxt, axis=0)   # [S, J, n]: A_0
    hop = nxt + (np.arange(S) * J)[:, None]                   # N_0, flat over sessions
    # delta: one for every firm, or [n] each firm's own (then the weight is per firm)
    weight = float(delta) if np.ndim(delta) == 0 else np.asarray(delta, np.float64)
    while np.max(weight) > 1e-300:                            # delta^(2^k): 2^k terms held
        ahead = np.take(acc.reshape(S * J, n), hop, axis=0)   # A_k o N_k
        ahead *= weight
        acc = acc + ahead
        hop = np.take(hop.ravel(), hop)
        weight = weight * weight
    return acc


def true_q(reward: np.ndarray, actions: np.ndarray, values: np.ndarray, m: int,
           delta: Any, memory: int = 1, lagged: bool = False) -> np.ndarray:
    """``Q [S, Z, n, m]``: firm ``i`` plays ``a`` once in state ``y``, the others their
    ``actions [S, Z, n]``, then everyone the profile (``values``: :func:`profile_values`);
    ``delta``: one, or ``[n]`` each firm's own (``Q_i = R_i + delta_i V_i``); the state
    after profile ``p`` is ``p J^(k-1) + y // J`` (memory ``k``; ``Z = J^k``);
    ``lagged`` (memory 1): ``reward [J^2, n]``, the profit of ``p`` after state ``y`` is
    ``R[y J + p]``."""
    if lagged:
        return _true_q_lagged(reward, actions, values, m, delta)
    return _gather_q(*_reply_table(reward, actions, values, m, delta, memory))


def _reply_table(reward: np.ndarray, actions: np.ndarray, values: np.ndarray, m: int,
                 delta: Any, memory: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`true_q` as a table and its index: ``table [S, n, Z / m, m]``, firm ``i``'s
    value ``W_i`` of the state after each of its ``m`` prices (innermost) with the rest
    of that state fixed, and ``rest [S, Z, n]``, the row of ``table[s, i]`` that the
    others' moves in state ``y`` (and, memory ``k > 1``, the older profiles kept) select,
    so that ``Q_i(y, a) = table[s, i, rest[s, y, i], a]`` (memory ``k``, not lagged)."""
    S, J, n = actions.shape
    R = np.asarray(reward, np.float64)
    profiles, Z = R.shape[0], values.shape[1]
    d = delta if np.ndim(delta) == 0 else np.asarray(delta, np.float64)   # [n]
    # W[s, y, i] = R[p(y), i] + delta_i V_i(y): firm i's value of reaching state y (its
    # profile p(y) = y // J^(k-1) played); Q_i(j, a) is W at the state after (j, a)
    W = values * d
    W += R[np.arange(Z) // profiles ** (memory - 1)] if memory > 1 else R
    radix = m ** np.arange(n - 1, -1, -1)                     # [n]
    moves = actions * radix
    after = moves.sum(-1)[..., None] - moves                  # [S, J, n]: the others' part
    step = radix * profiles ** (memory - 1)                   # the state per own price
    if memory > 1:
        after = after * profiles ** (memory - 1) + (np.arange(J) // profiles)[:, None]
    # the state's digits above and below firm i's own price (of weight step_i) -> a row
    rest = after // (step * m) * step + after % step
    table = np.stack([W[:, :, i].reshape(S, Z // (step[i] * m), m, step[i])
                      .transpose(0, 1, 3, 2).reshape(S, Z // m, m) for i in range(n)], 1)
    return table, rest


def _gather_q(table: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """``Q [S, Z, n, m]`` from :func:`_reply_table`'s rows: one row of ``m`` per (state, firm)."""
    S, _, n = rest.shape
    return np.ascontiguousarray(table[np.arange(S)[:, None, None], np.arange(n), rest])


def _true_q_lagged(reward: np.ndarray, actions: np.ndarray, values: np.ndarray, m: int,
                   delta: Any) -> np.ndarray:
    """:func:`true_q` of a lagged game (memory 1): ``Q_i(y, a) = R[y J + p, i] + delta_i
    V_i(p)``, ``p`` the profile of ``a`` and the others' ``sigma_k(y)``."""
    S, J, n = actions.shape
    R = np.asarray(reward, np.float64)
    d = delta if np.ndim(delta) == 0 else np.asarray(delta, np.float64)[:, None]   # [n, 1]
    radix = m ** np.arange(n - 1, -1, -1)                     # [n]
    moves = actions * radix
    others = moves.sum(-1)[..., None] - moves                 # [S, J, n]
    prof = others[..., None] + np.arange(m) * radix[:, None]  # [S, J, n, m]
    own = np.arange(n)[:, None]
    pay = prof + (np.arange(J) * J)[:, None, None]            # the pair (y, p)
    return R[pay, own] + d * values[np.arange(S)[:, None, None, None], prof, own]


def limit_cycle(nxt: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``[S, J]`` the states of the cycle the path from ``start [S]`` ends in (after ``J``
    steps every path is on its cycle; ``J`` more mark it; ``J``: the states, histories
    under memory ``k > 1``)."""
    S, J = nxt.shape
    rows = np.arange(S)
    x = np.asarray(start, np.int64)
    for _ in range(J):   # steps of the path (time), every session at once
        x = nxt[rows, x]
    marks = np.zeros((S, J), bool)
    for _ in range(J):
        marks[rows, x] = True
        x = nxt[rows, x]
    return marks


#: most entries of the ``[sessions, Z, n]`` action table held at once (int64; its limit
#: cycles followed together)
MAX_ENTRIES = 1 << 24
#: most entries of the ``[sessions, Z, n, m]`` true-Q table held at once (float64: 16 MiB
#: arrays, which the allocator reuses from block to block)
SUB_ENTRIES = 1 << 21


def diagnose(reward: np.ndarray, state: np.ndarray, greedy: np.ndarray, m: int,
             delta: Any, start: np.ndarray, q: np.ndarray | None = None,
             memory: int = 1, lagged: bool = False) -> Diagnostics:
    """The diagnostics of every session (module docstring): ``reward [J, n]``, ``state
    [Z, n]`` (each firm's own state after each history, ``Z = J^k``; memory 1: after each
    profile), ``greedy [S, n, N]`` (action indices of the learners' ``N`` states),
    ``start [S]`` (the history the limit cycle is followed from), ``q [S, n, N, m]`` the
    learned tables (None: no learned-Q error); ``lagged``: ``reward [J^2, n]`` of the
    (state, profile) pairs (module docstring; memory 1). Sessions go in blocks of at most
    :data:`MAX_ENTRIES` actions, and within them of :data:`SUB_ENTRIES` true-Q entries
    (the memory bound of a 100-price grid)."""
    S = np.asarray(greedy).shape[0]
    n = np.asarray(reward).shape[1]
    Z = np.asarray(state).shape[0]
    block = max(1, MAX_ENTRIES // (Z * n))
    parts = [_diagnose(reward, state, greedy[b:b + block], m, delta, start[b:b + block],
                       None if q is None else q[b:b + block], memory, lagged)
             for b in range(0, S, block)]   # blocks of sessions, each vectorised
    out = {f: np.concatenate([getattr(p, f) for p in parts])
           for f in Diagnostics.__dataclass_fields__}
    # their layout: a mean over sessions (check_summary) sums in its memory order
    inner = np.asfortranarray if MAX_ENTRIES // (Z * n * m) > 1 else np.ascontiguousarray
    for f in _SESSIONS_INNER:
        out[f] = inner(out[f])
    return Diagnostics(**out)


def _diagnose(reward: np.ndarray, state: np.ndarray, greedy: np.ndarray, m: int,
              delta: Any, start: np.ndarray, q: np.ndarray | None,
              memory: int = 1, lagged: bool = False) -> Diagnostics:
    greedy = np.asarray(greedy, np.int64)
    S, n, _ = greedy.shape
    firms = np.arange(n)
    state = np.asarray(state, np.int64)
    actions = greedy[:, firms, state]                         # [S, Z, n]
    radix = m ** np.arange(n - 1, -1, -1)
    nxt = (actions * radix).sum(-1)                           # [S, Z]
    own_reward = reward
    if memory > 1:   # states are histories: next(y) = p J^(k-1) + y // J
        J = np.asarray(reward).shape[0]
        y = np.arange(state.shape[0])
        nxt = nxt * J ** (memory - 1) + y // J
        own_reward = np.asarray(reward)[y // J ** (memory - 1)]   # [Z, n]
    path = limit_cycle(nxt, start)                            # [S, J]
    # the float work in smaller blocks of sessions (each session's numbers are its own)
    step = max(1, SUB_ENTRIES // (state.shape[0] * n * m))

    def part(b: int) -> dict:
        return _float_part(reward, own_reward, state, actions[b:b + step], nxt[b:b + step],
                           path[b:b + step], m, delta, None if q is None else q[b:b + step],
                           memory, lagged)

    starts = range(0, S, step)
    workers = min(len(starts), os.cpu_count() or 1)
    if workers > 1:   # numpy releases the GIL: the blocks on every core, in order
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(part, starts))
    else:
        parts = [part(b) for b in starts]
    return Diagnostics(*(np.concatenate([p[f] for p in parts]) for f in _FLOAT_FIELDS),
                       on_path=path)


def q_error(q: np.ndarray, state: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """The learned-Q error ``[S, n]`` (module docstring) of the learned tables ``q [S, n,
    N, m]`` against the true ``Q [S, Z, n, m]`` (overwritten with ``|Q|``), ``state [Z,
    n]`` each firm's own state: ``sum_{y,a} |q_i(state[y, i], a) - Q_i(y, a)| / sum_{y,a}
    |Q_i(y, a)|``, each sum numpy's over axes ``(y, a)``: each row of ``m`` summed
    pairwise (``np.add.reduce``), the rows added in the order of ``y``."""
    S, _, n, _ = Q.shape
    learned = q[np.arange(S)[:, None, None], np.arange(n), state].astype(np.float64)
    learned -= Q                                              # |learned - Q|, in place
    np.abs(learned, out=learned)
    np.abs(Q, out=Q)
    return learned.sum((1, 3)) / np.maximum(Q.sum((1, 3)), 1e-300)


#: numpy's pairwise sum adds a row of at most this many entries with eight accumulators
#: (larger rows it splits in halves: :func:`q_error` then)
PAIRWISE_BLOCK = 128


def _fused_sums(lagged: bool, n: int, m: int) -> bool:
    """Whether :func:`_q_error_rows` sums as :func:`q_error` does: rows of at most
    :data:`PAIRWISE_BLOCK`, and more than one firm (one firm's ``[S, Z, 1, m]`` table is
    summed by numpy over ``Z m`` entries at once, its axes merged), not lagged (whose
    true Q has no rows table)."""
    return not lagged and n > 1 and m <= PAIRWISE_BLOCK


@njit(nogil=True, cache=True)
def _row_sum(v: np.ndarray, m: int) -> float:   # pragma: no cover - compiled
    """``np.add.reduce(v[:m])`` to the bit (numpy's pairwise sum of ``m <= 128``: below 8
    one by one from 0; else eight accumulators over blocks of 8, combined as
    ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the rest one by one)."""
    if m < 8:
        res = 0.0
        for a in range(m):
            res += v[a]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    k = 8
    while k < m - m % 8:
        r0 += v[k]
        r1 += v[k + 1]
        r2 += v[k + 2]
        r3 += v[k + 3]
        r4 += v[k + 4]
        r5 += v[k + 5]
        r6 += v[k + 6]
        r7 += v[k + 7]
        k += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while k < m:
        res += v[k]
        k += 1
    return res


@njit(nogil=True, cache=True)
def _q_error_rows(q: np.ndarray, table: np.ndarray, rest: np.ndarray,
                  state: np.ndarray) -> np.ndarray:   # pragma: no cover - compiled
    """:func:`q_error` to the bit from :func:`_reply_table`'s rows (``Q_i(y, a) =
    table[s, i, rest[s, y, i], a]``), a row of ``m <= 128`` at a time: the same
    differences, the same pairwise row sums, added in the same order."""
    S, n, _, m = q.shape
    Z = rest.shape[1]
    out = np.empty((S, n))
    diff = np.empty(m)
    size = np.empty(m)
    for s in range(S):
        for i in range(n):
            num = 0.0
            den = 0.0
            for y in range(Z):
                row, own = rest[s, y, i], state[y, i]
                for a in range(m):
                    value = table[s, i, row, a]
                    diff[a] = abs(np.float64(q[s, i, own, a]) - value)
                    size[a] = abs(value)
                if y == 0:   # numpy's reduction starts from its first row's sum
                    num, den = _row_sum(diff, m), _row_sum(size, m)
                else:
                    num += _row_sum(diff, m)
                    den += _row_sum(size, m)
            out[s, i] = num / (1e-300 if den < 1e-300 else den)   # NaN stays NaN
    return out


def precompile() -> None:
    """Compile :func:`_q_error_rows` (or load numba's cache of it) for the arguments a
    run's check passes (a strided float32 view of the learners' rows; about a second
    on a fresh machine), by checking two sessions of a 3-price duopoly."""
    rows = np.zeros((2, 2, 9, 4), np.float32)
    diagnose(np.ones((9, 2)), np.repeat(np.arange(9)[:, None], 2, axis=1),
             np.zeros((2, 2, 9), np.int64), 3, 0.9, np.zeros(2, np.int64), rows[..., :3])


#: the :class:`Diagnostics` fields :func:`_float_part` computes (all but ``on_path``)
_FLOAT_FIELDS = ("br_all", "br_path", "nash_on_path", "spe", "gap_all", "gap_path", "q_error")
#: the ``[S, n]`` fields laid out sessions innermost (Fortran order), as the means over
#: states of ``[S, Z, n]`` tables indexed sessions innermost (``greedy[:, firms, state]``)
#: come out of blocks of sessions of at most MAX_ENTRIES true-Q entries (C order where
#: every such block holds one session): a mean over sessions
#: (:func:`jaxmarket.sessions.run.check_summary`) sums them in that memory order
_SESSIONS_INNER = ("br_all", "gap_all")


def _float_part(reward: np.ndarray, own_reward: np.ndarray, state: np.ndarray,
                actions: np.ndarray, nxt: np.ndarray, path: np.ndarray, m: int, delta: Any,
                q: np.ndarray | None, memory: int, lagged: bool = False) -> dict:
    S, Z, n = actions.shape
    offset = np.arange(Z) * Z if lagged else 0                # a lagged game's pair rows
    values = profile_values(own_reward, nxt, delta, offset)
    fused = _fused_sums(lagged, n, m)
    if lagged:
        Q = true_q(reward, actions, values, m, delta, memory, lagged)   # [S, Z, n, m]
        best = Q.max(-1)                                      # [S, J, n]
        played = np.take_along_axis(Q, actions[..., None], -1)[..., 0]
    else:   # each firm's best and played value from its rows of m, Q only if compared
        table, rest = _reply_table(reward, actions, values, m, delta, memory)
        at = (np.arange(S)[:, None, None], np.arange(n), rest)
        # C order, as Q's: the means over states below sum in memory order (an indexed
        # result may come out in another order)
        best = np.ascontiguousarray(table.max(-1)[at])       # [S, J, n]
        played = np.ascontiguousarray(table[at + (actions,)])
        Q = None if q is None or fused else _gather_q(table, rest)
    scale = np.maximum(np.abs(best), 1e-300)
    br = played >= best - TOL * np.maximum(np.abs(best), 1.0)  # [S, J, n]
    on = path[..., None]
    count = path.sum(-1)[:, None]
    gap = (best - played) / scale
    if q is None:
        error = np.full((S, n), np.nan)
    elif not fused:
        error = q_error(np.asarray(q), state, Q)
    else:   # the same sums, row by row, without the [S, Z, n, m] tables
        error = _q_error_rows(np.asarray(q), table, rest, state)
    return {"br_all": br.mean(1), "br_path": (br & on).sum(1) / count,
            "nash_on_path": (br | ~on).all((1, 2)), "spe": br.all((1, 2)),
            "gap_all": gap.mean(1), "gap_path": (gap * on).sum(1) / count,
            "q_error": error}


__all__ = ["MAX_ENTRIES", "TOL", "Diagnostics", "diagnose", "limit_cycle", "profile_values",
           "true_q"]
