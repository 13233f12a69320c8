"""The controller: which learner drives which agent group.

``learners:`` maps every agent group of the market to a learner config
(``{kind: ppo_bandit, learning_rate: 0.01, ...}``); :func:`build_controller` checks the
group names against the market and builds one :class:`Learner` per group.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.observations import history_length, off_action_scale
from jaxmarket.combinators.rewards import is_random
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import check_mapping, lookup_kind
from jaxmarket.config.precheck import check_learner_names
from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec
from jaxmarket.learners.population import split_learner_config
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.equilibrium import ActionSet, free_game, outcomes, solve
from jaxmarket.market.spec import MarketParams, MarketSpec, thaw
from jaxmarket.market.state import current_actions


def group_learner_spec(env: MarketEnv, params: MarketParams, group: str,
                       num_policies: int | None = None,
                       policy_index: tuple[int, ...] | None = None) -> LearnerSpec:
    """The :class:`LearnerSpec` of one agent group (bounds, observation size, payoff)."""
    g = env.spec.group(group)
    low, high = env.action_bounds(group, params)
    obs_dim = env.observation_shape(group, params)[-1]
    return LearnerSpec(num_agents=g.count, obs_dim=int(obs_dim),
                       num_products=env.spec.num_products,
                       action_low=np.asarray(low, np.float32),
                       action_high=np.asarray(high, np.float32),
                       num_policies=num_policies, policy_index=policy_index,
                       payoff=one_shot_payoff(env, params, group),
                       turns=group_turns(env.spec, group),
                       payoff_caveat=payoff_caveat(env.spec, group),
                       obs_scale=off_action_scale(thaw(g.observation) or (), g.action),
                       obs_periods=history_length(thaw(g.observation) or ())
                       or (1 if obs_dim else 0),
                       obs_firms=observed_firms(env.spec, group),
                       static_prices=partial(static_prices, env, params, group))


def observed_firms(spec: MarketSpec, group: str) -> tuple[int, ...] | None:
    """:attr:`LearnerSpec.obs_firms`: for an observation made only of ``history``
    (and ``empty``) components of a one-product market whose sellers are all this
    group's, the agent of its market whose price each feature is (a history of ``k``
    periods lists the ``S`` sellers' prices period by period, the most recent first:
    feature ``d`` is seller ``d mod S``); None otherwise."""
    g = spec.group(group)
    if g.side != "seller" or spec.num_products != 1:
        return None
    sellers = spec.num_sellers
    if g.offset != 0 or g.count != sellers:
        return None
    firms: list[int] = []
    for part in thaw(g.observation) or ():
        kind = part.get("kind") if isinstance(part, Mapping) else part
        if kind == "empty":
            continue
        if kind != "history":
            return None
        firms += list(range(sellers)) * int(part.get("k", 1))
    return tuple(firms)


#: (market spec, group, parameter bytes) -> the static prices of :func:`static_prices`
_STATIC_PRICES: dict[Any, tuple[np.ndarray, np.ndarray]] = {}


def static_prices(env: MarketEnv, params: MarketParams, group: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(nash [n], joint [n])``: the static one-shot game's Nash equilibrium prices and
    joint-profit-maximising prices of ``group``'s ``n`` agents (first product), every
    other group at its reset action, with prices free: the solver of the benchmarks
    (:func:`jaxmarket.market.equilibrium.solve`) on
    :func:`jaxmarket.market.equilibrium.free_game`'s box ``[0, high + 4 (high - low)]``
    of the group's action bounds. A ValueError where either is not found and verified
    (no profitable unilateral move, resp. no joint improvement). Memoised per market."""
    leaves = tuple(np.asarray(x).tobytes() for x in jax.tree.leaves(params))
    key = (env.spec, group, leaves)
    if key not in _STATIC_PRICES:
        low, high = env.action_bounds(group, params)
        bounds = np.stack([np.asarray(low, np.float32),
                           np.asarray(high, np.float32)], axis=-1)   # [n, P, 2]
        free_params, free_sets = free_game(env, params, {group: ActionSet.from_grid(bounds)})
        eq = solve(env, free_params, free_sets, continuous=False)[group]
        if not eq["converged"]:
            dev = eq.get("nash_deviation") or eq.get("joint_deviation")
            raise ValueError(f"the static game of {group} with prices free has no verified "
                             f"Nash equilibrium and joint optimum"
                             + (f" (agent {dev['agent']} gains {dev['gain']:.4g})"
                                if dev else ""))
        nash = np.asarray(eq["nash"], np.float64)[:, 0]
        joint = np.asarray(eq["joint"], np.float64)[:, 0]
        if env.spec.num_products == 1:
            payoff = one_shot_payoff(env, free_params, group)
            nash = polish(payoff, nash, joint=False)
            joint = polish(payoff, joint, joint=True)
        _STATIC_PRICES[key] = (nash, joint)
    nash, joint = _STATIC_PRICES[key]
    return nash.copy(), joint.copy()


