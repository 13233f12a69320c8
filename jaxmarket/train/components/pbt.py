"""Population-based training as a loop component: after the learners' update, at the
end of every period, the bottom members of each seed copy a top member and perturb its
hyperparameters (:mod:`jaxmarket.train.pbt` holds the step itself and its config)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import jax
import jax.numpy as jnp

from jaxmarket.learners.population import Population
from jaxmarket.train import pbt as pbt_mod
from jaxmarket.train.components.base import COMPONENTS, Component, HostOutput, Step
from jaxmarket.train.components.population import member_rewards, member_weights
from jaxmarket.train.tracking import CsvMetrics

#: the run directory's file of PBT events (one row per replaced member and
#: hyperparameter: ``pbt_mod.CSV_COLUMNS``)
EVENTS_FILE = "pbt.csv"


class PbtEvents(HostOutput):
    """``pbt.csv``: the header from the start (a run may have no event yet), then each
    chunk's events (``pbt/...`` chunk outputs, :func:`jaxmarket.train.pbt.event_rows`)."""

    def __init__(self, run_dir: Path):
        self.rows = CsvMetrics(Path(run_dir) / EVENTS_FILE)

    def start(self, runner, iteration: int) -> None:
        self.rows.truncate_after(iteration)
        if not self.rows.path.exists():
            self.rows.path.parent.mkdir(parents=True, exist_ok=True)
            with self.rows.path.open("w") as f:   # synced, as every append
                f.write(",".join(pbt_mod.CSV_COLUMNS) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def chunk(self, runner, outputs: dict, iteration: int, length: int) -> None:
        if outputs:
            self.rows.append(pbt_mod.event_rows(outputs, iteration))


@dataclass(frozen=True)
class Pbt(Component):
    """Owns ``{g: [S, K]}``: the running sum of each member's
    per-iteration mean reward since the last period boundary (its objective)."""

    configs: Mapping[str, pbt_mod.PbtConfig]
    pops: Mapping[str, Population]
    num_seeds: int
    num_envs: int
    sizes: Mapping[str, int]
    name = "pbt"
    host_prefix = pbt_mod.PREFIX

    def host(self, plan, run_dir) -> PbtEvents:
        return PbtEvents(run_dir)

    def init(self, key, runner):
        learners = dict(runner.learners)
        for i, (g, cfg) in enumerate(self.configs.items()):   # per-member initial hyper
            learners[g] = pbt_mod.initial_hyper(
                jax.random.fold_in(jax.random.fold_in(key, 4), i), cfg, learners[g],
                self.num_seeds)
        objective = {g: jnp.zeros((self.num_seeds, cfg.size), jnp.float32)
                     for g, cfg in self.configs.items()}
        return self.with_state(runner.replace(learners=learners), objective)

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
                self.state(old)[g] + metrics.pop(f"{pbt_mod.OBJECTIVE}{g}"), old.iteration + 1)
            metrics.update({f"{pbt_mod.PREFIX}{g}/{k}": v for k, v in events.items()})
        return self.with_state(new.replace(learners=learners), objective), metrics

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
