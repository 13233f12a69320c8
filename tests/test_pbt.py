"""Population-based training (jaxmarket/train/pbt.py, wired into the training loop):
the PBT step on a forced objective, the events it logs, seeds kept apart, resume, and
config errors before compiling."""

import copy
import csv
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONFIGS

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.train.pbt import PbtConfig, no_events, pbt_step
from jaxmarket.train.plan import resolve
from jaxmarket.train.checkpoints import Checkpoints
from jaxmarket.train.trainer import Trainer
from jaxmarket.train.tracking import CsvMetrics, Tracker, read_metrics

S, K = 3, 6
BOUNDS = (1e-4, 0.5)


step_jit = jax.jit(pbt_step, static_argnums=3)   # one compile per PbtConfig


def cfg(**kw) -> PbtConfig:
    base = dict(kind="ppo_bandit", size=K, period=1, start=0, objective="reward",
                replace_fraction=0.34, gap_relative=0.1, gap_absolute=0.0, mutation_rate=1.0,
                perturb=(1.2, 1.5), hyperparams=(("learning_rate",) + BOUNDS,))
    base.update(kw)
    return PbtConfig(**base)


def member_tree(key):
    """A Gaussian bandit's member leaves for S seeds x K members: every value unique, so
    a copied row identifies its source."""
    k1, k2, k3 = jax.random.split(key, 3)
    N = S * K
    return {"params": {"mean": jax.random.normal(k1, (N, 2)),
                       "log_std": jax.random.normal(k2, (N, 2))},
            "opt_state": ({"mu": jax.random.normal(k3, (N, 2)), "count": jnp.int32(7)},),
            "hyper": {"learning_rate": jnp.linspace(1e-3, 1e-2, N, dtype=jnp.float32)}}


def forced_objective():
    # a different ranking per seed; the bottom two of every seed trail the top by far
    base = np.array([0.9, 0.1, 0.8, 0.2, 0.5, 0.6], np.float32)
    return jnp.asarray(np.stack([np.roll(base, s) for s in range(S)]))


def test_bottom_members_copy_a_top_member_bitwise_and_perturb_within_bounds():
    """Catches: copying from the wrong member or seed, copying only the parameters (not
    the optimizer state), a factor outside the perturb range, no clipping to bounds,
    replacing members that are not in the bottom fraction."""
    config = cfg()
    tree, obj = member_tree(jax.random.key(0)), forced_objective()
    n = config.num_replace
    assert n == 2
    checked = 0
    step = lambda k, t, o: step_jit(k, t, o, config)  # noqa: E731
    tree_np = jax.tree.map(np.asarray, tree)
    for seed in range(20):
        new, ev = jax.tree.map(np.asarray, step(jax.random.key(seed), tree, obj))
        order = np.argsort(-np.asarray(obj), axis=1, kind="stable")
        replaced, source = np.asarray(ev["replaced"]), np.asarray(ev["source"])
        for s in range(S):
            bottom, top = set(order[s, K - n:]), set(order[s, :n])
            assert set(np.nonzero(replaced[s])[0]) == bottom       # the gap is large
            for k in range(K):
                i = s * K + k
                src = s * K + source[s, k]                           # within seed s
                leaves = [("mean", tree_np["params"]["mean"], new["params"]["mean"]),
                          ("log_std", tree_np["params"]["log_std"], new["params"]["log_std"]),
                          ("mu", tree_np["opt_state"][0]["mu"], new["opt_state"][0]["mu"])]
                if k in bottom:
                    assert source[s, k] in top
                    for name, old, now in leaves:
                        np.testing.assert_array_equal(np.asarray(now[i]), np.asarray(old[src]),
                                                      err_msg=name)
                    lr_src = float(tree_np["hyper"]["learning_rate"][src])
                    lr = float(new["hyper"]["learning_rate"][i])
                    ratio = lr / lr_src
                    assert (BOUNDS[0] <= lr <= BOUNDS[1]) and (
                        1.2 - 1e-5 <= ratio <= 1.5 + 1e-5
                        or 1 / 1.5 - 1e-5 <= ratio <= 1 / 1.2 + 1e-5
                        or lr in (np.float32(BOUNDS[0]), np.float32(BOUNDS[1]))), (lr, lr_src)
                    assert float(ev["old/learning_rate"][s, k]) == float(
                        tree_np["hyper"]["learning_rate"][i])
                    assert float(ev["new/learning_rate"][s, k]) == lr
                    checked += 1
                else:
                    assert source[s, k] == k
                    for name, old, now in leaves:
                        np.testing.assert_array_equal(np.asarray(now[i]), np.asarray(old[i]))
                    assert new["hyper"]["learning_rate"][i] == tree_np["hyper"]["learning_rate"][i]
        assert int(new["opt_state"][0]["count"]) == 7          # shared scalars untouched
    assert checked == 20 * S * n


