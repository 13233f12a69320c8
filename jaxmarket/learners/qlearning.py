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

Convergence (Calvano's rule): after each period, an agent's greedy strategy changed if
the argmax of the Q row it just updated changed. ``stable_periods`` counts consecutive
periods in which no agent's greedy strategy changed; once it reaches
``convergence_window`` the group is ``converged``: it stops learning (``update`` leaves
Q, ``t`` and the counter unchanged) and ``act`` is greedy.

Initial Q (``q_init="random_rival"``): the discounted payoff of each price against
uniformly random rivals, the same in every state::

    Q0[s, a] = E_{a_-i ~ U(grid)} [ payoff_i(a, a_-i) ] / (1 - delta)

computed from ``LearnerSpec.payoff`` on all ``m^A`` joint grid actions with ``vmap``.

Parameters are stacked per policy (``q [num_policies, m^D, m]``); agents sharing a
policy apply their updates of one period together (their increments add up). Next to
``q`` the state caches, per policy and state, ``greedy = argmax_a q`` and
``value = max_a q``, updated with the one row that changes each period: acting is then
one lookup, and the bootstrap ``max_a' Q[s', a']`` another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.fields import Field, check_mapping
from jaxmarket.learners.base import (
    Learner,
    LearnerDef,
    LearnerSpec,
    Transition,
    register,
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
    """Learner state of one group (one market)."""

    q: jax.Array               # [num_policies, num_states, m] float32
    greedy: jax.Array          # [num_policies, num_states] int32: argmax_a q, kept in sync
    value: jax.Array           # [num_policies, num_states] float32: max_a q, kept in sync
    policy_index: jax.Array    # [A] int32 agent slot -> policy
    step: jax.Array            # [] int32 periods learnt from (t of eps_t)
    stable_periods: jax.Array  # [] int32 consecutive periods without a greedy change
    converged: jax.Array       # [] bool


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
    radix = tuple(int(m) ** (num_digits - 1 - j) for j in range(num_digits))
    prices = jnp.asarray(np.linspace(low, high, m), dtype=jnp.float32)
    return PriceGrid(prices=prices, low=low, spacing=(high - low) / (m - 1), radix=radix)


def random_rival_q(payoff: Any, grid: jax.Array, num_agents: int, discount: float) -> jax.Array:
    """``[A, m]``: each agent's mean payoff of each grid price against uniformly random
    grid prices of the other agents, divided by ``1 - discount``."""
    m = int(grid.shape[0])
    num_joint = m ** num_agents
    if num_joint > _MAX_JOINT_ACTIONS:
        raise ValueError(f"q_learning: q_init='random_rival' evaluates all {m}^{num_agents} "
                         f"joint prices; too many, use q_init='zero'")
    joint = np.indices((m,) * num_agents).reshape(num_agents, -1).T  # [J, A]
    joint = jnp.asarray(joint, dtype=jnp.int32)
    rewards = jax.vmap(payoff)(grid[joint][..., None])  # [J, A]
    own_price = jax.nn.one_hot(joint, m, dtype=rewards.dtype)  # [J, A, m]
    mean_payoff = jnp.einsum("ja,jam->am", rewards, own_price) / (num_joint // m)
    return mean_payoff / (1.0 - discount)


def make(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    hyper = check_mapping(HYPER_FIELDS, hyper, "learners.q_learning")
    grid = make_grid(hyper, spec)
    m = grid.size
    num_states = m ** spec.obs_dim
    alpha = hyper["learning_rate"]
    delta = hyper["discount"]
    beta = hyper["exploration_decay"]
    window = hyper["convergence_window"]
    slots = spec.index().tolist()
    exclusive_policies = len(set(slots)) == len(slots)  # no two agents share a Q table
    if hyper["q_init"] == "random_rival":
        if spec.payoff is None:
            raise ValueError("q_learning: q_init='random_rival' needs LearnerSpec.payoff; "
                             "use q_init='zero' or a market that provides it")
        if delta >= 1.0:
            raise ValueError("q_learning: q_init='random_rival' needs discount < 1")

    def init(key: jax.Array, spec: LearnerSpec = spec) -> QLearningState:
        del key  # the initial Q is deterministic
        index = spec.index()
        if hyper["q_init"] == "random_rival":
            per_agent = random_rival_q(spec.payoff, grid.prices, spec.num_agents, delta)
            per_policy = scatter_mean(per_agent, index, spec.policies)
        else:
            per_policy = jnp.zeros((spec.policies, m), jnp.float32)
        q = jnp.broadcast_to(per_policy.astype(jnp.float32)[:, None, :],
                             (spec.policies, num_states, m))
        q = jnp.array(q)
        return QLearningState(q=q, greedy=jnp.argmax(q, axis=-1).astype(jnp.int32),
                              value=jnp.max(q, axis=-1), policy_index=index,
                              step=jnp.zeros((), jnp.int32),
                              stable_periods=jnp.zeros((), jnp.int32),
                              converged=jnp.zeros((), bool))

    def act(state: QLearningState, obs: jax.Array, key: jax.Array):
        num_agents = obs.shape[0]
        s = grid.state_index(obs)                               # [A]
        greedy = state.greedy[state.policy_index, s]
        eps = jnp.where(state.converged, 0.0, jnp.exp(-beta * state.step.astype(jnp.float32)))
        # One uniform per agent decides both whether to explore (u < eps) and, given that
        # it does, which price: u / eps is then uniform on [0, 1).
        u = jax.random.bits(key, (num_agents,), jnp.uint32).astype(jnp.float32) * 2.0**-32
        explore = u < eps
        random_action = jnp.minimum((u / jnp.maximum(eps, 1e-30) * m).astype(jnp.int32), m - 1)
        action = jnp.where(explore, random_action, greedy)
        return grid.prices[action][:, None], {"action_index": action}

    def learn_one_period(state: QLearningState, period):
        s, a, r, s_next, done = period                          # each [A]
        policy = state.policy_index
        learning = ~state.converged
        row = state.q[policy, s]                                # [A, m]
        old_greedy = state.greedy[policy, s]
        target = r + delta * jnp.where(done, 0.0, state.value[policy, s_next])
        is_action = jnp.arange(m, dtype=jnp.int32) == a[:, None]  # [A, m]
        q_sa = jnp.take_along_axis(row, a[:, None], axis=-1)[:, 0]
        increment = jnp.where(learning, alpha * (target - q_sa), 0.0)
        if exclusive_policies:
            new_q_sa = q_sa + increment
            q = state.q.at[policy, s, a].set(new_q_sa, unique_indices=True)
            new_row = jnp.where(is_action, new_q_sa[:, None], row)  # no read-back needed
        else:  # agents sharing a policy may update the same entry: increments add up
            q = state.q.at[policy, s, a].add(increment)
            new_row = q[policy, s]
        new_value, new_greedy = max_and_argmax(new_row)
        changed = (new_greedy != old_greedy) & learning
        # writing the old greedy index when not learning also orders this write after
        # the reads of the table above (so XLA updates it in place)
        greedy = state.greedy.at[policy, s].set(jnp.where(learning, new_greedy, old_greedy))
        value = state.value.at[policy, s].set(new_value)
        stable = jnp.where(jnp.any(changed), 0, state.stable_periods + 1)
        stable = jnp.where(learning, stable, state.stable_periods)
        step = jnp.where(learning & (state.step < _INT32_MAX), state.step + 1, state.step)
        converged = state.converged | (stable >= window)
        new_state = state.replace(q=q, greedy=greedy, value=value, step=step,
                                  stable_periods=stable, converged=converged)
        return new_state, jnp.sum(changed)

    def update(state: QLearningState, batch: Transition):
        s = grid.state_index(batch.obs)                         # [T, A]
        s_next = grid.state_index(batch.next_obs)
        aux = batch.aux if isinstance(batch.aux, Mapping) else {}
        a = aux.get("action_index")
        a = grid.nearest_index(batch.action[..., 0]) if a is None else a.astype(jnp.int32)
        periods = (s, a, batch.reward.astype(jnp.float32), s_next, batch.done.astype(bool))
        if batch.reward.shape[0] == 1:  # one period: no loop
            state, changes = learn_one_period(state, jax.tree.map(lambda x: x[0], periods))
            changes = changes[None]
        else:
            state, changes = jax.lax.scan(learn_one_period, state, periods)
        metrics = {"greedy_changes": jnp.sum(changes), "stable_periods": state.stable_periods,
                   "converged": state.converged,
                   "epsilon": jnp.where(state.converged, 0.0,
                                        jnp.exp(-beta * state.step.astype(jnp.float32)))}
        return state, metrics

    return Learner(init=init, act=act, update=update)


Q_LEARNING = register(LearnerDef(kind="q_learning", make=make, hyper_fields=HYPER_FIELDS,
                                 doc=__doc__.split("\n\n")[0]))
