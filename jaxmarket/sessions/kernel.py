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
:func:`jaxmarket.sessions.game.kernel_reason`: Calvano et al.'s learner (one ``delta``)
in :func:`_run_sessions`, every other design whose sellers own their Q tables (each
seller its own ``alpha``, ``beta`` and ``delta``) in :func:`_run_general` (:func:`plain`
picks). XLA:CPU flushes denormal results to zero, and
so does the kernel: on x86-64 each session runs under the processor's flush-to-zero and
denormals-are-zero modes, as XLA:CPU's threads do (:func:`_fp_enter`), elsewhere each
result is flushed (:func:`_ftz`). A converged session's greedy play before the tail
window is skipped by cycle arithmetic (:func:`_greedy_skip`): the same profile.

Why a hand-written loop: a session-period is a short chain of dependent table reads and
writes (``Q[s, a]``, ``max_a' Q[s', a']``, the greedy price), and XLA:CPU runs the
sessions in lockstep, one small gather, scatter or 15-way comparison kernel over the whole
batch after the other (``docs/benchmarks.md``: about 11x from the memory roofline). Here a
thread plays a few sessions at a time and runs all their periods of the chunk: their
tables (``n m^n (m + 1)`` float32: 28.8 KB for the duopoly) stay in the core's caches,
and slices of the sessions are spread over the cores (:func:`_in_threads`: threads of a
pool, each in numba's code without the interpreter's lock; a serial loop compiles in
about half the time of numba's parallel one, on a fresh machine's first run).
:func:`_run_sessions` plays 16 sessions side by side in the lanes of the vector
registers (:mod:`jaxmarket.sessions.lanes`), each at its own period: the sessions are
independent, so a period of 16 is a few gathers, vector operations and scatters, with
no branch on one session's exploration or greedy price; :func:`_run_general` plays one
session at a time.

What is not computed here is ``eps_t = exp(-beta t)``: XLA's float32 ``exp`` and the C
library's differ in the last bit for about one ``t`` in ten, and an exploration test
``u < eps_t`` that flips changes a session. The chunk's ``eps_t`` (one row per distinct
``beta``, one column per step the chunk can reach) is computed by XLA with the learner's
own expression and looked up. So is Boltzmann sampling's Gumbel noise: the kernel draws
``jax.random.gumbel(key_t, (n, m))``'s random words ``b`` itself and reads
``-log(-log(u(b)))`` from a table of every value jax's own ``gumbel`` gives a word's top
23 bits (:func:`gumbel_table`), so ``argmax_c g_c + (Q_c - max Q) / T`` is
``jax.random.categorical``'s draw bit for bit.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from numba import float32 as f32
from numba import int32 as i32
from numba import njit
from numba import uint32 as u32
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from jaxmarket.sessions import diagnostics, lanes

#: the sha256 (first 16 hex digits) of jaxmarket/sessions/lanes.py the loops here were
#: last compiled with: numba's cache of a function sees edits to the function's own file
#: only, so an edit to lanes.py edits this line too and the cached loops are compiled
#: again (tests/test_sessions_lanes.py checks it)
LANES_DIGEST = "7098fcb924f0b4d2"

_INT32_MAX = np.iinfo(np.int32).max


@intrinsic
def fma32(typingctx, a, b, c):
    """``a b + c`` rounded once (float32), as XLA:CPU computes a multiply feeding an add
    in one fused kernel."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


#: the smallest normal float32: XLA:CPU runs with denormals flushed to zero (FTZ/DAZ)
_FLT_MIN = np.float32(np.finfo(np.float32).tiny)


@njit(inline="always")
def _ftz(x):
    """``x`` flushed to a zero of its sign where it is a denormal, as XLA:CPU's float
    arithmetic leaves every result (a Q value decaying towards 0, as under
    ``feedback: full`` where a price never sells, would otherwise differ)."""
    if x != x or abs(x) >= _FLT_MIN:
        return x
    return f32(x * f32(0.0))


#: x86-64: the loops run with the processor's own flush-to-zero and denormals-are-zero
#: modes (MXCSR bits 15 and 6), as XLA:CPU's threads do, so no result needs
#: :func:`_ftz`; elsewhere every result is flushed by :func:`_ftz`
HARDWARE_FTZ = platform.machine().lower() in ("x86_64", "amd64")
_FTZ_DAZ = 0x8040


def _mxcsr_call(builder, name: str, pointer):
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    builder.call(fn, [builder.bitcast(pointer, ir.IntType(8).as_pointer())])


@intrinsic
def _swap_mxcsr(typingctx, bits):
    """The MXCSR register (x86 SSE's float control) before ``bits`` replace it. LLVM
    takes float arithmetic for pure, so only values loaded after the switch are
    computed under it: the loops' operands are loads from their arrays."""
    sig = types.uint32(types.uint32)

    def codegen(context, builder, signature, args):
        old = cgutils.alloca_once(builder, ir.IntType(32))
        _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", old)
        new = cgutils.alloca_once_value(builder, args[0])
        _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", new)
        # a compiler barrier: no load of the loop's arrays (and so no arithmetic on
        # them) moves across the switch
        barrier = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "", "~{memory}",
                               side_effect=True)
        builder.call(barrier, [])
        return builder.load(old)

    return sig, codegen


if HARDWARE_FTZ:
    @njit(inline="always")
    def _fp_enter():
        """Flush-to-zero and denormals-are-zero on (returns the previous MXCSR)."""
        old = _swap_mxcsr(u32(0x1F80))
        _swap_mxcsr(u32(old | u32(_FTZ_DAZ)))
        return old

    @njit(inline="always")
    def _fp_leave(old):
        """The float control :func:`_fp_enter` found, back."""
        _swap_mxcsr(u32(old))

    @njit(inline="always")
    def _flush(x):
        """A result as XLA:CPU leaves it: the processor flushes (:func:`_fp_enter`)."""
        return x
else:
    @njit(inline="always")
    def _fp_enter():
        return u32(0)

    @njit(inline="always")
    def _fp_leave(old):
        return None

    _flush = _ftz


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
def _greedy_period(gr, s, radix, table, tail, in_tail, lead, profiles):
    """One period of greedy play from state ``s``: the next state; the rewards of the
    profile played are added to ``tail`` when ``in_tail``. Memory ``k``: ``s`` is the
    history number, ``lead = J^(k-1)``, ``profiles = J`` (:func:`_next_history`)."""
    nxt = _greedy_profile(gr, s, radix)
    if in_tail:
        for j in range(gr.shape[0]):
            tail[j] += table[nxt, j]
    return _next_history(nxt, s, lead, profiles)


@njit(inline="always")
def _next_history(profile, h, lead, profiles):
    """The history after profile row ``profile`` was played in history ``h``:
    ``profile J^(k-1) + h // J`` (memory 1, ``lead = 1``: the profile)."""
    if lead > 1:
        return profile * lead + h // profiles
    return profile


@njit(inline="always")
def _greedy_profile(gr, s, radix):
    """The profile row every seller's greedy price in state ``s`` makes."""
    nxt = 0
    for j in range(gr.shape[0]):
        nxt += gr[j, s] * radix[j]
    return nxt


@njit(inline="always")
def _greedy_next(gr, s, radix, lead, profiles):
    """The state after ``s`` when every seller plays its greedy price (memory ``k``:
    :func:`_next_history`)."""
    return _next_history(_greedy_profile(gr, s, radix), s, lead, profiles)


@njit(inline="always")
def _greedy_skip(gr, s, radix, count, lead, profiles):
    """The state after ``count`` periods of greedy play from ``s``, in at most about
    three times the periods to the greedy cycle and round it (Brent's cycle detection:
    play is deterministic, so it enters a cycle of length ``lam`` after ``mu`` periods,
    and the state after ``count >= mu`` periods is the one after
    ``mu + (count - mu) mod lam``)."""
    if count <= 64:
        for _ in range(count):
            s = _greedy_next(gr, s, radix, lead, profiles)
        return s
    power, lam = 1, 1
    tortoise, hare = s, _greedy_next(gr, s, radix, lead, profiles)
    while tortoise != hare:   # lam: the cycle's length
        if power == lam:
            tortoise, power, lam = hare, power * 2, 0
        hare = _greedy_next(gr, hare, radix, lead, profiles)
        lam += 1
    tortoise, hare = s, s
    for _ in range(lam):
        hare = _greedy_next(gr, hare, radix, lead, profiles)
    mu = 0
    while tortoise != hare:   # mu: the periods before the cycle
        tortoise = _greedy_next(gr, tortoise, radix, lead, profiles)
        hare = _greedy_next(gr, hare, radix, lead, profiles)
        mu += 1
    steps = count if count <= mu else mu + (count - mu) % lam
    for _ in range(steps):
        s = _greedy_next(gr, s, radix, lead, profiles)
    return s