def test_clipping_to_the_bounds():
    """Catches a mutated value left outside [low, high]."""
    config = cfg(hyperparams=(("learning_rate", 1e-3, 1e-3),))
    new, ev = step_jit(jax.random.key(1), member_tree(jax.random.key(2)), forced_objective(),
                       config)
    replaced_lr = np.asarray(new["hyper"]["learning_rate"]).reshape(S, K)[
        np.asarray(ev["replaced"])]
    assert replaced_lr.size == S * 2
    np.testing.assert_array_equal(replaced_lr, np.float32(1e-3))


@pytest.mark.parametrize("gap", [dict(gap_relative=0.1), dict(gap_relative=0.0, gap_absolute=0.2)])
def test_no_member_is_replaced_when_the_gap_is_below_the_threshold(gap):
    """Catches replacing on a gap that is below either threshold (the rule needs both)."""
    obj = jnp.asarray(np.full((S, K), 1.0, np.float32) + np.linspace(0, 0.09, K, dtype=np.float32))
    if gap.get("gap_absolute"):
        obj = obj * 0.1   # relative gap ~ 0.5 (met), absolute gap <= 0.009 (not met)
    tree = member_tree(jax.random.key(3))
    new, ev = step_jit(jax.random.key(4), tree, obj, cfg(**gap))
    assert not np.asarray(ev["replaced"]).any()
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(new)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the same objectives with a 100x spread are replaced: the test is not vacuous
    _, ev = step_jit(jax.random.key(4), tree, (obj - obj.min()) * 100 + 0.01, cfg(**gap))
    assert np.asarray(ev["replaced"]).any()


def test_no_events_is_the_identity():
    tree, obj = member_tree(jax.random.key(5)), forced_objective()
    ev = no_events(tree, obj, cfg())
    assert not np.asarray(ev["replaced"]).any()
    np.testing.assert_array_equal(np.asarray(ev["source"]), np.tile(np.arange(K), (S, 1)))


# ---- through the training loop ---------------------------------------------------------

PBT = {"period": 4, "mutation_rate": 1.0, "replace_fraction": 0.5,
       "replace_reward_gap": {"relative": 0.0, "absolute": 0.0},
       "hyperparams": {"learning_rate": [1e-5, 1e-1]}, "init": {"learning_rate": "log_spaced"}}


def small(iterations=20, **pbt):
    config = load_config(CONFIGS / "logit_monopoly.yaml",
                         [f"train.num_iterations={iterations}", "train.chunk_size=10",
                          "train.num_envs=4", "train.num_seeds=2", "train.checkpoint_every=1",
                          "learners.seller.population=4", "learners.seller.buffer_length=2"])
    config["learners"]["seller"]["pbt"] = {**PBT, **pbt}
    return config


