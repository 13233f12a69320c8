"""Metric names and the host side of metrics: chunk outputs -> ``metrics.csv`` and
``seeds.csv`` rows.

In the compiled chunk, ``metrics[name]`` is ``[length, ...]``: the market metrics
``reward/<g>`` (``[]``), ``price/<g>`` and ``traffic/<g>`` (``[P]``) are means over the
rollout, seeds, markets and agents, and ``per_seed/<name>`` holds the same per seed
(``[S]``, ``[S, P]``); ``learner/<g>/<m>`` are the learners' own metrics, averaged over
whatever axis they report; components add theirs (``reward/<g>/m<k>``, ``model/<g>/...``,
``poi/<g>/...``, ``league/<g>/pool``, ``mapping/<g>/repaired``, ``crossplay/...``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PER_SEED = "per_seed/"   # prefix of the per-seed copies of the market metrics
# prefix of the non-finite action counts (loop.market_metrics): no metrics.csv column (a
# column would change every run's header); the trainer reads them (stop_on_nan and
# nonfinite_actions.csv)
NONFINITE = "nonfinite_actions/"


def metric_table(metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``metrics.csv`` columns of a chunk's metrics (``per_seed/`` and
    ``nonfinite_actions/`` left out): one
    ``[chunk]`` float64 array per column, per-product vectors expanded to name/p{j}, the
    POI observation's ``k`` values (``poi/<g>/obs``) to name/k{j}."""
    columns: dict[str, np.ndarray] = {}
    for name, value in metrics.items():
        if name.startswith((PER_SEED, NONFINITE)):
            continue
        v = np.asarray(value, np.float64)
        if v.ndim == 1:
            columns[name] = v
        else:
            axis = "k" if name.startswith("poi/") and name.endswith("/obs") else "p"
            for j in range(v.shape[1]):
                columns[f"{name}/{axis}{j}"] = v[:, j]
    return columns


def flatten_metrics(metrics: dict[str, np.ndarray], start: int,
                    keep: Sequence[int] | None = None) -> list[dict[str, float]]:
    """[chunk, ...] arrays (already means over seeds, markets and agents) -> one row per
    iteration (:func:`metric_table`'s columns); ``keep``: only the rows of these chunk
    indices (``train.log_every``), in that order."""
    columns = metric_table(metrics)
    n = next(iter(columns.values())).shape[0]
    return [{"iteration": start + i + 1, **{k: float(c[i]) for k, c in columns.items()}}
            for i in (range(n) if keep is None else keep)]


def logged(start: int, length: int, every: int, last: bool) -> list[int]:
    """The chunk indices (iterations ``start + 1 .. start + length``) that get a row:
    every multiple of ``every``, and the chunk's last iteration when ``last`` (the run's
    end, or a stop)."""
    keep = list(range((every - (start + 1) % every) % every, length, every))
    if last and (not keep or keep[-1] != length - 1):
        keep.append(length - 1)
    return keep


def seed_rows(metrics: dict[str, np.ndarray], start: int,
              keep: Sequence[int] | None = None) -> list[dict[str, float]]:
    """The ``per_seed/`` metrics ``[chunk, S(, P)]`` -> one ``seeds.csv`` row per
    iteration and seed (``iteration, seed, reward/<g>, price/<g>/p<j>, ...``); ``keep``
    as in :func:`flatten_metrics`."""
    per_seed = {k[len(PER_SEED):]: np.asarray(v) for k, v in metrics.items()
                if k.startswith(PER_SEED)}
    if not per_seed:
        return []
    num_seeds = next(iter(per_seed.values())).shape[1]
    rows = []
    for s in range(num_seeds):
        rows_s = flatten_metrics({k: v[:, s] for k, v in per_seed.items()}, start, keep)
        rows.append([{"iteration": r["iteration"], "seed": s,
                      **{k: v for k, v in r.items() if k != "iteration"}} for r in rows_s])
    return [row for it_rows in zip(*rows) for row in it_rows]   # iteration-major
