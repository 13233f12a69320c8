"""Tabular Q-learning on a price grid (Calvano et al., AER 2020, "algorithmic collusion").

Each seller picks one of ``m`` prices ``grid = linspace(grid_low, grid_high, m)``. Its
state is what it observed: the last ``k`` (``memory``) price profiles of all ``n``
sellers of the market, ``obs [A, D]`` with ``D = k * n`` (one product). Every observed
price is snapped to its nearest grid index ``d_j`` and the state is the mixed-radix
number ``s = sum_j d_j m^(D-1-j)`` of those ``m^D`` possibilities (``make`` refuses
``m^D > 2^31 - 1``, so every state index fits in int32).

Update, for each transition ``(s, a, r, s')`` of a batch in time order::

    Q[s, a] <- (1 - alpha) Q[s, a] + alpha (r + delta (1 - done) max_a' Q[s', a'])

Exploration: with probability ``eps_t = exp(-beta t)`` a uniformly random price, else the
greedy ``argmax_a Q[s, a]`` (first index on ties); ``t`` counts the periods the learner
has learnt from. One uniform ``u`` per agent and period decides both: explore when
``u < eps_t``, and then play price ``floor(m u / eps_t)`` (``u / eps_t`` is uniform on
[0, 1) given ``u < eps_t``).

Sessions: the training loop folds ``S = spec.num_sessions`` independent runs into the
slot and policy axes (session ``s`` owns slots ``s*A/S .. (s+1)*A/S - 1`` and policies
``s*K .. s*K + K - 1``). Everything that is not a Q table is kept per session: ``step``,
``stable_periods`` and ``converged`` have shape ``[S]`` (shape ``[]`` for a one-session
spec, as ``benchmarks/calvano.py`` uses under its own ``vmap`` over sessions).

Convergence (Calvano's rule, per session): after each period, an agent's greedy strategy
changed if the argmax of the Q row it just updated changed. A session's
``stable_periods`` counts consecutive periods in which no agent of that session changed
its greedy strategy; once it reaches ``convergence_window`` the session is
``converged``: it stops learning (``update`` leaves its Q tables, its ``t`` and its
counter unchanged, so its ``step`` is its period of convergence) and its agents act
greedily. The other sessions go on.

Initial Q (``q_init="random_rival"``): the discounted payoff of each price against
uniformly random rivals of the same market, the same in every state::

    Q0[s, a] = E_{a_-i ~ U(grid)} [ payoff_i(a, a_-i) ] / (1 - delta)

computed from the per-market ``LearnerSpec.payoff`` on all ``m^n`` joint grid actions
of one market's ``n = agents_per_market`` agents with ``vmap``; slot ``i`` gets the row
of agent ``i % n`` of its market, averaged onto policies.

Parameters are stacked per policy; agents sharing a policy apply their updates of one
period together (their increments add up). The state keeps one packed table
``rows [num_policies, m^D, m + 1]``: columns ``0 .. m-1`` are ``Q[s, .]`` and column
``m`` caches ``greedy = argmax_a Q[s, a]`` (an integer below 2^24, stored exactly as
float32), rewritten with the one row that changes each period. Acting reads the cached
greedy index, updating reads the same row, so one period touches one memory row per
agent for ``s`` (and one for the bootstrap ``max_a' Q[s', a']``, which is next period's
``s``): the run is bound by memory latency, and this layout measured 5-30% faster
(noisy, shared machine) than separate ``q``, ``greedy`` and ``value`` arrays. ``state.q``,
``state.greedy`` and ``state.value`` give the usual views.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.fields import Field, check_mapping
from jaxmarket.learners.base import (
    LEARNERS,
    Learner,
    LearnerDef,
    LearnerSpec,
    Transition,
    scatter_mean,
)

_INT32_MAX = np.iinfo(np.int32).max
# Largest number of joint actions evaluated for the random-rival initial Q.
_MAX_JOINT_ACTIONS = 1 << 22

HYPER_FIELDS: dict[str, Field] = {
    "grid_low": Field("float", default=None, optional=True,
                      doc="lowest grid price (null: the smallest action_low of the group)"),
    "grid_high": Field("float", default=None, optional=True,
                       doc="highest grid price (null: the largest action_high of the group)"),
    "grid_size": Field("int", default=15, low=2, doc="number of grid prices m"),
    "memory": Field("int", default=1, low=1, doc="price profiles remembered k"),
    "learning_rate": Field("float", default=0.15, low=0.0, high=1.0, low_open=True,
                           doc="alpha"),
    "discount": Field("float", default=0.95, low=0.0, high=1.0, doc="delta"),
    "exploration_decay": Field("float", default=4e-6, low=0.0,
                               doc="beta in eps_t = exp(-beta t)"),
    "convergence_window": Field("int", default=100_000, low=1,
                                doc="periods without any greedy change that mean converged"),
    "q_init": Field("choice", default="random_rival", choices=("random_rival", "zero"),
                    doc="initial Q: payoff against uniform rivals / (1 - delta), or zeros"),
}


@struct.dataclass
class QLearningState:
    """Learner state of one group across its sessions and markets. ``[S]`` below is
    ``[]`` when ``spec.num_sessions == 1``."""

    rows: jax.Array            # [num_policies, num_states, m + 1] float32: Q | greedy
    policy_index: jax.Array    # [A] int32 agent slot -> policy
    step: jax.Array            # [S] int32 periods learnt from (t of eps_t)
    stable_periods: jax.Array  # [S] int32 consecutive periods without a greedy change
    converged: jax.Array       # [S] bool
    # per-policy hyperparameters {name: [num_policies] float32}: learning_rate (alpha)
    # and exploration_decay (beta); PBT mutates them in-graph without recompiling
    hyper: Any = None

    @property
    def q(self) -> jax.Array:
        """``[num_policies, num_states, m]`` action values."""
        return self.rows[..., :-1]

    @property
    def greedy(self) -> jax.Array:
        """``[num_policies, num_states]`` int32 ``argmax_a q`` (first index on ties)."""
        return self.rows[..., -1].astype(jnp.int32)

    @property
    def value(self) -> jax.Array:
        """``[num_policies, num_states]`` ``max_a q``."""
        return jnp.max(self.q, axis=-1)

    def with_q(self, q: jax.Array) -> QLearningState:
        """This state holding action values ``q`` (its greedy column recomputed)."""
        return self.replace(rows=pack_rows(jnp.asarray(q, jnp.float32)))


def pack_rows(q: jax.Array) -> jax.Array:
    """``q [..., m]`` -> ``[..., m + 1]``: the values and their first argmax as float32."""
    greedy = jnp.argmax(q, axis=-1).astype(q.dtype)
    return jnp.concatenate([q, greedy[..., None]], axis=-1)


@struct.dataclass
class PriceGrid:
    """The static discretisation shared by act and update (numbers only)."""

    prices: jax.Array  # [m] float32
    low: float = struct.field(pytree_node=False)
    spacing: float = struct.field(pytree_node=False)
    radix: tuple[int, ...] = struct.field(pytree_node=False)  # m^(D-1-j), j < D

    @property
    def size(self) -> int:
        return int(self.prices.shape[0])

    def nearest_index(self, price: jax.Array) -> jax.Array:
        """Index of the grid price nearest to each ``price`` (int32, clipped)."""
        index = jnp.round((price - self.low) / self.spacing)
        return jnp.clip(index, 0, self.size - 1).astype(jnp.int32)

    def state_index(self, obs: jax.Array) -> jax.Array:
        """Mixed-radix state number of observations ``[..., D]`` -> ``[...]`` int32."""
        digits = self.nearest_index(obs)
        return jnp.sum(digits * jnp.asarray(self.radix, dtype=jnp.int32), axis=-1)


def max_and_argmax(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(max, first argmax)`` over the last axis (int32 index), as ``jnp.max`` /
    ``jnp.argmax``. For short rows it is written as a running comparison over the
    columns: elementwise across rows, several times faster on XLA:CPU than the variadic
    reduction behind ``jnp.argmax``."""
    width = rows.shape[-1]
    if width > 64:
        return jnp.max(rows, axis=-1), jnp.argmax(rows, axis=-1).astype(jnp.int32)
    best = rows[..., 0]
    index = jnp.zeros(best.shape, jnp.int32)
    for j in range(1, width):
        better = rows[..., j] > best  # strict: ties keep the first index, like argmax
        best = jnp.where(better, rows[..., j], best)
        index = jnp.where(better, j, index)
    return best, index


