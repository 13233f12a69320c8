"""fit: stop conditions fire at the right step, metrics.csv grows while training, resume
is bit-identical, and the offline CLI's bad input is one line with exit code 2."""

import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline import Algo, Stop, fit, make_algo, make_dataset
from jaxmarket.offline.algos.common import infer_norm

ROOT = Path(__file__).resolve().parents[1]


def tiny_dataset(n=256):
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    act = np.tanh(obs @ np.array([[0.5], [-0.3]], np.float32))   # a linear-ish behaviour
    return make_dataset(obs, act, rng.normal(size=n), meta={"action_low": [-1.0],
                                                             "action_high": [1.0]})


def counter_algo(ds, nan_from=None):
    """A toy algorithm whose state counts updates and whose loss turns NaN from an update."""
    def init(key):
        return {"step": jnp.zeros((), jnp.int32)}

    def update(state, batch, key):
        step = state["step"] + 1
        loss = batch["rewards"].mean() * 0 + 1.0
        if nan_from is not None:
            loss = jnp.where(step >= nan_from, jnp.nan, loss)
        return {"step": step}, {"loss": loss}

    return Algo("counter", init, update, lambda s, o: o[:, :1], infer_norm(ds), {})


def scripted(values):
    """An evaluator returning ``values`` in turn (one per evaluation)."""
    it = iter(values)
    return lambda algo, state: next(it)


def test_stop_after_steps_cuts_the_last_chunk():
    ds = tiny_dataset()
    r = fit(counter_algo(ds), ds, stop=250, chunk=100)
    assert [row["step"] for row in r.history] == [100, 200, 250]
    assert int(r.state["step"]) == 250 and r.stopped is None


def test_patience_target_nan_time_and_callbacks_stop_at_the_right_chunk():
    ds = tiny_dataset()
    algo = counter_algo(ds)
    # best 1 at eval 1, 2 at eval 2; evals 3 (2.0) and 4 (1.5) do not improve: patience 2
    r = fit(algo, ds, evaluators={"score": scripted([1, 2, 2, 1.5, 9, 9])},
            stop=Stop(steps=1000, metric="score", patience=2), chunk=100)
    assert r.steps == 400 and "no improvement of score in 2" in r.stopped
    # mode min: lower is better, target 0.5 reached at eval 3
    r = fit(algo, ds, evaluators={"e": scripted([3, 1, 0.5, 0.1])},
            stop=Stop(steps=1000, metric="e", target=0.5, mode="min"), chunk=100)
    assert r.steps == 300 and r.stopped.startswith("target reached: e=0.5")
    r = fit(counter_algo(ds, nan_from=150), ds, stop=1000, chunk=100)
    assert r.steps == 200 and r.stopped == "non-finite loss at step 200"
    r = fit(algo, ds, stop=Stop(steps=1000, time_s=1e-9), chunk=100)
    assert r.steps == 100 and r.stopped.startswith("time budget")
    r = fit(algo, ds, stop=1000, chunk=100,
            callbacks=[lambda step, state, row: "enough" if step >= 300 else None])
    assert r.steps == 300 and r.stopped == "enough"
    with pytest.raises(ConfigError, match="stop.metric"):
        Stop(steps=10, patience=3)


def test_metrics_csv_is_written_while_training_and_resume_is_bit_identical(tmp_path):
    ds = tiny_dataset()
    algo = make_algo("bc", ds, hidden=[8])
    seen = []

    def rows_on_disk(step, state, row):
        with (tmp_path / "a" / "metrics.csv").open() as f:
            seen.append(len(list(csv.DictReader(f))))

    logged = []
    full = fit(algo, ds, stop=400, chunk=100, run_dir=tmp_path / "a", callbacks=[rows_on_disk],
               logger=lambda step, row: logged.append(step))
    assert seen == [1, 2, 3, 4] and logged == [100, 200, 300, 400]
    fit(algo, ds, stop=200, chunk=100, run_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="run_dir"):
        fit(algo, ds, stop=400, chunk=100, run_dir=tmp_path / "b")
    resumed = fit(algo, ds, stop=400, chunk=100, run_dir=tmp_path / "b", resume=True)
    assert resumed.steps == 400 and [r["step"] for r in resumed.history] == [100, 200, 300, 400]
    for a, b in zip(jax.tree.leaves(full.state), jax.tree.leaves(resumed.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (tmp_path / "a" / "metrics.csv").read_text() == (tmp_path / "b" / "metrics.csv").read_text()
    # and the policy learned the behaviour's direction: a = tanh(0.5 x0 - 0.3 x1)
    x = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    a = np.asarray(algo.policy(full.state, x))[:, 0]
    assert a[0] > 0.1 and a[1] < -0.05


def test_offline_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    from jaxmarket.cli import run_cli
    from jaxmarket.cli.offline import main
    code = run_cli(main, ["--dataset", str(tmp_path / "missing"), "--algo", "cql",
                          "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "a dataset directory holding manifest.json" in err
    assert not (tmp_path / "r").exists()
    from jaxmarket.offline import save_dataset
    data = save_dataset(tiny_dataset(), tmp_path / "d")
    code = run_cli(main, ["--dataset", str(data), "--algo", "bc", "--eval", "bogus",
                          "--run-dir", str(tmp_path / "r")])
    assert code == 2 and capsys.readouterr().err.strip() == (
        "config error: --eval: got 'bogus'; allowed: names from sim, fqe, ope, action_diff, "
        "value, td")
    code = run_cli(main, ["--dataset", str(data), "--algo", "bc", "--metric", "los",
                          "--patience", "3", "--run-dir", str(tmp_path / "r")])
    assert code == 2 and capsys.readouterr().err.strip() == (
        "config error: --metric: got 'los'; allowed: one of the metrics.csv columns: loss, step")
    assert not (tmp_path / "r").exists()


def test_fit_refuses_a_dataset_of_other_spaces():
    ds = tiny_dataset()
    algo = make_algo("bc", ds, hidden=[4])
    other = make_dataset(np.zeros((8, 3)), np.zeros((8, 1)), np.zeros(8))
    with pytest.raises(ConfigError, match="obs_dim 3.*built for: obs_dim 2"):
        fit(algo, other, stop=1)


def test_in_graph_evaluators_run_inside_the_chunk_and_match_the_host_side_value(tmp_path):
    from jaxmarket.offline import action_difference
    ds = tiny_dataset()
    algo = make_algo("bc", ds, hidden=[4])
    score = action_difference(ds)
    r = fit(algo, ds, stop=250, chunk=100, run_dir=tmp_path, graph_evaluators={"ad": score},
            graph_every=40)
    with (tmp_path / "evaluations.csv").open() as f:
        rows = list(csv.DictReader(f))
    # every 40th update of each chunk and its last: chunks [1-100], [101-200], [201-250]
    assert [float(row["step"]) for row in rows] == [40, 80, 100, 140, 180, 200, 240, 250]
    # the value computed in the compiled chunk is the host-side scorer's at that state
    assert r.history[-1]["graph/ad"] == pytest.approx(float(score(algo, r.state)), rel=1e-6)
    assert float(rows[-1]["graph/ad"]) == r.history[-1]["graph/ad"]