@njit(inline="always")
def _greedy_rest(gr, s, radix, table, tail, first, count, tail_start, lead, profiles):
    """``count`` periods of greedy play from ``s`` starting at period ``first``: the
    periods before ``tail_start`` are skipped (:func:`_greedy_skip`), the ones in the tail
    played one by one, their rewards added to ``tail`` in order."""
    skip = min(max(tail_start - first, 0), count)
    s = _greedy_skip(gr, s, radix, skip, lead, profiles)
    for _ in range(count - skip):
        s = _greedy_period(gr, s, radix, table, tail, True, lead, profiles)
    return s


@njit(nogil=True, cache=True)
def _greedy_tail(gr, s, radix, table, tail, first, count, tail_start, lead, profiles):
    """:func:`_greedy_rest`, compiled once as a function of its own: the lane loop
    (:func:`_run_sessions`) calls it once per session and chunk at most."""
    return _greedy_rest(gr, s, radix, table, tail, first, count, tail_start, lead, profiles)


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


if HARDWARE_FTZ:
    @njit
    def _vflush(x):
        """A vector result as XLA:CPU leaves it: the processor flushes (:func:`_flush`)."""
        return x
else:
    _vflush = lanes.ftz


@njit(inline="always")
def _lane_prices(bf, ef, g, on, k, s, st, eoff, radix, act, held, n, states, m, drawn):
    """Each seller's price in every lane (epsilon-greedy, :func:`_run_sessions`), written
    to ``act`` and the greedy prices in force to ``held`` (``[j * 16 + lane]``); returns
    the profile row ``sum_j a_j radix_j``. ``drawn``: one lane's random bits (``bf``
    holds ``[lane, word, period]``)."""
    L = lanes.LANES
    lane_no = lanes.iota()
    tiny = lanes.splat_f(f32(1e-30))
    prof = lanes.splat_i(0)
    for j in range(n):
        word = lanes.gather_u32(bf, lanes.iadd(lanes.imul(lane_no, lanes.splat_i(drawn)),
                                               lanes.iadd(k, lanes.splat_i(j * PASS))), on)
        u = lanes.fmul(lanes.u2f(word), lanes.splat_f(f32(2.0 ** -32)))
        e = lanes.gather_f(ef, lanes.iadd(lanes.load_i(eoff, j * L), st), on)
        at = lanes.iadd(lanes.imul(lanes.iadd(lanes.imul(lane_no, lanes.splat_i(n)),
                                              lanes.splat_i(j)), lanes.splat_i(states)), s)
        greedy = lanes.gather_i32(g, at, on)
        explore = lanes.imin(lanes.f2i(lanes.fmul(lanes.fdiv(u, lanes.fmax(e, tiny)),
                                                  lanes.splat_f(f32(m)))),
                             lanes.splat_i(m - 1))
        aj = lanes.isel(lanes.flt(u, e), explore, greedy)
        lanes.store_i(act, j * L, aj)
        lanes.store_i(held, j * L, greedy)
        prof = lanes.iadd(prof, lanes.imul(aj, lanes.splat_i(radix[j])))
    return prof


@njit(inline="always")
def _lane_update(q, g, tf, on, base, prof, s, nxt, j, aj, was, rate, n, states, m, discount,
                 fused_target, fused_increment, spare_i, spare_f):
    """Seller ``j``'s update in every lane (:func:`_run_sessions`): ``Q_j[s, a_j]`` moved
    toward its target, written by a scatter; returns the greedy price after it, which is
    also written: the price taken where it beats the greedy one (ties to the lower
    index), a search of the row (:func:`~jaxmarket.sessions.lanes.row_argmax`) in the
    lanes where the greedy entry itself fell, else unchanged."""
    width = m + 1
    lane_no = lanes.iota()
    qj = lanes.iadd(base, lanes.splat_i(j * states * width))
    gj = lanes.imul(lanes.iadd(lanes.imul(lane_no, lanes.splat_i(n)), lanes.splat_i(j)),
                    lanes.splat_i(states))
    # the row's maximum is its cached greedy entry
    gn = lanes.gather_i32(g, lanes.iadd(gj, nxt), on)
    best = lanes.gather_f(q, lanes.iadd(qj, lanes.iadd(
        lanes.imul(nxt, lanes.splat_i(width)), gn)), on)
    r = lanes.gather_f(tf, lanes.iadd(lanes.imul(prof, lanes.splat_i(n)), lanes.splat_i(j)), on)
    delta = lanes.splat_f(discount)
    if fused_target:
        target = _vflush(lanes.ffma(delta, best, r))
    else:
        target = _vflush(lanes.fadd(r, _vflush(lanes.fmul(delta, best))))
    row = lanes.iadd(qj, lanes.imul(s, lanes.splat_i(width)))
    old = lanes.gather_f(q, lanes.iadd(row, aj), on)
    gap = _vflush(lanes.fsub(target, old))
    if fused_increment:
        new = _vflush(lanes.ffma(rate, gap, old))
    else:
        new = _vflush(lanes.fadd(old, _vflush(lanes.fmul(rate, gap))))
    top = lanes.gather_f(q, lanes.iadd(row, was), on)
    other = lanes.ine(aj, was)
    wins = lanes.band(other, lanes.bor(lanes.fgt(new, top), lanes.band(
        lanes.feq(new, top), lanes.ilt(aj, was))))
    greedy = lanes.isel(wins, aj, was)
    fell = lanes.mask_bits(lanes.band(on, lanes.band(lanes.bnot(other), lanes.flt(new, old))))
    if fell != 0:   # the greedy entry fell: search the row, before the write
        lanes.store_i(spare_i, 0, greedy)
        lanes.store_f(spare_f, 0, new)
        while fell != 0:
            lane = lanes.lowest_bit(fell)
            fell &= fell - 1
            spare_i[lane] = lanes.row_argmax(q, lanes.extract_i(row, lane), m,
                                             lanes.extract_i(aj, lane), spare_f[lane])
        greedy = lanes.load_i(spare_i, 0)
    lanes.scatter_f(q, lanes.iadd(row, aj), new, on)
    lanes.scatter_i32(g, lanes.iadd(gj, s), greedy, on)
    return greedy


