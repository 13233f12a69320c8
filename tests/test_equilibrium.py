"""Static equilibria on the market's own reward (jaxmarket.equilibrium) against the closed
forms of docs/ground_truths.md (jaxmarket.market.economics, float64), the Calvano et al. (2020)
baseline, auctions on a grid (numpy brute force of the auction rules), budget-bound
optima derived here, and the check CLI's JSON line."""

from __future__ import annotations

import itertools
import json

import jax
import numpy as np
import pytest
from scipy.optimize import fsolve, minimize

import jaxmarket
from jaxmarket.market import economics
from jaxmarket.cli.check import main as check_main
from jaxmarket.learners.equilibrium import profit_gain, summary_profit_gain
from jaxmarket.train.plan import resolve

PRICE_TOL = 2e-4   # float32 rewards locate a smooth optimum to ~1e-4 (a flat top)


@pytest.fixture(scope="module")
def duopoly():
    plan = resolve("configs/logit_duopoly.yaml", validate_only=True)
    return plan, jaxmarket.equilibrium(plan)


def test_logit_duopoly_nash_and_joint_are_the_closed_forms(duopoly):
    _, eq = duopoly
    s = eq["sellers"]
    assert s["converged"] and s["action_set"] == "box" and s["samples"] == 1
    np.testing.assert_allclose(s["nash"], economics.nash_price(2), atol=PRICE_TOL)
    np.testing.assert_allclose(s["joint"], economics.joint_monopoly_price(2), atol=PRICE_TOL)
    for what, price in (("nash", economics.nash_price(2)),
                        ("joint", economics.joint_monopoly_price(2))):
        # the profits at the prices found (float32 market, float64 formula) ...
        np.testing.assert_allclose(s[what + "_reward"], economics.logit_profits(
            np.ravel(s[what])), rtol=1e-5)
        # ... and, to the prices' precision, at the closed form
        np.testing.assert_allclose(s[what + "_reward"], economics.logit_profits(
            np.full(2, price)), rtol=5e-4)


def test_the_rewards_are_the_market_steps(duopoly):
    """nash_reward is what env.step pays for the Nash prices from the reset state."""
    _, eq = duopoly
    env, params = jaxmarket.make("configs/logit_duopoly.yaml")
    _, state = env.reset(jax.random.key(0), params)
    for what in ("nash", "joint"):
        actions = {"sellers": np.asarray(eq["sellers"][what], np.float32)}
        _, _, rewards, *_ = env.step(jax.random.key(0), state, actions, params)
        np.testing.assert_allclose(rewards["sellers"], eq["sellers"][what + "_reward"], rtol=1e-6)


def test_monopoly_price_and_the_budget_that_holds_it_down():
    """Lambert-W monopoly price; with the consumer's budget below it the seller priced
    above the budget sells nothing, so the optimum is the budget (derived on a grid)."""
    free = jaxmarket.equilibrium("configs/logit_monopoly.yaml")["seller"]
    assert free["converged"]
    assert abs(free["joint"][0][0] - economics.monopoly_price()) < PRICE_TOL
    assert abs(free["nash"][0][0] - economics.monopoly_price()) < PRICE_TOL
    budget = 1.6
    held = jaxmarket.equilibrium("configs/logit_monopoly.yaml",
                                 [f"market.consumers[0].budget={budget}"])["seller"]
    p = np.linspace(1.0, 2.5, 150_001)
    profit = np.where(p <= budget, economics.logit_profits(p[:, None])[:, 0], 0.0)
    assert abs(p[np.argmax(profit)] - budget) < 1e-4   # the budget binds
    assert held["converged"]
    # at most the budget as the market holds it (float32)
    assert abs(held["joint"][0][0] - budget) < 1e-5 and held["joint"][0][0] <= np.float32(budget)
    np.testing.assert_allclose(held["joint_reward"], profit.max(), rtol=1e-5)


def test_legacy_budget_cliff_is_the_budget():
    """One seller, revenue, no outside good, a consumer with budget 0.5 who buys only at
    or below it: revenue p 1{p <= 0.5}, maximised at the budget."""
    eq = jaxmarket.equilibrium("configs/budget_monopoly.yaml")["seller"]
    assert eq["converged"]
    assert 0.5 - 1e-6 <= eq["joint"][0][0] <= 0.5 and 0.5 - 1e-6 <= eq["nash"][0][0] <= 0.5
    np.testing.assert_allclose(eq["joint_reward"], [0.5], rtol=1e-5)


