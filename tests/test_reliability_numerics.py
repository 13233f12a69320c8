"""Extreme but valid inputs never give NaN or inf (docs/reliability.md, "Numerics").

Every distributor kind of the registry (:data:`DISTRIBUTORS`; each option value at least
once), every numeric seller, consumer, demand-process and distributor parameter drawn
from ``{0, 1e-30, 1, 1e30}`` (with ``-1`` and ``-1e30`` for unbounded fields, and the
field's own bounds), every demand process and every observation and reward component
of the registries, stepped through the jitted ``env.step`` with actions at (and beyond)
the action bounds: every reward, observation, info and state leaf stays finite. The
reference is the bound itself: money saturates at ``MONEY_MAX`` (1e36) and quoted prices
at ``PRICE_MAX / S`` (PRICE_MAX = 1e38), far below float32's 3.4e38.

Markets share one shape per (kind, options), so each compiles once; the values are
params (arrays), not structure.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from jaxmarket.combinators.observations import OBSERVATIONS
from jaxmarket.combinators.rewards import REWARDS, build_reward, profit, regret_ratio, surplus
from jaxmarket.combinators.saturate import MONEY_MAX
from jaxmarket.combinators.view import GroupView
from jaxmarket.config.errors import ConfigError
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.scenario import make
from jaxmarket.market.spec import CONSUMER_FIELDS, SELLER_FIELDS

P = 2
STEPS = 3
EXTREMES = (0.0, 1e-30, 1.0, 1e30)
NEGATIVE = (-1.0, -1e30)            # also drawn for fields without a lower bound
INTS = (0, 1, 2, 10**9)


def in_bounds(field, x: float) -> bool:
    """The config loader's rule (jaxmarket.config.fields): finite, above ``low`` (strictly
    when ``low_open``), at most ``high``."""
    if not math.isfinite(x):
        return False
    if field.low is not None and (x <= field.low if field.low_open else x < field.low):
        return False
    return field.high is None or x <= field.high


def candidates(field) -> list:
    """The extreme values of a numeric field that its bounds allow, and the bounds."""
    if field.kind in ("int", "ints"):
        pool = INTS + ((-1, -10**9) if field.low is None else ())
    else:
        pool = EXTREMES + (NEGATIVE if field.low is None else ())
    pool += tuple(b for b in (field.low, field.high) if b is not None)
    out = sorted({float(v) for v in pool if in_bounds(field, float(v))})
    out = [int(v) for v in out] if field.kind in ("int", "ints") else out
    assert out, field
    return out


def draw_setting(draw, field):
    """One value of a numeric registry field: a number, or a list of the default's
    length (the length is a shape: it stays fixed so each market compiles once)."""
    if field.kind in ("float", "int"):
        return draw(st.sampled_from(candidates(field)))
    n = len(field.default or ())
    return [draw(st.sampled_from(candidates(field))) for _ in range(n)]


def draw_entity(draw, field, count: int):
    """A [count, P] nested list for an entity field (``optional``: or None)."""
    if field.optional and draw(st.booleans()):
        return None
    pool = candidates(field)
    return [[draw(st.sampled_from(pool)) for _ in range(P)] for _ in range(count)]


def ordered(lo, hi):
    """Entry-wise (min, max) of two nested lists: low <= high as the loader requires."""
    return ([[min(a, b) for a, b in zip(r, s)] for r, s in zip(lo, hi)],
            [[max(a, b) for a, b in zip(r, s)] for r, s in zip(lo, hi)])


# ------------------------------------------------------------------ market structure

# option values that a Field cannot enumerate (lists whose entries must agree)
SHOCK = {"shock_values": [0.0, 1e30], "shock_probs": [0.5, 0.5]}
PRIORITY = {"ties": "order", "tie_order": [1, 0]}
EXTRA_OPTIONS = {"cournot": [SHOCK], "logit": [SHOCK], "first_price": [PRIORITY],
                 "second_price": [PRIORITY], "mixed_price": [PRIORITY]}


def option_variants(kind: str) -> list[dict]:
    """The defaults, then every bool/choice/int option at its other values, all options
    changed together (variant ``j`` takes each option's ``j``-th other value: every value
    is met once with the fewest markets to compile), plus :data:`EXTRA_OPTIONS`. (Every
    combination at the distributor level: tests/test_distributor_properties.py.)"""
    d = DISTRIBUTORS[kind]
    others = {}
    for name, f in d.options.items():
        if f.kind == "bool":
            values = [not f.default]
        elif f.kind == "choice":
            values = [c for c in f.choices if c != f.default]
        elif f.kind == "int":
            values = [v for v in candidates(f)[:1] if v != f.default]   # the lowest
        else:
            values = []
        if values:
            others[name] = values
    n = max([len(v) for v in others.values()], default=0)
    out = [{}] + [{k: v[min(j, len(v) - 1)] for k, v in others.items()} for j in range(n)]
    return out + EXTRA_OPTIONS.get(kind, [])


CASES = [(k, o) for k in DISTRIBUTORS for o in option_variants(k)]
IDS = [k + "".join(f"-{n}={'list' if isinstance(v, list) else v}" for n, v in o.items())
       for k, o in CASES]

SELLER_TERMS = [k for k, r in REWARDS.items() if "seller" in r.sides and not r.fields]
CONSUMER_TERMS = [k for k, r in REWARDS.items() if "consumer" in r.sides and not r.fields]
# every observation component with its defaults, and the other settings of each
ALL_OBSERVATIONS = ([{"kind": k} for k in OBSERVATIONS]
                    + [{"kind": "competitor_prices", "summary": ["min", "mean", "max"]},
                       {"kind": "budgets", "summary": "all"},
                       {"kind": "time", "period": 1e-30}, {"kind": "time", "period": 1e30},
                       {"kind": "history", "k": 2}])
# the money and price observations, for the sweep over distributors (fewer to compile)
MONEY_OBSERVATIONS = [{"kind": "own_reward"}, {"kind": "market_price"},
                      {"kind": "competitor_prices", "summary": ["min", "mean", "max"]},
                      {"kind": "history", "k": 1}]
DEMAND_KINDS = list(DEMANDS)


def seller_rewards(variant: int) -> list:
    """Variant 0: every seller term added in turn; variant 1: them in a ``sum`` with
    weights of both signs, averaged over a team and scaled by 1e30."""
    if variant == 0:
        return [{"kind": k} for k in SELLER_TERMS]
    weights = [(1e30, -1e30, 1.0, 1e-30)[i % 4] for i in range(len(SELLER_TERMS))]
    return [{"kind": "sum", "terms": [{"kind": k} for k in SELLER_TERMS], "weights": weights},
            {"kind": "team"}, {"kind": "scale", "factor": 1e30}]


@st.composite
def configs(draw, kind: str, options: dict, demands: list, observation: list,
            observe_all: bool):
    """A market config with every numeric parameter drawn from its extremes: two seller
    groups (the kind's first and last seller action: price and multiplier, or quantity
    twice), one consumer group per demand kind of ``demands`` (the first an agent).
    ``observation`` for the first seller group and the agent consumers, and for the
    second seller group too if ``observe_all`` (else only its own reward)."""
    d = DISTRIBUTORS[kind]
    distributor = {"kind": kind, **options,
                   **{n: draw_setting(draw, f) for n, f in d.params.items()}}
    actions = (d.actions[0], d.actions[-1])
    sellers = []
    for i, action in enumerate(actions):
        g = {"name": f"s{i}", "count": 2, "action": action, "reward": seller_rewards(i),
             "observation": observation if i == 0 or observe_all else [{"kind": "own_reward"}]}
        for name, f in SELLER_FIELDS.items():
            if f.kind == "entity":
                g[name] = draw_entity(draw, f, 2)
        g["low"], g["high"] = ordered(g["low"], g["high"])
        sellers.append(g)
    # one base price per product shared by every consumer (non-dense kinds need it)
    base = draw_entity(draw, CONSUMER_FIELDS["base_price"], 1)[0]
    consumers = []
    for i, dkind in enumerate(demands):
        params = DEMANDS[dkind].params
        g = {"name": f"c{i}", "count": 1, "agent": i == 0,
             "demand": {"kind": dkind, **{n: draw_setting(draw, f) for n, f in params.items()}}}
        for name, f in CONSUMER_FIELDS.items():
            if f.kind == "entity":
                g[name] = draw_entity(draw, f, 1)
        g["base_price"] = [base]
        g["budget_low"], g["budget_high"] = ordered(g["budget_low"], g["budget_high"])
        if g["agent"]:
            g["reward"] = [{"kind": k} for k in CONSUMER_TERMS]
            g["observation"] = observation
        consumers.append(g)
    episode = draw(st.sampled_from([1, 2, None]))
    return {"market": {"num_products": P, "episode_length": episode, "consumers": consumers,
                       "sellers": sellers, "distributor": distributor}}


def finite_leaves(tree, what: str) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        x = np.asarray(leaf)
        if np.issubdtype(x.dtype, np.floating):
            assert np.all(np.isfinite(x)), (what, jax.tree_util.keystr(path), x)


def run_market(data, config) -> None:
    """Reset, then STEPS jitted steps with every action at its low or high bound, or at
    +-1e30 (clipped to the bounds by the env); everything the env returns is finite."""
    try:
        env, params = make(config)
    except ConfigError:      # a cross-field rule of a registry entry (none today)
        reject()
    key = jax.random.PRNGKey(data.draw(st.integers(0, 2**16)))
    # reset_env is what env.reset jits (and env.step runs on auto-reset): run eagerly it
    # compiles nothing per market, so each market compiles one program, its step
    obs, state = env.reset_env(key, params)
    finite_leaves(obs, "reset observation")
    finite_leaves(state, "reset state")
    for t in range(STEPS):
        actions = {}
        for g in env.agent_groups:
            space = env.action_space(g, params)
            low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
            high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
            pick = np.asarray(data.draw(st.lists(st.sampled_from(range(4)),
                                                 min_size=low.size, max_size=low.size)))
            pick = pick.reshape(low.shape)
            actions[g] = np.select([pick == 0, pick == 1, pick == 2],
                                   [low, high, np.float32(1e30)], np.float32(-1e30))
        key, k = jax.random.split(key)
        obs, state, rewards, _, _, info = env.step(k, state, actions, params)
        finite_leaves(rewards, f"rewards at step {t}")
        finite_leaves(obs, f"observations at step {t}")
        finite_leaves(state, f"state at step {t}")
        finite_leaves(info, f"info at step {t}")


SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
@SETTINGS
@given(data=st.data())
def test_every_distributor_stays_finite_at_extreme_parameters(index, data):
    # the money observations and every reward term; the agent consumer's demand process
    # rotates through the registry, a second consumer has constant demand
    kind, options = CASES[index]
    demands = [DEMAND_KINDS[index % len(DEMAND_KINDS)], "constant"]
    run_market(data, data.draw(configs(kind, options, demands, MONEY_OBSERVATIONS, False)))


@SETTINGS
@given(data=st.data())
def test_every_observation_and_demand_process_stays_finite_at_extreme_parameters(data):
    # one market with every observation component (each setting) on every agent group
    # and one consumer group per demand process
    run_market(data, data.draw(configs("cheapest", {}, DEMAND_KINDS, ALL_OBSERVATIONS, True)))


def test_every_distributor_kind_is_covered():
    """A new kind in the registry joins the test without a change here; every option of
    every kind takes each of its enumerable values."""
    # the package's own kinds (a test or a docs example may register its own in the
    # same process: docs/extending.md adds one)
    own = {k for k, d in DISTRIBUTORS.items() if d.allocate.__module__.startswith("jaxmarket.")}
    assert {k for k, _ in CASES} == own
    for kind, d in DISTRIBUTORS.items():
        for name, f in d.options.items():
            seen = {o.get(name, f.default) if not isinstance(o.get(name), list) else "list"
                    for k, o in CASES if k == kind}
            if f.kind == "bool":
                assert seen == {True, False}, (kind, name)
            elif f.kind == "choice":
                assert seen == set(f.choices), (kind, name)
            else:
                assert len(seen) >= 2, (kind, name)


# ------------------------------------------------------------------ the formulas

def _view(**kw) -> GroupView:
    z = jnp.zeros((1, 1), jnp.float32)
    base = dict(action=z, price=z, traffic=z, fees=z, cost=z, value=z, sent=z, budget=z,
                all_prices=z, self_index=jnp.zeros((1,), jnp.int32), budgets=z,
                time=jnp.zeros((), jnp.int32), episode_length=jnp.ones((), jnp.int32),
                price_history=jnp.zeros((0, 1, 1)), last_reward=jnp.zeros((1,)))
    base.update({k: jnp.asarray(v, jnp.float32) for k, v in kw.items()})
    return GroupView(**base)


def test_profit_saturates_costs_like_fees():
    # the case: fees saturated at MONEY_MAX, cost 1e30 x traffic 1e30 = 1e60
    # (inf in float32) saturates at MONEY_MAX too: profit ~ 0, not -inf or NaN
    v = _view(fees=[[MONEY_MAX]], cost=[[1e30]], traffic=[[1e30]])
    assert abs(float(profit(v)[0])) <= 1e-6 * MONEY_MAX
    v = _view(fees=[[0.0]], cost=[[1e30]], traffic=[[1e30]])
    assert float(profit(v)[0]) == pytest.approx(-MONEY_MAX, rel=1e-6)
    # normal values: the formula exactly (every product and sum below is exact in float32)
    v = _view(fees=[[3.0, 2.5]], cost=[[0.5, 0.25]], traffic=[[2.0, 4.0]])
    assert float(profit(v)[0]) == (3.0 - 0.5 * 2.0) + (2.5 - 0.25 * 4.0)


def test_surplus_and_regret_saturate():
    v = _view(value=[[1e30]], traffic=[[1e30]], fees=[[1.0]])
    assert float(surplus(v)[0]) == pytest.approx(MONEY_MAX, rel=1e-6)
    # budget x sent = 1e60 saturates like the spend it bounds: the ratio stays ~1, not 0
    v = _view(budget=[[1e30]], sent=[[1e30]], fees=[[MONEY_MAX]])
    assert float(regret_ratio(v)[0]) == pytest.approx(1.0, rel=1e-6)
    v = _view(budget=[[2.0, 1.0]], sent=[[3.0, 1.0]], fees=[[3.0, 0.5]])
    assert float(regret_ratio(v)[0]) == 3.5 / 7.0


def test_sums_over_many_saturated_products_do_not_overflow():
    # float32 overflows past 340 terms of 1e36: 400 products at +MONEY_MAX saturate...
    fees = np.full((1, 400), MONEY_MAX, np.float32)
    v = _view(fees=fees, cost=np.zeros_like(fees), traffic=np.zeros_like(fees))
    assert float(profit(v)[0]) == pytest.approx(MONEY_MAX, rel=1e-5)
    # ...and 350 at +MONEY_MAX with 350 at -MONEY_MAX (cost 1e37 x 1 query, no fees)
    # sum to ~0
    half = np.arange(700) < 350
    v = _view(fees=np.where(half, MONEY_MAX, 0.0)[None], cost=np.where(half, 0.0, 1e37)[None],
              traffic=np.ones((1, 700)))
    assert abs(float(profit(v)[0])) <= 1e-3 * MONEY_MAX
    # (the plain float32 sum of those terms is not finite: the saturation is needed)
    terms = jnp.asarray(np.where(half, MONEY_MAX, -MONEY_MAX), jnp.float32)
    assert not np.isfinite(float(jnp.sum(terms)))


def test_scale_and_weights_saturate():
    v = _view(fees=[[MONEY_MAX]])
    chain = build_reward([{"kind": "revenue"}, {"kind": "scale", "factor": 1e30}], 1, "r",
                         "seller")
    assert float(chain(v)[0]) == pytest.approx(MONEY_MAX, rel=1e-6)
    chain = build_reward([{"kind": "sum", "terms": [{"kind": "revenue"}, {"kind": "revenue"}],
                           "weights": [1e30, -1e30]}], 1, "r", "seller")
    assert abs(float(chain(v)[0])) <= 1e-6 * MONEY_MAX          # not inf - inf = NaN
    chain = build_reward([{"kind": "revenue"}, {"kind": "scale", "factor": -2.0}], 1, "r",
                         "seller")
    assert float(chain(_view(fees=[[1.5]]))[0]) == -3.0
