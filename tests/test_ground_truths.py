"""Ground truths (docs/ground_truths.md).

Each test trains the scenario's learners with ``start_run`` into ``tmp_path`` and compares
what they learned with a number derived here, from the closed forms of
``jaxmarket.market.economics`` and the scenario's own config values (never a pasted constant).

*Learned price.* Unless stated otherwise it is the **policy mean** of the Gaussian bandit
read from the final checkpoint (``final_learner_state``), averaged over the vmapped seeds:
the price the learner converged to, i.e. what theory predicts. The summary's
``mean_price`` is the average of the *sampled* prices actually played over the last 10 %
of the iterations (mean + exploration noise, clipped to the bounds); it is checked to agree
with the policy mean within a few exploration stddevs, so both readings tell the same story.

The CI versions are reduced (fewer iterations; a jitted chunk of a few thousand
iterations runs in about a second, the cost is compiling it). The ``slow`` versions run
the shipped configs with 8 seeds and tighter tolerances (``pytest -m slow``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CONFIGS

from jaxmarket.market import economics
from jaxmarket.config.loader import load_config
from jaxmarket.train.slots import per_seed
from jaxmarket.train.run import final_learner_state, start_run

# Learner settings for the legacy default market that converge without overshooting the
# budget cliff (see test_budget_monopoly_ppo_bandit_learns_the_budget).
LEGACY_LEARNER = ["learners.seller.learning_rate=0.001", "learners.seller.stddev_low=0.002",
                  "learners.seller.buffer_length=4", "train.num_envs=8"]


def one_chunk(iterations: int) -> list[str]:
    """Train ``iterations`` in a single compiled chunk (one compilation)."""
    return [f"train.num_iterations={iterations}", f"train.chunk_size={iterations}",
            "train.checkpoint_every=1"]


def train(name: str, run_dir: Path, overrides: list[str]):
    """Run ``configs/NAME.yaml`` with ``overrides``; returns (config as run, summary,
    final Runner)."""
    summary = start_run(str(CONFIGS / f"{name}.yaml"), overrides, str(run_dir))
    assert summary["stopped"] is None, summary["stopped"]
    config = load_config(run_dir / "config.yaml")
    assert summary["iterations"] == config["train"]["num_iterations"]
    return config, summary, final_learner_state(run_dir)


def policy(runner, group: str, config: dict) -> tuple[np.ndarray, np.ndarray]:
    """(mean, stddev) of a Gaussian bandit group, ``[seeds, policies, products]`` (the
    loop folds seeds into the policy axis: ``[seeds * policies, products]``)."""
    seeds = int(config["train"]["num_seeds"])
    params = runner.learners[group].params
    mean = np.asarray(per_seed(params["mean"], seeds), np.float64)
    return mean, np.exp(np.asarray(per_seed(params["log_std"], seeds), np.float64))


def logit_economy(config: dict) -> dict:
    """The logit economy's parameters (a, c, a0, mu) read from a scenario config."""
    seller = config["market"]["sellers"][0]
    dist = config["market"]["distributor"]
    assert dist["kind"] == "logit" and dist.get("price_sensitivity", 1.0) == 1.0
    return {"quality": float(seller["quality"]), "cost": float(seller["cost"]),
            "outside_quality": float(dist.get("outside_quality", 0.0)),
            "mu": float(dist["temperature"])}


def check_summary_agrees(summary: dict, group: str, mean: np.ndarray, std: np.ndarray,
                         k: float = 3.0) -> None:
    """The played prices average to the policy mean within ``k`` exploration stddevs."""
    played = summary["final"][group]["mean_price"][0]
    assert abs(played - mean.mean()) <= k * std.max() + 1e-6, (played, mean.mean(), std.max())


# ------------------------------------------------------------------------ 1. legacy default

def legacy_case(run_dir: Path, extra: list[str], tol: float) -> None:
    config, summary, runner = train("budget_monopoly", run_dir, extra)
    budget = float(config["market"]["consumers"][0]["budget"])
    mean, std = policy(runner, "seller", config)
    learned = mean.mean()
    assert abs(learned - budget) <= tol * budget, (learned, budget, mean.ravel())
    # no seed stranded above the cliff (it would earn nothing there)
    assert np.all(mean < budget), mean.ravel()
    check_summary_agrees(summary, "seller", mean, std)


def test_budget_monopoly_ppo_bandit_learns_the_budget(tmp_path):
    """Budget-capped monopoly: reward = p x 1{p <= b}; optimum p* = b (read from the config).

    Learned price: the policy mean (seed average), within 2 % of the budget, every seed
    below the budget. A Gaussian policy with stddev s is best off a little *below* the
    cliff (about b - 2.6 s for s << b), so the stddev must shrink: ``stddev_low = 0.002``
    bounds that bias by ~0.005 = 1 % of b.

    The learner settings of ``configs/budget_monopoly.yaml`` (adam lr 0.01, 4 epochs per
    update, one market per seed) are overridden: with them the mean moves up to ~0.04 per
    update while the stddev shrinks to ~0.005, and after ~10k iterations every seed jumps
    over the cliff and stays there (all rewards 0, so the standardised advantages are 0
    and nothing moves it back). Here: lr 0.001, 8 markets per seed sharing the policy,
    buffer 4 (32 samples per update).
    """
    legacy_case(tmp_path / "legacy", LEGACY_LEARNER + one_chunk(10_000), tol=0.02)