def test_team_reward_makes_the_nash_the_joint_monopoly():
    eq = jaxmarket.equilibrium("configs/logit_duopoly_team.yaml")["sellers"]
    assert eq["converged"]
    np.testing.assert_allclose(eq["nash"], economics.joint_monopoly_price(2), atol=PRICE_TOL)
    np.testing.assert_allclose(eq["joint"], economics.joint_monopoly_price(2), atol=PRICE_TOL)
    assert profit_gain({"mean_reward": 0.3}, eq) is None   # pi_M == pi_N: undefined


def test_calvano_grid_equilibria_and_continuous_benchmarks():
    """Every pure equilibrium and the joint optimum on Calvano's 15-price grid (numpy
    over every profile), and the published continuous p_N = 1.4729, p_M = 1.9249."""
    eq = jaxmarket.equilibrium("configs/calvano.yaml")["sellers"]
    grid = economics.calvano_grid(2, 15)
    profiles = np.array(list(itertools.product(grid, grid)))          # [225, 2]
    profit = economics.logit_profits(profiles).reshape(15, 15, 2)
    stable = (profit[..., 0] >= profit[..., 0].max(0, keepdims=True) - 1e-9) \
        & (profit[..., 1] >= profit[..., 1].max(1, keepdims=True) - 1e-9)
    expected = sorted(tuple(grid[list(ij)]) for ij in np.argwhere(stable))
    found = sorted(tuple(np.ravel(e)) for e in eq["pure_equilibria"])
    assert len(found) == len(expected) == eq["num_pure_equilibria"] >= 1
    np.testing.assert_allclose(found, expected, atol=1e-5)
    assert tuple(np.ravel(eq["nash"])) in found and eq["converged"]
    best = np.unravel_index(np.argmax(profit.sum(-1)), (15, 15))
    np.testing.assert_allclose(np.ravel(eq["joint"]), grid[list(best)], atol=1e-5)
    c = eq["continuous"]
    assert c["converged"]
    np.testing.assert_allclose(c["nash"], 1.4729, atol=PRICE_TOL)    # published
    np.testing.assert_allclose(c["joint"], 1.9249, atol=PRICE_TOL)
    np.testing.assert_allclose(c["nash"], economics.nash_price(2), atol=PRICE_TOL)
    np.testing.assert_allclose(c["joint"], economics.joint_monopoly_price(2), atol=PRICE_TOL)


def _auction_payoffs(bids: np.ndarray, value: float, first: bool) -> np.ndarray:
    """``[..., 2]`` surplus of two bidders with a common value: the higher bid wins and
    pays its bid (first price) or the other's (second price); a tie splits the good and
    each pays the tied bid."""
    b0, b1 = bids[..., 0], bids[..., 1]
    win0 = np.where(b0 > b1, 1.0, np.where(b0 == b1, 0.5, 0.0))
    pay0, pay1 = (b0, b1) if first else (b1, b0)
    return np.stack([win0 * (value - pay0), (1 - win0) * (value - pay1)], -1)


@pytest.mark.parametrize("name, first", [("banchio2022_first", True),
                                         ("banchio2022_second", False)])
def test_auction_equilibria_on_the_grid(name, first):
    eq = jaxmarket.equilibrium(f"configs/{name}.yaml")["bidders"]
    grid = np.arange(1, 20) / 20.0
    bids = np.array(list(itertools.product(grid, grid))).reshape(19, 19, 2)
    u = _auction_payoffs(bids, 1.0, first)
    stable = (u[..., 0] >= u[..., 0].max(0, keepdims=True) - 1e-6) \
        & (u[..., 1] >= u[..., 1].max(1, keepdims=True) - 1e-6)
    expected = sorted(tuple(grid[list(ij)]) for ij in np.argwhere(stable))
    found = sorted(tuple(np.ravel(e)) for e in eq["pure_equilibria"])
    np.testing.assert_allclose(found, expected, atol=1e-6)
    assert tuple(np.ravel(eq["nash"])) in found and eq["converged"]
    if not first:   # bidding one's value (the grid's highest bid below it) is an equilibrium
        assert (0.95, 0.95) in {tuple(np.round(e, 6)) for e in found}
    np.testing.assert_allclose(sum(eq["joint_reward"]), u.sum(-1).max(), rtol=1e-5)
    np.testing.assert_allclose(eq["joint_reward"][0], eq["joint_reward"][1], rtol=1e-6)


