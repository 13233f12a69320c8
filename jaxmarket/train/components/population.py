"""Populations: which member drives which market slot, redrawn as episodes end, and
the per-member and cross-play metrics (``reward/<g>/m<k>``, ``price/<g>/m<k>``,
``crossplay/<g>/m<i>/m<j>``, ``mapping/<g>/repaired``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.learners.population import (Population, assignment_from_members,
                                           custom_members, draw_assignment,
                                           episodes_trigger_draw)
from jaxmarket.train.components.base import COMPONENTS, Component, HostOutput, Step, quoted
from jaxmarket.train.devices import to_host
from jaxmarket.train.slots import SlotView
from jaxmarket.train.tracking import CsvMetrics

#: the run directory's file of the assignments in force (groups with a dynamic population)
MAPPING_FILE = "mapping.csv"


def member_weights(pop: Population, num_envs: int, num_agents: int) -> jax.Array:
    """``[E * A, K]``: column ``k`` averages member ``k``'s slots of a seed."""
    layout = pop.layout(num_envs, num_agents)
    onehot = (layout[:, None] == np.arange(pop.size)[None]).astype(np.float32)
    return jnp.asarray(onehot / np.maximum(onehot.sum(0, keepdims=True), 1))


def member_rewards(step: Step, g: str, weights: jax.Array, num_seeds: int) -> jax.Array:
    """``[S, K]``: each member's mean reward over its slots of each seed."""
    return step.batch[g].reward.reshape(num_seeds, -1) @ weights


def assignment_of(runner) -> dict:
    """The population assignment in force, ``{group: (gather, scatter)}`` ``[S E A]``
    int32 each, of the groups with a dynamic population (none: ``{}``)."""
    return runner.components.get(Populations.name, {})