def move_order(spec: MarketSpec) -> str:
    return getattr(spec, "move_order", "simultaneous")


def group_turns(spec: MarketSpec, group: str) -> tuple[int, int] | None:
    """``(n, first)`` of :attr:`LearnerSpec.turns` under alternating moves: ``n`` sellers
    take turns, this group's agent ``j`` is seller ``first + j``; None otherwise."""
    g = spec.group(group)
    if move_order(spec) != "alternating" or g.side != "seller":
        return None
    return spec.num_sellers, g.offset


def payoff_caveat(spec: MarketSpec, group: str) -> str | None:
    """Why ``one_shot_payoff`` (one step from the reset state, every other group at its
    reset action, key 0) is not a period's exact payoff against the actual actions of
    ``group``'s market, or None when it is."""
    others = [g.name for g in spec.agent_groups if g.name != group]
    if others:
        return f"the market has other agent groups ({', '.join(others)}), held at reset"
    moving = [f"{g.name} ({g.demand_kind})" for g in spec.consumers
              if g.demand_kind != "constant"]
    if moving:
        return "consumer demand changes over time: " + ", ".join(moving)
    if not DISTRIBUTORS[spec.distributor].is_deterministic(thaw(spec.distributor_options)):
        return f"distributor {spec.distributor!r} draws random numbers"
    if is_random(thaw(spec.group(group).reward)):
        return f"{group}.reward draws noise each period (a noise term)"
    if move_order(spec) != "simultaneous":
        return "sellers move in turn (market.move_order: alternating)"
    return None


def polish(payoff: Any, x0: np.ndarray, joint: bool, steps: int = 8) -> np.ndarray:
    """The static solution ``x0 [n]`` (one product) refined by Newton's method on its
    first-order conditions: ``F_i(p) = d pi_i / d p_i`` (Nash) or ``d sum_j pi_j / d p_i``
    (joint optimum), ``p <- p - J^-1 F(p)``; ``F`` by forward-mode autodiff of the
    market's float32 ``payoff(prices [n, 1]) -> [n]``, ``J`` its central differences
    with step ``h = 1e-3 max(1, |p|)``. The search of
    :func:`~jaxmarket.market.equilibrium.solve` maximises float32 profits, whose maximum
    is flat to about 1e-4 in the prices; the first-order conditions are not, so the
    refined prices are exact to about float32 resolution. ``x0`` is kept where the
    reward has no usable derivatives (non-finite ``F`` or singular ``J``), where ``|F|``
    does not fall, or where the refined point lies more than 1% of ``max(1, |x0|)``
    from ``x0`` (a different solution)."""
    n = x0.shape[0]
    weights = jnp.asarray(np.ones((n, n)) if joint else np.eye(n), jnp.float32)

    def first_order(p):
        grad = jax.jacfwd(lambda q: payoff(q[:, None]))(p)        # [n, n]: d pi_j / d p_i
        return jnp.sum(weights * grad, axis=0)                    # F_i

    # op by op: XLA's fused program of the logit distributor's derivative returns NaN
    # where the op-by-op one is finite (measured on the Calvano duopoly's joint optimum)
    batch = jax.vmap(first_order)
    x0 = np.asarray(x0, np.float64)
    x = x0.copy()
    eye = np.eye(n)
    f0 = f = None
    for _ in range(steps):
        h = 1e-3 * max(1.0, float(np.max(np.abs(x))))
        points = np.concatenate([x[None], x + h * eye, x - h * eye])   # [2n + 1, n]
        values = np.asarray(batch(jnp.asarray(points, jnp.float32)), np.float64)
        if not np.all(np.isfinite(values)):
            return x0
        f = values[0]
        f0 = f if f0 is None else f0
        matrix = ((values[1:n + 1] - values[n + 1:]) / (2.0 * h)).T     # J[i, k] = dF_i/dp_k
        try:
            step = np.linalg.solve(matrix, f)
        except np.linalg.LinAlgError:
            return x0
        if not np.all(np.isfinite(step)):
            return x0
        x = x - step
        if np.max(np.abs(step)) <= 1e-6 * max(1.0, float(np.max(np.abs(x)))):
            break   # below the float32 noise of F
    h = 1e-3 * max(1.0, float(np.max(np.abs(x))))   # the same shapes: no new compile
    points = np.concatenate([x[None], x + h * eye, x - h * eye])
    end = np.asarray(batch(jnp.asarray(points, jnp.float32)), np.float64)[0]
    near = np.max(np.abs(x - x0)) <= 1e-2 * max(1.0, float(np.max(np.abs(x0))))
    better = np.all(np.isfinite(end)) and np.max(np.abs(end)) <= np.max(np.abs(f0))
    return x if near and better else x0


