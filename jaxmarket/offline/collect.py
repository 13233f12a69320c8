"""Making datasets: roll a scenario in a compiled loop and record every agent group's
transitions, streamed to disk chunk by chunk (or kept as a uniform reservoir sample).

``collect(config, steps, out, ...)`` steps all ``train.num_envs x train.num_seeds``
markets of the scenario ``steps`` times; each chunk of ``chunk`` steps is one jitted
``lax.scan`` whose rows go to disk before the next starts, so a dataset may exceed
memory. With ``capacity=M`` each group instead keeps a reservoir of ``M`` rows in the
scan carry (Algorithm R, :mod:`jaxmarket.offline.reservoir`), written once at the end:
a uniform sample of everything the markets produced.

The ``primary`` group (default: the first agent group) may be made noisy: ``noise=SIGMA``
(truncated Gaussian around its policy's action) or ``grid=K, epsilon=EPS`` (discrete,
epsilon-greedy on ``K`` price levels); the exact behaviour log-probabilities are then
recorded (else the learner's own ``aux["log_prob"]`` where it has one, else NaN).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.behaviour import epsilon_grid, truncated_gaussian
from jaxmarket.offline.dataset import DatasetWriter
from jaxmarket.offline.reservoir import reservoir_add, reservoir_init
from jaxmarket.offline.scenario import Scenario, load_scenario, make_step


def behaviour_override(sc: Scenario, group: str, noise: float | None, grid: int | None,
                       epsilon: float) -> tuple[dict, dict]:
    """(override for make_step, extra metadata) of the primary group's behaviour."""
    if noise is not None and grid is not None:
        raise ConfigError("--noise", noise, "either --noise or --grid, not both")
    low, high = sc.bounds(group)
    tiled = (np.tile(low, (sc.num_markets, 1)), np.tile(high, (sc.num_markets, 1)))
    if noise is not None:
        return {group: truncated_gaussian(float(noise), *tiled)}, {
            "behaviour": {"kind": "truncated_gaussian", "sigma": float(noise)}}
    if grid is not None:
        wrap, values = epsilon_grid(int(grid), float(epsilon), *tiled)
        return {group: wrap}, {"discrete": True, "action_values": values.tolist(),
                               "behaviour": {"kind": "epsilon_grid", "size": int(grid),
                                             "epsilon": float(epsilon)}}
    return {}, {"behaviour": {"kind": "policy"}}


def collect(config: Any = None, steps: int = 1000, out: str | Path = "dataset", *,
            policy_dir: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
            capacity: int | None = None, chunk: int = 1000, group: str | None = None,
            noise: float | None = None, grid: int | None = None, epsilon: float = 0.1,
            seed: int | None = None, progress: bool = False) -> dict:
    """Record ``steps`` steps of every market of the scenario into the directory ``out``;
    returns a summary (rows per group, seconds)."""
    for name, value, low in (("--steps", steps, 1), ("--chunk", chunk, 1)):
        if not isinstance(value, int) or value < low:
            raise ConfigError(name, value, f"an integer >= {low}")
    if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
        raise ConfigError("--capacity", capacity, "an integer >= 1")
    if noise is not None and grid is not None:
        raise ConfigError("--noise", noise, "either --noise or --grid, not both")
    if noise is not None and not noise > 0:
        raise ConfigError("--noise", noise, "a number > 0")
    if grid is not None and (not isinstance(grid, int) or grid < 2):
        raise ConfigError("--grid", grid, "an integer >= 2")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError("--epsilon", epsilon, "a number in [0, 1]")
    sc = load_scenario(config, policy_dir, overrides, seed)
    primary = group or sc.groups[0]
    if primary not in sc.groups:
        raise ConfigError("--group", primary, "one of the agent groups " + ", ".join(sc.groups))
    override, extra = behaviour_override(sc, primary, noise, grid, epsilon)
    reset, step = make_step(sc, override)
    key = jax.random.fold_in(jax.random.key(int(sc.config.get("seed", 0))), 11)
    k_reset, k_run = jax.random.split(key)
    carry = jax.jit(reset)(k_reset)
    P = sc.env.spec.num_products
    meta = {}
    for g in sc.groups:
        low, high = sc.bounds(g)
        m = {"group": g, "obs_dim": int(sc.specs[g].obs_dim), "action_dim": P,
             "action_low": low.min(0).tolist(), "action_high": high.max(0).tolist(),
             "agents_per_market": sc.size(g), "num_markets": sc.num_markets,
             "discrete": False, "behaviour": {"kind": "policy"}}
        if g == primary:
            m.update(extra)
        meta[g] = m
    summary = {"out": str(out), "steps": steps, "markets": sc.num_markets,
               "primary": primary, "rows": {}}
    t0 = time.perf_counter()
    writer = DatasetWriter(out, meta, {"primary": primary, "config": sc.config,
                                       "steps": steps, "capacity": capacity})
    try:
        if capacity is None:
            run = jax.jit(lambda c, k, n: jax.lax.scan(step, c, jax.random.split(k, n)),
                          static_argnums=2)
            done = 0
            while done < steps:
                n = min(chunk, steps - done)
                carry, rows = run(carry, jax.random.fold_in(k_run, done), n)
                rows = jax.device_get(rows)
                for g in sc.groups:   # [n, E*A, ...] -> [n * E*A, ...]
                    writer.write(g, {k: np.asarray(v).reshape((v.shape[0] * v.shape[1],)
                                                              + v.shape[2:])
                                     for k, v in rows[g].items()})
                done += n
                if progress:
                    print(f"collected {done}/{steps} steps", flush=True)
            for g in sc.groups:
                summary["rows"][g] = steps * sc.num_markets * sc.size(g)
        else:
            example = jax.eval_shape(step, carry, k_run)[1]
            res = {g: reservoir_init(example[g], capacity) for g in sc.groups}

            def body(state, k):
                c, res = state
                k_step, k_res = jax.random.split(k)
                c, rows = step(c, k_step)
                rkeys = jax.random.split(k_res, len(sc.groups))
                res = {g: reservoir_add(rkeys[i], res[g], rows[g])
                       for i, g in enumerate(sc.groups)}
                return (c, res), None

            run = jax.jit(lambda s, k, n: jax.lax.scan(body, s, jax.random.split(k, n))[0],
                          static_argnums=2)
            state, done = (carry, res), 0
            while done < steps:
                n = min(chunk, steps - done)
                state = run(state, jax.random.fold_in(k_run, done), n)
                done += n
            res = jax.device_get(state[1])
            for g in sc.groups:
                size = int(min(int(res[g].count), capacity))
                writer.write(g, {k: np.asarray(v)[:size] for k, v in res[g].data.items()})
                summary["rows"][g] = size
                summary.setdefault("offered", {})[g] = int(res[g].count)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    return summary


__all__ = ["behaviour_override", "collect"]
