"""``benchmarks/calvano.py`` beyond the duopoly baseline: ``--firms N``, ``--alpha``,
``--beta``, the one-line errors of bad flags, and the alpha x beta grid mode.

Expected values are computed here by hand or with numpy/scipy from the logit formulas
(never read back from ``jaxmarket.economics`` or the script)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "calvano.py"
A, C, A0, MU, DELTA, M, XI = 2.0, 1.0, 0.0, 0.25, 0.95, 15, 0.1


def load_calvano():
    spec = importlib.util.spec_from_file_location("calvano_cli_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
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
def three_firm_run():
    """A tiny ``--firms 3`` run through ``main`` (in-process): what the script reports."""
    return calvano.main(["--firms", "3", "--sessions", "2", "--beta", "1e-2", "--window",
                         "200", "--chunk", "500", "--max-periods", "1000", "--json"])


def test_three_firm_economics_match_a_scipy_solve(three_firm_run):
    # Bug caught: the script taking Nash/monopoly prices (or the grid) of the duopoly for
    # n = 3, or profits of the wrong number of sellers in pi_N / pi_M.
    result = three_firm_run
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
    assert result["p_nash"] == pytest.approx(p_n, abs=1e-8)
    assert result["p_monopoly"] == pytest.approx(2.0, abs=1e-12)
    assert result["pi_nash"] == pytest.approx(profits([p_n] * 3)[0], abs=1e-10)
    assert result["pi_monopoly"] == pytest.approx(0.25, abs=1e-12)
    # the grid spans [p_N - xi (p_M - p_N), p_M + xi (p_M - p_N)] of three sellers
    spread = XI * (2.0 - p_n)
    assert result["grid_low"] == pytest.approx(p_n - spread, abs=1e-8)
    assert result["grid_high"] == pytest.approx(2.0 + spread, abs=1e-8)
    # the run itself went through: finite gains of 2 sessions
    assert result["sessions"] == 2 and np.isfinite(result["profit_gain"])


def hand_grid(n: int) -> np.ndarray:
    p_n = solve_nash(n)
    p_m = float(solve_monopoly(n)[0])
    spread = XI * (p_m - p_n)
    return np.linspace(p_n - spread, p_m + spread, M)


def test_three_firm_first_period_matches_a_hand_computation():
    # Bugs caught: a state that is not the m^3 mixed-radix number of all three prices
    # (e.g. only two sellers observed), a payoff table in the wrong seller order, a
    # transition that does not pass every seller's new price to every seller, an
    # initial Q that is not the random-rival value, and an --alpha (or delta) that does
    # not reach the learner.
    n, sessions, alpha = 3, 6, 0.3
    setup = calvano.make_setup(firms=n, alpha=alpha)
    grid = hand_grid(n)
    np.testing.assert_allclose(setup.grid, grid, atol=1e-7)
    state, obs, keys = calvano.init_sessions(setup, jax.random.key(1), sessions)
    assert state.rows.shape == (sessions, n, M ** n, M + 1)  # m^3 states, Q | greedy

    # initial Q by hand: mean profit of each own price against uniform rivals / (1 - delta)
    profiles = np.stack(np.meshgrid(*[grid] * n, indexing="ij"), -1).reshape(-1, n)
    table = profits(profiles)                                      # [m^3, 3]
    own = np.indices((M,) * n).reshape(n, -1).T                    # [m^3, 3] indices
    q0 = np.stack([[table[own[:, i] == a, i].mean() for a in range(M)] for i in range(n)])
    q0 /= 1.0 - DELTA                                              # [3, m]
    rows0, obs0 = np.asarray(state.rows), np.asarray(obs)   # (the chunk donates them)
    np.testing.assert_allclose(rows0[..., :M], np.broadcast_to(q0[None, :, None, :],
                                                               rows0[..., :M].shape),
                               rtol=2e-6)

    chunk = calvano.make_chunk(setup, 1)
    state1, obs1, _ = chunk((state, obs, keys), jnp.uint32(0))
    rows1 = np.asarray(state1.rows)
    obs1 = np.asarray(obs1)
    for s in range(sessions):
        digits0 = np.abs(obs0[s, 0][:, None] - grid[None, :]).argmin(axis=1)
        state0 = int(digits0 @ [M * M, M, 1])
        # every seller observes the same profile: the prices of all three sellers
        assert np.all(obs1[s] == obs1[s, 0])
        action = np.abs(obs1[s, 0][:, None] - grid[None, :]).argmin(axis=1)
        np.testing.assert_allclose(obs1[s, 0], grid[action], atol=1e-6)
        for i in range(n):
            changed = np.argwhere(rows1[s, i, :, :M] != rows0[s, i, :, :M])
            # one period changes one entry per seller: Q_i[s0, a_i] (alpha > 0)
            assert changed.tolist() == [[state0, action[i]]]
            target = table[int(action @ [M * M, M, 1]), i] + DELTA * q0[i].max()
            expected = (1 - alpha) * q0[i, action[i]] + alpha * target
            assert rows1[s, i, state0, action[i]] == pytest.approx(expected, rel=2e-6)
            assert rows1[s, i, state0, M] == np.argmax(rows1[s, i, state0, :M])


def test_three_firm_greedy_play_is_averaged_over_its_cycle():
    # Bug caught: a limit cycle measured on the wrong states for n > 2 (observations of
    # fewer sellers, a burn-in or horizon of m^2 instead of m^n) or profits of two sellers.
    n = 3
    setup = calvano.make_setup(firms=n)
    grid = np.asarray(setup.grid)
    state, obs, _ = calvano.init_sessions(setup, jax.random.key(0), 2)
    low, high = 3, 11
    # session 0: everyone always plays `high`; session 1: play `high` after a period in
    # which all three played `low`, else `low`: the cycle (low, low, low) <-> (high, ...)
    q = np.zeros(state.rows[..., :M].shape, np.float32)          # [2, 3, m^3, m]
    q[0, :, :, high] = 1.0
    q[1, :, :, low] = 1.0
    all_low = low * (M * M + M + 1)
    q[1, :, all_low, :] = 0.0
    q[1, :, all_low, high] = 1.0
    greedy_state = state.with_q(jnp.asarray(q))
    cycle = np.asarray(calvano.greedy_cycle_profits(setup, greedy_state, obs))   # [2, 3]
    np.testing.assert_allclose(cycle[0], profits([grid[high]] * 3), rtol=1e-5)
    two = (profits([grid[low]] * 3) + profits([grid[high]] * 3)) / 2
    np.testing.assert_allclose(cycle[1], two, rtol=1e-5)


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
    # alpha = 1 is inside (0, 1]; a tiny beta is fine
    calvano.check_arguments(firms=2, alpha=1.0, beta=1e-12)
    calvano.check_arguments(firms=4, alpha=0.15, beta=4e-6, sessions=1)


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


# -- the fast step (make_fast_chunk) against the learner's act/update (make_chunk) -------

def test_unrolled_threefry_is_jax_threefry():
    # Bug caught: a round, rotation or key-schedule slip in the unrolled hash (the fast
    # step's random streams would silently differ from jax.random's).
    from jax.extend.random import threefry_2x32
    rng = np.random.default_rng(0)
    k = rng.integers(0, 2**32, size=2, dtype=np.uint32)
    x = rng.integers(0, 2**32, size=16, dtype=np.uint32)
    y0, y1 = calvano.threefry2x32(jnp.uint32(k[0]), jnp.uint32(k[1]), jnp.asarray(x[:8]),
                                  jnp.asarray(x[8:]))
    expected = np.asarray(threefry_2x32((jnp.uint32(k[0]), jnp.uint32(k[1])), jnp.asarray(x)))
    np.testing.assert_array_equal(np.concatenate([y0, y1]), expected)


def test_fast_step_runs_the_learners_sessions():
    # Bugs caught: a fast step whose draws, state index, table layout, update rounding,
    # greedy cache or convergence rule depart from the q_learning learner's act/update by
    # as much as one bit (a session's trajectory would then differ: Q tables, greedy
    # play, convergence periods), for the duopoly through run() (convergence, greedy
    # scoring) and for three sellers chunk by chunk (odd draw count, m^3 states).
    kw = {"sessions": 8, "beta": 2e-3, "window": 1000, "chunk": 1000, "max_periods": 20000,
          "progress": False}
    learner = calvano.run(step="learner", **kw)
    fast = calvano.run(step="fast", **kw)
    assert learner["converged_share"] > 0   # the comparison covers converged sessions
    for key in learner:
        if key not in ("wall_s", "compile_s", "step", "ns_per_session_period"):
            assert fast[key] == learner[key], key

    setup = calvano.make_setup(firms=3, alpha=0.3, beta=2e-2, window=30)
    with jax.threefry_partitionable(False):   # as run() draws
        carries = [calvano.init_sessions(setup, jax.random.key(2), 4) for _ in range(2)]
        reference = calvano.make_chunk(setup, 60)
        fast_chunk = calvano.make_fast_chunk(setup, 60, draws_per_pass=20)
        for first in (0, 60, 120):
            carries = [reference(carries[0], jnp.uint32(first)),
                       fast_chunk(carries[1], jnp.uint32(first))]
    (state_a, obs_a, _), (state_b, obs_b, _) = carries
    for a, b in zip(jax.tree.leaves((state_a, obs_a)), jax.tree.leaves((state_b, obs_b))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(state_a.step).min() > 0


# -- the kernel step (calvano_kernel.make_kernel_chunk, numba) against the learner -------

def test_kernel_step_runs_the_learners_sessions():
    # Bugs caught: a kernel whose hash, exploration test (eps_t looked up at the wrong
    # step or for the wrong beta), rounding (the contracted r + delta max Q), greedy cache
    # (the tie rule, the rescan when the greedy entry falls), convergence count or
    # greedy play after convergence departs from the q_learning learner by one bit.
    kw = {"sessions": 8, "beta": 2e-3, "window": 1000, "chunk": 1000, "max_periods": 20000,
          "progress": False}
    learner = calvano.run(step="learner", **kw)
    kernel = calvano.run(step="kernel", **kw)
    assert kernel["step"] == "kernel"
    assert learner["converged_share"] > 0   # converged sessions are compared too
    for key in learner:
        if key not in ("wall_s", "compile_s", "step", "ns_per_session_period"):
            assert kernel[key] == learner[key], key

    from calvano_kernel import make_kernel_chunk
    for firms, alpha, beta, window, sessions in ((3, 0.3, 2e-2, 30, 4), (2, 0.3, 5e-2, 15, 6)):
        setup = calvano.make_setup(firms=firms, alpha=alpha, beta=beta, window=window)
        with jax.threefry_partitionable(False):   # as run() draws
            carries = [calvano.init_sessions(setup, jax.random.key(3), sessions)
                       for _ in range(2)]
            if firms == 2:   # two sessions explore 4x slower: one eps_t row per beta
                def slower(state):
                    decay = state.hyper["exploration_decay"].at[:2].multiply(0.25)
                    return state.replace(hyper={**state.hyper, "exploration_decay": decay})
                carries = [(slower(c[0]),) + c[1:] for c in carries]
            reference = calvano.make_chunk(setup, 70)
            kernel_chunk = make_kernel_chunk(setup, 70)
            for first in (0, 70, 140, 210):
                carries = [reference(carries[0], jnp.uint32(first)),
                           kernel_chunk(carries[1], jnp.uint32(first))]
        (state_a, obs_a, _), (state_b, obs_b, _) = carries
        for a, b in zip(jax.tree.leaves((state_a, obs_a)), jax.tree.leaves((state_b, obs_b))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        steps = np.asarray(state_a.step)
        assert steps.min() > 0
        if firms == 2:   # some sessions converged mid-run, some still learn
            converged = np.asarray(state_a.converged)
            assert converged.any() and not converged.all(), steps


def test_kernel_step_without_numba_is_a_flag_error(monkeypatch):
    # Bug caught: a missing numba ending in an ImportError traceback, or the default
    # step still asking for the kernel.
    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.delitem(sys.modules, "calvano_kernel", raising=False)
    assert calvano.default_step() == "fast"
    with pytest.raises(ValueError, match=r"--step kernel needs numba.*\.\[bench\]"):
        calvano.chunk_maker("kernel")
    with pytest.raises(ValueError, match="--step: got 'quick'; allowed: kernel, fast, learner"):
        calvano.chunk_maker("quick")
