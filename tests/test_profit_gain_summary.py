"""summary.json's ``profit_gain`` (docs/equilibrium.md): a real run of the logit duopoly,
its window's mean reward against the static Nash and joint-monopoly profits worked out
here from the multinomial logit in float64 (scipy), independently of the solver."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar

from jaxmarket.learners.equilibrium import deterministic
from jaxmarket.train.plan import resolve
from jaxmarket.train.run import start_run

Q, C, MU, LOW, HIGH = 2.0, 1.0, 0.25, 1.0, 2.5     # configs/logit_duopoly.yaml
SHORT = ["train.num_iterations=20", "train.chunk_size=10", "train.num_envs=2",
         "train.num_seeds=3"]


def share(p_own: float, p_other: float) -> float:
    e = lambda p: np.exp((Q - p) / MU)  # noqa: E731
    return e(p_own) / (e(p_own) + e(p_other) + 1.0)   # outside option quality 0


def best_response(p_other: float) -> float:
    return minimize_scalar(lambda p: -(p - C) * share(p, p_other), bounds=(LOW, HIGH),
                           method="bounded", options={"xatol": 1e-10}).x


def profits() -> tuple[float, float]:
    """Per seller: the symmetric Nash (p = BR(p)) and the joint optimum."""
    p_n = brentq(lambda p: best_response(p) - p, LOW, HIGH, xtol=1e-10)
    p_m = minimize_scalar(lambda p: -2 * (p - C) * share(p, p), bounds=(LOW, HIGH),
                          method="bounded", options={"xatol": 1e-10}).x
    return (p_n - C) * share(p_n, p_n), (p_m - C) * share(p_m, p_m)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pg")
    start_run("configs/logit_duopoly.yaml", SHORT, str(d / "on"))
    start_run("configs/logit_duopoly.yaml", SHORT + ["train.profit_gain=false"], str(d / "off"))
    return {k: json.loads((d / k / "summary.json").read_text()) for k in ("on", "off")}


def test_profit_gain_is_the_window_reward_against_nash_and_monopoly(runs):
    pi_n, pi_m = profits()
    s = runs["on"]
    reward = s["final"]["sellers"]["mean_reward"]
    # the solver's profits are float32 on a searched grid: 1e-4 of the profit range
    assert s["profit_gain"]["sellers"] == pytest.approx((reward - pi_n) / (pi_m - pi_n),
                                                        abs=1e-3)
    seeds = s["per_seed"]["sellers"]
    want = [(r - pi_n) / (pi_m - pi_n) for r in seeds["mean_reward"]]
    assert seeds["profit_gain"] == pytest.approx(want, abs=1e-3)
    assert len(set(np.round(want, 6))) == 3    # three different seeds, three gains


def test_profit_gain_can_be_turned_off(runs):
    assert "profit_gain" not in runs["off"]
    assert runs["off"]["final"] == runs["on"]["final"]   # nothing else changes


def test_auto_computes_it_where_a_period_is_deterministic():
    """multi_product's demand is noisy (its static game averages 256 keys per profile):
    auto leaves it out and says how to ask for it; the logit duopoly's is not."""
    assert deterministic(resolve("configs/logit_duopoly.yaml"))
    assert not deterministic(resolve("configs/multi_product.yaml"))