@njit(nogil=True, cache=True)
def _run_sessions(lo, hi, rows, state_index, step, stable, converged, k0, k1, alpha, beta_row,
                  eps, step_lo, table, radix, c0, c1, first, length, discount, window,
                  tail, tail_start, fused_target, fused_increment, lead, profiles):
    """Advance sessions ``lo .. hi - 1`` ``length`` periods in place (without the
    interpreter's lock: :func:`_in_threads` runs slices of the sessions side by side).

    ``rows [S, n, m^n, m + 1]`` float32: seller ``j``'s Q row of state ``s`` and, in column
    ``m``, its greedy price index. ``eps [B, L]``: ``eps_t`` of distinct ``beta``
    ``b = beta_row[i, j]`` at step ``step_lo + l``. A learning session's period:

    * ``key_t = fold_in(key, first + k)``, ``u_j = bits(key_t)_j 2^-32``; seller ``j``
      explores iff ``u_j < eps_t`` with price ``min(floor(u_j / eps_t m), m - 1)``, else
      plays its greedy price;
    * ``Q_j[s, a_j] += alpha_j (pi_j(a) + delta max_a' Q_j[s', a'] - Q_j[s, a_j])`` (two
      fused multiply-adds) with
      ``s' = a`` (memory ``k``: ``s' = a J^(k-1) + s // J``, ``lead = J^(k-1)``,
      ``profiles = J``), the greedy price re-taken (first index of the row's maximum);
    * the stable count restarts when any greedy price changed; convergence once it
      reaches ``window``; the step advances (to at most 2^31 - 1).

    A converged session plays its greedy prices and does not learn
    (:func:`_greedy_rest`). ``tail [S, n]`` adds each period's rewards from period
    ``tail_start`` on. ``fused_target`` and ``fused_increment``: whether
    ``r + delta max Q`` and ``Q + alpha (target - Q)`` are one fused multiply-add each
    (one rounding) or a product rounded, then added: the rounding XLA chose for the same
    update (:func:`calibrate`).

    16 learning sessions play side by side, one in each lane of the vector registers
    (:mod:`jaxmarket.sessions.lanes`), each at its own period (:func:`_lane_prices`,
    :func:`_lane_update`); a session that converges or ends the chunk leaves its lane to
    the next session of the slice."""
    n = rows.shape[1]
    states = rows.shape[2]
    m = rows.shape[3] - 1
    half = c0.shape[0]
    span = eps.shape[1]
    L = lanes.LANES
    fp = _fp_enter()   # float control as XLA:CPU's threads (HARDWARE_FTZ)
    q = rows.reshape(rows.size)
    ef = eps.reshape(eps.size)
    tf = table.reshape(table.size)
    gr = np.zeros((L, n, states), np.int32)
    g = gr.reshape(gr.size)
    bits = np.zeros((L, 2 * half, PASS), np.uint32)
    bf = bits.reshape(bits.size)
    keys = np.empty((2, PASS), np.uint32)
    # each lane's session and its state, read and written 16 at a time
    who = np.zeros(L, np.int64)
    pos = np.zeros(L, np.int64)     # the periods of this chunk it has played
    st_ = np.zeros(L, np.int64)
    stb_ = np.zeros(L, np.int64)
    s_ = np.zeros(L, np.int64)
    live = np.zeros(L, np.int64)    # 1 where a session plays
    eoff = np.zeros(n * L, np.int64)       # seller j's eps_t in lane l: ef[eoff + t]
    al = np.zeros(n * L, np.float32)       # seller j's alpha in lane l
    act = np.zeros(n * L, np.int64)        # the period's prices, seller by seller
    held = np.zeros(n * L, np.int64)       # the greedy prices in force
    spare_i = np.zeros(L, np.int64)
    spare_f = np.zeros(L, np.float32)
    one = lanes.splat_i(1)
    zero = lanes.splat_i(0)
    following = lo
    playing = 0
    while True:
        for lane in range(L if playing < L and following < hi else 0):
            while live[lane] == 0 and following < hi:   # a free lane takes the next session
                i = following
                following += 1
                for j in range(n):   # its greedy prices (column m) as integers
                    for h in range(states):
                        gr[lane, j, h] = i32(rows[i, j, h, m])
                if converged[i] or length == 0:   # greedy play to the end of the chunk
                    state_index[i] = _greedy_tail(gr[lane], np.int64(state_index[i]), radix,
                                                  table, tail[i], np.int64(first),
                                                  np.int64(length), tail_start, lead, profiles)
                    continue
                who[lane], pos[lane] = i, 0
                st_[lane], stb_[lane], s_[lane] = step[i], stable[i], state_index[i]
                for j in range(n):
                    eoff[j * L + lane] = beta_row[i, j] * span - step_lo
                    al[j * L + lane] = alpha[i, j]
                live[lane] = 1
                playing += 1
        if playing == 0:
            break
        on = lanes.ine(lanes.load_i(live, 0), zero)
        p = lanes.load_i(pos, 0)
        s = lanes.load_i(s_, 0)
        st = lanes.load_i(st_, 0)
        k = lanes.iand(p, lanes.splat_i(PASS - 1))
        fresh = lanes.mask_bits(lanes.band(on, lanes.ieq(k, zero)))
        while fresh != 0:   # a lane's next 64 periods' random bits
            lane = lanes.lowest_bit(fresh)
            fresh &= fresh - 1
            played = pos[lane]
            _draw_bits(k0[who[lane]], k1[who[lane]], c0, c1, u32(first + played),
                       min(PASS, length - played), keys, bits[lane])
        prof = _lane_prices(bf, ef, g, on, k, s, st, eoff, radix, act, held, n, states, m,
                            2 * half * PASS)
        nxt = prof
        if lead > 1:
            nxt = lanes.iadd(lanes.imul(prof, lanes.splat_i(lead)),
                             lanes.idiv(s, lanes.splat_i(profiles)))
        changed = lanes.ine(zero, zero)
        base = lanes.imul(lanes.load_i(who, 0), lanes.splat_i(n * states * (m + 1)))
        for j in range(n):
            was = lanes.load_i(held, j * L)
            greedy = _lane_update(q, g, tf, on, base, prof, s, nxt, j, lanes.load_i(act, j * L),
                                  was, lanes.load_f(al, j * L), n, states, m, discount,
                                  fused_target, fused_increment, spare_i, spare_f)
            changed = lanes.bor(changed, lanes.ine(greedy, was))
        stb = lanes.isel(changed, zero, lanes.iadd(lanes.load_i(stb_, 0), one))
        st = lanes.isel(lanes.ilt(st, lanes.splat_i(_INT32_MAX)), lanes.iadd(st, one), st)
        late = lanes.mask_bits(lanes.band(on, lanes.ige(lanes.iadd(p, lanes.splat_i(first)),
                                                        lanes.splat_i(tail_start))))
        if late != 0:   # the rewards of the periods in the tail
            lanes.store_i(spare_i, 0, prof)
            while late != 0:
                lane = lanes.lowest_bit(late)
                late &= late - 1
                for j in range(n):
                    tail[who[lane], j] += table[spare_i[lane], j]
        p = lanes.iadd(p, one)
        lanes.store_i(s_, 0, nxt)
        lanes.store_i(st_, 0, st)
        lanes.store_i(stb_, 0, stb)
        lanes.store_i(pos, 0, p)
        done = lanes.band(on, lanes.ige(stb, lanes.splat_i(window)))
        leaving = lanes.mask_bits(lanes.bor(done, lanes.band(on, lanes.ieq(
            p, lanes.splat_i(length)))))
        while leaving != 0:   # a session that converged or ended the chunk
            lane = lanes.lowest_bit(leaving)
            leaving &= leaving - 1
            i = who[lane]
            h = s_[lane]
            converged_now = stb_[lane] >= window
            if converged_now:   # greedy play to the end of the chunk
                h = _greedy_tail(gr[lane], np.int64(h), radix, table, tail[i],
                                 np.int64(first + pos[lane]), np.int64(length - pos[lane]),
                                 tail_start, lead, profiles)
            _store_greedy(rows[i], gr[lane], m)
            state_index[i] = h
            step[i] = st_[lane]
            stable[i] = stb_[lane]
            converged[i] = converged_now
            live[lane] = 0
            playing -= 1
    _fp_leave(fp)


#: the roundings of the update's two multiply-adds the kernel can play, XLA:CPU's usual
#: choice first: (fused target, fused increment)
ROUNDINGS = ((True, True), (True, False), (False, True), (False, False))


def plain(game) -> bool:
    """Whether ``game`` is Calvano et al.'s (:func:`_run_sessions`): a deterministic
    period, every seller moving, epsilon-greedy from 1, the update on the price taken
    with Calvano's target and one ``delta``, each seller's state the price profile in
    force. Every other
    game :func:`jaxmarket.sessions.game.kernel_reason` accepts runs
    :func:`_run_general`."""
    s = game.settings
    if (game.probs is not None or game.turns is not None or s.boltzmann is not None
            or game.lagged
            or s.epsilon_start != 1.0 or s.feedback != "taken" or s.target != "simultaneous"
            or isinstance(s.discount, tuple)):
        return False
    rows = np.arange(game.histories)[:, None]
    want = (rows.size, game.sellers)
    return all(states.shape == want and bool(np.all(states == rows))
               for states in (state_table(game)[0],))


def state_table(game) -> np.ndarray:
    """``[K, J, n]`` int32: seller ``j``'s state index after profile row ``J`` under
    outcome ``K``, as the learner's ``act`` and ``update`` number the observation tables
    (on ``obs_grid_of``), clipped to the Q table as XLA's gather clips. Memory ``k > 1``:
    ``[1, J^k, n]``, the state after each history number (``game.history_obs``)."""
    from jaxmarket.learners.qlearning import obs_grid_of
    grid = obs_grid_of(game.settings)
    obs = game.obs if game.memory == 1 else game.history_obs(game.history_rows())
    # one program (as the learner's traced act numbers them), not one per operation
    states = np.asarray(jax.jit(type(grid).state_index)(grid, obs), np.int32)
    states = np.minimum(states, game.settings.num_states - 1)
    return states if game.probs is not None else states[None]


def history_in(game, sessions) -> np.ndarray:
    """``[S]`` int32 each session's history number ``h = sum_l j_l J^(k-1-l)`` of its
    profile in force ``j_0`` and ``past`` (memory 1: the profile's row)."""
    radix = np.asarray(game.radix, np.int64)
    h = (np.asarray(sessions.index, np.int64) * radix).sum(axis=-1)
    if game.memory > 1:
        past = (np.asarray(sessions.past, np.int64) * radix).sum(axis=-1)     # [S, k - 1]
        for lag in range(game.memory - 1):   # the k - 1 digits of the number, not a step
            h = h * game.profiles + past[:, lag]
    return h.astype(np.int32)