@pytest.mark.slow
def test_budget_monopoly_full(tmp_path):
    """8 seeds, 30k iterations (after convergence the cliff must still hold), 1 %."""
    legacy_case(tmp_path / "legacy", LEGACY_LEARNER + one_chunk(30_000) + ["train.num_seeds=8"],
                tol=0.01)


# ------------------------------------------------------------------------ 2. logit monopoly

def monopoly_case(run_dir: Path, extra: list[str], tol: float) -> None:
    config, summary, runner = train("logit_monopoly", run_dir, extra)
    target = economics.monopoly_price(**logit_economy(config))
    mean, std = policy(runner, "seller", config)
    assert abs(mean.mean() - target) <= tol * target, (mean.ravel(), target)
    assert np.all(np.abs(mean - target) <= 2 * tol * target), (mean.ravel(), target)
    check_summary_agrees(summary, "seller", mean, std)
    # and it earns the monopoly profit (the profit is flat at the top: second order)
    econ = logit_economy(config)
    best = economics.logit_profits([target], econ["quality"], econ["cost"],
                                   econ["outside_quality"], econ["mu"])[0]
    assert summary["final"]["seller"]["mean_reward"] == pytest.approx(best, rel=0.01)


def test_logit_monopoly_learns_lambert_w_price(tmp_path):
    """Single seller, logit demand: p* = c + mu (1 + W(exp((a - c - mu - a0)/mu)))
    (``economics.monopoly_price`` with a, c, a0, mu from the config). The learner starts
    at 1.3; learned price (seed-averaged policy mean) within 1 % of p*, every seed within
    2 %."""
    monopoly_case(tmp_path / "monopoly", one_chunk(5_000), tol=0.01)


@pytest.mark.slow
def test_logit_monopoly_full(tmp_path):
    monopoly_case(tmp_path / "monopoly", ["train.num_seeds=8"], tol=0.002)


# ------------------------------------------------------------------------ 2. logit duopoly

def duopoly_targets(config: dict) -> tuple[float, float]:
    econ = logit_economy(config)
    return economics.nash_price(2, **econ), economics.joint_monopoly_price(2, **econ)


def duopoly_check(config, summary, runner, team: bool, tol_gap: float) -> float:
    p_nash, p_mono = duopoly_targets(config)
    gap = p_mono - p_nash
    target = p_mono if team else p_nash
    mean, std = policy(runner, "sellers", config)          # [seeds, 2, 1]
    per_seller = mean.mean(0).ravel()               # seed average, each seller
    assert np.all(np.abs(per_seller - target) <= tol_gap * gap), (per_seller, target, gap)
    assert np.all(np.abs(mean - target) <= 2 * tol_gap * gap), (mean.ravel(), target, gap)
    check_summary_agrees(summary, "sellers", mean, std)
    return float(mean.mean())


@pytest.fixture(scope="module")
def duopoly_runs(tmp_path_factory):
    """Both duopoly runs, trained once for the three tests below (each compiles once)."""
    runs = {}

    def get(team: bool):
        if team not in runs:
            name = "logit_duopoly_team" if team else "logit_duopoly"
            runs[team] = train(name, tmp_path_factory.mktemp(name), one_chunk(5_000))
        return runs[team]

    return get


def test_logit_duopoly_independent_learners_reach_static_nash(duopoly_runs):
    """Independent learners (own profit each) end near the static Nash price p_N
    (``economics.nash_price(2, ...)``). Both start at 1.75, between p_N and p_M.

    Tolerance relative to the Nash-monopoly gap G = p_M - p_N (~0.45, the distance the
    test must discriminate): each seller's seed-averaged price within 0.05 G of p_N (about
    1.5 % of the price, far tighter than any partial collusion), every seed within 0.1 G.
    The slack is for the random walk of two learners whose rewards carry each other's
    exploration noise (observed per-seed spread ~0.02 G)."""
    config, summary, runner = duopoly_runs(False)
    duopoly_check(config, summary, runner, team=False, tol_gap=0.05)


def test_logit_duopoly_team_reward_reaches_joint_monopoly(duopoly_runs):
    """Both sellers paid the team reward (the mean profit, ``{kind: team, teams: [0, 0]}``)
    maximise joint profit: they end near the joint-monopoly price p_M
    (``economics.joint_monopoly_price(2, ...)``), same tolerances as the Nash test."""
    config, summary, runner = duopoly_runs(True)
    duopoly_check(config, summary, runner, team=True, tol_gap=0.05)


