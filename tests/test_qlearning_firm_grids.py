"""Each firm its own price grid (q_learning ``grid: {kind: calvano}``, per-firm lists):
Calvano et al.'s rule against the logit first-order conditions solved here, the session
engine's outcome tables against the logit profits written out here, the kernel against
the xla backend bit for bit, the loop engine's act, and the config errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import brentq

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.controller import group_learner_spec
from jaxmarket.learners.qlearning import make, obs_grid_of
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.engine import Settings
from jaxmarket.sessions.game import kernel_reason, make_game
from jaxmarket.sessions.run import session_plan
from jaxmarket.train.slots import tile_spec

QUALITY, OUTSIDE, MU = 2.0, 0.0, 0.25          # configs/calvano.yaml's logit economy
COST = np.array([1.0, 0.25])                    # calvano2020_cost025
BOUNDS = ["market.sellers.0.low=1.0", "market.sellers.0.high=2.5",
          "'market.sellers.0.cost=[[1.0], [0.25]]'"]


def overrides(*items: str) -> list[str]:
    return [o.strip("'") for o in BOUNDS] + list(items)


@functools.cache
def game(*items: str):
    return make_game(session_plan(load_config("configs/calvano.yaml", overrides(*items))))


def profits(prices) -> np.ndarray:
    """Logit profits (p_i - c_i) e^((a - p_i)/mu) / (sum_j e^((a - p_j)/mu) + e^(a0/mu))."""
    p = np.asarray(prices, np.float64)
    w = np.exp((QUALITY - p) / MU)
    return (p - COST) * w / (w.sum(axis=-1, keepdims=True) + np.exp(OUTSIDE / MU))


def shares(p: np.ndarray) -> np.ndarray:
    w = np.exp((QUALITY - p) / MU)
    return w / (w.sum() + np.exp(OUTSIDE / MU))


def static_prices() -> tuple[np.ndarray, np.ndarray]:
    """Nash: p_i - c_i = mu / (1 - s_i) (each firm's first-order condition), by
    bisection on firm i's own condition inside a fixed point; joint optimum: equal
    margins m = mu / (1 - s_1 - s_2) (the multiproduct logit monopolist's)."""
    with jax.enable_x64(True):
        p = COST + 0.5
        for _ in range(200):   # best responses (a contraction here)
            for i in range(2):
                def foc(x, i=i):
                    q = p.copy()
                    q[i] = x
                    return x - COST[i] - MU / (1 - shares(q)[i])
                p[i] = brentq(foc, COST[i], COST[i] + 5.0, xtol=1e-15)
        margin = brentq(lambda m: m - MU / (1 - shares(COST + m).sum()), 1e-3, 5.0,
                        xtol=1e-15)
    return p, COST + margin


def test_calvano_rule_gives_each_firm_its_interval():
    # Bugs caught: one grid for both firms, the rule's ends swapped or widened by the
    # wrong xi, the float32 search's p_N, p_M (off by up to 5e-4) used unrefined.
    pn, pm = static_prices()
    assert pn == pytest.approx([1.34369, 1.10519], abs=1e-5)    # the paper's Table 4 inputs
    assert pm == pytest.approx([2.38411, 1.63411], abs=1e-5)
    g = game("learners.sellers.grid={kind: calvano, xi: 0.1}")
    prices = np.asarray(g.grid.prices, np.float64)
    assert prices.shape == (2, 15)
    want = np.stack([np.linspace(pn[i] - 0.1 * (pm[i] - pn[i]),
                                 pm[i] + 0.1 * (pm[i] - pn[i]), 15) for i in range(2)])
    np.testing.assert_allclose(prices, want, atol=2e-6)
    xi = game("learners.sellers.grid={kind: calvano, xi: 0.0}")
    np.testing.assert_allclose(np.asarray(xi.grid.prices)[:, [0, -1]], np.stack([pn, pm], 1),
                               atol=2e-6)


def test_outcome_table_holds_each_firms_own_prices_and_states_are_the_profile():
    # Bugs caught: a profile's prices taken from one grid (or the firms' grids swapped),
    # an observed price snapped on the other firm's grid (then the state is not the
    # profile in force and the kernel would be refused).
    g = game("learners.sellers.grid={kind: calvano, xi: 0.1}")
    grid = np.asarray(g.grid.prices, np.float64)
    a = np.indices((15, 15)).reshape(2, -1).T                       # row j = 15 a1 + a2
    prices = np.stack([grid[0, a[:, 0]], grid[1, a[:, 1]]], axis=-1)
    np.testing.assert_allclose(np.asarray(g.reward, np.float64), profits(prices), rtol=2e-6,
                               atol=1e-7)
    np.testing.assert_allclose(np.asarray(g.obs, np.float64)[:, 0, :], prices, rtol=1e-7)
    states = np.asarray(obs_grid_of(g.settings).state_index(g.obs))
    np.testing.assert_array_equal(states, np.repeat(np.arange(225)[:, None], 2, axis=1))
    assert kernel_reason(g) is None


def test_explicit_and_bound_lists_make_the_same_grids():
    # Bugs caught: per-firm grid_low/grid_high ignored for one firm, a scalar not standing
    # for every firm, explicit per-firm lists snapped by the evenly spaced rule.
    by_bounds = game("learners.sellers.grid_size=3", "learners.sellers.grid_low=[1.2, 1.0]",
                     "learners.sellers.grid_high=2.0")
    np.testing.assert_allclose(np.asarray(by_bounds.grid.prices),
                               [[1.2, 1.6, 2.0], [1.0, 1.5, 2.0]], rtol=1e-7)
    explicit = game("learners.sellers.grid=[[1.2, 1.3, 2.0], [1.0, 1.5, 1.6]]")
    prices = np.asarray(explicit.grid.prices, np.float64)
    np.testing.assert_allclose(prices, [[1.2, 1.3, 2.0], [1.0, 1.5, 1.6]], rtol=1e-7)
    # price 1.56 is nearest 1.6 on firm 1's grid and 1.3 on firm 0's
    np.testing.assert_array_equal(
        np.asarray(explicit.grid.profile_index(jnp.asarray([1.56, 1.56], jnp.float32))), [1, 2])
    states = np.asarray(obs_grid_of(explicit.settings).state_index(explicit.obs))
    np.testing.assert_array_equal(states[:, 0], np.arange(9))


@pytest.mark.slow
def test_kernel_backend_plays_the_xla_per_firm_sessions_bit_for_bit():
    # Bug caught: a backend that maps indices to prices (or states to rows) differently
    # with per-firm grids.
    g = game("learners.sellers.grid={kind: calvano, xi: 0.1}", "learners.sellers.grid_size=7",
             "learners.sellers.exploration_decay=0.02", "learners.sellers.convergence_window=30",
             "learners.sellers.discount=0.5", "learners.sellers.learning_rate=0.3")
    settings = {"sessions": 8, "periods": 600, "chunk": 140, "window": 150, "stop": "periods"}
    key = jax.random.key(3)
    xla = eng.run(g, Settings(**settings, backend="xla"), key, compact=False)
    kernel = eng.run(g, Settings(**settings, backend="kernel"), key, compact=False)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")
    for a, b in ((xla.sessions.learner.rows, kernel.sessions.learner.rows),
                 (xla.sessions.index, kernel.sessions.index),
                 (xla.sessions.tail, kernel.sessions.tail),
                 (xla.sessions.learner.converged, kernel.sessions.learner.converged)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(xla.converged).any()
    grid = np.asarray(g.grid.prices)
    np.testing.assert_array_equal(kernel.greedy_price,
                                  grid[np.arange(2), kernel.greedy_index])


def test_loop_act_prices_each_slot_on_its_firms_grid():
    # Bug caught: the training loop's act pricing every slot on firm 0's grid, or an
    # update that snaps a played price on the wrong firm's grid.
    cfg = load_config("configs/calvano.yaml", overrides("learners.sellers.grid_size=5",
                                                        "learners.sellers.grid_low=[1.2, 1.0]",
                                                        "learners.sellers.grid_high=[2.0, 1.8]"))
    plan = session_plan(cfg)
    base = group_learner_spec(plan.env, plan.params, "sellers")
    spec = tile_spec(base, num_envs=3, num_seeds=2)                  # 12 slots
    learner = make({k: v for k, v in cfg["learners"]["sellers"].items() if k != "kind"}, spec)
    state = learner.init(jax.random.key(0), spec)
    obs = jnp.full((12, 2), 1.4, jnp.float32)
    price, aux = learner.act(state, obs, jax.random.key(1))
    grids = np.array([np.linspace(1.2, 2.0, 5), np.linspace(1.0, 1.8, 5)], np.float32)
    index = np.asarray(aux["action_index"])
    np.testing.assert_array_equal(np.asarray(price)[:, 0], grids[np.arange(12) % 2, index])


@pytest.mark.parametrize("item, field, says", [
    ("learners.sellers.grid_low=[1.2]", "learners.sellers.grid_low", "a list of 2 numbers"),
    ("learners.sellers.grid=[[1.2, 1.5], 1.5]", "learners.sellers.grid", "one price list per"),
    ("learners.sellers.grid=[[1.2, 1.5], [1.2, 1.4, 1.6]]", "learners.sellers.grid",
     "of one length"),
    ("learners.sellers.grid=[[1.2, 1.5], [1.2, 1.4], [1.1, 1.3]]", "learners.sellers.grid",
     "2 lists"),
    ("learners.sellers.grid=[[0.5, 1.5], [1.2, 1.4]]", "learners.sellers.grid",
     "action bounds"),
    ("learners.sellers.grid={kind: calvano, xi: -1}", "learners.sellers.grid.xi", ">= 0"),
    ("learners.sellers.grid={kind: nearest}", "learners.sellers.grid.kind", "calvano"),
])
def test_bad_per_firm_grids_are_config_errors_naming_the_field(item, field, says):
    with pytest.raises(ConfigError) as err:
        make_game(session_plan(load_config("configs/calvano.yaml", overrides(item))))
    assert err.value.field == field and says in err.value.allowed, err.value


def test_per_firm_grids_the_state_cannot_number_are_refused():
    # own_price alone is not the history of both firms' prices: no firm per digit
    items = overrides("learners.sellers.grid_low=[1.2, 1.0]",
                      "market.sellers.0.observation=[{kind: own_price}]")
    with pytest.raises(ConfigError) as err:
        make_game(session_plan(load_config("configs/calvano.yaml", items)))
    assert err.value.field == "learners.sellers.grid_low" and "memory 0" in err.value.allowed
    items = overrides("learners.sellers.grid={kind: calvano}",
                      "learners.sellers.obs_grid={low: 1.0, high: 2.5, size: 15}")
    with pytest.raises(ConfigError) as err:
        make_game(session_plan(load_config("configs/calvano.yaml", items)))
    assert err.value.field == "learners.sellers.obs_grid"
    items = overrides("learners.sellers.grid={kind: calvano}", "learners.sellers.grid_low=1.1")
    with pytest.raises(ConfigError) as err:
        make_game(session_plan(load_config("configs/calvano.yaml", items)))
    assert err.value.field == "learners.sellers.grid_low"
