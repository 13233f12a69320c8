"""Saturating arithmetic for money, prices and quantities (docs/reliability.md, "Numerics").

Every money amount of the market -- fees, spend, costs, profits, surplus, rewards, the
observations built from them -- saturates at :data:`MONEY_MAX`, quoted prices at
:data:`PRICE_MAX`, query counts at :data:`QUERY_MAX`; all far below float32's largest
finite value (3.4e38), so extreme but valid inputs (``cost: 1e30``, ``queries: 1e30``)
give saturated, finite numbers instead of ``inf`` or ``NaN``. Each function is the
identity on values inside the bounds (a ``minimum``/``clip`` that no normal value
touches, or a fallback selected only where the plain formula overflowed), and none sits
between a multiply and the add that consumes it (see :func:`cap`), so results in the
normal range are bit for bit those of the plain formula.
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


def cap(a, b, bound: float = MONEY_MAX) -> jax.Array:
    """``a`` (>= 0) capped so that the product ``cap(a, b) * b`` stays within ``bound``
    (up to one rounding): ``min(a, bound / |b|)``; ``a`` itself where ``b = 0``.

    The cap goes on an *operand*, not on the product: ``x - a * b`` and ``sum(a * b)``
    keep their multiply feeding the add, which XLA's CPU backend may contract into one
    fused multiply-add; a ``minimum`` between the two would round differently (one
    rounding more) even where it changes nothing, and shipped results would move."""
    return jnp.minimum(a, bound / jnp.abs(b))


def within(plain, safe, bound: float = MONEY_MAX) -> jax.Array:
    """``plain`` where it lies within ``+-bound``, else ``safe`` (its saturating version;
    NaN and inf are outside). The plain formula stays in the program exactly as it was
    -- no op inserted inside it -- and is selected for every normal value."""
    return jnp.where(jnp.abs(plain) <= bound, plain, safe)


def per_term(x, n: int, bound: float = MONEY_MAX) -> jax.Array:
    """``x`` clipped into ``[-bound / n, bound / n]``: a sum of ``n`` such terms stays
    within ``+-bound`` (for a term that is not a product: see :func:`cap`)."""
    return jnp.clip(x, -bound / n, bound / n)


def finite_mean(x, axis: int = 0) -> jax.Array:
    """``mean(x, axis)``; where the sum overflowed (values near float32's largest), the
    sum of ``x / n`` instead (finite for finite ``x``)."""
    mean = jnp.mean(x, axis=axis)
    safe = jnp.sum(x / x.shape[axis], axis=axis)
    return jnp.where(jnp.isfinite(mean), mean, safe)
