"""Deep RL in Calvano et al.'s economy (configs/calvano_ppo.yaml, design calvano_ppo):
a reduced ``jaxmarket reproduce`` on the regular trainer (PPO sellers, one seed = one
session), Delta recomputed from the seeds' profits in seeds.csv with the closed-form
Nash and joint-monopoly profits, the prices' move from the untrained policy's towards
the static Nash price, the impulse response of the greedy PPO strategies (the
deviation is the static best response on Calvano's grid), and the config errors of
designs and runs the new paths refuse."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from jaxmarket.analysis.impulse import impulse_response, strategies_from_runner
from jaxmarket.cli import run_cli
from jaxmarket.cli.reproduce import main as reproduce_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.market.economics import calvano_grid, joint_monopoly_price, logit_profits, nash_price
from jaxmarket.sessions.reproduce import NO_PUBLISHED, find_design, load_design, reproduce
from jaxmarket.train.plan import resolve

ROOT = Path(__file__).resolve().parents[1]
P_N, P_M = nash_price(2), joint_monopoly_price(2)
PI_N = float(logit_profits([P_N, P_N])[0])
PI_M = float(logit_profits([P_M, P_M])[0])
GRID = calvano_grid(2, 15, 0.1)
SEEDS, ITERATIONS, ENVS, T = 3, 60, 4, 16
REDUCED = [f"train.num_seeds={SEEDS}", f"train.num_iterations={ITERATIONS}",
           f"train.num_envs={ENVS}", f"train.rollout_length={T}", "train.chunk_size=30",
           "train.checkpoint_every=1", "learners.sellers.hidden_sizes=[16]",
           "learners.sellers.learning_rate=0.003"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    result = reproduce(find_design("calvano_ppo"), run_dir, REDUCED)
    return run_dir, result


def test_the_config_plays_calvanos_grid_with_ppo_sellers():
    plan = resolve(load_config(ROOT / "configs" / "calvano_ppo.yaml"))
    kind, hyper = plan.learner_settings["sellers"]
    assert kind == "ppo" and hyper["action_head"] == "discrete"
    spec = group_learner_spec(plan.env, plan.params, "sellers")
    low, high = np.unique(spec.action_low), np.unique(spec.action_high)
    assert low.size == high.size == 1
    np.testing.assert_allclose(np.linspace(low[0], high[0], hyper["num_actions"]), GRID,
                               atol=1e-5)
    assert plan.train.num_seeds >= 32


def test_delta_is_the_formula_applied_to_the_seeds_profits(run):
    run_dir, result = run
    assert result["engine"] == "loop" and result["measure"] == "profit_gain"
    assert result["sessions"] == SEEDS
    assert (result["periods"], result["max_periods"]) == (ITERATIONS * T, ITERATIONS * T)
    seeds = pd.read_csv(run_dir / "seeds.csv")
    last = seeds[seeds["iteration"] > ITERATIONS - math.ceil(0.1 * ITERATIONS)]
    profit = last.groupby("seed")["reward/sellers"].mean().to_numpy()
    delta = (profit - PI_N) / (PI_M - PI_N)
    assert result["value"] == pytest.approx(float(delta.mean()), abs=1e-4)
    lo, hi = result["ci95"]
    assert lo - 1e-12 <= result["value"] <= hi + 1e-12
    assert lo >= delta.min() - 1e-4 and hi <= delta.max() + 1e-4
    assert result["published"] is None and result["verdict"] == NO_PUBLISHED
    assert json.loads((run_dir / "reproduction.json").read_text()) == result


def test_prices_move_from_the_untrained_policy_towards_nash(run):
    run_dir, _ = run
    seeds = pd.read_csv(run_dir / "seeds.csv")
    price = seeds.groupby("iteration")["price/sellers/p0"].mean()
    # the untrained head's logits are ~0: every grid price about equally likely
    start = GRID.mean()
    assert price.iloc[0] == pytest.approx(start, abs=0.05)
    final = price.iloc[-math.ceil(0.1 * ITERATIONS):].mean()
    # the static best reply to the grid's mean price lies below it: a myopic gain
    # (profits move towards the static Nash price, the top of the one-shot game's
    # undercutting) pulls prices down from the start, and not below the grid
    reply = GRID[np.argmax(logit_profits(np.stack([GRID, np.full_like(GRID, start)], -1))[:, 0])]
    assert reply < start
    assert GRID[0] - 1e-9 <= final < start - 0.05


def test_the_impulse_response_deviates_to_the_static_best_response(run):
    run_dir, _ = run
    ir = impulse_response(run_dir, agent=0, deviation="best_response", periods=5)
    assert ir.session_price.shape == (SEEDS * ENVS, 5, 2)
    single = np.flatnonzero(ir.cycle_length == 1)
    assert single.size > 0
    for s in single:
        rival = ir.session_price[s, 0, 1]
        profits = logit_profits(np.stack([GRID, np.full_like(GRID, rival)], -1))[:, 0]
        # the market's grid is Calvano's to float32 rounding of its bounds (1e-5)
        assert np.argmin(np.abs(GRID - ir.session_price[s, 0, 0])) == np.argmax(profits)


def test_a_gaussian_ppo_group_has_no_greedy_grid_strategy():
    plan = resolve(load_config(ROOT / "configs" / "calvano_ppo.yaml",
                               ["learners.sellers.action_head=gaussian"]))
    with pytest.raises(ConfigError, match="learners.sellers.action_head.*discrete"):
        strategies_from_runner(plan, None)


def test_a_session_measure_on_a_trainer_design_is_refused(tmp_path):
    raw = yaml.safe_load((ROOT / "jaxmarket" / "designs" / "calvano_ppo.yaml").read_text())
    raw.update(measure="mean_played_profit", published=0.3)
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="measure.*a measure of a trainer run"):
        reproduce(load_design(path), tmp_path / "run", ["train.num_seeds=1"])
    assert not (tmp_path / "run").exists()


def test_a_design_without_a_published_number_is_listed(capsys):
    assert run_cli(reproduce_main, ["--list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    entry = next(d for d in listing if d["name"] == "calvano_ppo")
    assert entry["published"] is None and "Deng" in entry["source"]
    assert run_cli(reproduce_main, ["--list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("calvano_ppo "))
    assert "published not found" in line