def test_second_price_bid_is_the_value_against_a_random_rival():
    """Against a U[0, 1] rival (a fixed random policy, averaged over the sample keys)
    the expected surplus v b - b^2 / 2 is maximised at b = v = 0.7."""
    eq = jaxmarket.equilibrium("configs/second_price.yaml")
    assert list(eq) == ["bidder"]   # the random rival is part of the environment
    b = eq["bidder"]
    assert b["samples"] > 1 and b["converged"]
    assert abs(b["nash"][0][0] - 0.7) < 0.02
    assert abs(b["nash_reward"][0] - (0.7 * 0.7 - 0.7 ** 2 / 2)) < 0.03


def test_asymmetric_sellers_and_several_products():
    """Two products, the second with asymmetric costs and qualities: per product the
    logit Nash of the first-order conditions p_i - c_i = mu / (1 - s_i) (scipy), and the
    joint optimum of the summed profit (scipy), in float64."""
    cost, quality = np.array([[1.0, 1.0], [1.0, 1.3]]), np.array([[2.0, 2.0], [2.0, 2.4]])
    eq = jaxmarket.equilibrium("configs/logit_duopoly.yaml", [
        "market.num_products=2", f"market.sellers[0].cost={cost.tolist()}",
        f"market.sellers[0].quality={quality.tolist()}"])["sellers"]
    assert eq["converged"]
    nash, joint = np.asarray(eq["nash"]), np.asarray(eq["joint"])
    total = 0.0
    for p in range(2):
        a, c = quality[:, p], cost[:, p]
        def foc(x, a=a, c=c):
            return x - c - 0.25 / (1 - economics.logit_shares(x, a))

        np.testing.assert_allclose(nash[:, p], fsolve(foc, np.full(2, 1.5), xtol=1e-13),
                                   atol=PRICE_TOL)
        best = minimize(lambda x, a=a, c=c: -economics.logit_profits(x, a, c).sum(),
                        np.full(2, 1.9),
                        method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-14})
        np.testing.assert_allclose(joint[:, p], best.x, atol=PRICE_TOL)
        total += -best.fun
    np.testing.assert_allclose(sum(eq["joint_reward"]), total, rtol=2e-6)
    assert sum(eq["joint_reward"]) > sum(eq["nash_reward"])


def test_profit_gain(duopoly):
    plan, eq = duopoly
    s = eq["sellers"]
    pi_n, pi_m = np.mean(s["nash_reward"]), np.mean(s["joint_reward"])
    assert abs(profit_gain({"mean_reward": pi_n}, s)) < 1e-12
    assert abs(profit_gain({"mean_reward": pi_m}, s) - 1.0) < 1e-12
    np.testing.assert_allclose(profit_gain({"mean_reward": [pi_n, 0.5 * (pi_n + pi_m)]}, s),
                               [0.0, 0.5], atol=1e-12)
    summary = {"final": {"sellers": {"mean_reward": 0.25 * pi_n + 0.75 * pi_m}}}
    gains = summary_profit_gain(plan, summary, equilibria=eq)
    assert gains.keys() == {"sellers"} and abs(gains["sellers"] - 0.75) < 1e-12
    assert profit_gain({"mean_reward": float("nan")}, s) is None


