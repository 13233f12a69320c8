"""Episode-level split and k-fold, and the vmapped grid search: a run inside the grid
equals a separate fit on its fold, and the best cell is the best mean score."""

import jax
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import fit, make_algo, make_dataset
from jaxmarket.offline.cv import grid_search, kfold, split_episodes


def episodic_dataset(n=240, length=20):
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    act = np.tanh(obs @ np.array([[0.8], [-0.5]], np.float32))
    timeouts = (np.arange(n) % length) == length - 1          # 12 episodes of 20 steps
    return make_dataset(obs, act, rng.normal(size=n), timeouts=timeouts,
                        meta={"action_low": [-1.0], "action_high": [1.0]})


def test_split_and_kfold_never_cut_an_episode():
    ds = episodic_dataset()
    episode_of = ds["episode"]
    train, test = split_episodes(ds, 0.25, seed=3)
    assert len(train) + len(test) == len(ds) and len(test) == 3 * 20
    assert not set(train["episode"]) & set(test["episode"])
    folds = kfold(ds, 5, seed=0)
    held = np.concatenate([te for _, te in folds])
    np.testing.assert_array_equal(np.sort(held), np.arange(len(ds)))   # each row once
    for tr, te in folds:
        assert not set(episode_of[tr]) & set(episode_of[te])
        assert len(tr) + len(te) == len(ds)
    with pytest.raises(ConfigError, match="folds: got 13; allowed: at most the number of "
                                          "episodes \\(12\\)"):
        kfold(ds, 13)


def test_grid_search_cells_equal_separate_runs_and_best_is_the_best_mean():
    ds = episodic_dataset()
    kw = {"folds": 3, "seeds": 2, "steps": 40, "batch_size": 32, "score": "action_diff",
          "hidden": [8]}
    res = grid_search("bc", ds, {"learning_rate": [3e-3, 3e-4]}, **kw)
    assert len(res.table) == 2 * 3 * 2
    # the best cell has the lowest mean held-out action difference
    means = {c["learning_rate"]: np.mean([r["action_diff"] for r in res.table
                                          if r["learning_rate"] == c["learning_rate"]])
             for c in res.cells}
    assert res.best["learning_rate"] == min(means, key=means.get)
    # run (lr 3e-4, fold 1, seed 1) == fit on fold 1's training rows, scored on its test rows
    i = next(k for k, r in enumerate(res.table)
             if r["learning_rate"] == 3e-4 and r["fold"] == 1 and r["seed"] == 1)
    tr, te = kfold(ds, 3)[1]
    train = ds.take(tr)
    algo = make_algo("bc", train, learning_rate=3e-4, hidden=[8])
    alone = fit(algo, train, stop=40, chunk=40, seed=1, batch_size=32).state
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], res.states)),
                    jax.tree.leaves(alone)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    test = ds.take(te)
    diff = np.linalg.norm(np.asarray(algo.policy(alone, test["observations"]))
                          - test["actions"], axis=-1).mean()
    assert res.table[i]["action_diff"] == pytest.approx(diff, rel=1e-5)
    with pytest.raises(ConfigError, match="grid.hidden"):
        grid_search("bc", ds, {"hidden": [[8], [16]]}, **kw)