def make_grid(hyper: Mapping[str, Any], spec: LearnerSpec) -> PriceGrid:
    """Validate the spec against Q-learning's assumptions and build the price grid."""
    return price_grid(*grid_bounds(hyper, spec))


def grid_bounds(hyper: Mapping[str, Any], spec: LearnerSpec) -> tuple[float, float, int, int]:
    """``(grid_low, grid_high, grid_size, num_digits)`` of :func:`make_grid`, validated."""
    if spec.num_products != 1:
        raise ValueError(f"q_learning supports one product per seller; this group has "
                         f"num_products={spec.num_products}")
    memory = hyper["memory"]
    if spec.obs_dim <= 0 or spec.obs_dim % memory != 0:
        raise ValueError(f"q_learning needs observations of the last memory={memory} price "
                         f"profiles of all sellers (obs_dim = memory * num_sellers); got "
                         f"obs_dim={spec.obs_dim}")
    m = hyper["grid_size"]
    num_digits = spec.obs_dim
    if num_digits * np.log(m) >= np.log(_INT32_MAX + 1.0):
        raise ValueError(f"q_learning: grid_size^(memory * num_sellers) = {m}^{num_digits} "
                         f"states do not fit in int32 (nor in memory); lower grid_size or memory")
    low = hyper["grid_low"]
    high = hyper["grid_high"]
    low = float(np.min(spec.action_low)) if low is None else float(low)
    high = float(np.max(spec.action_high)) if high is None else float(high)
    if not high > low:
        raise ValueError(f"q_learning: grid_high ({high}) must exceed grid_low ({low})")
    return low, high, m, num_digits


