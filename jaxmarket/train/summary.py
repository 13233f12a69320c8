"""``summary.json``: final prices, rewards and traffic per agent group."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxmarket.market.env import MarketEnv
from jaxmarket.train.tracking import read_metrics


def write_summary(run_dir: Path, env: MarketEnv, stopped: str | None, iterations: int) -> dict:
    """``final[group]`` = ``mean_price`` (list, one per product), ``mean_reward`` and
    ``mean_traffic`` (list per product), averaged over seeds, agents (already in the
    metrics) and the last 10% of the iterations recorded."""
    header, data = read_metrics(run_dir / "metrics.csv")
    tail = data[-max(1, int(np.ceil(0.1 * len(data)))):]
    col = {name: i for i, name in enumerate(header)}
    P = env.spec.num_products
    final = {}
    for g in env.agent_groups:
        final[g] = {
            "mean_price": [float(tail[:, col[f"price/{g}/p{j}"]].mean()) for j in range(P)],
            "mean_reward": float(tail[:, col[f"reward/{g}"]].mean()),
            "mean_traffic": [float(tail[:, col[f"traffic/{g}/p{j}"]].mean()) for j in range(P)],
        }
    summary = {"final": final, "iterations": iterations, "stopped": stopped,
               "averaged_over_last_iterations": int(len(tail))}
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / "summary.json")
    return summary
