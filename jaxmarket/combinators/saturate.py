"""Saturating arithmetic for money, prices and quantities (docs/reliability.md, "Numerics").

Every money amount of the market -- fees, spend, costs, profits, surplus, rewards, the
observations built from them -- saturates at :data:`MONEY_MAX`, quoted prices at
:data:`PRICE_MAX`, query counts at :data:`QUERY_MAX`; all far below float32's largest
finite value (3.4e38), so extreme but valid inputs (``cost: 1e30``, ``queries: 1e30``)
give saturated, finite numbers instead of ``inf`` or ``NaN``. Each function is the
identity on values inside the bounds (a ``minimum``/``clip`` that no normal value
touches, or a fallback selected only where the plain formula overflowed), so results in
the normal range are bit for bit those of the plain formula.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRICE_MAX = 1e38     # prices (and budgets) are clipped into [0, PRICE_MAX]; NaN -> PRICE_MAX
QUERY_MAX = 1e35     # queries are clipped into [0, QUERY_MAX]
MONEY_MAX = 1e36     # money saturates here (q * p can exceed float32's range)
LOG_MONEY_MAX = 82.89  # log(MONEY_MAX) rounded down


def money(x) -> jax.Array:
    """Saturate a nonnegative money amount at MONEY_MAX (inf -> MONEY_MAX)."""
    return jnp.minimum(x, MONEY_MAX)


def signed_money(x) -> jax.Array:
    """Saturate a money amount of either sign into ``[-MONEY_MAX, MONEY_MAX]``."""
    return jnp.clip(x, -MONEY_MAX, MONEY_MAX)


def saturating_sum(x, axis: int = -1, bound: float = MONEY_MAX) -> jax.Array:
    """``sum(x, axis)`` saturated into ``[-bound, bound]``, for terms within ``+-bound``.

    Where the plain sum overflowed (more than ~340 terms near 1e36: ``inf``, or
    ``inf - inf = NaN`` when terms of both signs overflow separately) it is recomputed as
    ``n * sum(x / n)``, whose partial sums stay within ``+-bound``; elsewhere it is the
    plain sum, bit for bit."""
    total = jnp.sum(x, axis=axis)
    n = x.shape[axis]
    safe = jnp.sum(x / n, axis=axis) * n
    return jnp.clip(jnp.where(jnp.isfinite(total), total, safe), -bound, bound)


def finite_mean(x, axis: int = 0) -> jax.Array:
    """``mean(x, axis)``; where the sum overflowed (values near float32's largest), the
    mean of ``x / n`` summed instead (finite for finite ``x``)."""
    mean = jnp.mean(x, axis=axis)
    safe = jnp.sum(x / x.shape[axis], axis=axis)
    return jnp.where(jnp.isfinite(mean), mean, safe)