def test_check_cli_prints_the_equilibria_as_its_last_json_line(duopoly, capsys):
    _, eq = duopoly
    assert check_main(["configs/logit_duopoly.yaml", "--equilibrium", "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(line) == ["sellers"]
    for key in ("nash", "joint", "converged", "nash_reward", "joint_reward"):
        assert line["sellers"][key] == eq["sellers"][key]
    assert check_main(["configs/logit_duopoly.yaml", "--equilibrium"]) == 0
    text = capsys.readouterr().out
    assert "equilibrium of sellers" in text and "nash: actions" in text


def test_check_with_equilibrium_keeps_the_engine_and_its_memory_line(capsys):
    # Bug caught (issue 43): --equilibrium dropped the engine: line and printed the loop's
    # memory estimate for a session-engine design.
    assert check_main(["configs/calvano.yaml"]) == 0
    plain = capsys.readouterr().out.strip().splitlines()
    assert plain[-2] == "engine: sessions"
    assert check_main(["configs/calvano.yaml", "--equilibrium"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:len(plain)] == plain   # the same scenario, engine and memory lines
    assert lines[len(plain)].startswith("equilibrium of sellers")


def _bertrand_grid_equilibria(grid: np.ndarray, cost: float) -> list[float]:
    """Symmetric pure equilibria of the unit-demand Bertrand duopoly on ``grid`` (ties
    split the buyer; the cheaper seller sells one unit): numpy over every profile."""
    p0, p1 = np.meshgrid(grid, grid, indexing="ij")
    win0 = np.where(p0 < p1, 1.0, np.where(p0 == p1, 0.5, 0.0))
    profit = np.stack([win0 * (p0 - cost), (1 - win0) * (p1 - cost)], -1)
    stable = (profit[..., 0] >= profit[..., 0].max(0, keepdims=True) - 1e-9) \
        & (profit[..., 1] >= profit[..., 1].max(1, keepdims=True) - 1e-9)
    return [float(grid[i]) for i, j in np.argwhere(stable) if i == j]


def test_a_benchmark_that_is_no_equilibrium_is_refused_and_the_grid_games_used():
    # Bug caught (issue 43): Asker et al.'s continuous "Nash" p = 5.005 with rewards
    # [0, 3.005] (Bertrand undercutting: the iteration stops on no equilibrium) was
    # reported converged and every session was scored against it (Delta = -0.576).
    from jaxmarket.learners.equilibrium import benchmarks
    eq = jaxmarket.equilibrium("configs/asker2022_sync.yaml")["sellers"]
    c = eq["continuous"]
    assert not c["converged"] and not c["nash_verified"] and c["joint_verified"]
    dev = c["nash_deviation"]
    seller = dev["agent"]
    rival = 1 - seller
    assert np.ravel(c["nash"])[rival] > 2.0   # the rival earns above cost ...
    assert dev["to"] < np.ravel(c["nash"])[rival]   # ... so undercutting it pays
    assert dev["gain"] == pytest.approx(dev["to"] - 2.0 - c["nash_reward"][seller], rel=1e-3)
    grid = np.linspace(0.01, 10.0, 100)
    b = benchmarks(eq)
    equilibria = _bertrand_grid_equilibria(grid, 2.0)   # a pure equilibrium of the grid
    assert min(abs(p - b["nash_price"]) for p in equilibria) < 1e-5
    assert b["nash_profit"] == pytest.approx((b["nash_price"] - 2.0) / 2, rel=1e-5)
    assert b["joint_profit"] == pytest.approx((10.0 - 2.0) / 2, rel=1e-6)
    assert "the grid game's own actions" in b["method"] and "agent" in b["method"]
    # a smooth game's continuous benchmark verifies and is kept
    calvano = jaxmarket.equilibrium("configs/calvano.yaml")["sellers"]
    assert calvano["continuous"]["nash_verified"] and calvano["continuous"]["joint_verified"]
    assert "continuous actions" in benchmarks(calvano)["method"]
    # the interval's solution is the free game's too (no price of it binds): kept as it is
    assert "bounded" not in calvano and "prices" not in calvano["continuous"]


def test_no_verified_benchmark_leaves_delta_undefined_and_says_why():
    # Bug caught: a profit gain measured against a point where an agent gains by moving.
    from jaxmarket.learners.equilibrium import benchmarks
    eq = {"nash": [[5.0], [5.0]], "joint": [[10.0], [10.0]], "nash_reward": [0.0, 3.0],
          "joint_reward": [4.0, 4.0], "nash_verified": False, "joint_verified": True,
          "nash_deviation": {"agent": 0, "cell": 0, "from": 5.0, "to": 4.99, "gain": 2.99}}
    b = benchmarks(eq)
    assert b["nash_profit"] is None and "no pure equilibrium found" in b["undefined"]
    assert "agent 0 gains 2.99" in b["undefined"]
    assert profit_gain({"mean_reward": 2.0}, eq) is None
    ok = {**eq, "nash_verified": True}
    del ok["nash_deviation"]
    assert profit_gain({"mean_reward": 2.0}, ok) == pytest.approx((2.0 - 1.5) / (4.0 - 1.5))


def test_each_firm_its_own_group_gets_the_games_benchmarks():
    # Bug caught (issue 43): with each firm its own seller group, each group's "joint
    # optimum" held the other group fixed, so pi_M - pi_N was 3e-5 and Delta 4178.9.
    from jaxmarket.config.loader import load_config
    config = load_config("configs/logit_duopoly.yaml")
    seller = config["market"]["sellers"][0]
    config["market"]["sellers"] = [{**seller, "name": "a", "count": 1},
                                   {**seller, "name": "b", "count": 1}]
    config["learners"] = {"a": config["learners"]["sellers"], "b": config["learners"]["sellers"]}
    eq = jaxmarket.equilibrium(resolve(config, validate_only=True))
    for g in ("a", "b"):
        assert eq[g]["converged"] and eq[g]["nash_verified"] and eq[g]["joint_verified"]
        np.testing.assert_allclose(eq[g]["nash"], economics.nash_price(2), atol=PRICE_TOL)
        np.testing.assert_allclose(eq[g]["joint"], economics.joint_monopoly_price(2),
                                   atol=PRICE_TOL)
    pi_n = float(economics.logit_profits(np.full(2, economics.nash_price(2)))[0])
    pi_m = float(economics.logit_profits(np.full(2, economics.joint_monopoly_price(2)))[0])
    halfway = 0.5 * (pi_n + pi_m)
    summary = {"final": {g: {"mean_reward": halfway} for g in ("a", "b")}}
    gains = summary_profit_gain(None, summary, equilibria=eq)
    assert gains == pytest.approx({"a": 0.5, "b": 0.5}, abs=1e-3)


def test_a_free_game_without_an_interior_optimum_keeps_the_grids_interval():
    # Bug caught: with prices free, the linear duopoly's cartel prices one firm out (its
    # price raises the rival's demand without bound), so the free "joint optimum" is the
    # searched box's edge; Hansen et al.'s benchmarks are the symmetric closed forms.
    from jaxmarket.learners.equilibrium import benchmarks
    a, b, g = 0.48, 0.9, 0.6   # configs/hansen2021.yaml
    bench = benchmarks(jaxmarket.equilibrium("configs/hansen2021.yaml")["firms"])
    # FOCs at a common price: a - 2 b p + g p = 0 (Nash); d/dp p (a - (b - g) p) = 0
    assert bench["nash_price"] == pytest.approx(a / (2 * b - g), abs=PRICE_TOL)
    assert bench["joint_price"] == pytest.approx(a / (2 * (b - g)), abs=PRICE_TOL)
    assert "no interior optimum" in bench["free_unbounded"] and "bounded" not in bench


def test_check_marks_a_continuous_nash_that_is_no_equilibrium(capsys):
    # Bug caught: under price-directed prominence (configs/johnson2023.yaml) the
    # continuous search stops on [1.7, 1.7] with rewards [0, 0.538], no equilibrium
    # (undercutting takes the whole market), and check --equilibrium printed it as "nash"
    # with nothing to say so.
    assert check_main(["configs/johnson2023.yaml", "--equilibrium", "--json"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sellers"]
    c = found["continuous"]
    assert not c["nash_verified"] and c["joint_verified"]
    dev = c["nash_deviation"]
    assert check_main(["configs/johnson2023.yaml", "--equilibrium"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "continuous" in x][0]
    nash, joint = line.split(", joint ")
    assert "NOT verified" in nash and f"agent {dev['agent']} gains {dev['gain']:.6g}" in nash
    assert "NOT verified" not in joint
    # a verified solution carries no mark (the logit duopoly's)
    assert check_main(["configs/logit_duopoly.yaml", "--equilibrium"]) == 0
    assert "NOT verified" not in capsys.readouterr().out
