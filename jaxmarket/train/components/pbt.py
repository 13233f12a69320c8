"""Population-based training as a loop component: after the learners' update, at the
end of every period, the bottom members of each seed copy a top member and perturb its
hyperparameters (:mod:`jaxmarket.train.pbt` holds the step itself and its config)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import jax
import jax.numpy as jnp

from jaxmarket.learners.population import Population
from jaxmarket.train import pbt as pbt_mod
from jaxmarket.train.components.base import COMPONENTS, Component, Step
from jaxmarket.train.components.population import member_rewards, member_weights


@dataclass(frozen=True)
class Pbt(Component):
    """Owns ``runner.pbt[g]``: the running sum ``[S, K]`` of each member's
    per-iteration mean reward since the last period boundary (its objective)."""

    configs: Mapping[str, pbt_mod.PbtConfig]
    pops: Mapping[str, Population]
    num_seeds: int
    num_envs: int
    sizes: Mapping[str, int]
    name = "pbt"

    def init(self, key, runner):
        learners = dict(runner.learners)
        for i, (g, cfg) in enumerate(self.configs.items()):   # per-member initial hyper
            learners[g] = pbt_mod.initial_hyper(
                jax.random.fold_in(jax.random.fold_in(key, 4), i), cfg, learners[g],
                self.num_seeds)
        objective = {g: jnp.zeros((self.num_seeds, cfg.size), jnp.float32)
                     for g, cfg in self.configs.items()}
        return runner.replace(learners=learners, pbt=objective)

    def step_metrics(self, step: Step):
        """PBT's objective signal, per seed and member (popped before metrics are
        reported)."""
        return {f"{pbt_mod.OBJECTIVE}{g}": member_rewards(
                    step, g, member_weights(self.pops[g], self.num_envs, self.sizes[g]),
                    self.num_seeds) for g in self.configs}, None

    def after_update(self, key, old, new, metrics):
        metrics = dict(metrics)
        learners, objective = dict(new.learners), {}
        for i, (g, cfg) in enumerate(self.configs.items()):
            learners[g], objective[g], events = self.step(
                jax.random.fold_in(jax.random.fold_in(key, 3), i), cfg, learners[g],
                old.pbt[g] + metrics.pop(f"{pbt_mod.OBJECTIVE}{g}"), old.iteration + 1)
            metrics.update({f"{pbt_mod.PREFIX}{g}/{k}": v for k, v in events.items()})
        return new.replace(learners=learners, pbt=objective), metrics

    @staticmethod
    def step(key, cfg: pbt_mod.PbtConfig, state, total, iteration):
        """After the learners' update of iteration ``iteration`` (1-based): a PBT step
        when a period ends at or after ``start``; the objective sum restarts at every
        period boundary."""
        boundary = iteration % cfg.period == 0
        act = boundary & (iteration >= cfg.start)
        tree = pbt_mod.members(state, cfg.kind)
        objective = total / cfg.period

        def step(tree):
            return pbt_mod.pbt_step(key, tree, objective, cfg)

        def skip(tree):
            return tree, pbt_mod.no_events(tree, objective, cfg)

        # only the member leaves go through the branch (not the sample buffers)
        tree, events = jax.lax.cond(act, step, skip, tree)
        total = jnp.where(boundary, jnp.zeros_like(total), total)
        return pbt_mod.with_members(state, tree), total, events


@COMPONENTS.register("pbt")
def from_plan(plan) -> Pbt | None:
    if not plan.pbt:
        return None
    return Pbt(dict(plan.pbt), {g: p for g, p in plan.populations.items() if p is not None},
               plan.train.num_seeds, plan.train.num_envs,
               {g: plan.env.num_agents(g) for g in plan.groups})