def history_out(game, sessions, h: np.ndarray):
    """``sessions`` with ``index`` (and ``past``) of history numbers ``h [S]`` (numpy
    arrays, as every array a kernel chunk returns)."""
    rows = game.history_rows()[np.asarray(h, np.int64)]                      # [S, k]
    radix, m = np.asarray(game.radix, np.int64), game.grid.size
    digits = ((rows[..., None] // radix) % m).astype(np.int32)               # [S, k, n]
    past = np.ascontiguousarray(digits[:, 1:]) if game.memory > 1 else None
    return sessions._replace(index=np.ascontiguousarray(digits[:, 0]), past=past)


def roundings(game) -> tuple[tuple[bool, ...], ...]:
    """The roundings :func:`calibrate` tries for ``game``, XLA:CPU's usual choice first:
    :data:`ROUNDINGS` for :func:`_run_sessions`; for :func:`_run_general` (fused target,
    fused increment, fused pending sum), the last one only under a sequential target."""
    if plain(game):
        return ROUNDINGS
    carry = (True, False) if game.settings.target == "sequential" else (True,)
    return tuple((t, i, c) for c in carry for t, i in ROUNDINGS)


def _counters(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry counters of ``bits(key, (n,))`` as two halves ``(c0, c1)``: ``0 ..
    n - 1`` padded with zeros to an even count (not partitionable)."""
    half = (n + 1) // 2
    counts = np.arange(2 * half, dtype=np.uint32)
    counts[n:] = 0
    return counts[:half].copy(), counts[half:].copy()


def _history_sizes(game) -> tuple[int, int]:
    """``(J, J^(k-1))``: the profiles and the ``lead`` of a history number
    (:func:`_next_history`)."""
    return game.profiles, game.profiles ** (game.memory - 1)


def make_kernel_chunk(game, length: int, tail_start: int,
                      rounding: tuple[bool, ...] | None = None):
    """``(sessions, first_period) -> sessions`` as
    :func:`jaxmarket.sessions.engine.xla_chunk` returns it, run by :func:`_run_sessions`
    (or :func:`_run_general`: :func:`plain`) on every core (numba's threads). The
    arrays the kernel writes (the learner's Q tables, step, stability and convergence,
    the profile, the tail; Klein's pending updates) come back as numpy arrays, the
    kernel's own copies: the next chunk reads them without a round trip through JAX
    (a copy of every Q table into a JAX buffer and out again, about 16 ms a chunk for
    Calvano et al.'s 1000 sessions). The input is never written to."""
    if rounding is None:
        rounding = roundings(game)[0]
    if not plain(game):
        return _general_chunk(game, length, tail_start, rounding)
    n, m = game.sellers, game.grid.size
    discount = np.float32(game.settings.discount)
    window = int(game.settings.convergence_window)
    radix = np.asarray(game.radix, np.int32)
    table = np.array(game.reward, np.float32)
    c0, c1 = _counters(n)
    tail_start = np.int64(tail_start)
    profiles, lead = _history_sizes(game)
    key_words = _key_words()

    @jax.jit
    def eps_table(neg_beta, step_lo, span):
        """``exp(-beta t)`` as the learner computes it, ``[B, span]`` (``span`` static
        through its shape)."""
        t = (step_lo + jnp.arange(span.shape[0], dtype=jnp.int32)).astype(jnp.float32)
        return jnp.exp(neg_beta[:, None] * t[None, :])

    def chunk(sessions, first_period):
        state = sessions.learner
        alpha, betas, beta_row, step, converged, step_lo, span = _slot_hyper(state, length)
        eps = np.array(eps_table(*_table_args(betas, step_lo, span)))
        state_index = history_in(game, sessions)
        k0, k1 = key_words(sessions.key)
        # on 2 MB pages: 16 lanes' reads of 16 sessions' tables otherwise miss the TLB
        # (the loop about 1.3x faster on three firms' Q tables)
        rows = _huge_page_array(np.asarray(state.rows, np.float32))
        stable = np.array(state.stable_periods, np.int32)
        tail = np.array(sessions.tail, np.float32)
        _in_threads(_run_sessions, rows.shape[0], rows, state_index, step, stable,
                    converged, k0, k1, alpha, beta_row, eps, step_lo, table, radix, c0, c1,
                    np.uint32(first_period), int(length), discount, window, tail,
                    tail_start, bool(rounding[0]), bool(rounding[1]), lead, profiles)
        state = state.replace(rows=rows, step=step, stable_periods=stable,
                              converged=converged)
        return history_out(game, sessions, state_index)._replace(learner=state, tail=tail)

    # numba compiles on the first call (or loads its cache, or :func:`precompile` has
    # done so): here, on one session of one period, timed
    started = time.perf_counter()
    _await_precompile()
    _run_sessions(*_plain_probe(n, game.histories, m, table, radix, c0, c1, discount, window,
                                lead, profiles))
    chunk.compile_s = time.perf_counter() - started
    return chunk


def _plain_probe(n, histories, m, table, radix, c0, c1, discount, window, lead, profiles):
    """The arguments of :func:`_run_sessions` for one session of one period (their types
    are those of every call: one compiled loop)."""
    return (0, 1, np.zeros((1, n, histories, m + 1), np.float32), np.zeros(1, np.int32),
            np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, bool),
            np.zeros(1, np.uint32), np.zeros(1, np.uint32), np.zeros((1, n), np.float32),
            np.zeros((1, n), np.int32), np.ones((1, 1), np.float32), 0, table, radix,
            c0, c1, np.uint32(0), 1, discount, window, np.zeros((1, n), np.float32),
            np.int64(0), True, True, lead, profiles)


_PRECOMPILE: list = []


def plain_signature() -> tuple:
    """The numba types of every call of :func:`_run_sessions` (any game: sizes are not
    part of a signature)."""
    import numba
    args = _plain_probe(2, 4, 2, np.zeros((4, 2), np.float32), np.ones(2, np.int32),
                        np.zeros(1, np.uint32), np.ones(1, np.uint32), np.float32(0.9), 1, 1, 4)
    return tuple(numba.typeof(a) for a in args)


def callee_signatures() -> dict:
    """The numba types :func:`_run_sessions` calls :func:`_greedy_tail` and
    :func:`_draw_bits` with (each a function of its own, about a third of the loop's
    compilation each: :func:`compile_plain`'s halves compile them in two processes)."""
    from numba import types as nt
    return {_greedy_tail: (nt.int32[:, ::1], nt.int64, nt.int32[::1], nt.float32[:, ::1],
                           nt.float32[::1]) + (nt.int64,) * 5,
            _draw_bits: (nt.uint32, nt.uint32, nt.uint32[::1], nt.uint32[::1], nt.uint32,
                         nt.int64, nt.uint32[:, ::1], nt.uint32[:, ::1])}


#: how many processes :func:`compile_plain`'s work splits into
COMPILE_PARTS = 2


def compile_plain(part: int | None = None) -> None:
    """Compile :func:`_run_sessions` and the equilibrium check's learned-Q error
    (:func:`jaxmarket.sessions.diagnostics.precompile`), or load numba's cache of them.
    ``part``: one of two halves that processes of their own compile side by side,
    each into numba's cache (:mod:`jaxmarket.sessions.warmup`): 0 the greedy tail and the
    learned-Q error; 1 the random bits, then the loop, whose typing loads the greedy tail
    from numba's cache where part 0 has written it by then (else compiles it too)."""
    callees = callee_signatures()
    if part == 0:
        _greedy_tail.compile(callees[_greedy_tail])
        diagnostics.precompile()
        return
    if part == 1:
        _draw_bits.compile(callees[_draw_bits])
    _run_sessions.compile(plain_signature())
    if part is None:
        diagnostics.precompile()


def plain_cached() -> bool:
    """Whether numba's cache on disk holds :func:`_run_sessions` for
    :func:`plain_signature` (its index names the compilation for this source, machine and
    numba), read without loading or compiling anything; False where that cannot be told
    (numba's cache internals are not public)."""
    try:
        cache = _run_sessions._cache
        key = cache._index_key(plain_signature(), _run_sessions.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:   # noqa: BLE001  a numba whose cache is laid out otherwise
        return False


def precompile(after: Callable[[], None] | None = None) -> None:
    """:func:`compile_plain` on a thread of its own, once per process, while the caller
    goes on to the work before the first chunk (the plan's benchmarks, the outcome
    tables, XLA's compilations). ``after``: what the thread waits for first (the
    children ``python -m jaxmarket.train`` forked to compile them,
    :func:`jaxmarket.sessions.warmup.wait_children`), after which it loads numba's cache
    they filled; otherwise it compiles, overlapping numba's LLVM
    passes, which release the interpreter's lock, with XLA's. Compilation only: nothing
    runs; the first chunk waits for the thread (:func:`_await_precompile`). Errors are
    left to that chunk's call."""
    if _PRECOMPILE:
        return
    import threading

    def compile_plain_after_children():
        try:
            if after is not None:
                after()
            compile_plain()
        except Exception:   # noqa: BLE001  the run's own first call reports it
            pass

    thread = threading.Thread(target=compile_plain_after_children, name="jaxmarket-numba",
                              daemon=True)
    _PRECOMPILE.append(thread)
    thread.start()


def _await_precompile() -> None:
    """Wait for :func:`precompile`'s thread, if one was started: the loop is then in
    memory, and a first call does not compile it a second time beside a forked child."""
    import threading

    for thread in _PRECOMPILE:
        if thread is not threading.current_thread():
            thread.join()


def _table_args(betas: np.ndarray, step_lo: int, span: int) -> tuple:
    """The arguments of a chunk's jitted ``eps_table`` (``temp_table``: all but the
    first): the distinct ``-beta`` values, the lowest step and a ``[span]`` array whose
    shape is the span. numpy arrays of the types the tables are traced with (float32,
    int32, int8), passed as they are: no JAX operation of their own each chunk."""
    return (np.asarray(betas, np.float32), np.int32(step_lo), np.zeros(span, np.int8))


def _key_words():
    """``words(keys) -> (k0, k1)``: the two uint32 words of every session's key, each
    contiguous, as the kernels read them. A session's key is the same array in every
    chunk of a run, so the words of the last keys asked are kept: one conversion per
    run (per block of sessions), not per chunk."""
    last: list = []

    def words(keys) -> tuple[np.ndarray, np.ndarray]:
        if not last or last[0] is not keys:
            data = np.array(jax.random.key_data(keys), np.uint32)
            last[:] = [keys, (np.ascontiguousarray(data[:, 0]),
                              np.ascontiguousarray(data[:, 1]))]
        return last[1]

    return words


def _slot_hyper(state, length: int):
    """Each seller's ``alpha [S, n]``, the distinct ``-beta`` values and each seller's row
    among them (``beta_row [S, n]``), the step and convergence of every session, and the
    steps a chunk of ``length`` periods spans from the lowest learning step (``step_lo``,
    ``span``): what the kernels read of the learner state."""
    policy = np.asarray(state.policy_index)
    neg_beta = -np.take_along_axis(np.asarray(state.hyper["exploration_decay"], np.float32),
                                   policy, axis=1)
    alpha = np.ascontiguousarray(np.take_along_axis(
        np.asarray(state.hyper["learning_rate"], np.float32), policy, axis=1))
    betas, beta_row = np.unique(neg_beta, return_inverse=True)
    beta_row = beta_row.reshape(neg_beta.shape).astype(np.int32)
    step = np.array(state.step, np.int32)
    converged = np.array(state.converged, bool)
    learning = step[~converged]
    step_lo = int(learning.min()) if learning.size else 0
    span = (int(learning.max()) - step_lo if learning.size else 0) + int(length)
    return alpha, betas, beta_row, step, converged, step_lo, span


def _pending_in(state, sequential: bool, total: int, n: int):
    """The kernel's copies of Klein's pending updates ``(s, a, acc, valid)`` and the
    clock (zeros without a sequential target)."""
    if sequential:
        return ((np.array(state.pending["s"], np.int32), np.array(state.pending["a"], np.int32),
                 np.array(state.pending["acc"], np.float32),
                 np.array(state.pending["valid"], bool)), np.array(state.clock, np.int32))
    return ((np.zeros((total, n), np.int32), np.zeros((total, n), np.int32),
             np.zeros((total, n), np.float32), np.zeros((total, n), bool)),
            np.zeros(total, np.int32))


def _general_chunk(game, length: int, tail_start: int, rounding: tuple[bool, ...]):
    """:func:`make_kernel_chunk` of a game that is not :func:`plain`: the tables of
    :func:`_run_general` and, per call, the sessions' state in and out. What XLA
    computes and the kernel looks up (its float32 ``exp``, ``log`` and ``pow`` differ
    from the C library's in the last bit): ``eps_t`` (times ``epsilon.start``), the
    Boltzmann temperature ``T_t``, ``delta^lag`` of the pending sums, the counterfactual
    payoffs (the learner's own :func:`~jaxmarket.learners.qlearning.counterfactual_payoffs`
    of every profile) and, once per process, the Gumbel value of every random word
    (:func:`gumbel_table`: what ``jax.random.categorical`` adds is
    ``jax.random.gumbel(key_t, (n, m))``, whose words the kernel draws itself). Each
    seller ``j`` discounts with its firm's ``delta_j`` (``learners.<group>.discount``, one
    value or one per firm)."""
    from jaxmarket.learners.qlearning import counterfactual_payoffs
    settings = game.settings
    n, m = game.sellers, game.grid.size
    fused_target, fused_increment, fused_carry = (tuple(rounding) + (True,))[:3]
    deltas = (settings.discount if isinstance(settings.discount, tuple)
              else (settings.discount,) * n)
    discount = np.asarray(deltas, np.float32)                                  # [n]
    window = int(settings.convergence_window)
    radix = np.asarray(game.radix, np.int32)
    table = np.array(game.reward, np.float32)
    states = np.ascontiguousarray(state_table(game))
    act_states = states   # act numbers the observation as update does
    if game.probs is None:
        table = table[None]
        cum = np.zeros(0, np.float32)
    else:
        cum = np.cumsum(np.asarray(game.probs, np.float64))[:-1].astype(np.float32)
    full = settings.feedback == "full"
    digits = (np.arange(table.shape[1])[:, None] // radix) % m                 # [J, n]
    cf = (np.array(counterfactual_payoffs(settings, game.grid.prices[digits][..., None]),
                   np.float32) if full else np.zeros((1, 1, 1), np.float32))
    num_turns = settings.turn_period
    seat = np.asarray(settings.slot_phase(), np.int32)
    if game.turns is not None:   # the engine's seats: (first + j) mod turns
        seat = ((game.turns[1] + np.arange(n)) % game.turns[0]).astype(np.int32)
        num_turns = game.turns[0]
    sequential = settings.target == "sequential"
    # delta_j^turns as the learner's slot_values computes it (in float64, then float32)
    discount_n = np.asarray([d ** settings.turn_period for d in deltas], np.float32)
    weights = np.array(jax.jit(lambda lag: jnp.power(discount[:, None],
                                                     lag.astype(jnp.float32)[None, :]))(
        jnp.arange(max(num_turns, settings.turn_period), dtype=jnp.int32)), np.float32)
    boltzmann = settings.boltzmann is not None
    gtable = gumbel_table(gumbel_mode()) if boltzmann else np.zeros(1, np.float32)
    gbound = gumbel_bound(gtable) if boltzmann else np.zeros(1, np.float32)
    g_half = (n * m + 1) // 2 if boltzmann else 1
    g_counts = np.arange(2 * g_half, dtype=np.uint32)
    g_counts[n * m if boltzmann else 0:] = 0
    g0, g1 = g_counts[:g_half].copy(), g_counts[g_half:].copy()
    eps0 = settings.epsilon_start
    c0, c1 = _counters(n)
    tail_start = np.int64(tail_start)
    profiles, lead = _history_sizes(game)
    key_words = _key_words()

    @jax.jit
    def eps_table(neg_beta, step_lo, span):
        """``eps0 exp(-beta t)`` as the learner computes it, ``[B, span]``."""
        t = (step_lo + jnp.arange(span.shape[0], dtype=jnp.int32)).astype(jnp.float32)
        eps = jnp.exp(neg_beta[:, None] * t[None, :])
        return eps0 * eps if eps0 != 1.0 else eps

    @jax.jit
    def temp_table(step_lo, span):
        """``T0 rho^t`` as the learner computes it, ``[span]``."""
        t0, rho = settings.boltzmann
        t = (step_lo + jnp.arange(span.shape[0], dtype=jnp.int32)).astype(jnp.float32)
        return t0 * jnp.exp(t * np.float32(np.log(rho)))

    def call(rows, profile, outcome, step, stable, converged, clock, pending, key_data,
             alpha, beta_row, eps, temp, step_lo, first, count, tail):
        _in_threads(_run_general, rows.shape[0], rows, profile, outcome, step, stable,
                    converged, clock, *pending,
                    *key_data, alpha, beta_row, eps, temp, gtable, gbound, g0, g1, step_lo,
                    table, cf, act_states, states, cum, lead, profiles,
                    radix, seat, num_turns, weights, c0, c1, np.uint32(first), int(count),
                    discount, discount_n, window, tail, tail_start, boltzmann, full,
                    sequential, bool(fused_target), bool(fused_increment), bool(fused_carry),
                    bool(game.lagged))

    def chunk(sessions, first_period):
        state = sessions.learner
        first_period = int(first_period)
        alpha, betas, beta_row, step, converged, step_lo, span = _slot_hyper(state, length)
        if boltzmann:
            eps = np.zeros((1, 1), np.float32)
            temp = np.array(temp_table(*_table_args(betas, step_lo, span)[1:]))
        else:
            eps = np.array(eps_table(*_table_args(betas, step_lo, span)))
            temp = np.zeros(1, np.float32)
        profile = history_in(game, sessions)
        outcome = np.array(sessions.outcome, np.int32)
        key_data = key_words(sessions.key)
        rows = np.array(state.rows, np.float32)
        stable = np.array(state.stable_periods, np.int32)
        tail = np.array(sessions.tail, np.float32)
        total = rows.shape[0]
        pending, clock = _pending_in(state, sequential, total, n)
        call(rows, profile, outcome, step, stable, converged, clock, pending, key_data,
             alpha, beta_row, eps, temp, step_lo, first_period, int(length), tail)
        extra = {}
        if sequential:
            extra = {"pending": dict(zip(("s", "a", "acc", "valid"), pending)),
                     "clock": clock}
        state = state.replace(rows=rows, step=step, stable_periods=stable,
                              converged=converged, **extra)
        return history_out(game, sessions, profile)._replace(
            learner=state, tail=tail, outcome=outcome)

    # numba compiles on the first call (or loads its cache): one session of one period
    started = time.perf_counter()
    states_n = int(game.settings.num_states)
    one = np.zeros((1, n), np.int32)
    call(np.zeros((1, n, states_n, m + 1), np.float32), np.zeros(1, np.int32),
         np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32),
         np.zeros(1, bool), np.zeros(1, np.int32),
         (one, one.copy(), np.zeros((1, n), np.float32), np.zeros((1, n), bool)),
         (np.zeros(1, np.uint32), np.zeros(1, np.uint32)), np.zeros((1, n), np.float32),
         one.copy(),
         np.ones((1, 1), np.float32), np.zeros(1, np.float32), 0, 0, 1,
         np.zeros((1, n), np.float32))
    chunk.compile_s = time.perf_counter() - started
    return chunk


def calibration_periods(game) -> int:
    """The periods :func:`calibrate` plays: 64; under memory ``k > 1``, ``64 J^(k-1)``
    (at most 16,384), so that each of the ``J^k`` states is updated about as often as a
    memory-1 state in 64 periods (fewer leave every rounding agreeing: each entry is
    moved once from its initial value)."""
    return 64 if game.memory == 1 else min(16_384, 64 * game.profiles ** (game.memory - 1))


@jax.jit
def _copy(tree):
    """A copy of every array of ``tree`` in buffers of its own (one program, not one per
    array)."""
    return jax.tree.map(jnp.copy, tree)


def calibrate(game, sessions, first_period: int, tail_start: int, xla_chunk,
              periods: int = 64) -> tuple[bool, ...] | None:
    """The rounding (:func:`roundings`) under which the kernel plays ``periods`` periods
    of ``sessions`` (the run's own batch) exactly as XLA's program of the same update
    does (``xla_chunk(game, periods, tail_start)``), or None when none does. XLA:CPU
    contracts a multiply feeding an add into one fused multiply-add wherever both land
    in one fused kernel, and that depends on the program (a grid of 15 prices: both
    fused; of 5: the increment rounded on its own), so the kernel asks the program."""

    def fields(s):
        return [np.asarray(x) for x in jax.tree.leaves((s.learner, s.index, s.tail,
                                                         s.outcome, s.past))]

    # XLA's program is compiled here once per game and batch and not kept in JAX's
    # persistent cache: its answer is (jaxmarket.sessions.calibration), so a later run
    # never compiles it, and writing it out would cost a first run about a second more
    previous = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        want = fields(xla_chunk(game, periods, tail_start)(
            _copy(sessions), np.uint32(first_period)))
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", previous)
    for rounding in roundings(game):
        got = fields(make_kernel_chunk(game, periods, tail_start, rounding)(
            sessions, np.uint32(first_period)))
        same = all(np.array_equal(a, b) for a, b in zip(want, got))
        del got
        if same:
            return rounding
    return None


def numba_threads() -> int:
    """Threads :func:`_run_sessions` spreads sessions over: numba's thread count
    (``NUMBA_NUM_THREADS``, the cores; ``numba.set_num_threads`` lowers it)."""
    import numba
    return int(numba.get_num_threads())


#: slices of the sessions per thread (:func:`_in_threads`): a thread that finishes its
#: slice early takes the next, so sessions that converged (cheap greedy play) and
#: sessions still learning even out over the threads
SLICES_PER_THREAD = 4
_POOL: dict = {}


def _in_threads(loop, sessions: int, *args) -> None:
    """``loop(lo, hi, *args)`` over slices ``[lo, hi)`` of ``sessions`` on
    :func:`numba_threads` threads at once, this one among them (the loops release the
    interpreter's lock; sessions are independent, so any slicing gives the same bits):
    each thread takes the next slice not yet taken. Returns when every slice taken has
    been played: where one raises, or this thread is interrupted, no further slice is
    taken and the ones running finish first, so nothing writes into the arrays after
    it returns."""
    import threading
    from concurrent.futures import ThreadPoolExecutor, wait
    threads = min(numba_threads(), sessions)
    if threads <= 1:
        loop(0, sessions, *args)
        return
    if _POOL.get("threads") != threads:
        if "pool" in _POOL:
            _POOL["pool"].shutdown()
        _POOL.update(threads=threads, pool=ThreadPoolExecutor(
            threads - 1, thread_name_prefix="jaxmarket-kernel"))
    size = -(-sessions // (SLICES_PER_THREAD * threads))
    slices = iter([(lo, min(lo + size, sessions)) for lo in range(0, sessions, size)])
    lock, stop = threading.Lock(), threading.Event()

    def play():
        while not stop.is_set():
            with lock:
                taken = next(slices, None)
            if taken is None:
                return
            loop(taken[0], taken[1], *args)

    futures = [_POOL["pool"].submit(play) for _ in range(threads - 1)]
    try:
        play()
        for f in futures:
            f.result()
    except BaseException:
        stop.set()
        wait(futures)
        raise


# -- the general loop -------------------------------------------------------------------

@njit(cache=True)
def _draw_outcome_bits(keys, count, out):
    """``out[k]``: ``jax.random.bits(fold_in(key_k, 1), ())`` of the period keys
    ``keys[:, k]`` (the stream :func:`jaxmarket.sessions.engine.draw_outcome` reads: its
    uniform is ``(bits >> 9) 2^-23``)."""
    for k in range(count):
        a0, a1 = threefry2x32(keys[0, k], keys[1, k], u32(0), u32(1))
        out[k], _ = threefry2x32(a0, a1, u32(0), u32(0))


@njit(cache=True)
def _fold_keys(k0, k1, first, count, keys):
    """``keys[:, k]``: ``fold_in(key, first + k)``."""
    for k in range(count):
        keys[0, k], keys[1, k] = threefry2x32(k0, k1, u32(0), u32(first + u32(k)))


@njit(cache=True)
def _act_bits(keys, c0, c1, count, out):
    """``out[:, k]``: ``bits(keys[:, k], (n,))`` (the counters of :func:`_draw_bits`)."""
    half = c0.shape[0]
    for h in range(half):
        for k in range(count):
            out[h, k], out[half + h, k] = threefry2x32(keys[0, k], keys[1, k], c0[h], c1[h])


#: float32 Gumbel values, one per 23-bit mantissa (:func:`gumbel_table`), per mode and
#: platform
_GUMBEL = {}


def _mantissa_bits(key, bit_width, shape):
    """The random bits of :func:`gumbel_table`'s generator: element ``f`` of the
    (flattened) ``shape`` is ``(key + f) << 9``, the 32-bit word whose top 23 bits are
    ``key + f``."""
    size = int(np.prod(shape))
    return jax.lax.shift_left(jax.lax.iota(jnp.uint32, size).reshape(shape) + key[0],
                              jnp.uint32(9))


def _huge_page_array(like: np.ndarray) -> np.ndarray:
    """A copy of ``like`` in memory the kernel asks Linux to back with 2 MB pages
    (``madvise(MADV_HUGEPAGE)``): random reads of a 32 MB table otherwise miss the TLB
    on almost every read (about 1.5x on the Boltzmann chunk). A plain copy where the
    platform has no such advice."""
    import mmap
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return like.copy()
    page = 2 << 20
    buf = mmap.mmap(-1, like.nbytes + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advice)
    except OSError:
        pass
    raw = np.frombuffer(buf, np.uint8)
    start = (-raw.ctypes.data) % page
    out = raw[start:start + like.nbytes].view(like.dtype).reshape(like.shape)
    out[...] = like
    return out


def gumbel_table(mode: str = "low") -> np.ndarray:
    """``[2^23]`` float32: ``jax.random.gumbel``'s value for every random word ``b``,
    indexed by ``b >> 9``. Its ``mode="low"`` float32 sample reads one word per value:
    ``u = max(tiny, (f - 1) (1 - tiny) + tiny)`` with ``f`` the float32 of bits
    ``(b >> 9) | 0x3F800000`` (in ``[1, 2)``), then ``-log(-log(u))``: a function of the
    word's top 23 bits. The table is jax's own ``gumbel`` (jitted, XLA's float32 ``log``)
    run on a generator (``jax.extend.random.define_prng_impl``) whose words are
    ``f << 9`` for ``f = 0 .. 2^23 - 1``, so ``table[b >> 9]`` is XLA's noise bit for bit
    by construction (``tests/test_sessions_kernel_designs.py`` checks it on real keys).
    Computed once per process (about 0.1 s, 32 MB, on 2 MB pages where Linux allows)."""
    if mode != "low":
        raise ValueError(f"gumbel_table: mode {mode!r} reads more than one word per value")
    where = (mode, jax.default_backend())   # XLA's log of the platform the run uses
    if where not in _GUMBEL:
        from jax.extend.random import define_prng_impl
        impl = define_prng_impl(
            key_shape=(1,), seed=lambda s: jnp.zeros((1,), jnp.uint32),
            split=lambda k, shape: jnp.zeros(tuple(shape) + (1,), jnp.uint32),
            random_bits=_mantissa_bits, fold_in=lambda k, d: k, name="mantissas")
        key = jax.random.wrap_key_data(jnp.zeros((1,), jnp.uint32), impl=impl)
        table = jax.jit(lambda k: jax.random.gumbel(k, (1 << 23,), jnp.float32, mode))(key)
        _GUMBEL[where] = _huge_page_array(np.asarray(table, np.float32))
    return _GUMBEL[where]


#: ``log2`` of the words one entry of :func:`gumbel_bound` covers
BOUND_SHIFT = 11
#: :func:`gumbel_bound` of each table, by the table's ``id``
_BOUND = {}


def gumbel_bound(table: np.ndarray) -> np.ndarray:
    """``[2^23 / 2^BOUND_SHIFT]`` float32: the largest of each run of ``2^BOUND_SHIFT``
    consecutive entries of :func:`gumbel_table` (16 KB, in the processor's first-level
    cache): ``bound[b >> (9 + BOUND_SHIFT)] >= table[b >> 9]`` for every word ``b``."""
    if id(table) not in _BOUND:   # the tables of gumbel_table live as long as the process
        _BOUND[id(table)] = table.reshape(-1, 1 << BOUND_SHIFT).max(axis=1)
    return _BOUND[id(table)]


def gumbel_mode() -> str:
    """The ``mode`` of ``jax.random.categorical``'s Gumbel noise under the present jax
    config (``jax_high_dynamic_range_gumbel``: ``"high"``, else ``"low"``)."""
    return "high" if jax.config.jax_high_dynamic_range_gumbel else "low"


@njit(inline="always")
def _draw_pass(k0, k1, first, count, acting, boltzmann, random, keys, c0, c1, bits, g0, g1,
               gbits, n, m, gtable, top_c, top_v, wmax, obits):
    """One pass's draws of :func:`_run_general`, periods ``first + k``, ``k < count``:
    ``keys[:, k] = fold_in(key, first + k)``; while ``acting`` (learning), the act's
    uniforms' words ``bits`` or, with ``boltzmann``, the words ``gbits[f, k]`` of its
    Gumbel noise ``gumbel(keys[:, k], (n, m))`` (``bits(keys[:, k], (n m,))``, the
    counters ``(g0, g1)``, flattened ``f = j m + c``) and each seller's largest value
    (:func:`_top_noise`); with ``random`` outcomes, their words ``obits``."""
    if acting or random:
        _fold_keys(k0, k1, first, count, keys)
    if acting:
        if boltzmann:
            _act_bits(keys, g0, g1, count, gbits)
            _top_noise(gbits, count, n, m, gtable, top_c, top_v, wmax)
        else:
            _act_bits(keys, c0, c1, count, bits)
    if random:
        _draw_outcome_bits(keys, count, obits)


@njit(inline="always")
def _target(reward, discount, best, fused):
    """``reward + discount best`` rounded as XLA's program rounds it (``fused``: one
    fused multiply-add)."""
    if fused:
        return _flush(fma32(discount, best, reward))
    return _flush(reward + _flush(f32(discount * best)))


@njit(inline="always")
def _increment(old, target, alpha, fused):
    """``old + alpha (target - old)`` rounded as XLA's program rounds it."""
    if fused:
        return _flush(fma32(alpha, _flush(f32(target - old)), old))
    return _flush(old + _flush(f32(alpha * _flush(f32(target - old)))))


@njit(cache=True)
def _top_noise(words, count, n, m, table, top_c, top_v, wmax):
    """For each seller ``j`` and period ``k < count``: ``top_c[j, k]`` the price with the
    largest word ``words[j m + c, k]`` (the largest Gumbel noise, up to the table's last
    bit; the first on ties) and ``top_v[j, k]`` its value ``table[word >> 9]``, read for
    a whole pass at once so that the reads of the 32 MB table overlap
    (:func:`_boltzmann_price` reads the others only where they can win). Loops over
    independent periods, which the compiler vectorises."""
    for j in range(n):
        off = j * m
        for k in range(count):
            wmax[k] = words[off, k]
            top_c[j, k] = 0
        for c in range(1, m):
            for k in range(count):
                w = words[off + c, k]
                if w > wmax[k]:
                    wmax[k] = w
                    top_c[j, k] = c
        for k in range(count):
            top_v[j, k] = table[wmax[k] >> u32(9)]


@njit(inline="always")
def _boltzmann_price(qs, words, k, j, m, temperature, tiny, greedy, table, bound, top_c,
                     top_v):
    """The first argmax over prices ``c`` of ``g_c + (Q_c - Q_greedy) / T'``,
    ``T' = max(T, tiny)``, ``g_c = table[words[j m + c, k] >> 9]`` (:func:`gumbel_table`),
    rounded as XLA's program computes it: the division by a broadcast scalar becomes a
    multiply by its reciprocal (XLA's algebraic simplifier), which fuses with the add,
    ``v_c = fma(Q_c - Q_greedy, 1 / T', g_c)``, one rounding.

    ``g_c`` is a random read of a 32 MB table, so only the largest is read for every
    period (:func:`_top_noise`) and the others only where they can win: ``v_c``
    is nondecreasing in ``g_c`` (a rounded multiply-add), so with
    ``u_c = fma(Q_c - Q_greedy, 1 / T', bound[words[j m + c, k] >> (9 + BOUND_SHIFT)])
    >= v_c`` (:func:`gumbel_bound`), a price whose ``u_c`` is below a value already
    known cannot be the maximum, and every price that is has its value read. Ties go to
    the first price, as ``argmax``."""
    top = qs[greedy]
    inv = _flush(f32(f32(1.0) / max(temperature, tiny)))
    off = j * m
    first = top_c[j, k]
    price = first
    best = _flush(fma32(_flush(f32(qs[first] - top)), inv, top_v[j, k]))
    for c in range(m):
        if c == first:
            continue
        d = _flush(f32(qs[c] - top))
        word = words[off + c, k]
        if _flush(fma32(d, inv, bound[word >> u32(9 + BOUND_SHIFT)])) < best:
            continue
        v = _flush(fma32(d, inv, table[word >> u32(9)]))
        if v > best or (v == best and c < price):
            best = v
            price = c
    return price


@njit(inline="always")
def _full_row(qs, m, taken, reward, cf_row, discount, best, alpha, fused_target,
              fused_increment):
    """Full feedback: every price ``c``'s Q moved toward ``cf_c + discount best`` (the
    taken price's payoff its ``reward``); returns the row's new first argmax."""
    for c in range(m):   # independent prices: one vector loop
        pay = reward if c == taken else cf_row[c]
        qs[c] = _increment(qs[c], _target(pay, discount, best, fused_target), alpha,
                           fused_increment)
    greedy = 0
    top = qs[0]
    for c in range(1, m):
        if qs[c] > top:
            top = qs[c]
            greedy = c
    return greedy


@njit(inline="always")
def _greedy_after(qs, m, taken, new, old, greedy):
    """The first argmax of a row after only ``taken``'s value moved from ``old`` to
    ``new`` (a full rescan only where the greedy price itself fell)."""
    if taken != greedy:
        top = qs[greedy]
        if new > top or (new == top and taken < greedy):
            return taken
        return greedy
    if new < old:
        top = qs[0]
        greedy = 0
        for c in range(1, m):
            if qs[c] > top:
                top = qs[c]
                greedy = c
    return greedy


@njit(inline="always")
def _greedy_columns(q, m):
    """``[n, N]`` int32: each seller's greedy price per state (column ``m`` of its rows)."""
    gr = np.empty((q.shape[0], q.shape[1]), np.int32)
    for j in range(q.shape[0]):
        for r in range(q.shape[1]):
            gr[j, r] = i32(q[j, r, m])
    return gr


@njit(inline="always")
def _store_greedy(q, gr, m):
    """Column ``m`` of the rows: the greedy prices ``gr``."""
    for j in range(q.shape[0]):
        for r in range(q.shape[1]):
            q[j, r, m] = f32(gr[j, r])


@njit(inline="always")
def _next_profile(a, prow, radix, m, num_turns, seat, t):
    """The profile row after prices ``a``: under turns only the sellers whose turn it is
    change theirs."""
    nxt = 0
    for j in range(a.shape[0]):
        d = a[j]
        if num_turns > 1 and t % u32(num_turns) != u32(seat[j]):
            d = (prow // radix[j]) % m
        nxt += d * radix[j]
    return nxt


@njit(inline="always")
def _outcome_of(u, cum):
    """The period's outcome: ``#{c: u >= cum_c}``."""
    o = 0
    for c in range(cum.shape[0]):
        if u >= cum[c]:
            o += 1
    return o


@njit(inline="always")
def _act(a, sa, gr, q, words, k, table, bound, top_c, top_v, bits, eps, beta_row, row,
         temp, boltzmann, learning, m):
    """Each seller's price ``a_j`` in state ``sa_j``: greedy, or while ``learning``
    epsilon-greedy on ``u_j = bits_j 2^-32`` (``min(floor(u_j / e_j * m), m - 1)`` when
    ``u_j < e_j = eps[beta_row_j, row]``), or with ``boltzmann`` the noisy argmax of
    :func:`_boltzmann_price` at ``T = temp[row] > 0`` (see :func:`_run_general`)."""
    mf = f32(m)
    scale = f32(2.0 ** -32)
    tiny = f32(1e-30)
    for j in range(a.shape[0]):
        s = sa[j]
        aj = gr[j, s]
        if learning:
            if boltzmann:
                if temp[row] > 0:
                    aj = _boltzmann_price(q[j, s], words, k, j, m, temp[row], tiny,
                                          aj, table, bound, top_c, top_v)
            else:
                u = f32(bits[j]) * scale
                e = eps[beta_row[j], row]
                if u < e:
                    aj = min(i32(u / max(e, tiny) * mf), i32(m - 1))
        a[j] = aj


@njit(nogil=True, cache=True)
def _run_general(lo, hi, rows, profile, outcome, step, stable, converged, clock, pend_s, pend_a,
                 pend_acc, pend_valid, k0, k1, alpha, beta_row, eps, temp, gtable, gbound,
                 g0, g1, step_lo, table, cf, act_states, states, cum, lead, profiles, radix, seat,
                 num_turns, weights, c0, c1, first, length, discount, discount_n, window, tail,
                 tail_start, boltzmann, full, sequential, fused_target, fused_increment,
                 fused_carry, lagged):
    """Advance sessions ``lo .. hi - 1`` ``length`` periods in place (as
    :func:`_run_sessions`): the learner's ``act``/``update``
    of any game :func:`jaxmarket.sessions.game.kernel_reason` accepts, in the order and
    float32 arithmetic of :func:`jaxmarket.sessions.engine.xla_chunk`'s period.

    ``rows [S, n, N, m + 1]``: seller ``j``'s Q rows of its ``N`` states (column ``m``: its
    greedy price). ``profile [S]``: each session's history number ``h`` (memory ``k``:
    :func:`_next_history`, ``lead = J^(k-1)``, ``profiles = J``; the profile in force
    ``h // lead``). ``states [K, J^k, n]``: seller ``j``'s state after history ``h``
    under outcome ``K`` (the update's ``state_index`` of ``obs``); ``act_states``: the
    state ``act`` reads. ``table [K, J, n]``: the rewards (``lagged``: ``[1, J^2, n]``,
    of the pair of the profile before and the new one, row ``p J + j``). A period ``t``
    of session ``i``:

    * act: epsilon-greedy on ``u_j = bits(key_t)_j 2^-32`` and ``eps [B, L]`` (0 once
      converged), or, with ``boltzmann``, the first argmax of
      ``g_jc + (Q_j[s_j, c] - max Q_j[s_j]) / max(T_t, 1e-30)`` (rounded as
      :func:`_boltzmann_price` says) where
      ``T_t = temp[t - step_lo] > 0`` (else greedy) and ``g = gumbel(key_t, (n, m))``,
      ``g_jc = gtable[bits(key_t, (n m,))_{j m + c} >> 9]`` (:func:`gumbel_table`, the
      counters ``(g0, g1)``); under turns (``num_turns > 1``) only
      the sellers with ``t mod num_turns == seat_j`` change their price;
    * random outcomes (``cum``, ``K > 1``): the outcome is ``#{c: u >= cum_c}``,
      ``u = (bits(fold_in(key_t, 1)) >> 9) 2^-23``;
    * update: Calvano's target ``r_j + delta_j max Q_j[s'_j]`` (``discount [n]``: each
      seller's own) on the price taken, or with ``full`` on every price (``cf [J, n, m]``:
      what each would have earned, the taken one its reward), or with ``sequential``
      Klein's pending update (``pend_*``, ``clock``, ``weights[j, lag] = delta_j^lag``,
      ``discount_n[j] = delta_j^turns``); ``fused_*``: whether the target, the increment
      and the pending sum are fused multiply-adds (XLA's rounding, :func:`calibrate`);
    * the stable count, convergence, the step and the tail as in :func:`_run_sessions`."""
    n = rows.shape[1]
    m = rows.shape[3] - 1
    half = c0.shape[0]
    random = cum.shape[0] > 0
    scale23 = f32(2.0 ** -23)
    for i in range(lo, hi):
        fp = _fp_enter()   # float control as XLA:CPU's threads (HARDWARE_FTZ)
        q = rows[i]
        prow = profile[i]
        o = outcome[i]
        st = step[i]
        stb = stable[i]
        done = converged[i]
        clk = clock[i]
        a, sj, sa = np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32)
        bits = np.empty((2 * half, PASS), np.uint32)
        gbits = np.empty((2 * g0.shape[0], PASS), np.uint32)
        top_c = np.zeros((n, PASS), np.int32)
        top_v = np.zeros((n, PASS), np.float32)
        wmax = np.empty(PASS, np.uint32)
        obits = np.empty(PASS, np.uint32)
        keys = np.empty((2, PASS), np.uint32)
        gr = _greedy_columns(q, m)
        for start in range(0, length, PASS):
            todo = min(PASS, length - start)
            _draw_pass(k0[i], k1[i], u32(first + start), todo, not done, boltzmann, random,
                       keys, c0, c1, bits, g0, g1, gbits, n, m, gtable, top_c, top_v,
                       wmax, obits)
            for k in range(todo):
                t = u32(first + start + k)
                learning = not done
                row = st - step_lo
                for j in range(n):
                    sj[j] = states[o, prow, j]
                    sa[j] = act_states[o, prow, j]
                _act(a, sa, gr, q, gbits, k, gtable, gbound, top_c, top_v, bits[:, k], eps,
                     beta_row[i], row, temp, boltzmann, learning, m)
                nxt = _next_profile(a, prow // lead if lead > 1 else prow, radix, m,
                                    num_turns, seat, t)   # the new profile and history:
                hn = _next_history(nxt, prow, lead, profiles)
                pay = prow * profiles + nxt if lagged else nxt   # the reward's row
                if random:
                    o = _outcome_of(f32(obits[k] >> u32(9)) * scale23, cum)
                # the update
                changed = False
                for j in range(n):
                    r = table[o, pay, j]
                    s = sj[j]
                    if sequential:
                        lag = (clk - seat[j]) % num_turns
                        if lag < 0:
                            lag += num_turns
                        target = _target(pend_acc[i, j], discount_n[j], q[j, s, gr[j, s]],
                                         fused_target)
                        us, ua = pend_s[i, j], pend_a[i, j]
                        due = lag == 0 and pend_valid[i, j]
                        if lag == 0:
                            pend_s[i, j] = s
                            pend_a[i, j] = a[j]
                            pend_acc[i, j] = r
                            pend_valid[i, j] = True
                        else:   # pend_acc + delta^lag r
                            pend_acc[i, j] = _target(pend_acc[i, j], weights[j, lag], r,
                                                     fused_carry)
                        if not (learning and due):
                            continue
                        s, aj = us, ua
                    else:
                        if not learning:
                            continue
                        sn = states[o, hn, j]
                        best = q[j, sn, gr[j, sn]]
                        aj = a[j]
                        if full:
                            greedy = _full_row(q[j, s], m, aj, r, cf[nxt, j], discount[j], best,
                                               alpha[i, j], fused_target, fused_increment)
                            if greedy != gr[j, s]:
                                changed = True
                                gr[j, s] = greedy
                            continue
                        target = _target(r, discount[j], best, fused_target)
                    old = q[j, s, aj]
                    new = _increment(old, target, alpha[i, j], fused_increment)
                    q[j, s, aj] = new
                    greedy = _greedy_after(q[j, s], m, aj, new, old, gr[j, s])
                    if greedy != gr[j, s]:
                        changed = True
                        gr[j, s] = greedy
                if learning:
                    stb = 0 if changed else stb + 1
                    if st < _INT32_MAX:
                        st += 1
                    done = stb >= window
                clk = i32(clk + 1)
                prow = hn
                if first + start + k >= tail_start:
                    for j in range(n):
                        tail[i, j] += table[o, pay, j]
        _store_greedy(q, gr, m)
        profile[i], outcome[i], step[i], clock[i] = prow, o, st, clk
        stable[i] = stb
        converged[i] = done
        _fp_leave(fp)
