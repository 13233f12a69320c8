"""``benchmarks/calvano.py``, the timing wrapper of ``configs/calvano.yaml`` on the
session engine: ``--firms N``, ``--alpha``, ``--beta`` and the other flags reaching the
config, the JSON read from the run directory, the one-line errors of bad flags, and the
alpha x beta grid mode. (The engine itself: ``tests/test_sessions_engine.py``.)

Expected values are computed here by hand or with numpy/scipy from the logit formulas
(never read back from ``jaxmarket.market.economics`` or the script)."""

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "calvano.py"
A, C, A0, MU, DELTA, M, XI = 2.0, 1.0, 0.0, 0.25, 0.95, 15, 0.1


def load_calvano():
    spec = importlib.util.spec_from_file_location("calvano_cli_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


calvano = load_calvano()


def profits(prices) -> np.ndarray:
    """Logit profits ``(p_i - c) e^{(a - p_i)/mu} / (sum_j e^{(a - p_j)/mu} + e^{a0/mu})``
    over the last axis, written out here."""
    p = np.asarray(prices, np.float64)
    weight = np.exp((A - p) / MU)
    return (p - C) * weight / (weight.sum(axis=-1, keepdims=True) + np.exp(A0 / MU))


def solve_nash(n: int) -> float:
    """Symmetric static Nash price by best-response iteration, each best response a
    scalar maximisation of the seller's own profit (no first-order formula)."""
    p = 1.5
    for _ in range(200):
        best = minimize_scalar(lambda x: -profits([x] + [p] * (n - 1))[0],
                               bounds=(C, C + 3.0), method="bounded",
                               options={"xatol": 1e-12}).x
        if abs(best - p) < 1e-11:
            break
        p = best
    return p


def solve_monopoly(n: int) -> np.ndarray:
    """Prices maximising the sum of the ``n`` profits (no symmetry imposed)."""
    result = minimize(lambda p: -profits(p).sum(), np.linspace(1.6, 2.2, n), method="BFGS",
                      options={"gtol": 1e-12})
    return result.x


@pytest.fixture(scope="module")
def three_firm_run(tmp_path_factory):
    """A tiny ``--firms 3`` run through ``main`` (in-process) into a kept run directory:
    ``(what the script reports, the run directory, the --save-strategies directory)``."""
    base = tmp_path_factory.mktemp("three")
    run_dir, saved = base / "run", base / "saved"
    result = calvano.main(["--firms", "3", "--sessions", "3", "--beta", "1e-2", "--window",
                           "200", "--chunk", "300", "--max-periods", "1000", "--run-dir",
                           str(run_dir), "--save-strategies", str(saved), "--json"])
    return result, run_dir, saved


#: the package's static benchmarks are a float32 numeric solve: within 1e-4 of scipy's
#: (the duopoly's values, what a three-firm bug would report, are 0.1 away)
BENCHMARK_TOL = 1e-4


def test_three_firm_economics_match_a_scipy_solve(three_firm_run):
    # Bug caught: the script taking Nash/monopoly prices (or the grid) of the duopoly for
    # n = 3, or profits of the wrong number of sellers in pi_N / pi_M.
    result = three_firm_run[0]
    p_n = solve_nash(3)
    p_m = solve_monopoly(3)
    assert np.ptp(p_m) < 1e-5  # the cartel prices symmetrically
    # Nash first-order condition, by central finite differences of firm 0's profit
    h = 1e-6
    slope = (profits([p_n + h, p_n, p_n])[0] - profits([p_n - h, p_n, p_n])[0]) / (2 * h)
    assert abs(slope) < 1e-7
    # by hand: W(3 e^3) = 3, so p_M = c + mu (1 + 3) = 2 and each share is 1/4
    assert p_m[0] == pytest.approx(2.0, abs=1e-5)
    assert result["firms"] == 3 and result["states"] == M ** 3
    assert result["p_nash"] == pytest.approx(p_n, abs=BENCHMARK_TOL)
    assert result["p_monopoly"] == pytest.approx(2.0, abs=BENCHMARK_TOL)
    assert result["pi_nash"] == pytest.approx(profits([p_n] * 3)[0], abs=BENCHMARK_TOL)
    assert result["pi_monopoly"] == pytest.approx(0.25, abs=BENCHMARK_TOL)
    # the grid spans [p_N - xi (p_M - p_N), p_M + xi (p_M - p_N)] of three sellers
    spread = XI * (2.0 - p_n)
    assert result["grid_low"] == pytest.approx(p_n - spread, abs=1e-8)
    assert result["grid_high"] == pytest.approx(2.0 + spread, abs=1e-8)
    # ... and it is the grid the run played (its strategies.npz)
    with np.load(three_firm_run[1] / "strategies.npz") as saved:
        np.testing.assert_allclose(saved["grid"], hand_grid(3), atol=1e-6)
        assert saved["q"].shape == (3, 3, M ** 3, M)


def hand_grid(n: int) -> np.ndarray:
    p_n = solve_nash(n)
    p_m = float(solve_monopoly(n)[0])
    spread = XI * (p_m - p_n)
    return np.linspace(p_n - spread, p_m + spread, M)


def test_the_json_is_the_runs_summary_and_sessions(three_firm_run):
    # Bugs caught: a JSON not read from the run it timed (the per-session Delta, the
    # convergence flags, the periods), a profit gain that is not the mean of the
    # sessions', session-periods or ns per session-period miscounted, a compile time
    # that is not part of the wall time, and --save-strategies copying another file.
    result, run_dir, saved = three_firm_run
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "sessions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["profit_gain"]) for r in rows] == result["profit_gains"]
    assert [r["converged"] == "1" for r in rows] == result["converged"]
    assert result["profit_gain"] == summary["profit_gain"]["sellers"]
    gains = np.asarray(result["profit_gains"])
    assert result["profit_gain"] == pytest.approx(gains.mean(), abs=1e-12)
    assert result["profit_gain_sd"] == pytest.approx(gains.std(), abs=1e-12)
    assert result["sessions"] == 3 == len(rows)
    assert result["periods_simulated"] == summary["periods"]
    assert result["periods_simulated"] <= 1000
    assert result["session_periods"] == 3 * result["periods_simulated"]
    assert result["ns_per_session_period"] == pytest.approx(
        1e9 * result["wall_s"] / result["session_periods"])
    assert 0 < result["compile_s"] < result["wall_s"]
    assert result["target_met"] is False     # 3 sessions are not the 1000 of the target
    assert (result["alpha"], result["beta"], result["convergence_window"]) == (0.15, 0.01, 200)
    assert result["devices"] == 1 and result["delta"] == 0.95 and result["grid_size"] == M
    assert (saved / "strategies.npz").read_bytes() == (run_dir / "strategies.npz").read_bytes()


def test_flags_become_the_configs_overrides():
    # Bugs caught: a flag that does not reach its config key (or the wrong one), a
    # number YAML reads as a string (``1e-05``), --firms without the n-seller grid
    # bounds, and --step fast/learner not mapped to the XLA backend.
    config = calvano.build_config(firms=3, alpha=0.2, beta=1e-5, window=7, sessions=5,
                                  max_periods=99, chunk=11, seed=4, step="kernel")
    seller = config["market"]["sellers"][0]
    learner = config["learners"]["sellers"]
    assert seller["count"] == 3
    grid = hand_grid(3)
    assert seller["low"] == pytest.approx(grid[0], abs=1e-8)
    assert seller["high"] == pytest.approx(grid[-1], abs=1e-8)
    assert learner["learning_rate"] == 0.2 and learner["exploration_decay"] == 1e-5
    assert isinstance(learner["exploration_decay"], float)
    assert learner["convergence_window"] == 7
    assert config["train"]["num_seeds"] == 5 and config["train"]["num_iterations"] == 99
    assert config["train"]["chunk_size"] == 11 and config["seed"] == 4
    assert config["train"]["session_backend"] == "kernel"
    for step in ("fast", "learner"):
        assert calvano.build_config(step=step)["train"]["session_backend"] == "xla"
    assert "session_backend" not in calvano.build_config()["train"]   # the engine chooses
    # what the config ships is the baseline the flags default to
    shipped = calvano.build_config()
    assert shipped["learners"]["sellers"]["learning_rate"] == 0.15
    assert shipped["learners"]["sellers"]["exploration_decay"] == 4e-6
    assert shipped["market"]["sellers"][0]["low"] == pytest.approx(hand_grid(2)[0], abs=1e-8)


def test_kernel_and_xla_steps_give_the_same_sessions():
    # Bugs caught: --step not reaching the engine (both runs on one backend: the
    # "backend" of each says which ran), or the two backends playing different sessions.
    kw = {"sessions": 8, "beta": 2e-3, "window": 1000, "chunk": 2000, "max_periods": 20000,
          "progress": False}
    kernel = calvano.run(step="kernel", **kw)
    xla = calvano.run(step="fast", **kw)
    assert (kernel["backend"], xla["backend"]) == ("kernel", "xla")
    assert (kernel["step"], xla["step"]) == ("kernel", "fast")
    assert kernel["converged_share"] > 0   # converged sessions are compared too
    for key in ("profit_gains", "converged", "mean_convergence_period", "periods_simulated"):
        assert kernel[key] == xla[key], key


BAD_FLAGS = [
    (["--firms", "1"], "--firms"),
    (["--firms", "0"], "--firms"),
    (["--alpha", "0"], "--alpha"),
    (["--alpha", "1.5"], "--alpha"),
    (["--alpha", "-0.1"], "--alpha"),
    (["--beta", "0"], "--beta"),
    (["--beta", "-4e-6"], "--beta"),
    (["--grid-alpha", "0.1,1.2"], "--alpha"),
    (["--grid-beta", "4e-6,0"], "--beta"),
    (["--grid-alpha", "0.1,x"], "--grid-alpha"),
    (["--firms", "three"], "--firms"),
    (["--devices", "99"], "--devices"),
    (["--devices", "2"], "--devices"),
    (["--step", "quick"], "--step"),
    (["--window", "0"], "--window"),
    (["--grid-beta", "1e-5", "--save-strategies", "x"], "grid mode"),
    (["--firms", "4", "--sessions", "100000"], "GiB"),
]


@pytest.mark.parametrize("argv, names", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flags_exit_2_with_one_line(argv, names, capsys):
    # Bug caught: a bad setting that starts a run (or dies in a traceback deep inside
    # JAX) instead of a one-line error with argparse's exit status 2.
    with pytest.raises(SystemExit) as exit_info:
        calvano.main(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("calvano.py: error:"), err
    assert names in lines[0]


def test_valid_edges_are_accepted():
    # alpha = 1 is inside (0, 1]; a tiny beta is fine; 15^5 joint prices fit the tables
    calvano.check_arguments(firms=2, alpha=1.0, beta=1e-12)
    calvano.check_arguments(firms=4, alpha=0.15, beta=4e-6, sessions=1)
    calvano.check_arguments(firms=5, alpha=0.15, beta=4e-6, sessions=1)
    with pytest.raises(ValueError, match="--firms 6: 15\\^6 joint prices"):
        calvano.check_arguments(firms=6, alpha=0.15, beta=4e-6, sessions=1)


def test_bad_flag_as_a_script_exits_2_with_one_line():
    # Bug caught: the same, through the real command line (argparse's own usage text).
    out = subprocess.run([sys.executable, str(SCRIPT), "--alpha", "2"], capture_output=True,
                         text=True)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "--alpha" in out.stderr


def test_grid_mode_runs_each_cell_with_its_own_parameters(capsys):
    # Bugs caught: a grid that runs every cell with the default (or the first) alpha or
    # beta, labels cells with parameters they did not use, or drops/duplicates cells.
    tiny = ["--sessions", "2", "--window", "300", "--chunk", "500", "--max-periods", "3000"]
    result = calvano.main(["--grid-alpha", "1,0.15", "--grid-beta", "5e-3,2e-3", *tiny,
                           "--json"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(result))
    cells = result["cells"]
    assert [(c["alpha"], c["beta"]) for c in cells] == [(1.0, 5e-3), (1.0, 2e-3),
                                                         (0.15, 5e-3), (0.15, 2e-3)]
    assert all(c["sessions"] == 2 and c["firms"] == 2 for c in cells)
    # a cell is exactly the single run with its alpha and beta ...
    single = calvano.run(sessions=2, alpha=1.0, beta=2e-3, window=300, chunk=500,
                         max_periods=3000, progress=False)
    for key in ("profit_gain", "profit_gain_sd", "converged_share",
                "mean_convergence_period", "periods_simulated"):
        assert cells[1][key] == single[key], key
    # ... and differs from the cell with the default alpha (so the check above has teeth)
    assert (cells[1]["profit_gain"], cells[1]["mean_convergence_period"]) != \
        (cells[3]["profit_gain"], cells[3]["mean_convergence_period"])


def test_kernel_step_without_numba_is_a_flag_error(monkeypatch):
    # Bug caught: a missing numba ending in a traceback from inside the engine instead
    # of a one-line flag error (the package depends on numba; a broken install).
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"--step kernel needs numba"):
        calvano.check_step("kernel")
    calvano.check_step("fast")   # the XLA backend needs no numba
    with pytest.raises(ValueError, match="--step: got 'quick'; allowed: kernel, fast, learner"):
        calvano.check_step("quick")
