"""Episode-level train/test split, k-fold cross-validation and grid search, with the whole
grid x folds x seeds trained as one vmapped program.

``split_episodes(ds, test_fraction, seed)`` and ``kfold(ds, k, seed)`` split whole
episodes (:meth:`Dataset.episodes`), never rows of one episode across sides.

``grid_search(name, dataset, grid, folds=k, seeds=s, steps=n, score=...)`` trains every
cell of the hyperparameter grid on every fold's training episodes with every seed:
``C x F x S`` runs in one ``jax.vmap`` of one ``lax.scan``. The varied hyperparameters are
*arrays* (traced values, so one compilation serves the whole grid; only float
hyperparameters may vary, network sizes are static); each run's normalisation comes from
its own training fold; its minibatches are drawn from its fold's rows, padded to a common
length, by ``randint(0, fold_size)`` and a gather. Run ``(c, f, s)`` is therefore the same
computation as ``fit(make_algo(name, train_f, **cell_c), train_f, stop=n, chunk=n,
seed=s)`` on the fold's rows (equal up to float rounding of batched matmuls). Each run is
scored on its held-out fold by an in-graph scorer:

* ``td``          -- mean squared TD error ``(Q(s,a) - r - gamma (1 - t) Q(s', pi(s')))^2`` (min);
* ``action_diff`` -- mean ``||pi(s) - a||`` (min);
* ``value``       -- mean ``Q(s_0, pi(s_0))`` over held-out initial states (max);
* ``sim``         -- the policy's discounted value in the dataset's scenario (max; the
  data only trains it).

The result is a table (one row per run, plus the per-cell mean over folds and seeds) and
the best cell by that mean.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import check_mapping
from jaxmarket.offline.algos import ALGOS, COMMON
from jaxmarket.offline.algos.common import Norm, infer_norm, normalise, raw_data
from jaxmarket.offline.dataset import Dataset
from jaxmarket.offline.scenario import load_scenario
from jaxmarket.offline.simulate import rollout_fn

SCORES = {"td": "min", "action_diff": "min", "value": "max", "sim": "max"}


def split_episodes(ds: Dataset, test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, test) with a ``test_fraction`` of the episodes (at least one) held out."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError("test_fraction", test_fraction, "a number in (0, 1)")
    eps = ds.episodes()
    if len(eps) < 2:
        raise ConfigError("dataset", f"{len(eps)} episode", "at least 2 episodes to split")
    order = np.random.default_rng(seed).permutation(len(eps))
    n_test = min(len(eps) - 1, max(1, round(test_fraction * len(eps))))
    test = np.concatenate([eps[i] for i in order[:n_test]])
    train = np.concatenate([eps[i] for i in order[n_test:]])
    return ds.take(np.sort(train)), ds.take(np.sort(test))


def kfold(ds: Dataset, k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` (train rows, test rows) index pairs; fold ``i`` holds out every ``k``-th
    episode of a seeded permutation, starting at ``i``."""
    eps = ds.episodes()
    if not isinstance(k, int) or k < 2:
        raise ConfigError("folds", k, "an integer >= 2")
    if k > len(eps):
        raise ConfigError("folds", k, f"at most the number of episodes ({len(eps)})")
    order = np.random.default_rng(seed).permutation(len(eps))
    folds = []
    for i in range(k):
        test = np.sort(np.concatenate([eps[j] for j in order[i::k]]))
        train = np.setdiff1d(np.arange(len(ds)), test)
        folds.append((train, test))
    return folds


@dataclasses.dataclass
class GridResult:
    table: list[dict[str, Any]]        # one row per run: cell values, fold, seed, score
    cells: list[dict[str, Any]]        # one row per cell: values, mean and std of the score
    best: dict[str, Any]               # the best cell's row
    score: str
    states: Any                        # final states, leading axis = run (table order)


def _pad(groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(g) for g in groups)
    idx = np.zeros((len(groups), width), np.int32)
    for i, g in enumerate(groups):
        idx[i, :len(g)] = g
    return idx, np.asarray([len(g) for g in groups], np.int32)


