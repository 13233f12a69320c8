"""How a group's agents across all seeds and markets are laid out for its learner.

Seeds are not a ``vmap`` over the whole program: they are folded into the agent axis.
With ``S`` seeds of ``E`` markets each, a group of ``A`` agents driven by ``K``
parameter sets is seen by its learner as ``S * E * A`` slots and ``S * K`` policies,
``policy_index[(s * E + e) * A + a] = s * K + index[a]``: the markets of one seed share
that seed's parameters, and seeds never share anything (data, not a code path). This
keeps learner-internal control flow (``lax.cond`` on a buffer counter, say) a real
branch: under a ``vmap`` over seeds its predicate would be batched and both branches
would run every step.

A resampled population reorders the slots: ``assignment[g] = (gather, scatter)``
maps market slot order to the learner's member-grouped order and back
(:class:`SlotView`). A league with live seats only shows the learner seat 0 of each
market.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.learners.base import LearnerSpec
from jaxmarket.learners.population import Population


def tile_spec(spec: LearnerSpec, num_envs: int, num_seeds: int = 1,
              population: Population | None = None) -> LearnerSpec:
    """A group's spec seen across ``num_seeds x num_envs`` markets: slots
    ``S * E * A``, policies ``S * K``, seed ``s`` owning policies ``s*K .. s*K + K - 1``.
    With a ``population``, ``K`` is its size and slot ``j`` of a seed (in the learner's
    member-grouped order) is driven by member ``population.layout(E, A)[j]``."""
    if population is not None and population.live_seats_only:   # the live seats
        spec = dataclasses.replace(spec, num_agents=1, action_low=spec.action_low[:1],
                                   action_high=spec.action_high[:1], payoff=None)
    if population is not None:
        layout = population.layout(num_envs, spec.num_agents)              # [E * A]
        spec = dataclasses.replace(spec, num_policies=population.size, policy_index=None)
        per_seed = layout
    elif num_envs == 1 and num_seeds == 1:
        return spec
    else:
        per_seed = np.tile(np.asarray(spec.index()), num_envs)           # [E * A]
    index = (np.arange(num_seeds)[:, None] * spec.policies + per_seed[None]).ravel()
    markets = num_envs * num_seeds
    return dataclasses.replace(
        spec, num_agents=spec.num_agents * markets, num_policies=spec.policies * num_seeds,
        policy_index=tuple(int(i) for i in index), num_markets=markets, num_sessions=num_seeds,
        action_low=np.tile(spec.action_low, (markets, 1)),
        action_high=np.tile(spec.action_high, (markets, 1)))


def per_seed(x: jax.Array, num_seeds: int) -> jax.Array:
    """Policy-stacked leaf ``[S * K, ...]`` -> ``[S, K, ...]``."""
    x = jnp.asarray(x)
    return x.reshape((num_seeds, x.shape[0] // num_seeds) + x.shape[1:])


@dataclasses.dataclass(frozen=True)
class SlotView:
    """Market arrays ``[E, A, ...]`` (``E``: all markets) <-> a learner's slots.

    ``sizes``: agents per group; ``live_only``: league groups whose learner acts for
    seat 0 of each market only."""

    num_markets: int
    sizes: Mapping[str, int]
    live_only: frozenset = frozenset()

    @classmethod
    def of(cls, plan) -> "SlotView":
        """The view of a :class:`~jaxmarket.train.plan.RunPlan`."""
        live = frozenset(g for g, p in plan.populations.items()
                         if p is not None and p.league and p.live_seats_only)
        return cls(plan.num_markets, {g: plan.env.num_agents(g) for g in plan.groups}, live)

    def flat(self, x: jax.Array, g: str) -> jax.Array:
        """``[E, A, ...] -> [E * A, ...]`` (a league's live seats: ``[E, ...]``)."""
        if g in self.live_only:
            return x[:, 0]
        return x.reshape((self.num_markets * self.sizes[g],) + x.shape[2:])

    @staticmethod
    def to_learner(x: jax.Array, g: str, assignment: Mapping) -> jax.Array:
        """Market slot order -> the learner's slot order."""
        return x[assignment[g][0]] if g in assignment else x

    @staticmethod
    def to_market(x: jax.Array, g: str, assignment: Mapping) -> jax.Array:
        """The learner's slot order -> market slot order."""
        return x[assignment[g][1]] if g in assignment else x

    def learner_view(self, x: jax.Array, g: str, assignment: Mapping) -> jax.Array:
        """``[E, A, ...]`` market array -> the learner's ``[slots, ...]``."""
        return self.to_learner(self.flat(x, g), g, assignment)

    def market_actions(self, a: jax.Array, g: str, assignment: Mapping) -> jax.Array:
        """The learner's actions ``[slots, P]`` -> the market's ``[E, A, P]`` (a league's
        live seats: ``[E, 1, P]``, seat 0; the league adds the other seats)."""
        if g in self.live_only:
            return a[:, None]
        a = self.to_market(a, g, assignment)
        return a.reshape((self.num_markets, self.sizes[g]) + a.shape[1:])

    def learner_done(self, done: jax.Array, g: str, assignment: Mapping) -> jax.Array:
        """The markets' ``done [E]`` -> one flag per learner slot."""
        if g in self.live_only:
            return done
        return self.to_learner(jnp.repeat(done, self.sizes[g]), g, assignment)
