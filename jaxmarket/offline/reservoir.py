"""A jittable reservoir (Vitter's Algorithm R) over a stream of batches.

The reservoir keeps ``capacity`` rows of a pytree stream such that, after ``n`` rows have
been offered, every one of them is in the reservoir with probability ``capacity / n``.
Algorithm R, one row at a time: row ``t`` (0-based) goes to slot ``t`` while
``t < capacity``; after that a ``j ~ Uniform{0..t}`` is drawn and the row replaces slot
``j`` if ``j < capacity`` (else it is dropped).

:func:`reservoir_add` offers a whole batch of ``B`` rows in one vectorised step with the
same result as offering them one by one: every row draws its ``j`` at once, and when
several rows of the batch land on the same slot the *last* of them wins (as it would have
overwritten the earlier ones sequentially). The winner of each slot is a
``segment_max`` of row positions over target slots: no Python loop, no data-dependent
shapes, so the reservoir lives in the carry of a ``lax.scan``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Reservoir:
    data: Any            # pytree of [capacity, ...] arrays
    count: jax.Array     # int32: rows offered so far (streams up to 2**31 - 1 rows)

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]

    def size(self) -> jax.Array:
        return jnp.minimum(self.count, self.capacity)


def reservoir_init(example: Any, capacity: int) -> Reservoir:
    """An empty reservoir of ``capacity`` rows shaped like one row of ``example``
    (a pytree of ``[B, ...]`` arrays)."""
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + x.shape[1:], x.dtype), example)
    return Reservoir(data, jnp.zeros((), jnp.int32))


def reservoir_add(key: jax.Array, res: Reservoir, batch: Any) -> Reservoir:
    """Offer the ``B`` rows of ``batch`` (pytree of ``[B, ...]``) in order."""
    capacity = res.capacity
    b = jax.tree.leaves(batch)[0].shape[0]
    t = res.count + jnp.arange(b, dtype=jnp.int32)                         # global positions
    # j ~ Uniform{0..t} (randint's maxval is exclusive)
    j = jax.random.randint(key, (b,), 0, jnp.maximum(t + 1, 1), dtype=jnp.int32)
    target = jnp.where(t < capacity, t, jnp.where(j < capacity, j, capacity))   # capacity: drop
    winner = jax.ops.segment_max(jnp.arange(b, dtype=jnp.int32), target,
                                 num_segments=capacity + 1)[:capacity]       # [capacity]
    has = winner >= 0

    def put(old, new):
        picked = new[jnp.clip(winner, 0, b - 1)]
        mask = has.reshape((capacity,) + (1,) * (old.ndim - 1))
        return jnp.where(mask, picked, old)

    data = jax.tree.map(put, res.data, batch)
    return Reservoir(data, res.count + jnp.int32(b))


def reservoir_contents(res: Reservoir) -> Any:
    """The filled rows (host side: ``min(count, capacity)`` of them)."""
    n = int(res.size())
    return jax.tree.map(lambda x: x[:n], res.data)


__all__ = ["Reservoir", "reservoir_add", "reservoir_contents", "reservoir_init"]
