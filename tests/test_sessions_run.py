"""``python -m jaxmarket.train`` on the session engine (``train.engine``): the run
directory of a sessions run checked against numbers derived here (logit profits written
out, the greedy strategies replayed in numpy, Cournot equilibria in closed form), the
engine choice, bit-identical resume after SIGKILL, and a design no shipped config holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.optimize import minimize, minimize_scalar

from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main as train_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions.run import choose_engine

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
A, C, MU = 2.0, 1.0, 0.25
# a reduced Calvano duopoly: beta 100x the published, a 2,000-period window
FAST = ["train.num_seeds=12", "train.chunk_size=5000", "learners.sellers.exploration_decay=4e-4",
        "learners.sellers.convergence_window=2000", "train.num_iterations=200000"]


def logit_profits(p: np.ndarray) -> np.ndarray:
    """``(p_i - c) e^{(a - p_i)/mu} / (sum_j e^{(a - p_j)/mu} + 1)`` (a_0 = 0)."""
    w = np.exp((A - p) / MU)
    return (p - C) * w / (w.sum(axis=-1, keepdims=True) + 1.0)


def benchmarks() -> tuple[float, float]:
    """Static Nash (best-response iteration of scalar maximisations) and joint-monopoly
    profits of the logit duopoly, per firm."""
    p = 1.5
    for _ in range(100):
        p = minimize_scalar(lambda x: -logit_profits(np.array([x, p]))[0], bounds=(1, 3),
                            method="bounded", options={"xatol": 1e-12}).x
    joint = minimize(lambda q: -logit_profits(q).sum(), np.array([1.8, 1.9])).x
    return float(logit_profits(np.array([p, p]))[0]), float(logit_profits(joint).mean())


def train(*args: str) -> int:
    return run_cli(train_main, list(args))


@pytest.fixture(scope="module")
def calvano_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sessions") / "calvano"
    assert train(str(CONFIGS / "calvano.yaml"), "--run-dir", str(run_dir), *FAST) == 0
    return run_dir


def greedy_cycle_profit(greedy: np.ndarray, start: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Mean profit per firm over the limit cycle of greedy play from ``start``, replayed
    here: state = last period's price indices, ``greedy[i, s]`` firm i's response."""
    m = grid.size
    s = int(start[0] * m + start[1])
    seen, path = {}, []
    while s not in seen:
        seen[s] = len(path)
        path.append(s)
        s = int(greedy[0, s] * m + greedy[1, s])
    cycle = path[seen[s]:]
    prices = np.array([[grid[c // m], grid[c % m]] for c in cycle])
    return logit_profits(prices).mean(axis=0)


def test_auto_runs_calvano_on_the_session_engine_with_the_papers_measure(calvano_run):
    # Bugs caught: Delta measured on played (exploring) profits or against wrong
    # benchmarks, a cycle averaged over the wrong periods, sessions.csv rows that do not
    # belong to their session, a summary that does not say which engine ran.
    summary = json.loads((calvano_run / "summary.json").read_text())
    assert summary["engine"] == "sessions"
    pi_n, pi_m = benchmarks()
    bench = summary["benchmarks"]["sellers"]
    assert bench["nash_profit"] == pytest.approx(pi_n, rel=2e-4)
    assert bench["joint_profit"] == pytest.approx(pi_m, rel=2e-4)
    rows = pd.read_csv(calvano_run / "sessions.csv")
    assert len(rows) == 12 and rows["converged"].all()
    with np.load(calvano_run / "strategies.npz") as d:
        greedy, grid, last = d["greedy"], d["grid"], d["last"]
    for s in range(12):
        profit = greedy_cycle_profit(greedy[s], last[s], grid)
        np.testing.assert_allclose(rows.loc[s, ["cycle_profit_0", "cycle_profit_1"]], profit,
                                   rtol=1e-5)
        expected = (profit.mean() - pi_n) / (pi_m - pi_n)
        assert rows.loc[s, "profit_gain"] == pytest.approx(expected, abs=2e-3)
    gains = rows["profit_gain"].to_numpy()
    assert summary["profit_gain"]["sellers"] == pytest.approx(gains.mean(), abs=1e-12)
    low, high = summary["profit_gain_ci95"]["sellers"]
    assert low < gains.mean() < high and high - low < 4 * gains.std()
    # convergence: the learner's own period of convergence, a session at most the cap
    conv = summary["convergence"]
    assert conv["share"] == 1.0
    assert conv["mean_period"] == pytest.approx(rows["convergence_period"].mean())
    assert rows["convergence_period"].max() < 200_000


def test_the_engine_choice_names_its_reason():
    # Bug caught: auto silently training a design the tables cannot hold exactly on
    # the session engine, or an explicit engine: sessions accepted for it.
    engine, reason, _ = choose_engine(load_config(str(CONFIGS / "logit_duopoly.yaml")))
    assert engine == "loop" and "q_learning" in reason
    noisy = load_config(str(CONFIGS / "calvano.yaml"),
                        ["market.consumers[0].demand={kind: noisy, sigma: 0.1}"])
    engine, reason, _ = choose_engine(noisy)
    assert engine == "loop" and "constant" in reason
    with pytest.raises(ConfigError, match="train.engine"):
        choose_engine(load_config(str(CONFIGS / "logit_duopoly.yaml"),
                                  ["train.engine=sessions"]))
    assert choose_engine(load_config(str(CONFIGS / "calvano.yaml"),
                                     ["train.engine=loop"]))[0] == "loop"
    assert choose_engine(load_config(str(CONFIGS / "calvano.yaml")))[0] == "sessions"


def _files(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes()
            for name in ("summary.json", "sessions.csv", "strategies.npz")}


def test_resume_after_sigkill_gives_the_same_files(tmp_path):
    # Bug caught: a checkpoint that misses part of the sessions' state (keys, the
    # profile in force, the tail sums, the outcome), or a resume that restarts the
    # periods' numbering: the resumed run's files differ from the uninterrupted run's.
    args = [str(CONFIGS / "calvano.yaml"), "train.num_seeds=8", "train.chunk_size=2000",
            "learners.sellers.exploration_decay=2e-4", "learners.sellers.convergence_window=4000",
            "train.num_iterations=60000", "train.checkpoint_every=1",
            "train.session_backend=xla"]
    whole = tmp_path / "whole"
    assert train(*args, "--run-dir", str(whole)) == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "jaxmarket.train", *args, "--run-dir",
                             str(cut)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:   # killed once two chunks are checkpointed
        steps = [p.name for p in (cut / "checkpoints").glob("*") if p.name.isdigit()]
        if any(int(s) >= 4000 for s in steps):
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (cut / "summary.json").exists()
    assert train("--resume", str(cut)) == 0
    assert _files(cut) == _files(whole)
    record = json.loads((cut / "run.json").read_text())
    assert record["segments"][-1]["start_period"] >= 4000


def cournot_nash_grid(grid: np.ndarray, a: float, c: float) -> set[tuple[int, int]]:
    """Pure Nash profiles of the Cournot duopoly on a quantity grid: profit
    ``q_i (max(a - q_i - q_j, 0) - c)``, every unilateral deviation checked."""
    q = grid
    price = np.maximum(a - q[:, None] - q[None, :], 0.0)
    own = q[:, None] * (price - c)                            # [i, j]: firm 0 at q_i
    best = own.max(axis=0)
    return {(i, j) for i in range(q.size) for j in range(q.size)
            if own[i, j] >= best[j] - 1e-9 and own[j, i] >= best[i] - 1e-9}


def test_a_design_no_config_holds_runs_on_the_session_engine(tmp_path):
    """A Cournot duopoly with cost c = 0.1 (a = 1, b = 1) and stateless full-feedback
    Q-learners (Asker et al.'s synchronous learner): every action's value moves toward
    the payoff it would have earned, so with constant exploration the learners settle
    on the grid's static Nash quantity, (a - c) / 3 = 0.3 (on the grid)."""
    config = {
        "market": {"num_products": 1,
                   "consumers": [{"name": "buyers", "count": 1, "queries": 1.0}],
                   "sellers": [{"name": "firms", "count": 2, "action": "quantity",
                                "low": 0.0, "high": 0.6, "initial": 0.2, "cost": 0.1,
                                "reward": [{"kind": "profit"}], "observation": []}],
                   "distributor": {"kind": "cournot", "intercept": 1.0, "slope": 1.0}},
        "learners": {"firms": {"kind": "q_learning", "grid_low": 0.0, "grid_high": 0.6,
                               "grid_size": 13, "memory": 0, "learning_rate": 0.05,
                               "discount": 0.0, "epsilon": {"start": 0.1, "decay": 0.0},
                               "q_init": "zero", "feedback": "full",
                               "convergence_window": 1_000_000_000}},
        "train": {"num_iterations": 20_000, "num_seeds": 16, "chunk_size": 5000,
                  "session_stop": "periods"},
    }
    path = tmp_path / "cournot_cost.yaml"
    path.write_text(yaml.safe_dump(config))
    engine, _, _ = choose_engine(load_config(str(path)))
    assert engine == "sessions"
    run_dir = tmp_path / "run"
    assert train(str(path), "--run-dir", str(run_dir)) == 0
    grid = np.linspace(0.0, 0.6, 13)
    nash = cournot_nash_grid(grid, 1.0, 0.1)
    assert nash == {(5, 7), (6, 6), (7, 5)} and grid[6] == pytest.approx(0.3)
    rows = pd.read_csv(run_dir / "sessions.csv")
    profiles = np.rint(rows[["greedy_price_0", "greedy_price_1"]].to_numpy() / 0.05)
    assert {tuple(int(x) for x in p) for p in profiles} <= nash
    summary = json.loads((run_dir / "summary.json").read_text())
    # Nash profit (a - c)^2 / 9 = 0.09, joint optimum (a - c)^2 / 8 per firm
    bench = summary["benchmarks"]["firms"]
    assert bench["nash_profit"] == pytest.approx(0.81 / 9, rel=1e-4)
    assert bench["joint_profit"] == pytest.approx(0.81 / 8, rel=1e-4)
    assert summary["profit_gain"]["firms"] == pytest.approx(0.0, abs=5e-4)
    # played profits: the learners explore 10% of the periods, so below Nash on average
    assert summary["played_profit_gain"]["firms"] < 0.0


SHOCKS = ["market.distributor.shock_values=[0.9,1.1]", "market.distributor.shock_probs=[0.5,0.5]",
          "market.sellers[0].observation=[{kind: market_price}]",
          "learners.firms.obs_grid={low: 0.0, high: 1.1, size: 12}"]


def test_a_shocked_cournot_duopolys_benchmarks_are_the_exact_expectation():
    """Intercept a in {0.9, 1.1} with probability 1/2 each, chosen quantities before the
    shock: E[profit_i] = q_i (E[a] - Q), so Nash q = E[a]/3 with profit E[a]^2/9 = 1/9
    and the joint optimum q = E[a]/4 with 1/8 per firm (averaging 256 sampled keys gave
    0.1127 and 0.1262)."""
    from jaxmarket.learners.equilibrium import benchmarks, equilibrium, exact
    from jaxmarket.train.plan import resolve
    plan = resolve(load_config(str(CONFIGS / "cournot.yaml"), SHOCKS), validate_only=True)
    assert exact(plan)
    eq = equilibrium(plan)["firms"]
    b = benchmarks(eq)
    assert b["nash_profit"] == pytest.approx(1 / 9, rel=2e-4)
    assert b["joint_profit"] == pytest.approx(1 / 8, rel=2e-4)
    assert b["nash_price"] == pytest.approx(1 / 3, rel=2e-4)
    assert "exact" in b["method"] and "2 outcomes" in b["method"]


def test_market_price_is_not_snapped_to_a_quantity_grid():
    # Bug caught: a market price observed in a quantity market ([0, 0.5] grid) numbered
    # on the action grid, where every price above 0.5 is one state.
    from jaxmarket.learners.qlearning import obs_grid_of
    from jaxmarket.sessions.game import make_game
    from jaxmarket.sessions.run import session_plan
    with pytest.raises(ConfigError) as err:
        session_plan(load_config(str(CONFIGS / "cournot.yaml"), SHOCKS[:3]))
    assert err.value.field == "learners.firms.obs_grid" and "market_price" in err.value.allowed
    game = make_game(session_plan(load_config(str(CONFIGS / "cournot.yaml"), SHOCKS)))
    states = obs_grid_of(game.settings).state_index(np.array([[0.6], [0.8], [1.0]], np.float32))
    grid = np.linspace(0.0, 1.1, 12)
    np.testing.assert_array_equal(states, [np.abs(grid - x).argmin() for x in (0.6, 0.8, 1.0)])
    assert game.settings.num_states == 12 and game.num_outcomes == 2


@pytest.mark.slow
def test_a_stochastic_design_gives_the_same_delta_on_both_engines(tmp_path):
    """The shocked Cournot duopoly, 32 sessions on each engine (their own random
    streams): the played-profit Delta of the last 2,000 periods agree within the 95%
    interval of their difference (standard errors from the sessions)."""
    args = [str(CONFIGS / "cournot.yaml"), *SHOCKS, "learners.firms.exploration_decay=5e-4",
            "learners.firms.convergence_window=1000", "train.num_iterations=20000",
            "train.num_seeds=32", "train.chunk_size=5000", "train.session_stop=periods",
            "train.session_window=2000"]
    assert train(*args, "--run-dir", str(tmp_path / "s")) == 0
    assert train(*args, "train.engine=loop", "--run-dir", str(tmp_path / "l")) == 0
    sessions = pd.read_csv(tmp_path / "s" / "sessions.csv")["played_profit_gain"].to_numpy()
    loop = json.loads((tmp_path / "l" / "summary.json").read_text())
    seeds = np.asarray(loop["per_seed"]["firms"]["profit_gain"])
    assert loop["engine"] == "loop" and seeds.size == sessions.size == 32
    se = np.hypot(sessions.std(ddof=1) / np.sqrt(32), seeds.std(ddof=1) / np.sqrt(32))
    assert abs(sessions.mean() - seeds.mean()) < 1.96 * se
    assert se < 0.3   # the comparison is informative: Delta's range here is ~[-2, 1]


def test_load_run_compare_plot_and_sweep_read_a_sessions_run(calvano_run, tmp_path):
    # Bugs caught: load_run without the sessions table, compare reporting no interval or
    # a test of the wrong samples, a sweep cell that is not the run train would make.
    import jaxmarket
    from scipy.stats import ttest_ind
    from jaxmarket.cli.plot import main as plot_main
    from jaxmarket.cli.sweep.main import main as sweep_main
    run = jaxmarket.load_run(calvano_run)
    assert run.engine == "sessions" and len(run.sessions) == 12
    other = tmp_path / "other"
    assert train(str(CONFIGS / "calvano.yaml"), "--run-dir", str(other), *FAST,
                 "learners.sellers.learning_rate=0.25") == 0
    table = jaxmarket.compare([calvano_run, other])
    gains = [jaxmarket.load_run(d).sessions["profit_gain"] for d in (calvano_run, other)]
    assert table["profit_gain/sellers"].tolist() == pytest.approx([g.mean() for g in gains])
    assert table.loc[str(other), "p_value/sellers"] == pytest.approx(
        ttest_ind(gains[1], gains[0], equal_var=False).pvalue)
    assert table.loc[str(other), "differs"] == "learners.sellers.learning_rate"
    assert (table["profit_gain/sellers/ci95_low"] < table["profit_gain/sellers"]).all()
    assert run_cli(plot_main, [str(calvano_run)]) == 0
    assert (calvano_run / "plots" / "sessions.png").stat().st_size > 10_000
    sweep = tmp_path / "sweep"
    assert run_cli(sweep_main, [str(CONFIGS / "calvano.yaml"), "--grid",
                                "learners.sellers.learning_rate=[0.15, 0.25]", "--run-dir",
                                str(sweep), "--metric", "sellers/profit_gain", *FAST]) == 0
    cell = sweep / "cells" / "1"
    assert (cell / "sessions.csv").read_bytes() == (other / "sessions.csv").read_bytes()
    rows = pd.read_csv(sweep / "sweep.csv")
    np.testing.assert_allclose(rows[rows["cell"] == 1]["final/sellers/profit_gain"], gains[1])


def test_a_population_or_pbt_design_stays_on_the_loop():
    # Bug caught: auto putting a q_learning group with a population (or PBT) on the
    # session engine, which plays one Q table per seller and session and would drop it.
    # (a population needs several markets per seed: the engine plays one)
    config = load_config(str(CONFIGS / "calvano.yaml"),
                         ["learners.sellers.population=2", "train.num_envs=2",
                          "train.num_seeds=2"])
    engine, reason, _ = choose_engine(config)
    assert engine == "loop" and "num_envs" in reason
    from jaxmarket.sessions.game import check_game
    from jaxmarket.train.plan import resolve
    with pytest.raises(ValueError, match="population"):
        check_game(resolve(config, validate_only=True))


def test_load_run_names_the_file_and_line_it_cannot_read(calvano_run, tmp_path):
    # Bug caught: a damaged summary.json or a cut metrics.csv raising a bare
    # JSONDecodeError / numpy ValueError that names no file.
    import shutil

    import jaxmarket
    from jaxmarket.train.rundir import RunDirError
    run = tmp_path / "run"
    shutil.copytree(calvano_run, run)
    (run / "summary.json").write_text('{"engine": "sessions",\n  "sessions": ')
    with pytest.raises(RunDirError, match=r"summary.json has 37 bytes, not the \d+ of the "
                       r"result published at period 50000 \(published.json\).*--resume"):
        jaxmarket.load_run(run)
    (run / "summary.json").unlink()
    (run / "published.json").unlink()   # a run still in its first segment: rows only
    (run / "metrics.csv").write_text("iteration,reward\n1,0.5\n2,junk\n3,0.25\n")
    with pytest.raises(RunDirError, match=r"metrics.csv line 3 is not a row of 2 numbers"):
        jaxmarket.load_run(run).metrics


def test_strategies_npz_holds_every_array_deflated_or_stored_by_size(tmp_path):
    # Bugs caught: an array lost or changed on its way into strategies.npz (np.load
    # reads back other values, dtypes or shapes), a large Q table deflated (seconds of
    # one core for under half its size) or a small one left undeflated, a member dated
    # by the clock (two runs' files would differ in their bytes).
    import zipfile
    from jaxmarket.sessions.run import save_npz
    rng = np.random.default_rng(1)
    arrays = {"q": rng.normal(size=(3, 5, 7)).astype(np.float32),
              "greedy": rng.integers(0, 7, (3, 5)).astype(np.int32),
              "converged": np.array([True, False, True]), "memory": 2, "lagged": False,
              "pi_nash": float("nan"), "big": np.zeros(300, np.float64)}
    path = tmp_path / "s.npz"
    with path.open("wb") as f:
        save_npz(f, arrays, store_bytes=1000)
    with np.load(path) as z:
        assert sorted(z.files) == sorted(arrays)
        for name, want in arrays.items():
            got = z[name]
            assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
            np.testing.assert_array_equal(got, want)
    with zipfile.ZipFile(path) as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
        dates = {i.date_time for i in z.infolist()}
    assert kinds["big.npy"] == zipfile.ZIP_STORED      # 2,400 bytes > 1,000
    assert kinds["q.npy"] == kinds["greedy.npy"] == zipfile.ZIP_DEFLATED
    # no clock in the file: a run and its replay on a cluster give the same bytes
    assert dates == {(1980, 1, 1, 0, 0, 0)}


@pytest.mark.parametrize("block_bytes", [1, 1000, 1 << 20])   # 1, 2, all rows
def test_a_stored_array_is_numpys_own_bytes_whatever_its_layout_and_blocks(block_bytes):
    # Bugs caught: a block lost, repeated or written from a stale buffer (the last, short
    # block; a strided slice copied block by block), a header other than numpy's, a
    # Fortran-ordered or 0-d array written in another order.
    import io

    from jaxmarket.sessions.run import _write_npy_blocks
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(7, 3, 5, 9)).astype(np.float32)
    for value in (rows[..., :8], rows, rows[::2], np.asfortranarray(rows[0]),
                  rows > 0, np.float64(3.5), np.zeros((0, 4))):
        want, got = io.BytesIO(), io.BytesIO()
        np.lib.format.write_array(want, value, allow_pickle=False)
        _write_npy_blocks(got, value, block_bytes)
        assert got.getvalue() == want.getvalue()
        got.seek(0)
        np.testing.assert_array_equal(np.lib.format.read_array(got), value)