def grid_search(name: str, dataset: Dataset, grid: Mapping[str, list], *, folds: int = 3,
                seeds: int = 1, steps: int = 1000, batch_size: int = 256, score: str = "td",
                score_gamma: float | None = None, sim_steps: int = 200, fold_seed: int = 0,
                **fixed: Any) -> GridResult:
    """Train and score the grid (see the module docstring). ``fixed`` are the other
    hyperparameters of the algorithm; ``score_gamma`` (the discount of the ``td`` and
    ``sim`` scores) defaults to the algorithm's ``gamma`` (0.9 for those without one)."""
    if name not in ALGOS:
        raise ConfigError("--algo", name, "one of " + ", ".join(ALGOS))
    if score not in SCORES:
        raise ConfigError("score", score, "one of " + ", ".join(SCORES))
    for key, val in (("steps", steps), ("seeds", seeds), ("batch_size", batch_size)):
        if not isinstance(val, int) or val < 1:
            raise ConfigError(key, val, "an integer >= 1")
    definition = ALGOS[name]
    fields = {**COMMON, **definition.fields}
    if not grid or any(not isinstance(v, (list, tuple)) or not v for v in grid.values()):
        raise ConfigError("grid", dict(grid), "a mapping of hyperparameter -> non-empty list")
    for key in grid:
        if key not in definition.fields or definition.fields[key].kind != "float":
            floats = sorted(k for k, f in definition.fields.items() if f.kind == "float")
            raise ConfigError(f"grid.{key}", grid[key], "a float hyperparameter of "
                              f"{name}: one of " + ", ".join(floats))
    keys = list(grid)
    cells = [dict(zip(keys, vals)) for vals in itertools.product(*(grid[k] for k in keys))]
    for cell in cells:   # every cell validated with concrete values
        check_mapping(fields, {**fixed, **cell}, f"algo.{name}", ignore=())
    base = check_mapping(fields, {**fixed, **cells[0]}, f"algo.{name}", ignore=())
    gamma = score_gamma if score_gamma is not None else base.get("gamma", 0.9)
    if "gamma" in grid and score_gamma is None and score in ("td", "sim"):
        raise ConfigError("score_gamma", None, "a fixed discount for the scores when gamma "
                          "is part of the grid")
    splits = kfold(dataset, folds, fold_seed)
    norms = [infer_norm(dataset.take(tr), base["normalize_obs"], base["reward_scale"])
             for tr, _ in splits]
    train_idx, train_n = _pad([tr for tr, _ in splits])
    test_idx, test_n = _pad([te for _, te in splits])
    runs = [(c, f, s) for c in range(len(cells)) for f in range(folds) for s in range(seeds)]
    hyper_arr = {k: jnp.asarray([cells[c][k] for c, _, _ in runs], jnp.float32) for k in keys}
    fold_of = np.asarray([f for _, f, _ in runs])
    norm_arr = jax.tree.map(lambda *xs: jnp.stack(xs)[fold_of], *norms)
    keys_arr = jax.vmap(jax.random.key)(jnp.asarray([s for _, _, s in runs], jnp.uint32))
    raw = raw_data(dataset)
    first = jnp.asarray(np.asarray(dataset["step"]) == 0)
    sim = None
    if score == "sim":
        if dataset.meta.get("config") is None:
            raise ConfigError("score", "sim", "a dataset made by jaxmarket.collect")
        sim = rollout_fn(load_scenario(dataset.meta["config"]), dataset.meta["group"],
                         sim_steps, gamma)

    def one_run(hyper, norm: Norm, tr_idx, tr_n, te_idx, te_n, key):
        algo = definition.make(norm, {**base, **hyper}, dataset)
        state = algo.init(jax.random.fold_in(key, 0x5EED))

        def one(state, k):
            k_batch, k_update = jax.random.split(k)
            rows = tr_idx[jax.random.randint(k_batch, (batch_size,), 0, tr_n)]
            batch = normalise(jax.tree.map(lambda x: x[rows], raw), norm)
            return algo.update(state, batch, k_update)

        state, _ = jax.lax.scan(one, state, jax.random.split(jax.random.fold_in(key, 0), steps))
        mask = (jnp.arange(te_idx.shape[0]) < te_n).astype(jnp.float32)
        held = jax.tree.map(lambda x: x[te_idx], raw)
        if score == "action_diff":
            diff = jnp.linalg.norm(algo.policy(state, held["obs"]) - held["actions"], axis=-1)
            value = (diff * mask).sum() / mask.sum()
        elif score in ("td", "value"):
            if algo.q_value is None:
                raise ConfigError("score", score, f"an algorithm with a critic ({name} has none)")
            if score == "td":
                q = algo.q_value(state, held["obs"], held["actions"])
                nq = algo.q_value(state, held["next_obs"], algo.policy(state, held["next_obs"]))
                err = (q - held["rewards"] - gamma * (1.0 - held["terminals"]) * nq) ** 2
                value = (err * mask).sum() / mask.sum()
            else:
                m0 = mask * first[te_idx]
                m0 = jnp.where(m0.sum() > 0, m0, mask)
                q0 = algo.q_value(state, held["obs"], algo.policy(state, held["obs"]))
                value = (q0 * m0).sum() / m0.sum()
        else:
            value = sim(lambda obs: algo.policy(state, obs), key)["discounted_return"]
        return state, value

    program = jax.jit(jax.vmap(one_run))
    states, values = program(hyper_arr, norm_arr, jnp.asarray(train_idx[fold_of]),
                             jnp.asarray(train_n[fold_of]), jnp.asarray(test_idx[fold_of]),
                             jnp.asarray(test_n[fold_of]), keys_arr)
    values = np.asarray(values, np.float64)
    table = [{**cells[c], "fold": f, "seed": s, score: float(v)}
             for (c, f, s), v in zip(runs, values)]
    per_cell = values.reshape(len(cells), folds * seeds)
    cell_rows = [{**cell, "mean": float(per_cell[i].mean()), "std": float(per_cell[i].std())}
                 for i, cell in enumerate(cells)]
    pick = np.argmax if SCORES[score] == "max" else np.argmin
    best = cell_rows[int(pick(per_cell.mean(1)))]
    return GridResult(table, cell_rows, best, score, states)


__all__ = ["GridResult", "grid_search", "kfold", "split_episodes"]