def retarget(trainer, run_dir, iterations):
    """``trainer`` writing to ``run_dir`` for ``iterations``, sharing its compiled chunks."""
    t = copy.copy(trainer)
    t.run_dir, t.checkpoints = run_dir, Checkpoints(run_dir)
    t.metrics, t.seed_metrics = CsvMetrics(run_dir / "metrics.csv"), CsvMetrics(run_dir / "seeds.csv")
    t.tcfg = dataclasses.replace(trainer.tcfg, num_iterations=iterations)
    return t


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_training_run_logs_events_that_match_the_state_and_resumes_bit_identically(tmp_path):
    """Catches: events missing from or inconsistent with pbt.csv, PBT outputs leaking into
    metrics.csv, initial log-spaced learning rates not applied, a resumed run that
    differs from an uninterrupted one (objective sums or keys not checkpointed), pbt.csv
    rows past the checkpoint kept on resume."""
    config = small()
    full = Trainer(resolve(config), tmp_path / "full")
    runner0 = full.initial_runner()
    lr0 = np.asarray(runner0.learners["seller"].hyper["learning_rate"]).reshape(2, 4)
    np.testing.assert_allclose(lr0, np.tile(np.logspace(-5, -1, 4), (2, 1)), rtol=1e-6)
    full.train(Tracker(), runner0, 0)
    final = full.restore()[0].learners["seller"]
    events = rows(tmp_path / "full" / "pbt.csv")
    assert events and {int(e["iteration"]) for e in events} <= {4, 8, 12, 16, 20}
    header, _ = read_metrics(tmp_path / "full" / "metrics.csv")
    assert not any(h.startswith("pbt") for h in header)
    # the last iteration (20) was a PBT step and nothing trained after it: the replaced
    # members of the final state hold their source's parameters and the logged new lr
    last = [e for e in events if int(e["iteration"]) == 20]
    assert len(last) == 2 * 2          # replace_fraction 0.5, gaps 0: two per seed
    for e in last:
        i, src = int(e["seed"]) * 4 + int(e["member"]), int(e["seed"]) * 4 + int(e["source"])
        assert float(final.hyper["learning_rate"][i]) == float(np.float32(e["new"]))
        np.testing.assert_array_equal(np.asarray(final.params["mean"][i]),
                                      np.asarray(final.params["mean"][src]))
        assert float(e["source_objective"]) > float(e["objective"])

    # the objective of the step at iteration 8 is each member's mean reward over
    # iterations 5..8 (its mean over seeds: the reward/seller/m<k> columns)
    _, out = full.chunk_fn(10)(full.initial_runner())
    for k in range(4):
        np.testing.assert_allclose(np.asarray(out["pbt/seller/objective"][7, :, k]).mean(),
                                   np.asarray(out[f"reward/seller/m{k}"][4:8]).mean(),
                                   rtol=1e-5)

    # stopped after the first chunk (mid-period: the objective sums must be checkpointed),
    # then restored from its checkpoint and continued:
    # identical files (the same Trainer's compiled chunk, retargeted, saves a compile)
    first = retarget(full, tmp_path / "resumed", 10)
    first.train(Tracker(), first.initial_runner(), 0)
    # a chunk whose rows were written but whose checkpoint was lost (a crash): resume
    # must drop them
    with open(tmp_path / "resumed" / "pbt.csv", "a") as f:
        f.write("15,seller,0,1,2,0.1,0.2,learning_rate,0.001,0.002\n")
    second = retarget(full, tmp_path / "resumed", 20)
    runner, start = second.restore()
    assert start == 10
    second.train(Tracker(), runner, start)
    for name in ("metrics.csv", "pbt.csv", "seeds.csv"):
        assert (tmp_path / "resumed" / name).read_text() == (tmp_path / "full" / name).read_text(), name


BAD = [
    (lambda c: c["learners"].update(seller={"kind": "epsilon_greedy", "population": 4,
                                            "pbt": c["learners"]["seller"]["pbt"]}),
     "learners.seller.kind"),
    (lambda c: c["learners"]["seller"]["pbt"].update(hyperparams={"momentum": [0.1, 0.9]}),
     "learners.seller.pbt.hyperparams.momentum"),
    (lambda c: c["learners"]["seller"]["pbt"].update(hyperparams={"learning_rate": [0.1, 1e-3]}),
     "learners.seller.pbt.hyperparams.learning_rate"),
    (lambda c: c["learners"]["seller"].pop("population"), "learners.seller.pbt"),
    (lambda c: c["learners"]["seller"]["pbt"].update(perturb=[0.5, 2.0]),
     "learners.seller.pbt.perturb"),
    (lambda c: c["learners"]["seller"]["pbt"].update(init={"clip_eps": "log_spaced"}),
     "learners.seller.pbt.init.clip_eps"),
]


@pytest.mark.parametrize("edit,field", BAD, ids=[f for _, f in BAD])
def test_bad_pbt_config_names_the_field_before_compiling(edit, field):
    """Catches a bad PBT setting reaching the compiler (or silently ignored)."""
    config = small()
    edit(config)
    with pytest.raises(ConfigError) as err:
        resolve(config)
    assert err.value.field == field, str(err.value)
    assert "\n" not in str(err.value)


def test_bad_pbt_config_exits_2(tmp_path, capsys):
    from jaxmarket.cli import run_cli
    from jaxmarket.train.__main__ import main
    code = run_cli(main, [str(CONFIGS / "logit_monopoly.yaml"), "--run-dir",
                          str(tmp_path / "run"), "learners.seller.population=2",
                          "learners.seller.pbt={hyperparams: {learning_rate: [1, 0.1]}}"])
    assert code == 2
    assert "learners.seller.pbt.hyperparams.learning_rate" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_top_level_pbt_applies_to_groups_with_a_population_and_group_keys_override():
    """Catches the top-level block being ignored, or overriding the group's own keys."""
    config = small()
    config["pbt"] = {**config["learners"]["seller"].pop("pbt"), "period": 7, "start": 3}
    plan = resolve(config)
    assert (plan.pbt["seller"].period, plan.pbt["seller"].start) == (7, 3)
    config["learners"]["seller"]["pbt"] = {"period": 9}
    plan = resolve(config)
    assert (plan.pbt["seller"].period, plan.pbt["seller"].start) == (9, 3)
    config["learners"]["seller"].pop("pbt")
    config["learners"]["seller"].pop("population")
    with pytest.raises(ConfigError) as err:
        resolve(config)
    assert err.value.field == "pbt"
