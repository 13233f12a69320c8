"""Closed-form economics the simulator is checked against (numpy/scipy, float64).

Multinomial-logit demand (Calvano et al., AER 2020): seller ``i`` with quality ``a_i``,
marginal cost ``c_i`` and price ``p_i`` competes with an outside good of quality
``a_0``; ``mu`` is the horizontal differentiation::

    share_i  = exp((a_i - p_i) / mu) / (sum_j exp((a_j - p_j) / mu) + exp(a_0 / mu))
    profit_i = (p_i - c_i) * share_i

Baseline economy: ``a = 2, c = 1, a_0 = 0, mu = 0.25``; then the single-seller optimum is
1.8020, the two-seller static Nash price 1.4729 and the two-seller joint-monopoly price
1.9250.

>>> round(float(monopoly_price(2.0, 1.0, 0.0, 0.25)), 4)
1.802
>>> round(float(nash_price(2)), 4), round(float(joint_monopoly_price(2)), 4)
(1.4729, 1.925)

Also Cournot competition with linear inverse demand (:func:`cournot_nash_quantity`,
:func:`cournot_monopoly_quantity`), price competition with linear differentiated demand
(:func:`linear_nash_price`, :func:`linear_monopoly_price`) and the query-distributor
price curve of the 2022 indexer selection
(:func:`isa_optimal_fee`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import lambertw, logsumexp

ArrayLike = np.ndarray | float

#: s = (sqrt(5) - 1) / 2, the constant of the indexer-selection utility curve.
GOLDEN_S = (math.sqrt(5.0) - 1.0) / 2.0


def logit_shares(prices: ArrayLike, quality: ArrayLike = 2.0, outside_quality: float = 0.0,
                 mu: float = 0.25) -> np.ndarray:
    """Market shares under multinomial-logit demand, over the last axis of ``prices``::

        share_i = exp((a_i - p_i)/mu) / (sum_j exp((a_j - p_j)/mu) + exp(a_0/mu))

    ``quality`` broadcasts against ``prices``. Computed with a log-sum-exp, so extreme
    prices do not overflow.
    """
    prices = np.asarray(prices, dtype=np.float64)
    utility = (np.asarray(quality, dtype=np.float64) - prices) / mu
    utility = np.broadcast_to(utility, prices.shape)
    outside = np.full(prices.shape[:-1] + (1,), outside_quality / mu)
    log_denominator = logsumexp(np.concatenate([utility, outside], axis=-1), axis=-1,
                                keepdims=True)
    return np.exp(utility - log_denominator)


def logit_profits(prices: ArrayLike, quality: ArrayLike = 2.0, cost: ArrayLike = 1.0,
                  outside_quality: float = 0.0, mu: float = 0.25) -> np.ndarray:
    """Per-seller profits ``(p_i - c_i) * share_i`` (one unit of demand), over the last
    axis of ``prices``."""
    prices = np.asarray(prices, dtype=np.float64)
    shares = logit_shares(prices, quality, outside_quality, mu)
    return (prices - np.asarray(cost, dtype=np.float64)) * shares


def monopoly_price(quality: float = 2.0, cost: float = 1.0, outside_quality: float = 0.0,
                   mu: float = 0.25) -> float:
    """Profit-maximising price of a single seller facing the outside good::

        p* = c + mu * (1 + W(exp((a - c - mu - a_0) / mu)))

    with ``W`` the principal branch of the Lambert W function. Derivation: the first-order
    condition ``p - c = mu / (1 - share)`` with ``1 - share = 1 / (1 + exp((a - p - a_0)/mu))``
    gives ``x e^x = exp((a - c - mu - a_0)/mu)`` for ``x = (p - c)/mu - 1``.
    """
    return _lambert_price(quality, cost, outside_quality, mu, count=1)


def joint_monopoly_price(n: int = 2, quality: float = 2.0, cost: float = 1.0,
                         outside_quality: float = 0.0, mu: float = 0.25) -> float:
    """The common price maximising ``n * profit`` of ``n`` symmetric sellers (what a
    cartel sets)::

        p_M = c + mu * (1 + W(n * exp((a - c - mu - a_0) / mu)))

    Derivation: with every seller at ``p`` the inside share is ``n * share(p)`` and
    ``d share / dp = -share (1 - n share) / mu``, so the first-order condition is
    ``p - c = mu / (1 - n share)``: a single seller of quality ``a + mu ln n``, hence
    the Lambert-W form of :func:`monopoly_price`. The objective is single-peaked
    (log-concave share), so the stationary point is the maximum.
    """
    if n < 1:
        raise ValueError(f"joint_monopoly_price: n must be >= 1, got {n}")
    return _lambert_price(quality, cost, outside_quality, mu, count=n)


def _lambert_price(quality: float, cost: float, outside_quality: float, mu: float,
                   count: int) -> float:
    # log of the W argument, kept in log space so large (a - c)/mu do not overflow
    log_arg = math.log(count) + (quality - cost - mu - outside_quality) / mu
    if log_arg > 700.0:  # W(e^y) ~ y - log y for huge y; refine with Newton on w + log w = y
        w = log_arg - math.log(log_arg)
        for _ in range(50):
            w -= (w + math.log(w) - log_arg) / (1.0 + 1.0 / w)
    else:
        w = float(np.real(lambertw(math.exp(log_arg))))
    return cost + mu * (1.0 + w)


def nash_price(n: int = 2, quality: float = 2.0, cost: float = 1.0, outside_quality: float = 0.0,
               mu: float = 0.25) -> float:
    """Symmetric static Nash price of ``n`` identical sellers: the root of::

        p - c = mu / (1 - share(p)),   share(p) = e^{(a-p)/mu} / (n e^{(a-p)/mu} + e^{a_0/mu})

    (each seller's first-order condition, ``d share_i / d p_i = -share_i (1 - share_i) / mu``,
    at a common price). Solved with ``scipy.optimize.brentq``; ``n = 1`` is the monopoly
    price.
    """
    if n < 1:
        raise ValueError(f"nash_price: n must be >= 1, got {n}")

    def gap(p: float) -> float:
        share = logit_shares(np.full(n, p), quality, outside_quality, mu)[0]
        return (p - cost) - mu / (1.0 - share)

    low, high = cost, cost + mu  # gap(c) < 0; widen the upper end until gap > 0
    while gap(high) <= 0.0:
        high = cost + 2.0 * (high - cost)
    return float(brentq(gap, low, high, xtol=1e-14, rtol=1e-14, maxiter=500))


def profit_gain(profit: ArrayLike, pi_nash: float, pi_monopoly: float) -> ArrayLike:
    """Calvano's normalised profit gain ``Delta = (pi - pi_N) / (pi_M - pi_N)``: 0 at the
    static Nash profit, 1 at the joint-monopoly profit."""
    return (np.asarray(profit, dtype=np.float64) - pi_nash) / (pi_monopoly - pi_nash)


def calvano_grid(n: int = 2, m: int = 15, xi: float = 0.1, quality: float = 2.0,
                 cost: float = 1.0, outside_quality: float = 0.0, mu: float = 0.25) -> np.ndarray:
    """The ``m`` equally spaced prices of Calvano et al. spanning::

        [p_N - xi (p_M - p_N),  p_M + xi (p_M - p_N)]

    with ``p_N`` the static Nash and ``p_M`` the joint-monopoly price of ``n`` symmetric
    sellers."""
    p_n = nash_price(n, quality, cost, outside_quality, mu)
    p_m = joint_monopoly_price(n, quality, cost, outside_quality, mu)
    spread = xi * (p_m - p_n)
    return np.linspace(p_n - spread, p_m + spread, m)


def isa_optimal_fee(budget: float, weight: float) -> float:
    """Fee maximising ``fee * u(fee / budget) ** weight`` over ``0 <= fee <= budget``, with
    the indexer-selection utility ``u(x) = 1/(x + s) - s``, ``s = (sqrt 5 - 1)/2``.

    Since ``s^2 = 1 - s``, ``u(x) = s (1 - x) / (x + s)`` (so ``u(0) = 1``, ``u(1) = 0``).
    With ``x = fee / budget`` the log objective ``log x + w log(1 - x) - w log(x + s)``
    has first-order condition ``x^2 - B x - s = 0`` with ``B = 1 - s - w (1 + s)``, whose
    only root in ``(0, 1)`` is::

        fee* = budget * (B + sqrt(B^2 + 4 s)) / 2

    (e.g. ``w = 1``: ``fee* = (1 - s) budget ~= 0.382 budget``; ``w = 0``: the budget).
    """
    if budget < 0:
        raise ValueError(f"isa_optimal_fee: budget must be >= 0, got {budget}")
    if weight < 0:
        raise ValueError(f"isa_optimal_fee: weight must be >= 0, got {weight}")
    b = 1.0 - GOLDEN_S - weight * (1.0 + GOLDEN_S)
    return budget * (b + math.sqrt(b * b + 4.0 * GOLDEN_S)) / 2.0


def isa_utility(normalised_price: ArrayLike) -> ArrayLike:
    """``u(x) = 1/(x + s) - s`` of the indexer-selection price curve (``u(1) = 0``)."""
    x = np.asarray(normalised_price, dtype=np.float64)
    return 1.0 / (x + GOLDEN_S) - GOLDEN_S


# --------------------------------------------------------------------------- Cournot
# n symmetric firms choose quantities q_i; inverse demand P(Q) = a - b Q (Q = sum_i q_i),
# marginal cost c (a > c >= 0, b > 0); profit_i = (P(Q) - c) q_i.

def cournot_nash_quantity(n: int = 2, a: float = 1.0, b: float = 1.0, c: float = 0.0) -> float:
    """Per-firm quantity of the symmetric Cournot-Nash equilibrium. The first-order
    condition ``a - b Q - b q_i - c = 0`` at ``q_i = q`` gives::

        q* = (a - c) / (b (n + 1))
    """
    return (a - c) / (b * (n + 1))


def cournot_nash_price(n: int = 2, a: float = 1.0, b: float = 1.0, c: float = 0.0) -> float:
    """Clearing price at the Cournot-Nash quantities: ``a - b n q* = (a + n c) / (n + 1)``."""
    return a - b * n * cournot_nash_quantity(n, a, b, c)


def cournot_nash_profit(n: int = 2, a: float = 1.0, b: float = 1.0, c: float = 0.0) -> float:
    """Per-firm Cournot-Nash profit: ``(P* - c) q* = (a - c)**2 / (b (n + 1)**2)``."""
    return (cournot_nash_price(n, a, b, c) - c) * cournot_nash_quantity(n, a, b, c)


def cournot_monopoly_quantity(n: int = 2, a: float = 1.0, b: float = 1.0,
                              c: float = 0.0) -> float:
    """Per-firm quantity of the joint monopoly (total profit ``(a - b Q - c) Q`` maximised
    at ``Q_M = (a - c) / (2 b)``), split equally::

        q_M = (a - c) / (2 b n)     (the total is n q_M)
    """
    return (a - c) / (2.0 * b * n)


def cournot_monopoly_price(n: int = 2, a: float = 1.0, b: float = 1.0,
                           c: float = 0.0) -> float:
    """Joint-monopoly price: ``a - b Q_M = (a + c) / 2`` (independent of ``n``)."""
    return a - b * n * cournot_monopoly_quantity(n, a, b, c)


def cournot_monopoly_profit(n: int = 2, a: float = 1.0, b: float = 1.0,
                            c: float = 0.0) -> float:
    """Per-firm joint-monopoly profit: ``(P_M - c) q_M = (a - c)**2 / (4 b n)``."""
    return (cournot_monopoly_price(n, a, b, c) - c) * cournot_monopoly_quantity(n, a, b, c)


# --------------------------------------------------------------------------- linear
# Linear differentiated demand (Singh & Vives 1984), distributor ``linear``: n symmetric
# firms set prices p_i; firm i sells q_i = a - b p_i + g sum_{j != i} p_j (b > 0, g >= 0:
# substitutes), marginal cost c; profit_i = (p_i - c) q_i.

def linear_nash_price(n: int = 2, a: float = 1.0, b: float = 1.0, g: float = 0.5,
                      c: float = 0.0) -> float:
    """Price of the symmetric Bertrand-Nash equilibrium. The first-order condition
    ``a - 2 b p_i + b c + g sum_{j != i} p_j = 0`` at ``p_i = p`` gives::

        p_N = (a + b c) / (2 b - g (n - 1))     (valid when 2 b > g (n - 1))

    >>> round(linear_nash_price(2, 0.48, 0.9, 0.6, 0.0), 6)
    0.4
    """
    return (a + b * c) / (2.0 * b - g * (n - 1))


def linear_nash_quantity(n: int = 2, a: float = 1.0, b: float = 1.0, g: float = 0.5,
                         c: float = 0.0) -> float:
    """Per-firm quantity at the Nash prices: ``a - (b - g (n - 1)) p_N``."""
    return a - (b - g * (n - 1)) * linear_nash_price(n, a, b, g, c)


def linear_nash_profit(n: int = 2, a: float = 1.0, b: float = 1.0, g: float = 0.5,
                       c: float = 0.0) -> float:
    """Per-firm Nash profit: ``(p_N - c) (a - (b - g (n - 1)) p_N)`` (``= b (p_N - c)**2``)."""
    return (linear_nash_price(n, a, b, g, c) - c) * linear_nash_quantity(n, a, b, g, c)


def linear_monopoly_price(n: int = 2, a: float = 1.0, b: float = 1.0, g: float = 0.5,
                          c: float = 0.0) -> float:
    """Price of the joint monopoly: total profit at a common price ``p``,
    ``n (p - c) (a - B p)`` with ``B = b - g (n - 1)``, is maximised at::

        p_M = (a / (b - g (n - 1)) + c) / 2     (valid when b > g (n - 1))

    (then the joint profit is concave in the n prices, so the common price is the
    unconstrained optimum; with the clip at 0 of ``linear``, a firm priced out of the
    market still raises its rivals' demand by ``g`` times its price, so price bounds
    far above ``p_M`` admit asymmetric profiles of higher joint profit.)

    >>> round(linear_monopoly_price(2, 0.48, 0.9, 0.6, 0.0), 6)
    0.8
    """
    return (a / (b - g * (n - 1)) + c) / 2.0


def linear_monopoly_quantity(n: int = 2, a: float = 1.0, b: float = 1.0, g: float = 0.5,
                             c: float = 0.0) -> float:
    """Per-firm quantity at the joint-monopoly price: ``a - (b - g (n - 1)) p_M``."""
    return a - (b - g * (n - 1)) * linear_monopoly_price(n, a, b, g, c)


def linear_monopoly_profit(n: int = 2, a: float = 1.0, b: float = 1.0, g: float = 0.5,
                           c: float = 0.0) -> float:
    """Per-firm joint-monopoly profit: ``(p_M - c) (a - (b - g (n - 1)) p_M)``
    (``= (a - B c)**2 / (4 B)``, ``B = b - g (n - 1)``)."""
    return (linear_monopoly_price(n, a, b, g, c) - c) * linear_monopoly_quantity(n, a, b, g, c)
