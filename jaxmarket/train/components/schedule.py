"""``train.schedule``: market parameters that change at given iterations."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.train.components.base import COMPONENTS, Component
from jaxmarket.train.config import ScheduleEntry, schedule_leaf, with_schedule_leaf


@dataclass(frozen=True)
class Schedule(Component):
    """Applies the changes due at this (0-based) iteration to the params the runner
    carries (so they persist, and a checkpoint holds them)::

        leaf <- value  where iteration == at
    """

    entries: tuple[ScheduleEntry, ...]
    name = "schedule"

    def market_params(self, params, iteration: jax.Array):
        for entry in self.entries:   # static: the config's list
            leaf = schedule_leaf(params, entry.path)
            value = jnp.asarray(np.asarray(entry.value, np.float32))
            params = with_schedule_leaf(params, entry.path,
                                        jnp.where(iteration == entry.at, value, leaf))
        return params


@COMPONENTS.register("schedule")
def from_plan(plan) -> Schedule | None:
    return Schedule(tuple(plan.schedule)) if plan.schedule else None
