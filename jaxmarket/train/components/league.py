"""League play: frozen snapshots of a group's members drive opponent seats.

A group with a league mapping has its members enter a ring pool of ``pool_size``
snapshots every ``snapshot_every`` iterations; each market draws the pool entry its
opponents play for the next iteration (the newest with probability ``latest_prob``,
else uniform over the filled entries). The opponents are the group's own seats
``1 ..`` (``live_seats_only``: the learner acts for seat 0) or another group's agents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxmarket.learners.base import LEARNERS, Learner, materialize
from jaxmarket.learners.population import Population
from jaxmarket.train.components.base import COMPONENTS, Component
from jaxmarket.train.slots import SlotView


def snapshot_fields(state: Any, kind: str) -> dict:
    """The part of a learner state of ``kind`` a league snapshot freezes: what ``act``
    reads of the members, as its definition declares (:attr:`LearnerDef.snapshot`: Q
    tables, parameters, or every field)."""
    return LEARNERS[kind].snapshot(state)


@dataclass(frozen=True)
class League(Component):
    """Owns ``{g: {"pool": snapshot fields [pool_size, S K, ...],
    "count": snapshots taken (int32), "draw": [S E] each market's pool entry}}``."""

    leagues: Mapping[str, Population]
    learners: Mapping[str, Learner]
    view: SlotView
    kinds: Mapping[str, str]          # group -> its learner kind
    name = "league"

    def init(self, key, runner):
        E = self.view.num_markets
        league = {g: {"pool": jax.tree.map(lambda x: jnp.repeat(x[None], pop.pool_size, 0),
                                           snapshot_fields(runner.learners[g], self.kinds[g])),
                      "count": jnp.ones((), jnp.int32), "draw": jnp.zeros((E,), jnp.int32)}
                  for g, pop in self.leagues.items()}
        return self.with_state(runner, league)

    def act(self, runner, actions, obs, keys):
        """The live group's seats ``1 ..`` and the opponent groups' agents play the
        drawn snapshots."""
        actions = dict(actions)
        for g, pop in self.leagues.items():
            if pop.live_seats_only:   # live seat 0, then the snapshots' seats
                opponents = self.snapshot_actions(g, runner, obs[g][:, 1:],
                                                  jax.random.fold_in(keys[g], 1))
                actions[g] = jnp.concatenate([actions[g], opponents], axis=1)
            else:   # another group plays g's league snapshots
                actions[pop.opponents] = self.snapshot_actions(
                    g, runner, obs[pop.opponents], jax.random.fold_in(keys[g], 1))
        return actions

    def snapshot_actions(self, g: str, runner, seats: jax.Array, key: jax.Array) -> jax.Array:
        """The actions ``[E, n, P]`` of ``n`` snapshot-driven seats ``seats [E, n, D]``
        of every market, taken ``L`` at a time (``L``: the live seats per market the
        learner acts for, so seat ``(e, c L + l)`` plays the snapshot of the member of
        live slot ``(e, l)``): computed under each pool entry (``vmap``) and each block,
        and each market's drawn entry kept."""
        E = self.view.num_markets
        n, L = seats.shape[1], (1 if g in self.view.live_only else self.view.sizes[g])
        state = runner.learners[g]
        blocks = seats.reshape((E, n // L, L) + seats.shape[2:]).swapaxes(0, 1)
        blocks = blocks.reshape((n // L, E * L) + seats.shape[2:])          # [n/L, E L, D]

        def one_entry(entry):
            snap = state.replace(**entry)
            keys = jax.random.split(key, n // L)
            return jax.vmap(lambda o, k: materialize(self.learners[g].act(snap, o, k)[0]))(
                blocks, keys)                                               # [n/L, E L, P]
        every = jax.vmap(one_entry)(self.state(runner)[g]["pool"])              # [pool, n/L, E L, P]
        draw = jnp.repeat(self.state(runner)[g]["draw"], L)                     # [E L]
        chosen = jnp.take_along_axis(every, draw[None, None, :, None], axis=0)[0]
        chosen = chosen.reshape((n // L, E, L, chosen.shape[-1])).swapaxes(0, 1)
        return chosen.reshape((E, n, chosen.shape[-1]))

    def after_update(self, key, old, new, metrics):
        metrics, league = dict(metrics), {}
        for i, (g, pop) in enumerate(self.leagues.items()):
            league[g] = self.snapshot(jax.random.fold_in(jax.random.fold_in(key, 5), i), g,
                                      new.learners[g], self.state(old)[g], old.iteration + 1)
            metrics[f"league/{g}/pool"] = jnp.minimum(league[g]["count"],
                                                      pop.pool_size).astype(jnp.float32)
        return self.with_state(new, league), metrics

    def snapshot(self, key, g: str, state, league: dict, iteration) -> dict:
        """After the update of iteration ``iteration`` (1-based): every ``snapshot_every``
        iterations the members enter the pool (ring position ``count mod pool_size``);
        then each market draws its opponents' entry for the next iteration."""
        E, pop = self.view.num_markets, self.leagues[g]
        take = iteration % pop.snapshot_every == 0
        pos = league["count"] % pop.pool_size
        pool = jax.tree.map(lambda p, x: p.at[pos].set(jnp.where(take, x, p[pos])),
                            league["pool"], snapshot_fields(state, self.kinds[g]))
        count = league["count"] + take.astype(jnp.int32)
        k_latest, k_any = jax.random.split(key)
        newest = (count - 1) % pop.pool_size
        filled = jnp.minimum(count, pop.pool_size)
        latest = jax.random.uniform(k_latest, (E,)) < pop.latest_prob
        draw = jnp.where(latest, newest, jax.random.randint(k_any, (E,), 0, filled))
        return {"pool": pool, "count": count, "draw": draw.astype(jnp.int32)}


@COMPONENTS.register("league")
def from_plan(plan) -> League | None:
    leagues = {g: p for g, p in plan.populations.items() if p is not None and p.league}
    kinds = {g: plan.learner_settings[g][0] for g in leagues}
    return League(leagues, dict(plan.learners), SlotView.of(plan), kinds) if leagues else None
