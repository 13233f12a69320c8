"""Calvano et al. (2020) through the generic training loop: ``configs/calvano.yaml``
(two ``q_learning`` sellers in the logit market) trained by ``start_run``, with the
seeds folded into the learner's slot axis as sessions, each converging on its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxmarket.market import economics
from jaxmarket.train.run import final_learner_state, start_run

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "calvano.yaml"
SEEDS, ITERATIONS, WINDOW = 4, 80_000, 5_000


def test_calvano_config_colludes_through_the_training_loop(tmp_path):
    """4 sessions (seeds), beta = 2e-4 (50x the published decay), a 5,000-period
    convergence window, 80,000 periods (~20 s of training on a loaded 2-core CPU;
    sessions converge at ~50,000).

    Threshold, as in the reduced benchmark test: static Nash play scores Delta = 0 and
    pricing uniformly at random on the grid scores Delta ~= 0.50, so an average above
    0.6 is supra-competitive beyond both, i.e. learnt tacit coordination. The summary
    averages the sellers' rewards over the last 10% of the iterations, when every
    session has converged and plays its greedy strategies (measured: ~0.70)."""
    run_dir = tmp_path / "run"
    summary = start_run(str(CONFIG), [
        f"train.num_seeds={SEEDS}", f"train.num_iterations={ITERATIONS}",
        "train.chunk_size=20000", "learners.sellers.exploration_decay=2e-4",
        f"learners.sellers.convergence_window={WINDOW}"], str(run_dir))

    grid = economics.calvano_grid()
    p_n, p_m = economics.nash_price(2), economics.joint_monopoly_price(2)
    pi_n = economics.logit_profits([p_n, p_n])[0]
    pi_m = economics.logit_profits([p_m, p_m])[0]
    pairs = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1)
    random_play = economics.profit_gain(economics.logit_profits(pairs)[..., 0].mean(), pi_n, pi_m)
    assert 0.45 < random_play < 0.55

    gain = economics.profit_gain(summary["final"]["sellers"]["mean_reward"], pi_n, pi_m)
    assert gain > max(0.6, random_play + 0.1)
    assert gain < 1.0

    state = final_learner_state(run_dir).learners["sellers"]
    converged = np.asarray(state.converged)
    steps = np.asarray(state.step)
    assert converged.shape == steps.shape == (SEEDS,)
    assert converged.all()
    # each session stopped at its own convergence period, at most ~90% into the run
    assert (steps <= 0.9 * ITERATIONS).all()
    np.testing.assert_array_equal(state.stable_periods, WINDOW)
    assert state.q.shape == (SEEDS * 2, 15 * 15, 15)
