"""``materialize`` returns its input unchanged for every float (and passes other dtypes
through), so routing actions through it cannot change any result."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.learners.base import materialize


def test_materialize_is_the_identity_on_every_float():
    x = np.array([0.0, -0.0, 1.0, -1.0, 1.2e-38, 3.4e38, -3.4e38, 2.0**24, 2.0**24 + 2,
                  np.inf, -np.inf, np.nan, 0.1, -7.25], np.float32)
    out = np.asarray(jax.jit(materialize)(jnp.asarray(x)))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x)  # NaN == NaN for assert_array_equal
    rng = np.random.default_rng(0)
    y = (rng.normal(size=(3, 5, 7)) * 10.0 ** rng.integers(-30, 30, (3, 5, 7))).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(materialize)(jnp.asarray(y))), y)


def test_materialize_treats_subnormals_like_any_arithmetic():
    """XLA:CPU flushes subnormal floats to zero in arithmetic; ``materialize`` does
    exactly what a multiplication by one does there, no more."""
    x = jnp.asarray([1e-45, -1e-40, 1e-39], jnp.float32)
    one = jnp.ones((), jnp.float32)  # an argument, so XLA cannot fold the product away
    times_one = np.asarray(jax.jit(lambda v, w: v * w)(x, one))
    np.testing.assert_array_equal(np.asarray(jax.jit(materialize)(x)), times_one)


def test_materialize_passes_integers_and_booleans_through():
    i = jnp.arange(-3, 4, dtype=jnp.int32)
    np.testing.assert_array_equal(np.asarray(materialize(i)), np.arange(-3, 4))
    b = jnp.asarray([True, False])
    np.testing.assert_array_equal(np.asarray(materialize(b)), [True, False])