def test_logit_duopoly_team_price_clearly_above_independent(duopoly_runs):
    """Ordering: the colluding price exceeds the independent one by most of the gap
    (> 0.8 G). In profits: Calvano's gain Delta = (pi - pi_N) / (pi_M - pi_N) of the
    profit per seller actually earned (summary ``mean_reward``, the team reward being the
    mean profit) is above that of a common price p_M - 0.1 G for the team and below that
    of p_N + 0.1 G for the independent learners (bounds computed here)."""
    config, s_ind, r_ind = duopoly_runs(False)
    _, s_team, r_team = duopoly_runs(True)
    p_nash, p_mono = duopoly_targets(config)
    independent = policy(r_ind, "sellers", config)[0].mean()
    team = policy(r_team, "sellers", config)[0].mean()
    assert team - independent > 0.8 * (p_mono - p_nash), (independent, team)
    econ = logit_economy(config)
    pi_n, pi_m = (economics.logit_profits([p, p], econ["quality"], econ["cost"],
                                          econ["outside_quality"], econ["mu"])[0]
                  for p in (p_nash, p_mono))
    # mean_reward of the team group is the mean profit per seller

    def gain_at(price: float) -> float:
        pi = economics.logit_profits([price, price], econ["quality"], econ["cost"],
                                     econ["outside_quality"], econ["mu"])[0]
        return float(economics.profit_gain(pi, pi_n, pi_m))

    gap = p_mono - p_nash
    team_gain = economics.profit_gain(s_team["final"]["sellers"]["mean_reward"], pi_n, pi_m)
    ind_gain = economics.profit_gain(s_ind["final"]["sellers"]["mean_reward"], pi_n, pi_m)
    assert team_gain > gain_at(p_mono - 0.1 * gap), team_gain
    assert ind_gain < gain_at(p_nash + 0.1 * gap), ind_gain


@pytest.mark.slow
@pytest.mark.parametrize("team", [False, True])
def test_logit_duopoly_full(tmp_path, team):
    name = "logit_duopoly_team" if team else "logit_duopoly"
    config, summary, runner = train(name, tmp_path / name, ["train.num_seeds=8"])
    duopoly_check(config, summary, runner, team=team, tol_gap=0.03)


# ------------------------------------------------------------------- 4. second-price auction

def second_price_case(run_dir: Path, extra: list[str], tol: float, seed_tol: float) -> None:
    config, summary, runner = train("second_price", run_dir, extra)
    bidder = next(s for s in config["market"]["sellers"] if s["name"] == "bidder")
    value = float(bidder["value"])
    assert config["market"]["distributor"]["kind"] == "second_price"
    mean, _ = policy(runner, "bidder", config)
    assert abs(mean.mean() - value) <= tol, (mean.ravel(), value)
    assert np.all(np.abs(mean - value) <= seed_tol), (mean.ravel(), value)
    # the bids actually played (time- and seed-averaged) agree too
    assert abs(summary["final"]["bidder"]["mean_price"][0] - value) <= tol


def test_second_price_bidder_learns_to_bid_its_value(tmp_path):
    """Second-price auction, bidder value v (from the config) against a rival bidding
    U[0, 1]: truthful bidding is dominant; here the expected surplus v b - b^2/2 has its
    unique maximum at b = v (and, being quadratic, so does a Gaussian policy's expected
    surplus for any stddev, so the stddev floor of 0.1 biases nothing).

    Tolerance: seed-averaged policy mean within 0.02 of v (~3 % of v), every seed within
    0.05. The rival makes the reward noisy (std ~0.25 per sample against a surplus loss of
    only (b - v)^2 / 2 for a wrong bid: 0.0002 at 0.02), so each seed's mean wanders by
    about +-0.015 even with 1024 samples per update. The bids actually played, averaged
    over the last 10 % of the iterations and the seeds (summary ``mean_price``), must be
    within 0.02 of v as well."""
    second_price_case(tmp_path / "second_price", one_chunk(5_000), tol=0.02, seed_tol=0.05)


@pytest.mark.slow
def test_second_price_full(tmp_path):
    """8 seeds, the shipped 12k iterations: seed mean within 0.015, each seed within 0.04.
    Not tighter: a lower learning rate or bigger batches hardly narrow the per-seed wander
    (std ~0.015 with lr 0.0005 and 24k iterations too), so 0.015 on the mean of 8 seeds is
    already ~2.5 standard errors."""
    second_price_case(tmp_path / "second_price", ["train.num_seeds=8"], tol=0.015,
                      seed_tol=0.04)


def test_ground_truths_script_reports_each_seed_of_the_folded_run():
    """``benchmarks/ground_truths.py`` (the full runs' script) on one scenario with two
    seeds: it must split the seeds back out of the folded policy axis (it broke once when
    seeds were folded in), and its number is the monopoly price of the config's economy."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ground_truths.py"
    out = subprocess.run([sys.executable, str(script), "--only", "logit_monopoly", "--seeds",
                          "2", "--json"], capture_output=True, text=True, check=True)
    (row,) = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["seeds"] == 2 and len(row["per_seed"]) == 2
    assert row["learned"] == pytest.approx(np.mean(row["per_seed"]), abs=1e-4)
    target = economics.monopoly_price(**logit_economy(load_config(CONFIGS / "logit_monopoly.yaml")))
    assert row["theory"] == pytest.approx(target, rel=1e-6)
    assert abs(row["learned"] - target) < 0.01 * target
