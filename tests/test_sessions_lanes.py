"""The 16-lane vector operations the kernel plays 16 sessions with
(:mod:`jaxmarket.sessions.lanes`), lane by lane against numpy and the scalar loop's own
operations: a lane must compute what one session's scalar period computes, and the
gathers and scatters must touch exactly the lanes of their mask."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from jaxmarket.sessions import lanes as ln
from jaxmarket.sessions.kernel import fma32

f32 = np.float32


@njit
def _gather_scatter(qf, qi, qu, index, mask, value_f, value_i):
    idx = ln.load_i(index, 0)
    on = ln.ine(ln.load_i(mask, 0), ln.splat_i(0))
    got_f, got_i, got_u = np.zeros(16, np.float32), np.zeros(16, np.int64), np.zeros(16, np.int64)
    ln.store_f(got_f, 0, ln.gather_f(qf, idx, on))
    ln.store_i(got_i, 0, ln.gather_i32(qi, idx, on))
    ln.store_i(got_u, 0, ln.gather_u32(qu, idx, on))
    ln.scatter_f(qf, idx, ln.load_f(value_f, 0), on)
    ln.scatter_i32(qi, idx, ln.load_i(value_i, 0), on)
    return got_f, got_i, got_u, ln.mask_bits(on)


def test_gathers_and_scatters_touch_only_the_lanes_of_their_mask():
    # Bugs caught: a gather that reads a masked-off lane (or leaves it unset), a scatter
    # that writes one, an int32 gather that zero-extends a negative value, a uint32 one
    # that sign-extends a word above 2^31, a scatter into the wrong element.
    rng = np.random.default_rng(0)
    for _ in range(20):
        qf = rng.normal(size=200).astype(f32)
        qi = rng.integers(-2**31, 2**31, 200).astype(np.int32)
        qu = rng.integers(0, 2**32, 200, dtype=np.uint64).astype(np.uint32)
        index = rng.permutation(200)[:16].astype(np.int64)
        mask = (rng.random(16) < 0.6).astype(np.int64)
        value_f = rng.normal(size=16).astype(f32)
        value_i = rng.integers(-2**31, 2**31, 16).astype(np.int64)
        want_f, want_i = qf.copy(), qi.copy()
        on = mask != 0
        want_f[index[on]] = value_f[on]
        want_i[index[on]] = value_i[on].astype(np.int32)
        qf_in, qi_in = qf.copy(), qi.copy()
        got_f, got_i, got_u, bits = _gather_scatter(qf_in, qi_in, qu, index, mask, value_f,
                                                    value_i)
        np.testing.assert_array_equal(got_f, np.where(on, qf[index], 0))
        np.testing.assert_array_equal(got_i, np.where(on, qi[index].astype(np.int64), 0))
        np.testing.assert_array_equal(got_u, np.where(on, qu[index].astype(np.int64), 0))
        np.testing.assert_array_equal(qf_in, want_f)
        np.testing.assert_array_equal(qi_in, want_i)
        assert bits == sum(1 << lane for lane in range(16) if on[lane])


@njit
def _arith(a, b, c, words):
    x, y, z = ln.load_f(a, 0), ln.load_f(b, 0), ln.load_f(c, 0)
    out = np.zeros((8, 16), np.float32)
    ln.store_f(out[0], 0, ln.fadd(x, y))
    ln.store_f(out[1], 0, ln.fsub(x, y))
    ln.store_f(out[2], 0, ln.fmul(x, y))
    ln.store_f(out[3], 0, ln.fdiv(x, y))
    ln.store_f(out[4], 0, ln.ffma(x, y, z))
    ln.store_f(out[5], 0, ln.fmax(x, y))
    ln.store_f(out[6], 0, ln.u2f(ln.load_i(words, 0)))
    ln.store_f(out[7], 0, ln.fsel(ln.flt(x, y), x, z))
    ints = np.zeros(16, np.int64)
    ln.store_i(ints, 0, ln.f2i(ln.fmul(x, ln.splat_f(np.float32(7.0)))))
    scalar = np.zeros(16, np.float32)
    for lane in range(16):   # the scalar loop's fused multiply-add
        scalar[lane] = fma32(a[lane], b[lane], c[lane])
    return out, ints, scalar


def test_lane_arithmetic_rounds_as_the_scalar_loop_does():
    # Bugs caught: a vector op that rounds twice (an fma split into a product and a
    # sum), a conversion of a word above 2^31 read as negative, a truncation that
    # rounds, a max or select whose operands are swapped.
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = (rng.normal(size=16) * 10.0 ** rng.integers(-3, 4, 16)).astype(f32)
        b = (rng.normal(size=16) * 10.0 ** rng.integers(-3, 4, 16)).astype(f32)
        c = rng.normal(size=16).astype(f32)
        words = rng.integers(0, 2**32, 16, dtype=np.uint64).astype(np.int64)
        out, ints, scalar = _arith(a, b, c, words)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(out[0], a + b)
            np.testing.assert_array_equal(out[1], a - b)
            np.testing.assert_array_equal(out[2], a * b)
            np.testing.assert_array_equal(out[3], a / b)
        np.testing.assert_array_equal(out[4], scalar)
        np.testing.assert_array_equal(out[5], np.where(a > b, a, b))
        np.testing.assert_array_equal(out[6], words.astype(np.uint32).astype(f32))
        np.testing.assert_array_equal(out[7], np.where(a < b, a, c))
        np.testing.assert_array_equal(ints, np.trunc(a * f32(7.0)).astype(np.int64))


@njit
def _flushed(x):
    out = np.zeros(16, np.float32)
    ln.store_f(out, 0, ln.ftz(ln.load_f(x, 0)))
    return out


def test_ftz_flushes_each_denormal_to_a_zero_of_its_sign():
    # Bug caught: denormals left as they are on a machine without hardware
    # flush-to-zero (XLA:CPU's results are flushed), a flush that loses the sign, or
    # one that touches the smallest normal number or a NaN.
    tiny = np.finfo(f32).tiny
    x = np.array([1e-39, -1e-39, tiny, -tiny, 0.0, -0.0, 1.0, np.nan,
                  tiny / 2, -tiny / 4, 3e-45, -3e-45, 2.5, -7.0, np.inf, -np.inf], f32)
    got = _flushed(x)
    small = (np.abs(x) < tiny) & (x != 0)
    np.testing.assert_array_equal(got[~small], x[~small])
    assert np.all(got[small] == 0)
    np.testing.assert_array_equal(np.signbit(got[small]), np.signbit(x[small]))
    assert small.sum() == 6


@njit
def _argmax(q, offset, m, at, value):
    return ln.row_argmax(q, offset, m, at, value)


@pytest.mark.parametrize("m", [3, 15, 16, 17, 31, 32, 40])
def test_row_argmax_is_the_first_maximum_of_the_row_as_it_will_be_written(m):
    # Bugs caught: the last of tied maxima, a column at or past m read, the column
    # about to be written read at its old value, a tie between two blocks of 16 given to
    # the later one, signed zeros told apart, a row at the end of the array read past it.
    rng = np.random.default_rng(m)
    for t in range(300):
        rows = rng.integers(-3, 3, (4, m + 1)).astype(f32)
        if t % 3 == 0:
            rows = rng.normal(size=(4, m + 1)).astype(f32)
        if t % 7 == 0:
            rows[3, rng.integers(0, m)] = -0.0
        rows[:, m] = 1e9   # the greedy column: never a price
        q = rows.reshape(-1)
        r = int(rng.integers(0, 4))
        at = int(rng.integers(0, m))
        value = f32(rng.integers(-3, 4)) if t % 2 else f32(rng.normal())
        want = rows[r, :m].copy()
        want[at] = value
        assert _argmax(q, r * (m + 1), m, at, value) == int(np.argmax(want)), (m, t)


def test_lowest_bit_walks_a_mask_in_lane_order():
    # Bug caught: a walk over the lanes of a mask that skips or repeats one.
    @njit
    def walk(x):
        out = []
        while x != 0:
            out.append(ln.lowest_bit(x))
            x &= x - 1
        return out

    for x in (1, 2, 0b1010, 0xFFFF, 0x8001, 0x4000):
        assert list(walk(np.int64(x))) == [b for b in range(16) if x >> b & 1]


def test_the_kernels_record_of_lanes_py_is_its_digest():
    # Bug caught: an edit to lanes.py that numba's cache of the kernel loops does not see
    # (it watches the loops' own file, kernel.py), so a machine with a warm cache keeps
    # playing the old lane operations.
    import hashlib
    from pathlib import Path

    from jaxmarket.sessions import kernel
    digest = hashlib.sha256(Path(ln.__file__).read_bytes()).hexdigest()[:16]
    assert kernel.LANES_DIGEST == digest, (
        f"set kernel.LANES_DIGEST = {digest!r} (lanes.py changed)")
