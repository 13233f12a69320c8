"""The session engine's ``kernel`` backend: each session's periods of a chunk as one
compiled loop per thread (numba, a dependency of the package).

:func:`make_kernel_chunk` runs exactly the sessions of
:func:`jaxmarket.sessions.engine.xla_chunk` (the ``q_learning`` learner's
``act``/``update``), bit for bit: the same random streams (JAX's Threefry-2x32,
:func:`threefry2x32` below), the same float32 arithmetic in the same order, the same
tie rule for the greedy price, the same convergence rule (``tests/test_sessions_engine.py``
compares the two). XLA:CPU decides by itself whether ``r + delta max Q`` and
``Q + alpha (target - Q)`` are fused multiply-adds (it depends on the grid and on the
number of sessions), so the kernel plays whichever rounding XLA's program of the run
uses (:func:`calibrate`). It plays the games of
:func:`jaxmarket.sessions.game.kernel_reason`: Calvano et al.'s learner.

Why a hand-written loop: a session-period is a short chain of dependent table reads and
writes (``Q[s, a]``, ``max_a' Q[s', a']``, the greedy price), and XLA:CPU runs the
sessions in lockstep, one small gather, scatter or 15-way comparison kernel over the whole
batch after the other (``docs/benchmarks.md``: about 11x from the memory roofline). Here a
thread takes one session at a time and runs all its periods of the chunk: its tables
(``n m^n (m + 1)`` float32: 28.8 KB for the duopoly) stay in the core's L1/L2 cache,
and sessions are spread over the cores (``numba.prange``).

What is not computed here is ``eps_t = exp(-beta t)``: XLA's float32 ``exp`` and the C
library's differ in the last bit for about one ``t`` in ten, and an exploration test
``u < eps_t`` that flips changes a session. The chunk's ``eps_t`` (one row per distinct
``beta``, one column per step the chunk can reach) is computed by XLA with the learner's
own expression and looked up.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from numba import float32 as f32
from numba import int32 as i32
from numba import njit, prange
from numba import uint32 as u32
from numba.core import types
from numba.extending import intrinsic

_INT32_MAX = np.iinfo(np.int32).max


@intrinsic
def fma32(typingctx, a, b, c):
    """``a b + c`` rounded once (float32), as XLA:CPU computes a multiply feeding an add
    in one fused kernel."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@njit(inline="always")
def _rotl(x, r):
    return u32((x << u32(r)) | (x >> u32(32 - r)))


@njit(inline="always")
def _mix(x0, x1, r):
    """One Threefry round: ``x0 += x1; x1 = rotl(x1, r) ^ x0``."""
    x0 = u32(x0 + x1)
    return x0, u32(_rotl(x1, r) ^ x0)


@njit(inline="always")
def _group(x0, x1, a, b, c, d):
    """Four rounds with rotations ``a, b, c, d``."""
    x0, x1 = _mix(x0, x1, a)
    x0, x1 = _mix(x0, x1, b)
    x0, x1 = _mix(x0, x1, c)
    return _mix(x0, x1, d)


