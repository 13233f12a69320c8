"""``summary.json``: final prices, rewards and traffic per agent group, over seeds and
for each seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxmarket.market.env import MarketEnv
from jaxmarket.models.metrics import asymptotic, auc
from jaxmarket.train.tracking import read_metrics


def _final(header: list[str], tail: np.ndarray, group: str, num_products: int) -> dict:
    col = {name: i for i, name in enumerate(header)}
    return {
        "mean_price": [float(tail[:, col[f"price/{group}/p{j}"]].mean())
                       for j in range(num_products)],
        "mean_reward": float(tail[:, col[f"reward/{group}"]].mean()),
        "mean_traffic": [float(tail[:, col[f"traffic/{group}/p{j}"]].mean())
                         for j in range(num_products)],
    }


def _members(header: list[str], tail: np.ndarray, group: str, num_products: int) -> dict:
    """A population's members over the last window: ``mean_reward [K]``, ``mean_price
    [K][P]`` and, where the group has several agents per market, the cross-play matrix
    ``crossplay[i][j]`` (member i's mean reward against member j; ``None`` where they
    never met)."""
    col = {name: i for i, name in enumerate(header)}
    K = sum(1 for h in header if h.startswith(f"reward/{group}/m"))
    if not K:
        return {}
    out = {"mean_reward": [float(tail[:, col[f"reward/{group}/m{k}"]].mean()) for k in range(K)],
           "mean_price": [[float(tail[:, col[f"price/{group}/m{k}/p{j}"]].mean())
                           for j in range(num_products)] for k in range(K)]}
    if f"crossplay/{group}/m0/m0" in col:
        with np.errstate(all="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN: never met
                matrix = [[np.nanmean(tail[:, col[f"crossplay/{group}/m{i}/m{j}"]])
                           for j in range(K)] for i in range(K)]
        out["crossplay"] = [[None if np.isnan(v) else float(v) for v in row] for row in matrix]
    return out


def _models(header: list[str], data: np.ndarray) -> dict:
    """External models (``model/<g>/<error>`` columns, means over seeds): per error its
    ``final`` value, ``auc`` (the mean over the run, jaxmarket.models.metrics.auc) and
    ``asymptotic`` (the mean over the last 20% of the iterations); docs/poi.md."""
    out: dict = {}
    it = data[:, header.index("iteration")]
    for i, name in enumerate(header):
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "model" and parts[2].endswith("_error"):
            e = data[:, i]
            out.setdefault(parts[1], {})[parts[2]] = {
                "final": float(e[-1]), "auc": auc(it, e), "asymptotic": asymptotic(e)}
    return out


def write_summary(run_dir: Path, env: MarketEnv, stopped: str | None, iterations: int) -> dict:
    """``final[group]`` = ``mean_price`` (list, one per product), ``mean_reward`` and
    ``mean_traffic`` (list per product), averaged over seeds, agents (already in the
    metrics) and the last 10% of the iterations recorded, ``ceil(0.1 * rows)``.
    ``per_seed[group]`` holds the same three for each seed (from ``seeds.csv``), as lists
    indexed by seed. ``members[group]`` (groups with a population) holds each member's
    ``mean_reward``, ``mean_price`` and the cross-play matrix over the same window.
    ``models[group]`` (groups with an external model) holds the final, mean (AUC) and
    asymptotic values of its ground-truth errors."""
    header, data = read_metrics(run_dir / "metrics.csv")
    n_tail = max(1, int(np.ceil(0.1 * len(data))))
    tail = data[-n_tail:]
    P = env.spec.num_products
    final = {g: _final(header, tail, g, P) for g in env.agent_groups}
    summary = {"final": final, "iterations": iterations, "stopped": stopped,
               "averaged_over_last_iterations": int(len(tail))}
    members = {g: _members(header, tail, g, P) for g in env.agent_groups}
    if any(members.values()):
        summary["members"] = {g: m for g, m in members.items() if m}
    models = _models(header, data)
    if models:
        summary["models"] = models
    if (run_dir / "seeds.csv").is_file():
        s_header, s_data = read_metrics(run_dir / "seeds.csv")
        seed_col, it_col = s_data[:, s_header.index("seed")], s_data[:, s_header.index("iteration")]
        last = it_col >= data[-n_tail, 0]
        seeds = np.unique(seed_col).astype(int)
        per_seed = {g: [_final(s_header, s_data[last & (seed_col == s)], g, P) for s in seeds]
                    for g in env.agent_groups}
        summary["per_seed"] = {g: {k: [r[k] for r in rows] for k in rows[0]}
                               for g, rows in per_seed.items()}
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / "summary.json")
    return summary
