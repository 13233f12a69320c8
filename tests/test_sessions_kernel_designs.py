"""The kernel backend's general loop (:func:`jaxmarket.sessions.kernel._run_general`)
against the XLA backend, design by design: every shipped session design whose game is
not Calvano et al.'s plain one (full feedback, an epsilon schedule from below 1,
Boltzmann exploration, alternating moves with Klein's sequential target, random period
outcomes, a stateless learner, an observation grid of its own), and designs given one
discount per firm (``name:delta`` cases: Calvano's plain game, full feedback, Klein's
sequential target), which the kernel plays in its general loop.

Each game is the design's own config with faster exploration, a short convergence
window and (where the design's would make sessions sit still) a lower discount, so that
a few hundred periods hold exploration, greedy changes and, for most, convergence
mid-run; both backends play the same sessions in chunks that do not divide the periods,
and every leaf of the sessions' state (Q tables with their greedy column, step, stable
count, convergence, the pending sequential updates and their clock, the profile, the
outcome in force, the tail sums) must be equal bit for bit: one update that differs
changes a Q entry, and the comparison fails.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.loader import load_config
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.engine import Settings
from jaxmarket.sessions.game import kernel_reason, make_game
from jaxmarket.sessions.kernel import make_kernel_chunk, plain, roundings
from jaxmarket.sessions.reproduce import find_design
from jaxmarket.sessions.run import session_plan

#: design -> (learner overrides, whether some sessions converge within the run)
CASES = {
    # alpha 0.5: the Q of a price that never sells decays into denormals within the run
    "asker2022_sync": ({"convergence_window": 1000, "learning_rate": 0.5}, False),
    "klein2021": ({"epsilon": {"start": 1.0, "decay": 2e-2}, "convergence_window": 30}, True),
    "calvano2021": ({"exploration_decay": 1e-1, "convergence_window": 10, "discount": 0.3,
                     "learning_rate": 0.5}, True),
    "asker2022_async": ({"convergence_window": 40}, False),
    "calvano2020_boltzmann": ({"boltzmann": {"temperature": 1.0, "decay": 0.95},
                               "convergence_window": 30, "discount": 0.5,
                               "learning_rate": 0.3}, True),
    "waltman2008_n3": ({"boltzmann": {"temperature": 1.0, "decay": 0.98},
                        "convergence_window": 30}, True),
    "calvano2020_memoryless": ({"exploration_decay": 2e-2, "convergence_window": 30}, True),
    "banchio2022_first": ({"convergence_window": 20, "epsilon": {"start": 0.5, "decay": 0.03},
                           "learning_rate": 0.5, "discount": 0.3}, False),
    "calvano2020_demand015": ({"exploration_decay": 3e-2, "convergence_window": 20,
                               "discount": 0.3, "learning_rate": 0.5}, True),
    # per-firm discounts: each seller's target r + delta_j max Q with its own delta_j
    "calvano2020:delta": ({"exploration_decay": 3e-2, "convergence_window": 20,
                           "discount": [0.5, 0.2], "learning_rate": 0.5}, True),
    "asker2022_sync:delta": ({"convergence_window": 1000, "learning_rate": 0.5,
                              "discount": [0.95, 0.6]}, False),
    "klein2021:delta": ({"epsilon": {"start": 1.0, "decay": 2e-2}, "convergence_window": 30,
                         "discount": [0.95, 0.7]}, True),
}
#: quick enough for every run of the suite; the others are marked slow
QUICK = ("asker2022_sync", "klein2021", "calvano2020:delta")


@functools.cache
def design_game(name: str):
    """The game of case ``name`` (``design`` or ``design:variant``) of :data:`CASES`."""
    design = find_design(name.split(":")[0])
    group = next(iter(load_config(design.config, list(design.overrides))["learners"]))
    learner, _ = CASES[name]
    items = list(design.overrides) + [f"learners.{group}.{k}={v!r}"
                                      for k, v in learner.items()]
    return make_game(session_plan(load_config(design.config, items)))


def leaves(sessions: eng.Sessions) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves((sessions.learner, sessions.index,
                                                    sessions.tail, sessions.outcome))]


def run_both(game, periods=400, sessions=6, chunk=140, seed=7):
    settings = {"sessions": sessions, "periods": periods, "chunk": chunk, "window": 150,
                "stop": "periods"}
    key = jax.random.key(seed)
    xla = eng.run(game, Settings(**settings, backend="xla"), key, compact=False)
    kernel = eng.run(game, Settings(**settings, backend="kernel"), key, compact=False)
    return xla, kernel


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])
def test_general_kernel_plays_the_design_bit_for_bit_like_xla(name):
    # Bugs caught: a kernel whose act (its state numbering, the explore test at
    # eps0 exp(-beta t), the Boltzmann argmax of Gumbel noise plus (Q - max Q) / T, the
    # seats of alternating moves), outcome draw, update (full feedback's counterfactual
    # row, Klein's pending sums and their clock), rounding of its multiply-adds, stable
    # count, greedy play after convergence or tail departs from the learner's act/update
    # by one bit.
    game = design_game(name)
    _, converges = CASES[name]
    assert kernel_reason(game) is None and not plain(game)
    xla, kernel = run_both(game)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")   # no fallback
    for i, (a, b) in enumerate(zip(leaves(xla.sessions), leaves(kernel.sessions))):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: leaf {i}")
    # the comparison has teeth: Q tables moved away from their start, and where the game
    # converges, some session did mid-run (then played greedily, in the tail too)
    start = leaves(eng.init_sessions(game, 6, jax.random.key(7)))[0]
    assert not np.array_equal(start, leaves(xla.sessions)[0])
    if converges:
        converged = np.asarray(xla.converged)
        assert converged.any() and np.asarray(xla.step)[converged].min() < 350, xla.step


def test_a_rounding_other_than_xlas_changes_the_sessions():
    # Bug caught: a comparison too weak to see one update rounded differently (the
    # calibration would then accept any rounding): under full feedback every period
    # rewrites 100 Q values per seller, and the kernel with the increment rounded other
    # than XLA's program rounds it departs from that program.
    game = design_game("asker2022_sync")
    key = jax.random.key(3)
    with jax.threefry_partitionable(False):
        sessions = eng.init_sessions(game, 4, key)
        want = leaves(eng.xla_chunk(game, 200, 10**9)(
            jax.tree.map(lambda x: x.copy(), sessions), np.uint32(0)))
        results = {r: leaves(make_kernel_chunk(game, 200, 10**9, r)(sessions, np.uint32(0)))
                   for r in roundings(game)}
    same = [r for r, got in results.items()
            if all(np.array_equal(a, b) for a, b in zip(want, got))]
    # discount 0: the target's rounding cannot matter, the increment's does
    assert same and len({r[1] for r in same}) == 1, same


def test_kernel_flushes_denormals_to_zero_as_xla_does():
    # Bug caught: a kernel that keeps denormal results where XLA:CPU flushes them to zero
    # (a Q value halving towards 0 under full feedback: XLA's 0.0 against the kernel's
    # 6e-45, seen in asker2022_sync; whether numba's threads flush on their own depends on
    # how they were started, so the kernel flushes itself).
    from jaxmarket.sessions.kernel import _ftz
    tiny = np.finfo(np.float32).tiny
    for value, want in ((np.float32(tiny / 4), 0.0), (np.float32(-tiny / 4), -0.0),
                        (np.float32(tiny), tiny), (np.float32(-2.5), -2.5),
                        (np.float32(0.0), 0.0)):
        got = _ftz(value)
        assert got == want and np.signbit(got) == np.signbit(np.float32(want)), value
    with jax.default_device(jax.devices("cpu")[0]):   # XLA's own rule, for the record
        x = jax.jit(lambda v: v * np.float32(0.25))(np.float32(tiny))
    assert float(x) == 0.0


def test_kernel_loops_run_under_xlas_float_control_and_give_it_back():
    # Bugs caught: on x86-64 the loops leave the flushing to the processor
    # (flush-to-zero and denormals-are-zero in MXCSR, as XLA:CPU's threads run): a loop
    # that forgot to switch them on would keep denormal Q values where XLA has zeros,
    # and one that did not switch them back would change the float arithmetic of the
    # rest of the process (numpy's denormals would vanish).
    from numba import njit
    from jaxmarket.sessions.kernel import HARDWARE_FTZ, _flush, _fp_enter, _fp_leave

    @njit
    def inside(x):   # x: an array, its value loaded as the loops load theirs
        fp = _fp_enter()
        y = _flush(x[0] * np.float32(0.25))
        _fp_leave(fp)
        return y

    @njit
    def after(x):
        _fp_leave(_fp_enter())
        return _flush(x[0] * np.float32(0.25))

    tiny = np.float32(np.finfo(np.float32).tiny)
    x = np.array([tiny], np.float32)
    assert inside(x) == 0.0   # as XLA: jax.jit(lambda v: v * 0.25)(tiny) == 0
    # the mode given back: denormals again (x86), or _ftz flushes them
    assert after(x) == (tiny * np.float32(0.25) if HARDWARE_FTZ else 0.0)
    assert np.float32(tiny) * np.float32(0.25) > 0   # numpy's own arithmetic untouched


def test_per_firm_discounts_reach_the_kernel_as_each_sellers_own():
    # Bug caught: a case list whose per-firm discounts were lost on the way (one delta
    # for both sellers would not test the per-seller lookup), or a per-firm game sent to
    # the plain loop, which plays one delta.
    for name in ("calvano2020:delta", "asker2022_sync:delta", "klein2021:delta"):
        game = design_game(name)
        assert isinstance(game.settings.discount, tuple), name
        assert len(set(game.settings.discount)) == 2 and not plain(game), name
    design = find_design("calvano2020")   # one delta: the plain loop
    assert plain(make_game(session_plan(load_config(design.config, list(design.overrides)))))


def test_auto_takes_the_kernel_for_boltzmann_and_per_firm_discounts():
    # Bug caught: auto keeping Boltzmann exploration (now noise the kernel draws itself)
    # or per-firm discounts on xla, or refusing them as kernel; and auto sending
    # Boltzmann to the kernel under jax_high_dynamic_range_gumbel, whose noise reads two
    # words per value (the kernel's table is of mode low).
    for name in ("calvano2020_boltzmann", "waltman2008_n3", "calvano2020:delta",
                 "klein2021"):
        game = design_game(name)
        assert eng.choose_backend(game, "auto") == ("kernel", None), name
        assert eng.choose_backend(game, "kernel") == ("kernel", None), name
    game = design_game("calvano2020_boltzmann")
    jax.config.update("jax_high_dynamic_range_gumbel", True)
    try:
        backend, note = eng.choose_backend(game, "auto")
        assert eng.choose_backend(design_game("klein2021"), "auto") == ("kernel", None)
    finally:
        jax.config.update("jax_high_dynamic_range_gumbel", False)
    assert backend == "xla" and "jax_high_dynamic_range_gumbel" in note


def test_gumbel_table_is_jaxs_gumbel_and_categorical():
    # Bugs caught: a table indexed other than by the word's top 23 bits, of another
    # mode or minval, or noise drawn with other counters than gumbel(key_t, (n, m)) and
    # categorical(key_t, logits) use (the kernel's words are _act_bits of the (n m)
    # counters, checked here against jax.random.bits).
    from jaxmarket.sessions.kernel import _act_bits, _fold_keys, gumbel_table
    table = gumbel_table()
    assert table.shape == (1 << 23,) and table.dtype == np.float32
    n, m, periods = 3, 15, 4096
    with jax.threefry_partitionable(False):
        key = jax.random.key(11)
        keys = jax.vmap(lambda t: jax.random.fold_in(key, t))(np.arange(periods, dtype=np.uint32))
        want = np.asarray(jax.vmap(lambda k: jax.random.gumbel(k, (n, m), jnp.float32))(keys))
        words = np.asarray(jax.vmap(lambda k: jax.random.bits(k, (n * m,), jnp.uint32))(keys))
        logits = jax.random.normal(jax.random.key(2), (n, m)) * 3.0
        sample = np.asarray(jax.vmap(lambda k: jax.random.categorical(k, logits))(keys))
    np.testing.assert_array_equal(table[words >> 9], want.reshape(periods, -1))
    # the kernel's own words of the same keys
    half = (n * m + 1) // 2
    counts = np.arange(2 * half, dtype=np.uint32)
    counts[n * m:] = 0
    kd = np.asarray(jax.random.key_data(key), np.uint32)
    folded = np.empty((2, periods), np.uint32)
    _fold_keys(kd[0], kd[1], np.uint32(0), periods, folded)
    out = np.empty((2 * half, periods), np.uint32)
    _act_bits(folded, counts[:half].copy(), counts[half:].copy(), periods, out)
    np.testing.assert_array_equal(out[:n * m].T, words)
    # categorical: the first argmax of noise + logits (the same float32 sum)
    noisy = table[words >> 9].reshape(periods, n, m) + np.asarray(logits, np.float32)
    np.testing.assert_array_equal(np.argmax(noisy, axis=-1), sample)
    # every entry: jax's mode-low formula on the word f << 9, restated
    f = jnp.arange(1 << 23, dtype=jnp.uint32)
    tiny = np.float32(np.finfo(np.float32).tiny)

    @jax.jit
    def restated(f):
        x = jax.lax.bitcast_convert_type((f | np.uint32(0x3F800000)), jnp.float32) - 1.0
        u = jnp.maximum(tiny, x * (np.float32(1.0) - tiny) + tiny)
        return -jnp.log(-jnp.log(u))
    np.testing.assert_array_equal(table, np.asarray(restated(f)))


def _fma32(a, b, c) -> np.float32:
    """``a b + c`` rounded once to float32 (exact rational arithmetic)."""
    from fractions import Fraction
    return np.float32(float(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))))


def test_boltzmann_logit_is_rounded_as_xlas_program_at_a_float32_tie():
    # Bug caught: a kernel that computes the noisy logit g_c + (Q_c - max Q) / T as a
    # quotient then a sum (two roundings) where XLA's program multiplies by 1 / T and
    # fuses the add (one rounding): the two part only where two prices' noisy logits
    # (nearly) tie in float32, about once in 10^7 session-periods, so the design test's
    # few hundred periods never see it. Here seller 0's Q row is built so that the two
    # roundings pick different prices in the very first period, at T = 1000.
    d = find_design("calvano2020_boltzmann")
    game = make_game(session_plan(load_config(
        d.config, [o for o in d.overrides if not o.startswith("train.")])))
    n, m = game.sellers, game.grid.size
    with jax.threefry_partitionable(False):
        sessions = eng.init_sessions(game, 1, jax.random.key(5))
        key_t = jax.random.fold_in(sessions.key[0], np.uint32(0))
        g = np.asarray(jax.random.gumbel(key_t, (n, m), jnp.float32))[0]
    temperature = np.float32(game.settings.boltzmann[0])
    inv = np.float32(1.0) / temperature
    assert float(inv) * float(temperature) != 1.0   # 1 / T is not exact
    low, high = sorted(range(2), key=lambda c: g[c])      # the greedy price: lower noise
    row, found = np.full(m, -1e9, np.float32), None
    x = np.float32((g[low] - g[high]) * temperature)      # about where the two tie

    def pick(v_high):   # the first argmax of prices `low` (value g_low) and `high`
        return high if (v_high > g[low] or (v_high == g[low] and high < low)) else low

    for step in range(-4000, 4000):
        x_try = np.float32(x + np.float32(step) * np.spacing(x))
        if x_try >= 0:
            continue
        fused = pick(_fma32(x_try, inv, g[high]))
        quotient = pick(np.float32(np.float32(x_try / temperature) + g[high]))
        if fused != quotient:
            found = (x_try, fused, quotient)
            break
    assert found is not None
    row[low], row[high] = 0.0, found[0]
    rows = np.asarray(sessions.learner.rows).copy()
    rows[0, 0, :, :m] = row
    rows[0, 0, :, m] = low
    sessions = sessions._replace(learner=sessions.learner.replace(rows=jnp.asarray(rows)))
    picked = {}
    for backend in ("xla", "kernel"):
        runner = eng.Runner(game, Settings(1, 1, 1, "periods", 1000, backend))
        after, _ = runner.advance(jax.tree.map(lambda v: v.copy(), sessions), 0)
        picked[backend] = int(np.asarray(after.index)[0, 0])
    assert picked == {"xla": found[1], "kernel": found[1]}, (picked, found)


def test_boltzmann_price_reads_what_can_win_and_picks_the_full_argmax():
    # Bugs caught: a pruning bound that is not an upper bound of the noise (a bucket's
    # minimum, another bucket size than gumbel_bound's), a skipped price that could
    # have won, a tie not sent to the first price, the wrong largest word: the kernel's
    # choice (two reads of the 32 MB table per period, about) against the first argmax
    # of every price's fma(Q_c - max Q, 1 / T, g_c), on random rows with repeated
    # words, equal Q values and temperatures from hot to greedy.
    from numba import njit
    from jaxmarket.sessions.kernel import (PASS, _boltzmann_price, _flush, _top_noise,
                                           fma32, gumbel_bound, gumbel_table)
    f32 = np.float32

    @njit
    def pruned(q, words, temps, table, bound, out):
        n, m = q.shape[1], q.shape[2]
        top_c = np.zeros((n, PASS), np.int32)
        top_v = np.zeros((n, PASS), np.float32)
        _top_noise(words, PASS, n, m, table, top_c, top_v, np.empty(PASS, np.uint32))
        for k in range(PASS):
            for j in range(n):
                out[k, j] = _boltzmann_price(q[k, j], words, k, j, m, temps[k],
                                             f32(1e-30), np.argmax(q[k, j]), table,
                                             bound, top_c, top_v)

    @njit
    def every_price(q, words, temps, table, out):
        n, m = q.shape[1], q.shape[2]
        for k in range(PASS):
            inv = _flush(f32(f32(1.0) / max(temps[k], f32(1e-30))))
            for j in range(n):
                top = q[k, j, np.argmax(q[k, j])]
                best, price = f32(0.0), 0
                for c in range(m):
                    v = _flush(fma32(_flush(f32(q[k, j, c] - top)), inv,
                                     table[words[j * m + c, k] >> np.uint32(9)]))
                    if c == 0 or v > best:
                        best, price = v, c
                out[k, j] = price

    table = gumbel_table()
    bound = gumbel_bound(table)
    rng = np.random.default_rng(0)
    n, m = 2, 15
    chosen = []
    for trial in range(300):
        words = rng.integers(0, 2**32, (n * m, PASS), dtype=np.uint64).astype(np.uint32)
        if trial % 3 == 0:   # repeated words: equal noise
            words[1::4] = words[0::4][: words[1::4].shape[0]]
        q = rng.normal(0.0, 1.0, (PASS, n, m)).astype(f32)
        if trial % 2 == 0:   # equal Q values
            q = np.round(q * 2.0).astype(f32) / f32(2.0)
        temps = np.asarray(rng.choice([1e3, 1.0, 1e-2, 1e-6, 0.0], PASS), f32)
        got = np.zeros((PASS, n), np.int32)
        want = np.zeros((PASS, n), np.int32)
        pruned(q, words, temps, table, bound, got)
        every_price(q, words, temps, table, want)
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
        chosen.append(want)
    chosen = np.concatenate(chosen)
    # the cases have teeth: every price gets chosen, and not only the greedy one
    assert len(np.unique(chosen)) == m
    # an exact tie of a price read after the largest word's with a lower index (the
    # first argmax is the lower one), its bound equal to its value (the largest entry
    # of its bucket): price 3 greedy with noise g_3, price 7 with the largest word and
    # Q_7 - Q_3 = g_3 - g_7 (exact: Sterbenz), so v_7 = g_3 = v_3 at T = 1
    from jaxmarket.sessions.kernel import BOUND_SHIFT
    width = 1 << BOUND_SHIFT
    bucket = int(0.7 * (1 << 23)) // width
    low = bucket * width + int(np.argmax(table[bucket * width:(bucket + 1) * width]))
    high = low + 3 * width
    g_low, g_high = table[low], table[high]
    assert 0 < g_low < g_high <= 2 * g_low and bound[low // width] == g_low
    words = np.zeros((n * m, PASS), np.uint32)
    words[3], words[7] = np.uint32(low << 9), np.uint32(high << 9)
    q = np.full((PASS, n, m), -100.0, f32)
    q[:, :, 3], q[:, :, 7] = 0.0, f32(g_low - g_high)
    temps = np.ones(PASS, f32)
    got, want = np.zeros((PASS, n), np.int32), np.zeros((PASS, n), np.int32)
    pruned(q, words, temps, table, bound, got)
    every_price(q, words, temps, table, want)
    assert (want == 3).all() and (got == 3).all()