@njit(inline="always")
def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011), JAX's default hash: rotations
    (13, 15, 26, 6) and (17, 29, 16, 24) in alternate groups of four rounds, a key
    injection ``ks[(i+1) % 3], ks[(i+2) % 3] + i + 1`` after group ``i``,
    ``ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)``."""
    k2 = u32(k0 ^ k1 ^ u32(0x1BD11BDA))
    x0, x1 = u32(x0 + k0), u32(x1 + k1)
    x0, x1 = _group(x0, x1, 13, 15, 26, 6)
    x0, x1 = u32(x0 + k1), u32(x1 + k2 + u32(1))
    x0, x1 = _group(x0, x1, 17, 29, 16, 24)
    x0, x1 = u32(x0 + k2), u32(x1 + k0 + u32(2))
    x0, x1 = _group(x0, x1, 13, 15, 26, 6)
    x0, x1 = u32(x0 + k0), u32(x1 + k1 + u32(3))
    x0, x1 = _group(x0, x1, 17, 29, 16, 24)
    x0, x1 = u32(x0 + k1), u32(x1 + k2 + u32(4))
    x0, x1 = _group(x0, x1, 13, 15, 26, 6)
    return u32(x0 + k2), u32(x1 + k0 + u32(5))


@njit(inline="always")
def _greedy_period(gr, s, radix, table, tail, in_tail):
    """One period of greedy play from profile ``s``: the next profile; its rewards are
    added to ``tail`` when ``in_tail``."""
    nxt = 0
    for j in range(gr.shape[0]):
        nxt += gr[j, s] * radix[j]
    if in_tail:
        for j in range(gr.shape[0]):
            tail[j] += table[nxt, j]
    return nxt


#: Periods whose random bits one session draws at a time (a loop over independent
#: periods, which the compiler vectorises), before playing them one after the other.
PASS = 64


@njit(cache=True)
def _draw_bits(k0, k1, c0, c1, first, count, keys, out):
    """``out[:2 half, k]``: ``jax.random.bits(fold_in(key, first + k), (n,))`` for
    ``k < count`` (not partitionable: counters ``0 .. n - 1`` padded to even, hashed as
    two halves ``(c0, c1)``). Loops over independent periods with unit stride, which
    LLVM vectorises (3x faster than one period's two hashes after the other)."""
    half = c0.shape[0]
    for k in range(count):
        keys[0, k], keys[1, k] = threefry2x32(k0, k1, u32(0), u32(first + u32(k)))
    for h in range(half):
        for k in range(count):
            out[h, k], out[half + h, k] = threefry2x32(keys[0, k], keys[1, k], c0[h], c1[h])


@njit(parallel=True, cache=True)
def _run_sessions(rows, state_index, step, stable, converged, k0, k1, alpha, beta_row,
                  eps, step_lo, table, radix, c0, c1, first, length, discount, window,
                  tail, tail_start, fused_target, fused_increment):
    """Advance every session ``length`` periods in place.

    ``rows [S, n, m^n, m + 1]`` float32: seller ``j``'s Q row of state ``s`` and, in column
    ``m``, its greedy price index. ``eps [B, L]``: ``eps_t`` of distinct ``beta``
    ``b = beta_row[i, j]`` at step ``step_lo + l``. A learning session's period:

    * ``key_t = fold_in(key, first + k)``, ``u_j = bits(key_t)_j 2^-32``; seller ``j``
      explores iff ``u_j < eps_t`` with price ``min(floor(u_j / eps_t m), m - 1)``, else
      plays its greedy price;
    * ``Q_j[s, a_j] += alpha_j (pi_j(a) + delta max_a' Q_j[s', a'] - Q_j[s, a_j])`` (two
      fused multiply-adds) with
      ``s' = a``, the greedy price re-taken (first index of the row's maximum);
    * the stable count restarts when any greedy price changed; convergence once it
      reaches ``window``; the step advances (to at most 2^31 - 1).

    A converged session plays its greedy prices and does not learn. ``tail [S, n]``
    adds each period's rewards from period ``tail_start`` on. ``fused_target`` and
    ``fused_increment``: whether ``r + delta max Q`` and ``Q + alpha (target - Q)`` are
    one fused multiply-add each (one rounding) or a product rounded, then added: the
    rounding XLA chose for the same update (:func:`calibrate`)."""
    sessions, n = rows.shape[0], rows.shape[1]
    m = rows.shape[3] - 1
    half = c0.shape[0]
    mf = f32(m)
    scale = f32(2.0 ** -32)
    tiny = f32(1e-30)
    for i in prange(sessions):
        q = rows[i]
        s = state_index[i]
        st = step[i]
        stb = stable[i]
        done = converged[i]
        a = np.empty(n, np.int32)
        bits = np.empty((2 * half, PASS), np.uint32)
        keys = np.empty((2, PASS), np.uint32)
        # the greedy prices as integers during the chunk (column m holds them as float32)
        gr = np.empty((n, q.shape[1]), np.int32)
        for j in range(n):
            for r in range(q.shape[1]):
                gr[j, r] = i32(q[j, r, m])
        for start in range(0, length, PASS):
            if done:   # greedy play to the end of the chunk
                for k in range(length - start):
                    s = _greedy_period(gr, s, radix, table, tail[i],
                                       first + start + k >= tail_start)
                break
            todo = min(PASS, length - start)
            _draw_bits(k0[i], k1[i], c0, c1, u32(first + start), todo, keys, bits)
            for k in range(todo):
                if done:
                    s = _greedy_period(gr, s, radix, table, tail[i],
                                       first + start + k >= tail_start)
                    continue
                nxt = 0
                row = st - step_lo
                for j in range(n):
                    u = f32(bits[j, k]) * scale
                    e = eps[beta_row[i, j], row]
                    aj = gr[j, s]
                    if u < e:
                        aj = min(i32(u / max(e, tiny) * mf), i32(m - 1))
                    a[j] = aj
                    nxt += aj * radix[j]
                changed = False
                for j in range(n):
                    # the row's maximum is its cached greedy entry
                    best = q[j, nxt, gr[j, nxt]]
                    if fused_target:
                        target = fma32(discount, best, table[nxt, j])
                    else:
                        target = table[nxt, j] + f32(discount * best)
                    aj = a[j]
                    old = q[j, s, aj]
                    if fused_increment:
                        new = fma32(alpha[i, j], f32(target - old), old)
                    else:
                        new = old + f32(alpha[i, j] * f32(target - old))
                    q[j, s, aj] = new
                    greedy = gr[j, s]
                    if aj != greedy:   # only Q[s, a] moved: it wins or ties first
                        top = q[j, s, greedy]
                        if new > top or (new == top and aj < greedy):
                            greedy = aj
                    elif new < old:    # the greedy entry fell: look again
                        top = q[j, s, 0]
                        greedy = 0
                        for c in range(1, m):
                            if q[j, s, c] > top:
                                top = q[j, s, c]
                                greedy = c
                    if greedy != gr[j, s]:
                        changed = True
                        gr[j, s] = greedy
                stb = 0 if changed else stb + 1
                if st < _INT32_MAX:
                    st += 1
                done = stb >= window
                s = nxt
                if first + start + k >= tail_start:
                    for j in range(n):
                        tail[i, j] += table[s, j]
        for j in range(n):
            for r in range(q.shape[1]):
                q[j, r, m] = f32(gr[j, r])
        state_index[i] = s
        step[i] = st
        stable[i] = stb
        converged[i] = done


#: the roundings of the update's two multiply-adds the kernel can play, XLA:CPU's usual
#: choice first: (fused target, fused increment)
ROUNDINGS = ((True, True), (True, False), (False, True), (False, False))


def make_kernel_chunk(game, length: int, tail_start: int,
                      rounding: tuple[bool, bool] = ROUNDINGS[0]):
    """``(sessions, first_period) -> sessions`` as
    :func:`jaxmarket.sessions.engine.xla_chunk` returns it, run by :func:`_run_sessions`
    on every core (numba's threads)."""
    if game.probs is not None:
        raise ValueError("kernel backend: random period outcomes (use the xla backend)")
    n, m = game.sellers, game.grid.size
    discount = np.float32(game.settings.discount)
    window = int(game.settings.convergence_window)
    radix = np.asarray(game.radix, np.int32)
    table = np.array(game.reward, np.float32)
    half = (n + 1) // 2
    counts = np.arange(2 * half, dtype=np.uint32)
    counts[n:] = 0
    c0, c1 = counts[:half].copy(), counts[half:].copy()
    tail_start = np.int64(tail_start)

    @jax.jit
    def eps_table(neg_beta, step_lo, span):
        """``exp(-beta t)`` as the learner computes it, ``[B, span]`` (``span`` static
        through its shape)."""
        t = (step_lo + jnp.arange(span.shape[0], dtype=jnp.int32)).astype(jnp.float32)
        return jnp.exp(neg_beta[:, None] * t[None, :])

    def chunk(sessions, first_period):
        state = sessions.learner
        policy = np.asarray(state.policy_index)
        neg_beta = -np.take_along_axis(np.asarray(state.hyper["exploration_decay"],
                                                  np.float32), policy, axis=1)
        alpha = np.ascontiguousarray(np.take_along_axis(
            np.asarray(state.hyper["learning_rate"], np.float32), policy, axis=1))
        betas, beta_row = np.unique(neg_beta, return_inverse=True)
        beta_row = beta_row.reshape(neg_beta.shape).astype(np.int32)
        step = np.array(state.step, np.int32)
        converged = np.array(state.converged, bool)
        learning = step[~converged]
        step_lo = int(learning.min()) if learning.size else 0
        span = (int(learning.max()) - step_lo if learning.size else 0) + int(length)
        eps = np.array(eps_table(jnp.asarray(betas, jnp.float32), jnp.int32(step_lo),
                                 jnp.zeros(span, jnp.int8)))
        index = np.asarray(sessions.index, np.int32)
        state_index = (index * radix).sum(axis=-1).astype(np.int32)
        key_data = np.array(jax.random.key_data(sessions.key), np.uint32)
        rows = np.array(state.rows, np.float32)
        stable = np.array(state.stable_periods, np.int32)
        tail = np.array(sessions.tail, np.float32)
        _run_sessions(rows, state_index, step, stable, converged,
                      np.ascontiguousarray(key_data[:, 0]), np.ascontiguousarray(key_data[:, 1]),
                      alpha, beta_row, eps, step_lo, table, radix, c0, c1,
                      np.uint32(first_period), int(length), discount, window, tail, tail_start,
                      bool(rounding[0]), bool(rounding[1]))
        index = ((state_index[:, None] // radix) % m).astype(np.int32)      # [S, n]
        state = state.replace(rows=jnp.asarray(rows), step=jnp.asarray(step),
                              stable_periods=jnp.asarray(stable),
                              converged=jnp.asarray(converged))
        return sessions._replace(learner=state, index=jnp.asarray(index),
                                 tail=jnp.asarray(tail))

    # numba compiles on the first call (or loads its cache): do it here, on one session of
    # one period, and say how long it took
    started = time.perf_counter()
    _run_sessions(np.zeros((1, n, m ** n, m + 1), np.float32), np.zeros(1, np.int32),
                  np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, bool),
                  np.zeros(1, np.uint32), np.zeros(1, np.uint32), np.zeros((1, n), np.float32),
                  np.zeros((1, n), np.int32), np.ones((1, 1), np.float32), 0, table, radix,
                  c0, c1, np.uint32(0), 1, discount, window, np.zeros((1, n), np.float32),
                  np.int64(0), True, True)
    chunk.compile_s = time.perf_counter() - started
    return chunk


def calibrate(game, sessions, first_period: int, tail_start: int, xla_chunk,
              periods: int = 64) -> tuple[bool, bool] | None:
    """The rounding (:data:`ROUNDINGS`) under which the kernel plays ``periods`` periods
    of ``sessions`` (the run's own batch) exactly as XLA's program of the same update
    does (``xla_chunk(game, periods, tail_start)``), or None when none does. XLA:CPU
    contracts a multiply feeding an add into one fused multiply-add wherever both land
    in one fused kernel, and that depends on the program (a grid of 15 prices: both
    fused; of 5: the increment rounded on its own), so the kernel asks the program."""

    def fields(s):
        st = s.learner
        return [np.asarray(x) for x in (st.rows, st.step, st.stable_periods, st.converged,
                                         s.index, s.tail)]

    want = fields(xla_chunk(game, periods, tail_start)(
        jax.tree.map(lambda x: x.copy(), sessions), np.uint32(first_period)))
    for rounding in ROUNDINGS:
        got = fields(make_kernel_chunk(game, periods, tail_start, rounding)(
            sessions, np.uint32(first_period)))
        same = all(np.array_equal(a, b) for a, b in zip(want, got))
        del got
        if same:
            return rounding
    return None


def numba_threads() -> int:
    """Threads :func:`_run_sessions` spreads sessions over."""
    import numba
    return int(numba.get_num_threads())