def price_grid(low: float, high: float, m: int, num_digits: int) -> PriceGrid:
    """The grid of ``m`` prices ``linspace(low, high, m)`` for states of ``num_digits``
    observed prices."""
    radix = tuple(int(m) ** (num_digits - 1 - j) for j in range(num_digits))
    prices = jnp.asarray(np.linspace(low, high, m), dtype=jnp.float32)
    return PriceGrid(prices=prices, low=low, spacing=(high - low) / (m - 1), radix=radix)


def _check_joint_actions(m: int, agents_per_market: int) -> None:
    if m ** agents_per_market > _MAX_JOINT_ACTIONS:
        raise ValueError(f"q_learning: q_init='random_rival' evaluates all "
                         f"{m}^{agents_per_market} joint prices of a market; too many, use "
                         f"q_init='zero'")


def random_rival_q(payoff: Any, grid: jax.Array, agents_per_market: int,
                   discount: float) -> jax.Array:
    """``[n, m]`` (``n = agents_per_market``): each agent's mean payoff of each grid price
    against uniformly random grid prices of the other agents of its market, divided by
    ``1 - discount``. ``payoff`` is the per-market one-shot payoff ``[n, 1] -> [n]``."""
    m = int(grid.shape[0])
    n = agents_per_market
    _check_joint_actions(m, n)
    num_joint = m ** n
    joint = np.indices((m,) * n).reshape(n, -1).T  # [J, n]
    joint = jnp.asarray(joint, dtype=jnp.int32)
    rewards = jax.vmap(payoff)(grid[joint][..., None])  # [J, n]
    own_price = jax.nn.one_hot(joint, m, dtype=rewards.dtype)  # [J, n, m]
    mean_payoff = jnp.einsum("ja,jam->am", rewards, own_price) / (num_joint // m)
    return mean_payoff / (1.0 - discount)


def session_layout(spec: LearnerSpec) -> tuple[int, int]:
    """``(slots per session, policies per session)``, checking that ``spec`` folds its
    sessions as the training loop does: contiguous slot blocks, contiguous policy blocks,
    and no slot driven by another session's policy."""
    sessions, slots, policies = spec.num_sessions, spec.num_agents, spec.policies
    if sessions < 1 or slots % sessions or policies % sessions:
        raise ValueError(f"q_learning: {slots} agent slots and {policies} policies do not "
                         f"split into num_sessions={sessions} equal sessions")
    if spec.num_markets < 1 or slots % spec.num_markets:
        raise ValueError(f"q_learning: {slots} agent slots do not split into "
                         f"num_markets={spec.num_markets} equal markets")
    slots_per_session, policies_per_session = slots // sessions, policies // sessions
    index = np.asarray(spec.index())
    if np.any(index // policies_per_session != np.arange(slots) // slots_per_session):
        raise ValueError("q_learning: policy_index lets a session drive another session's "
                         "policies; sessions must not share parameters")
    return slots_per_session, policies_per_session


@dataclass(frozen=True)
class QLearningSettings:
    """Q-learning's resolved settings (static)."""

    grid_low: float             # the price grid: linspace(grid_low, grid_high, grid_size)
    grid_high: float
    grid_size: int              # m
    num_digits: int             # D = obs_dim: observed prices per state
    learning_rate: float        # alpha
    discount: float             # delta
    exploration_decay: float    # beta
    convergence_window: int
    q_init: str
    num_sessions: int
    num_slots: int
    slots_per_session: int
    exclusive_policies: bool    # no two agents share a Q table
    # what ``init`` uses when it is given no spec: the make-time spec's
    policy_index: tuple[int, ...]
    num_policies: int
    agents_per_market: int
    payoff: Any = None

    @property
    def num_states(self) -> int:
        return self.grid_size ** self.num_digits

    @property
    def session_shape(self) -> tuple[int, ...]:
        """Per-session quantities: shape [S], or [] for one session (the benchmark's
        vmapped path, which then runs exactly the single-session code)."""
        return () if self.num_sessions == 1 else (self.num_sessions,)


def grid_of(settings: QLearningSettings) -> PriceGrid:
    return price_grid(settings.grid_low, settings.grid_high, settings.grid_size,
                      settings.num_digits)


def per_slot(settings: QLearningSettings, x: jax.Array) -> jax.Array:
    """A per-session array ``[S]`` -> per slot ``[A]`` (slots are contiguous per session)."""
    if settings.num_sessions == 1:
        return x  # a scalar broadcasts
    return jnp.repeat(x, settings.slots_per_session, total_repeat_length=settings.num_slots)


def any_per_session(settings: QLearningSettings, x: jax.Array) -> jax.Array:
    """``[A]`` bool -> ``[S]``: whether any slot of each session is set."""
    if settings.num_sessions == 1:
        return jnp.any(x)
    return jnp.any(x.reshape(settings.num_sessions, settings.slots_per_session), axis=-1)


def slot_epsilon(settings: QLearningSettings, state: QLearningState) -> jax.Array:
    """``[A]`` exploration probability of each slot: ``exp(-beta_k t_s)`` with its
    policy's ``beta_k`` and its session's ``t_s`` (0 once the session converged)."""
    beta_slot = state.hyper["exploration_decay"][state.policy_index]
    t = per_slot(settings, state.step.astype(jnp.float32))
    return jnp.where(per_slot(settings, state.converged), 0.0, jnp.exp(-beta_slot * t))


def epsilon(settings: QLearningSettings, state: QLearningState) -> jax.Array:
    """``[S]`` mean exploration probability of each session's slots (0 once
    converged; the session's ``exp(-beta t)`` when its policies share one beta)."""
    eps = slot_epsilon(settings, state)
    if settings.num_sessions == 1:
        return jnp.mean(eps)
    return jnp.mean(eps.reshape(settings.num_sessions, settings.slots_per_session), axis=-1)


def init(settings: QLearningSettings, key: jax.Array,
         spec: LearnerSpec | None = None) -> QLearningState:
    del key  # the initial Q is deterministic
    m, num_states = settings.grid_size, settings.num_states
    if spec is None:
        index = jnp.asarray(settings.policy_index, dtype=jnp.int32)
        payoff, n, policies = settings.payoff, settings.agents_per_market, settings.num_policies
        num_agents = settings.num_slots
    else:
        if (spec.num_sessions, spec.num_agents) != (settings.num_sessions, settings.num_slots):
            raise ValueError(f"q_learning: init got a spec with {spec.num_agents} slots in "
                             f"{spec.num_sessions} sessions; the learner was made for "
                             f"{settings.num_slots} slots in {settings.num_sessions}")
        index = spec.index()
        payoff, n, policies = spec.payoff, spec.agents_per_market, spec.policies
        num_agents = spec.num_agents
    if settings.q_init == "random_rival":
        per_market = random_rival_q(payoff, grid_of(settings).prices, n,
                                    settings.discount)                     # [n, m]
        per_slot_rows = jnp.tile(per_market, (num_agents // n, 1))         # slot i: i % n
        per_policy = scatter_mean(per_slot_rows, index, policies)
    else:
        per_policy = jnp.zeros((policies, m), jnp.float32)
    row = pack_rows(per_policy.astype(jnp.float32))                       # [K, m + 1]
    rows = jnp.array(jnp.broadcast_to(row[:, None, :], (policies, num_states, m + 1)))
    shape = settings.session_shape
    return QLearningState(
        rows=rows, policy_index=index, step=jnp.zeros(shape, jnp.int32),
        stable_periods=jnp.zeros(shape, jnp.int32), converged=jnp.zeros(shape, bool),
        hyper={"learning_rate": jnp.full((policies,), settings.learning_rate, jnp.float32),
               "exploration_decay": jnp.full((policies,), settings.exploration_decay,
                                             jnp.float32)})


def act(settings: QLearningSettings, state: QLearningState, obs: jax.Array, key: jax.Array):
    grid, m = grid_of(settings), settings.grid_size
    num_agents = obs.shape[0]
    s = grid.state_index(obs)                               # [A]
    greedy = state.rows[state.policy_index, s, m].astype(jnp.int32)
    eps = slot_epsilon(settings, state)                     # [A]
    # One uniform per agent decides both whether to explore (u < eps) and, given that
    # it does, which price: u / eps is then uniform on [0, 1).
    u = jax.random.bits(key, (num_agents,), jnp.uint32).astype(jnp.float32) * 2.0**-32
    explore = u < eps
    random_action = jnp.minimum((u / jnp.maximum(eps, 1e-30) * m).astype(jnp.int32), m - 1)
    action = jnp.where(explore, random_action, greedy)
    return grid.prices[action][:, None], {"action_index": action}


def learn_one_period(settings: QLearningSettings, state: QLearningState, period):
    m = settings.grid_size
    s, a, r, s_next, done = period                          # each [A]
    policy = state.policy_index
    learning_session = ~state.converged                     # [S]
    learning = per_slot(settings, learning_session)         # [A]
    row = state.rows[policy, s]                             # [A, m + 1]
    old_greedy = row[:, m].astype(jnp.int32)
    row = row[:, :m]
    next_value = jnp.max(state.rows[policy, s_next, :m], axis=-1)
    target = r + settings.discount * jnp.where(done, 0.0, next_value)
    is_action = jnp.arange(m, dtype=jnp.int32) == a[:, None]  # [A, m]
    q_sa = jnp.take_along_axis(row, a[:, None], axis=-1)[:, 0]
    alpha_slot = state.hyper["learning_rate"][policy]
    increment = jnp.where(learning, alpha_slot * (target - q_sa), 0.0)
    if settings.exclusive_policies:
        new_row = jnp.where(is_action, (q_sa + increment)[:, None], row)
        _, new_greedy = max_and_argmax(new_row)
        new_rows = jnp.concatenate([new_row, new_greedy.astype(jnp.float32)[:, None]], -1)
        # a whole row per agent: its values and its greedy index
        rows = state.rows.at[policy, s].set(new_rows, unique_indices=True)
    else:  # agents sharing a policy may update the same entry: increments add up
        rows = state.rows.at[policy, s, a].add(increment)
        _, new_greedy = max_and_argmax(rows[policy, s, :m])
        # agents on the same (policy, state) row write the same greedy index
        rows = rows.at[policy, s, m].set(new_greedy.astype(jnp.float32))
    changed = (new_greedy != old_greedy) & learning
    stable = jnp.where(any_per_session(settings, changed), 0, state.stable_periods + 1)
    stable = jnp.where(learning_session, stable, state.stable_periods)
    step = jnp.where(learning_session & (state.step < _INT32_MAX), state.step + 1,
                     state.step)
    converged = state.converged | (stable >= settings.convergence_window)
    new_state = state.replace(rows=rows, step=step,
                              stable_periods=stable, converged=converged)
    return new_state, jnp.sum(changed)


def update(settings: QLearningSettings, state: QLearningState, batch: Transition):
    grid = grid_of(settings)
    s = grid.state_index(batch.obs)                         # [T, A]
    s_next = grid.state_index(batch.next_obs)
    aux = batch.aux if isinstance(batch.aux, Mapping) else {}
    a = aux.get("action_index")
    a = grid.nearest_index(batch.action[..., 0]) if a is None else a.astype(jnp.int32)
    periods = (s, a, batch.reward.astype(jnp.float32), s_next, batch.done.astype(bool))
    one_period = partial(learn_one_period, settings)
    if batch.reward.shape[0] == 1:  # one period: no loop
        state, changes = one_period(state, jax.tree.map(lambda x: x[0], periods))
        changes = changes[None]
    else:
        state, changes = jax.lax.scan(one_period, state, periods)
    metrics = {"greedy_changes": jnp.sum(changes), "stable_periods": state.stable_periods,
               "converged": state.converged,
               "epsilon": epsilon(settings, state)}
    return state, metrics


def qlearning_settings(hyper: Mapping[str, Any], spec: LearnerSpec) -> QLearningSettings:
    """Validate ``hyper`` against ``spec`` (nothing traced) and resolve the settings."""
    hyper = check_mapping(HYPER_FIELDS, hyper, "learners.q_learning")
    low, high, m, num_digits = grid_bounds(hyper, spec)
    slots = spec.index().tolist()
    slots_per_session, _ = session_layout(spec)
    if hyper["q_init"] == "random_rival":
        if spec.payoff is None:
            raise ValueError("q_learning: q_init='random_rival' needs LearnerSpec.payoff; "
                             "use q_init='zero' or a market that provides it")
        if hyper["discount"] >= 1.0:
            raise ValueError("q_learning: q_init='random_rival' needs discount < 1")
        _check_joint_actions(m, spec.agents_per_market)
    return QLearningSettings(
        grid_low=low, grid_high=high, grid_size=m, num_digits=num_digits,
        learning_rate=hyper["learning_rate"], discount=hyper["discount"],
        exploration_decay=hyper["exploration_decay"],
        convergence_window=hyper["convergence_window"], q_init=hyper["q_init"],
        num_sessions=spec.num_sessions, num_slots=spec.num_agents,
        slots_per_session=slots_per_session,
        exclusive_policies=len(set(slots)) == len(slots),
        policy_index=tuple(int(i) for i in slots), num_policies=spec.policies,
        agents_per_market=spec.agents_per_market, payoff=spec.payoff)


def make(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    settings = qlearning_settings(hyper, spec)
    return Learner(init=partial(init, settings), act=partial(act, settings),
                   update=partial(update, settings))


Q_LEARNING = LEARNERS.register(LearnerDef(kind="q_learning", make=make,
                                          hyper_fields=HYPER_FIELDS,
                                          doc=__doc__.split("\n\n")[0]))
