"""Summary metrics of an external model's error curve (per run) and across seeds.

For an error curve ``e_1 .. e_n`` logged at iterations ``t_1 < .. < t_n`` (one phase of
a run), with ``s`` its trailing moving average over ``smooth`` points::

    auc          = sum_k e_k (t_{k+1} - t_k) / (t_n - t_1)     (left Riemann sum, the
                   mean error over the phase; the last point gets the mean spacing)
    convergence  = the first t_k with s_k <= threshold (None: never)
    asymptotic   = mean of e over the last ``tail`` fraction of the points

Across seeds: the interquartile mean with a 95% percentile-bootstrap interval, rliable's
definitions (Agarwal et al. 2021). rliable itself is not used: rliable 1.2 needs
``arch<8`` (it passes ``random_state``), and ``arch<8`` fails to import with pandas 3.
"""

from __future__ import annotations

import numpy as np


def auc(t, e) -> float:
    t, e = np.asarray(t, np.float64), np.asarray(e, np.float64)
    if len(t) < 2:
        return float(e.mean())
    dt = np.diff(t)
    dt = np.append(dt, dt.mean())
    return float(np.sum(e * dt) / np.sum(dt))


def smoothed(e, smooth: int) -> np.ndarray:
    e = np.asarray(e, np.float64)
    c = np.cumsum(np.insert(e, 0, 0.0))
    k = np.arange(1, len(e) + 1)
    lo = np.maximum(k - smooth, 0)
    return (c[k] - c[lo]) / (k - lo)


def convergence(t, e, threshold: float, smooth: int = 5):
    s = smoothed(e, smooth)
    hit = np.nonzero(s <= threshold)[0]
    return None if hit.size == 0 else int(np.asarray(t)[hit[0]])


def asymptotic(e, tail: float = 0.2) -> float:
    e = np.asarray(e, np.float64)
    n = max(1, round(len(e) * tail))
    return float(e[-n:].mean())


def iqm(x) -> float:
    """Interquartile mean (the mean of the middle 50%, scipy's trim_mean(x, 0.25))."""
    from scipy.stats import trim_mean
    return float(trim_mean(np.asarray(x, np.float64), 0.25))


def iqm_interval(x, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``(iqm, low, high)``: the IQM over seeds and its 95% percentile-bootstrap
    interval (``scipy.stats.bootstrap``; with one task rliable's stratified bootstrap is
    this plain bootstrap over runs, and its default method is the percentile one)."""
    from scipy.stats import bootstrap, trim_mean

    x = np.asarray(x, np.float64)
    point = iqm(x)
    if np.all(x == x[0]):
        return point, point, point
    res = bootstrap((x,), lambda v, axis=-1: trim_mean(v, 0.25, axis=axis), n_resamples=reps,
                    confidence_level=0.95, method="percentile",
                    rng=np.random.default_rng(seed))
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)
