"""A run's outputs (docs/runs.md): train.log_every (rows, values, resume), the per-seed
rows as Parquet, summary.json's seeds as distributions (checked against numpy/scipy
computations here), per agent and per seed convergence, run.json, plain progress lines,
load_run / compare / plot --seeds. Every run is the tiny legacy scenario of
tests/test_reliability_rundir.py (40 iterations in chunks of 10: one compiled program)."""

import csv
import itertools
import json
import math
import platform
import shutil
import subprocess

import jax
import numpy as np
import pytest
import yaml
from conftest import CONFIGS, ROOT
from scipy import stats

import jaxmarket
from jaxmarket.cli import run_cli
from jaxmarket.cli.plot import main as plot_main
from jaxmarket.analysis.plots import mean_interval, plot_series
from jaxmarket.cli.train import main as train_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.train.config import AUTO_MAX_ROWS, AUTO_MAX_SEED_ROWS, auto_log_every, resolve_train
from jaxmarket.train.provenance import git_commit
from jaxmarket.train.summary import seed_stats

LEGACY = str(CONFIGS / "budget_monopoly.yaml")
TINY = ["train.num_iterations=40", "train.chunk_size=10", "train.checkpoint_every=1",
        "train.num_seeds=2", "train.num_envs=2"]


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def train(*args):
    assert run_cli(train_main, list(args)) == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run with log_every 1 (csv) and 3 (parquet per-seed rows)."""
    base = tmp_path_factory.mktemp("runs")
    train(LEGACY, "--run-dir", str(base / "every1"), *TINY)
    train(LEGACY, "--run-dir", str(base / "every3"), *TINY, "train.log_every=3",
          "train.seeds_format=parquet")
    return base / "every1", base / "every3"


# ------------------------------------------------------------------ 4. output sized to the run

def test_log_every_keeps_the_rows_at_its_multiples_and_the_last_iteration(runs):
    full, every3 = runs
    a, b = rows_of(full / "metrics.csv"), rows_of(every3 / "metrics.csv")
    wanted = [i for i in range(1, 41) if i % 3 == 0 or i == 40]
    assert [int(r[0]) for r in b[1:]] == wanted
    assert b[0] == a[0] and b[1:] == [a[i] for i in wanted]          # the same text
    # the file's size: exactly those lines of the full run's file
    lines = (full / "metrics.csv").read_bytes().splitlines(keepends=True)
    assert (every3 / "metrics.csv").stat().st_size == \
        len(lines[0]) + sum(len(lines[i]) for i in wanted)
    # the per-seed rows (Parquet) hold the full run's seeds.csv values at those iterations
    seeds = jaxmarket.load_run(every3).seeds
    full_seeds = jaxmarket.load_run(full).seeds
    expect = full_seeds[full_seeds.iteration.isin(wanted)].reset_index(drop=True)
    assert list(seeds.columns) == list(expect.columns)
    np.testing.assert_array_equal(seeds.to_numpy(), expect.to_numpy())
    # the summary averages the last ceil(10%) of the rows it has
    s = json.loads((every3 / "summary.json").read_text())
    col = b[0].index("reward/seller")
    tail = [float(r[col]) for r in b[1:]][-math.ceil(0.1 * len(wanted)):]
    assert s["final"]["seller"]["mean_reward"] == np.mean(tail)
    assert s["log_every"] == 3 and s["averaged_over_last_rows"] == len(tail)
    assert s["averaged_over_last_iterations"] == 40 - wanted[-len(tail)] + 1


def test_auto_log_every_is_1_for_short_runs_and_bounds_the_rows_of_long_ones():
    for path in sorted(CONFIGS.glob("*.yaml")):   # the sizes the regression runs use
        train_cfg = dict(yaml.safe_load(path.read_text()).get("train") or {})
        short = {**train_cfg, "num_iterations": 400, "num_seeds": 8}
        assert resolve_train(short).log_every == 1, path.name
    for n, s in [(400, 8), (10_000, 10), (10_001, 1), (2_500_000, 8), (10**6, 1000),
                 (123_457, 3)]:
        every = auto_log_every(n, s)
        assert math.log10(every) == int(math.log10(every))     # a power of ten
        rows = math.ceil(n / every)
        assert rows <= AUTO_MAX_ROWS and rows * s <= AUTO_MAX_SEED_ROWS
        if every > 1:   # the next smaller power of ten would write too many rows
            smaller = math.ceil(n / (every // 10))
            assert smaller > AUTO_MAX_ROWS or smaller * s > AUTO_MAX_SEED_ROWS
    assert auto_log_every(2_500_000, 8) == 1000   # calvano.yaml: 2,500 rows, not 2.5M


@pytest.mark.parametrize("field, value", [("log_every", 0), ("log_every", "often"),
                                          ("log_every", 2.5), ("seeds_format", "json")])
def test_bad_output_settings_are_config_errors(field, value):
    with pytest.raises(ConfigError) as err:
        resolve_train({field: value})
    assert err.value.field == f"train.{field}"


def test_a_resumed_run_with_log_every_equals_the_uninterrupted_one(runs, tmp_path):
    _, every3 = runs
    # as a kill during the last save leaves it: checkpoint 40 and the summary gone, the
    # rows of 31-40 already written (the last one cut in half)
    d = tmp_path / "r"
    shutil.copytree(every3, d)
    shutil.rmtree(d / "checkpoints" / "40")
    (d / "summary.json").unlink()
    text = (d / "metrics.csv").read_bytes()
    (d / "metrics.csv").write_bytes(text[:-7])
    train("--resume", str(d))
    assert (d / "metrics.csv").read_bytes() == (every3 / "metrics.csv").read_bytes()
    a, b = jaxmarket.load_run(d), jaxmarket.load_run(every3)
    np.testing.assert_array_equal(a.seeds.to_numpy(), b.seeds.to_numpy())
    for key in ("final", "per_seed", "over_seeds", "agents"):
        assert a.summary[key] == b.summary[key]
    record = a.record   # run.json: the first record kept, this invocation appended
    assert len(record["segments"]) == 2
    assert record["segments"][1]["start_iteration"] == 30
    assert record["segments"][1]["command"].startswith("python -m jaxmarket.train --resume")
    assert record["command"] == record["segments"][0]["command"]
    assert record["compile_s"] == round(sum(s["compile_s"] for s in record["segments"]), 3)
    # extended: the old last row (40) stays, the new rows continue at the multiples
    train("--resume", str(d), "train.num_iterations=50")
    its = [int(r[0]) for r in rows_of(d / "metrics.csv")[1:]]
    assert its == [i for i in range(1, 51) if i % 3 == 0 or i in (40, 50)]


def test_resume_refuses_a_metrics_file_missing_a_logged_row(runs, tmp_path, capsys):
    _, every3 = runs
    d = tmp_path / "r"
    shutil.copytree(every3, d)
    shutil.rmtree(d / "checkpoints" / "40")
    lines = (d / "metrics.csv").read_text().splitlines(keepends=True)
    (d / "metrics.csv").write_text("".join(lines[:3] + lines[4:]))   # iteration 9 lost
    assert run_cli(train_main, ["--resume", str(d)]) == 1
    assert "holds rows up to iteration 6 only" in capsys.readouterr().err


# ------------------------------------------------------------------ 3. seeds as distributions

def test_seed_stats_against_numpy_and_an_exact_bootstrap():
    x = np.random.default_rng(3).lognormal(size=6)   # 6 seeds
    s = seed_stats(x)
    assert s["mean"] == pytest.approx(x.mean(), rel=1e-12)
    assert s["std"] == pytest.approx(np.sqrt(((x - x.mean()) ** 2).sum() / 5), rel=1e-12)
    assert s["se"] == pytest.approx(s["std"] / np.sqrt(6), rel=1e-12)
    middle = np.sort(x)[1:5]   # 25% trimmed from each end: floor(0.25 * 6) = 1 value each
    assert s["iqm"] == pytest.approx(middle.mean(), rel=1e-12)
    # the bootstrap distribution of the mean, exactly: all 6^6 equally likely resamples
    idx = np.array(list(itertools.product(range(6), repeat=6)))
    lo, hi = np.percentile(x[idx].mean(1), [2.5, 97.5])
    width = hi - lo
    assert abs(s["ci95_low"] - lo) < 0.05 * width and abs(s["ci95_high"] - hi) < 0.05 * width
    # arrays: each entry on its own; equal seeds: a zero-width interval; one seed: None
    grid = seed_stats(np.stack([x, 2 * x, np.full(6, 7.0)], axis=1))
    assert grid["mean"] == pytest.approx([x.mean(), 2 * x.mean(), 7.0])
    assert grid["ci95_low"][2] == grid["ci95_high"][2] == 7.0
    assert grid["iqm"][1] == pytest.approx(stats.trim_mean(2 * x, 0.25))
    one = seed_stats(np.array([[1.5, 2.5]]))
    assert one["mean"] == [1.5, 2.5] and one["std"] == [None, None] and one["ci95_low"] == [None, None]


def test_summary_over_seeds_and_per_agent_figures_join_the_files_and_the_final_state(runs):
    full, _ = runs
    run = jaxmarket.load_run(full)
    s = run.summary
    seeds = run.seeds
    last = seeds[seeds.iteration >= 37]     # the last 10% of 40 iterations
    per_seed = [g["reward/seller"].mean() for _, g in last.groupby("seed")]
    assert s["per_seed"]["seller"]["mean_reward"] == per_seed
    stat = s["over_seeds"]["seller"]["mean_reward"]
    assert stat["mean"] == pytest.approx(np.mean(per_seed), rel=1e-12)
    assert stat["std"] == pytest.approx(np.std(per_seed, ddof=1), rel=1e-12)
    assert s["over_seeds"]["seller"]["num_seeds"] == 2
    # per agent: the final state's prices, averaged over each seed's markets (seed-major)
    state = run.runner().env_state
    prices = np.asarray(state.prices["seller"], np.float64).reshape(2, 2, 1, 1).mean(1)
    agents = s["agents"]["seller"]["final_price"]
    np.testing.assert_array_equal(np.array(agents["per_seed"]), prices)
    np.testing.assert_allclose(agents["mean"], prices.mean(0), rtol=1e-12)
    rewards = np.asarray(state.last_reward["seller"], np.float64).reshape(2, 2, 1).mean(1)
    np.testing.assert_array_equal(np.array(s["agents"]["seller"]["final_reward"]["per_seed"]),
                                  rewards)


def test_q_learning_sessions_report_their_convergence(tmp_path):
    d = tmp_path / "q"
    train(str(CONFIGS / "calvano.yaml"), "--run-dir", str(d), "train.num_iterations=60",
          "train.engine=loop",
          "train.chunk_size=30", "train.num_seeds=4", "learners.sellers.exploration_decay=0.5",
          "learners.sellers.convergence_window=8")
    run = jaxmarket.load_run(d)
    conv = run.summary["convergence"]["sellers"]
    learner = run.runner().learners["sellers"]
    assert conv["converged"] == np.asarray(learner.converged).tolist()
    assert conv["stable_periods"] == np.asarray(learner.stable_periods).tolist()
    steps = np.asarray(learner.step).tolist()
    assert conv["converged_at"] == [t if c else None for t, c in zip(steps, conv["converged"])]
    assert conv["share_converged"] == np.mean(conv["converged"])
    assert any(conv["converged"])   # greedy from the start: sessions settle within 60 periods
    for c, k in zip(conv["converged"], conv["stable_periods"]):
        assert c == (k >= 8)


# ------------------------------------------------------------------ 6. run.json, 5. progress

def test_run_json_records_how_the_run_was_made(runs):
    _, every3 = runs
    r = json.loads((every3 / "run.json").read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert r["git_commit"] == head
    assert r["jax_version"] == jax.__version__ and r["python_version"] == platform.python_version()
    assert r["jaxmarket_version"] == jaxmarket.__version__
    import jaxlib
    assert r["jaxlib_version"] == jaxlib.__version__
    assert r["command"] == "python -m jaxmarket.train " + " ".join(
        [LEGACY, "--run-dir", str(every3), *TINY, "train.log_every=3",
         "train.seeds_format=parquet"])
    assert r["devices"]["platform"] == "cpu" and r["devices"]["used"] == 1
    assert r["seed"] == 0 and r["status"] == "finished" and r["iterations"] == 40
    assert r["compile_s"] >= 0 and r["run_s"] >= 0 and isinstance(r["host"], str)


def test_git_commit_is_none_outside_a_checkout(tmp_path):
    package = tmp_path / "jaxmarket"          # a copy of the package that git does not know
    package.mkdir()
    (package / "__init__.py").write_text("")
    assert git_commit(package) == (None, None)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert git_commit(ROOT / "jaxmarket")[0] == head


def test_plain_progress_lines_when_stdout_is_not_a_terminal(runs, tmp_path, capsys):
    train(LEGACY, "--run-dir", str(tmp_path / "p"), *TINY, "--progress-every", "1e-9")
    out = capsys.readouterr().out.splitlines()
    progress = [line for line in out if line.startswith("iteration ")]
    assert [line.split(",")[0] for line in progress] == [
        f"iteration {i}/40 ({i * 100 // 40}%)" for i in (10, 20, 30, 40)]
    assert all(" it/s, " in line and " ETA " in line for line in progress)
    assert any(line.startswith("compiled the 10-iteration chunk in ") for line in out)
    assert run_cli(train_main, [LEGACY, "--progress-every", "0"]) == 2


# ------------------------------------------------------------------ 7. runs back in Python

def test_load_run_gives_the_files_values_and_a_policy(runs):
    full, _ = runs
    run = jaxmarket.load_run(full)
    raw = rows_of(full / "metrics.csv")
    assert list(run.metrics.columns) == raw[0]
    np.testing.assert_array_equal(run.metrics.to_numpy(), np.array(raw[1:], np.float64))
    seeds = rows_of(full / "seeds.csv")
    np.testing.assert_array_equal(run.seeds.to_numpy(), np.array(seeds[1:], np.float64))
    assert run.summary == json.loads((full / "summary.json").read_text())
    assert run.config == yaml.safe_load((full / "config.yaml").read_text())
    assert run.iterations == 40
    policy = run.policy()
    actions = policy.act(jax.random.key(0), policy.obs)
    prices = np.asarray(actions["seller"])
    assert prices.shape == (4, 1, 1) and np.isfinite(prices).all()
    again = policy.act(jax.random.key(0), policy.obs)
    np.testing.assert_array_equal(prices, np.asarray(again["seller"]))
    _, state, rewards, *_ = policy.step(jax.random.key(1), policy.state, actions)
    assert np.asarray(rewards["seller"]).shape == (4, 1)
    # the market quotes what the policy chose (within the seller's bounds)
    low, high = 0.0, 3.0   # configs/budget_monopoly.yaml
    quoted = np.asarray(state.prices["seller"])
    np.testing.assert_allclose(quoted, np.clip(prices, low, high), rtol=0, atol=0)
    with pytest.raises(ConfigError):
        jaxmarket.load_run(full / "nowhere")


def test_compare_tabulates_the_runs_over_seeds_figures(runs, capsys):
    full, every3 = runs
    table = jaxmarket.compare([full, every3])
    assert list(table.index) == [str(full), str(every3)]
    for d in (full, every3):
        st = json.loads((d / "summary.json").read_text())["over_seeds"]["seller"]
        assert table.loc[str(d), "reward/seller"] == st["mean_reward"]["mean"]
        assert table.loc[str(d), "price/seller/p0/ci95_high"] == st["mean_price"]["ci95_high"][0]
    assert run_cli(plot_main, [str(full), str(every3), "--compare"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("reward/seller "))
    assert row.split()[1:] == [f"{table['reward/seller'].iloc[i]:.4g}" for i in range(2)]


def test_plot_seeds_draws_each_seed_and_the_interval_of_their_mean(runs, capsys):
    full, _ = runs
    s = plot_series(full, "seller", seeds=True)
    seeds = jaxmarket.load_run(full).seeds
    lines = s["panels"]["reward"]["seed_lines"]["reward/seller"]
    for k in range(2):
        np.testing.assert_array_equal(lines[k], seeds[seeds.seed == k]["reward/seller"])
    low, high = s["panels"]["reward"]["bands"]["reward/seller"]
    np.testing.assert_array_equal((low, high), mean_interval(lines))
    # two seeds: the resampled means are a, b or (a + b) / 2; the 95% interval spans the
    # two seeds' values (each drawn twice with probability 1/4)
    np.testing.assert_allclose(low, lines.min(0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(high, lines.max(0), rtol=0, atol=1e-12)
    assert run_cli(plot_main, [str(full), "--seeds"]) == 0
    assert (full / "plots" / "seller.png").stat().st_size > 0


def test_mean_interval_against_the_exact_bootstrap():
    x = np.array([[0.1, 5.0], [0.4, 5.0], [1.3, 5.0], [2.0, 5.0]])   # 4 seeds, 2 iterations
    low, high = mean_interval(x, resamples=20_000)
    means = np.array([x[list(i), 0].mean() for i in itertools.product(range(4), repeat=4)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    assert abs(low[0] - lo) < 0.05 * (hi - lo) and abs(high[0] - hi) < 0.05 * (hi - lo)
    assert low[1] == high[1] == pytest.approx(5.0)