@dataclass(frozen=True)
class Populations(Component):
    """The groups with a population (``learners.<g>.population`` / ``mapping``); the
    dynamic ones (resampled, custom) own the slot assignment in force,
    ``{g: (gather, scatter)}`` (:func:`assignment_of`)."""

    pops: Mapping[str, Population]
    num_seeds: int
    num_envs: int
    sellers: frozenset
    view: SlotView
    name = "population"

    @property
    def dynamic(self) -> tuple[str, ...]:
        return tuple(g for g, p in self.pops.items() if p.dynamic)

    def draw(self, key: jax.Array, episode: jax.Array) -> tuple[dict, dict]:
        """A fresh assignment of every dynamic group, and the slots a custom mapping's
        draw had to repair (``mapping/<g>/repaired``)."""
        out, repaired = {}, {}
        S, E, sizes = self.num_seeds, self.num_envs, self.view.sizes
        for i, g in enumerate(self.dynamic):
            k = jax.random.fold_in(key, i)
            if self.pops[g].custom:
                members = custom_members(k, self.pops[g], episode, S, E, sizes[g])
                *out[g], repaired[g] = assignment_from_members(members, self.pops[g].size)
                out[g] = tuple(out[g])
            else:
                out[g] = draw_assignment(k, self.pops[g], S, E, sizes[g])
        return out, repaired

    def init(self, key, runner):
        # the first assignment is drawn from a key of its own (fold_in): scenarios without
        # a resampled population keep exactly the random streams they had
        if not self.dynamic:
            return runner
        assignment = self.draw(jax.random.fold_in(key, 1), jnp.zeros((), jnp.int32))[0]
        return self.with_state(runner, assignment)

    def assignment(self, runner) -> dict:
        return assignment_of(runner)

    def host(self, plan, run_dir) -> "MappingLog | None":
        return MappingLog(self, run_dir) if self.dynamic else None

    def members(self, runner) -> dict[str, np.ndarray]:
        """``{group: [S, E, A]}`` the member driving each market slot under the runner's
        assignment: ``layout[scatter[i] mod E A]``."""
        out = {}
        for g in self.dynamic:
            scatter = to_host(assignment_of(runner)[g][1])
            n = scatter.size // self.num_seeds
            layout = self.pops[g].layout(self.num_envs, n // self.num_envs)
            out[g] = layout[scatter % n].reshape(self.num_seeds, self.num_envs, -1)
        return out

    def step_metrics(self, step: Step):
        metrics = {}
        S = self.num_seeds
        for g, pop in self.pops.items():
            w = member_weights(pop, self.num_envs, self.view.sizes[g])
            r = member_rewards(step, g, w, S)                                        # [S, K]
            price = quoted(step.info, g, self.sellers)
            pr = jnp.einsum("sjp,jk->kp", self.view.learner_view(price, g, step.assignment)
                            .reshape((S, -1, price.shape[-1])), w) / S               # [K, P]
            for k in range(w.shape[1]):   # static: one metric column per member
                metrics[f"reward/{g}/m{k}"] = r[:, k].mean()
                metrics[f"price/{g}/m{k}"] = pr[k]
            if self.view.sizes[g] > 1 and not pop.league:
                metrics.update(self.cross_play(g, step.rewards[g], step.assignment))
        return metrics, None

    def cross_play(self, g: str, reward: jax.Array, assignment: Mapping) -> dict:
        """``crossplay/<g>/m<i>/m<j>``: the mean reward of member ``i``'s slots in the
        markets where another agent of the group is member ``j`` (NaN where they never
        met this step)::

            C[i, j] = sum_{x, a} r[x, a] [m(x, a) = i] [j among the others of market x]
                      / sum_{x, a} [m(x, a) = i] [j among the others of market x]
        """
        pop, A = self.pops[g], self.view.sizes[g]
        K, E = pop.size, self.view.num_markets
        slot_member = jnp.asarray(np.tile(pop.layout(self.num_envs, A), self.num_seeds))
        member = self.view.to_market(slot_member, g, assignment).reshape(E, A)  # market order
        onehot = jax.nn.one_hot(member, K, dtype=jnp.float32)                   # [E, A, K]
        others = (onehot.sum(1, keepdims=True) - onehot) > 0                    # [E, A, K]
        total = jnp.einsum("xa,xai,xaj->ij", reward, onehot, others)
        count = jnp.einsum("xai,xaj->ij", onehot, others)
        mean = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
        return {f"crossplay/{g}/m{i}/m{j}": mean[i, j] for i in range(K) for j in range(K)}

    def after_rollout(self, key, old, new, traj, metrics, outputs):
        """A new draw for the groups whose mapping redraws after the episodes that just
        ended; the assignment stays fixed within a rollout (a learner slot's trajectory
        stays one market slot's)."""
        if not self.dynamic:
            return new, traj, metrics
        redraw = {g: episodes_trigger_draw(self.pops[g], old.episodes, new.episodes)
                  for g in self.dynamic}
        # not a split: other streams unchanged
        fresh, repaired = self.draw(jax.random.fold_in(key, 2), new.episodes)
        assignment = {g: jax.tree.map(lambda a, b: jnp.where(redraw[g], a, b),
                                      fresh[g], assignment_of(old)[g]) for g in self.dynamic}
        metrics = dict(metrics)
        for g, count in repaired.items():
            metrics[f"mapping/{g}/repaired"] = jnp.where(redraw[g], count, 0).astype(jnp.float32)
        return self.with_state(new, assignment), traj, metrics


class MappingLog(HostOutput):
    """``mapping.csv``: the assignment in force at the start, then after each chunk
    that changed it (rows: iteration, group, seed, market, members)."""

    def __init__(self, component: Populations, run_dir: Path):
        self.component = component
        self.rows = CsvMetrics(Path(run_dir) / MAPPING_FILE)
        self.logged: dict[str, np.ndarray] = {}

    @staticmethod
    def rows_of(members: dict[str, np.ndarray], iteration: int) -> list[dict]:
        """From ``iteration`` on, market ``market`` of seed ``seed`` has its agents driven
        by ``members`` (space-separated, agent order)."""
        return [{"iteration": iteration, "group": g, "seed": s, "market": e,
                 "members": " ".join(str(int(k)) for k in m[s, e])}
                for g, m in members.items() for s in range(m.shape[0])
                for e in range(m.shape[1])]

    def start(self, runner, iteration: int) -> None:
        self.logged = self.component.members(runner)
        self.rows.truncate_after(iteration)
        if iteration == 0:
            self.rows.path.parent.mkdir(parents=True, exist_ok=True)
            self.rows.append(self.rows_of(self.logged, 0))

    def chunk(self, runner, outputs: dict, iteration: int, length: int) -> None:
        now = self.component.members(runner)
        changed = {g: m for g, m in now.items() if not np.array_equal(m, self.logged[g])}
        self.rows.append(self.rows_of(changed, iteration + length))
        self.logged = now


@COMPONENTS.register("population")
def from_plan(plan) -> Populations | None:
    pops = {g: p for g, p in plan.populations.items() if p is not None}
    if not pops:
        return None
    sellers = frozenset(g.name for g in plan.env.spec.sellers)
    return Populations(pops, plan.train.num_seeds, plan.train.num_envs, sellers,
                       SlotView.of(plan))
