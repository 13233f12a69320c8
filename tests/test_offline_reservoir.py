"""The jittable reservoir keeps a uniform sample of a stream offered in batches."""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxmarket.offline.reservoir import reservoir_add, reservoir_contents, reservoir_init

N, M, B, TRIALS = 40, 10, 8, 4000     # stream length, capacity, batch, independent runs


def _run(key):
    res = reservoir_init({"id": jnp.zeros((B,), jnp.int32)}, M)

    def body(res, i):
        return reservoir_add(jax.random.fold_in(key, i), res,
                             {"id": i * B + jnp.arange(B, dtype=jnp.int32)}), None

    res, _ = jax.lax.scan(body, res, jnp.arange(N // B))
    return res.data["id"], res.count


def test_reservoir_sample_is_uniform_over_the_stream():
    ids, counts = jax.jit(jax.vmap(_run))(jax.random.split(jax.random.key(0), TRIALS))
    ids = np.asarray(ids)
    assert np.all(np.asarray(counts) == N)
    # each run holds M distinct rows of the stream
    assert all(len(set(row)) == M for row in ids[:200])
    # Algorithm R: every row of the stream is kept with probability M / N, so its
    # inclusion count over independent runs is Binomial(TRIALS, M / N)
    p = M / N
    hits = np.bincount(ids.ravel(), minlength=N)
    z = (hits - TRIALS * p) / np.sqrt(TRIALS * p * (1 - p))
    assert np.abs(z).max() < 5.0, z                       # Bonferroni over 40 rows: < 1e-4
    # sum z^2 ~ chi^2(N) (slightly less spread: inclusions are negatively correlated)
    assert (z ** 2).sum() < stats.chi2.ppf(1 - 1e-6, N)


def test_reservoir_fills_in_order_then_counts_every_offer():
    res = reservoir_init({"x": jnp.zeros((3, 2))}, 5)
    res = reservoir_add(jax.random.key(0), res, {"x": jnp.arange(6.0).reshape(3, 2)})
    assert int(res.count) == 3 and int(res.size()) == 3
    np.testing.assert_array_equal(reservoir_contents(res)["x"], np.arange(6.0).reshape(3, 2))
    res = reservoir_add(jax.random.key(1), res, {"x": 10 + jnp.arange(6.0).reshape(3, 2)})
    # 6 offered, capacity 5: rows 0-4 fill slots 0-4 in order; row 5 then either
    # replaces one slot (in place) or is dropped
    got = np.asarray(res.data["x"])
    assert int(res.count) == 6 and got.shape == (5, 2)
    first = np.r_[np.arange(6.0).reshape(3, 2), 10 + np.arange(4.0).reshape(2, 2)]
    same = np.all(got == first, axis=1)
    assert same.sum() >= 4
    if same.sum() == 4:
        np.testing.assert_array_equal(got[~same][0], [14.0, 15.0])


def test_reservoir_same_key_same_sample():
    a, _ = _run(jax.random.key(3))
    b, _ = _run(jax.random.key(3))
    np.testing.assert_array_equal(a, b)