def one_shot_payoff(env: MarketEnv, params: MarketParams, group: str):
    """``payoff(actions [A, P]) -> rewards [A]`` of ``group`` for one step from the reset
    state, every other agent group holding its reset action (deterministic key); where
    the period's draw has finitely many declared outcomes (a Cournot demand shock,
    :func:`jaxmarket.market.equilibrium.outcomes`), their exact expectation
    ``sum_k p_k reward_k``."""
    found = outcomes(env)
    if found is not None and len(found) > 1:
        parts = [(p, one_shot_payoff(e, params, group)) for p, e in found]
        return lambda actions: sum(np.float32(p) * f(actions) for p, f in parts)

    def payoff(actions: jax.Array) -> jax.Array:
        _, state = env.reset_env(jax.random.key(0), params)
        acts = current_actions(env.spec, state)
        acts[group] = actions
        state = env.one_shot_state(state, acts, params)
        _, _, rewards, _, _ = env.step_env(jax.random.key(0), state, acts, params)
        return rewards[group]

    return payoff


def resolve_learner(config: Any, where: str) -> tuple[str, dict]:
    """Validate one learner config; returns (kind, hyper with defaults). The population
    keys (``population``, ``mapping``) are the training loop's, not the learner's: see
    :mod:`jaxmarket.learners.population`."""
    config, _ = split_learner_config(config)
    if isinstance(config, Mapping) and "external_model" in config:   # the training loop's
        config = {k: v for k, v in config.items() if k != "external_model"}   # (models/)
    kind, definition = lookup_kind(config, LEARNERS, where,
                                   "a mapping with a 'kind' key, e.g. {kind: ppo_bandit}")
    hyper = check_mapping(definition.hyper_fields, config, where)
    return kind, hyper


def check_learner(config: Any, spec: LearnerSpec, where: str) -> tuple[str, dict]:
    """:func:`resolve_learner`, and the learner handles the market's move order: what
    can be checked without building it."""
    kind, hyper = resolve_learner(config, where)
    order = "alternating" if spec.turns is not None else "simultaneous"
    if order not in LEARNERS[kind].move_orders:
        able = [k for k, d in LEARNERS.items() if order in d.move_orders]
        raise ConfigError(f"{where}.kind", kind, f"a learner that handles market.move_order "
                          f"{order!r} (its action takes effect only in its turn): "
                          + ", ".join(able))
    return kind, hyper


def build_learner(config: Any, spec: LearnerSpec, where: str) -> Learner:
    kind, hyper = check_learner(config, spec, where)
    try:
        return LEARNERS[kind].make(hyper, spec)
    except ConfigError as err:
        raise ConfigError(_in_group(err.field, kind, where), err.value, err.allowed) from None


def _in_group(field: str, kind: str, where: str) -> str:
    """A learner's own error names ``learners.<kind>.<field>`` (or a bare ``<field>``):
    the user wrote ``learners.<group>.<field>``, so say that."""
    prefix = f"learners.{kind}"
    if field == prefix or field.startswith(prefix + ".") or field.startswith(prefix + "["):
        return where + field[len(prefix):]
    if field.startswith(where):
        return field
    return f"{where}.{field}"


def check_controller(env: MarketEnv, params: MarketParams, learners: Any,
                     where: str = "learners",
                     specs: Mapping[str, LearnerSpec] | None = None) -> dict[str, tuple[str, dict]]:
    """Every agent group has a learner config, no other name has one, and each is valid
    (:func:`check_learner`): ``{group: (kind, settings)}``, nothing built."""
    _check_names(env, learners, where)
    specs = specs or {name: group_learner_spec(env, params, name) for name in env.agent_groups}
    return {name: check_learner(learners[name], specs[name], f"{where}.{name}")
            for name in env.agent_groups}


def _check_names(env: MarketEnv, learners: Any, where: str) -> None:
    groups = env.agent_groups
    if not isinstance(learners, Mapping):
        raise ConfigError(where, learners, "a mapping from agent group name to learner config; "
                          f"agent groups: {', '.join(groups)}")
    check_learner_names(learners, list(groups), where)


def build_controller(env: MarketEnv, params: MarketParams, learners: Any,
                     where: str = "learners",
                     specs: Mapping[str, LearnerSpec] | None = None) -> dict[str, Learner]:
    """One learner per agent group; every agent group needs one, unknown names fail.
    ``specs`` (default: each group's own spec) lets the training loop pass the specs of
    its folded seeds and markets (and of the observation features it appends)."""
    _check_names(env, learners, where)
    specs = specs or {name: group_learner_spec(env, params, name) for name in env.agent_groups}
    return {name: build_learner(learners[name], specs[name], f"{where}.{name}")
            for name in env.agent_groups}


def learners_template(env: MarketEnv) -> str:
    """A ready-to-paste ``learners:`` block for the scenario's agent groups."""
    lines = ["learners:"]
    for g in env.spec.agent_groups:
        what = {"price": "prices", "multiplier": "price multipliers", "budget": "budgets",
                "quantity": "quantities"}.get(g.action, g.action)
        kind = "ppo" if g.observation else "ppo_bandit"
        lines.append(f"  {g.name}: {{kind: {kind}}}   # {g.side}s, {g.count} agent(s) "
                     f"setting {what}")
    return "\n".join(lines)
