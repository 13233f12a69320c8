"""Fixed policies as learners: ``constant``, ``schedule``, ``undercut`` and ``random``.

They follow the learner protocol (``init``/``act``/``update``) so that fixed agents sit in
a group like any learner, but nothing is trained: ``update`` is a no-op, except that the
learner state counts time steps (``state["t"]``, incremented by the number of
transitions ``T`` of each batch) for ``schedule``.

* ``constant``  -- ``action[a, p] = value[a, p]`` (``value``: a number, one per product or
  ``[A, P]``; must lie within the action bounds).
* ``schedule``  -- ``action = values[k]`` with ``k`` the last index such that
  ``timestamps[k] <= t`` (before the first timestamp the first value is used); ``t`` is
  the number of transitions passed to ``update`` so far, so when the training loop calls
  ``update`` after every step, ``act`` at step ``t`` sees ``t``.
* ``undercut``  -- ``action = clip(min_competitor_price - amount, action_low, action_high)``.
  The competitors' minimum price per product is read from ``obs[:, :P]``: **the group's
  observation must start with the ``competitor_prices`` summary ``min``** (the learner
  checks ``obs_dim >= P`` but cannot check which feature comes first).
* ``random``    -- ``action ~ Uniform(action_low, action_high)`` independently per slot and
  product (the legacy random traffic generator, e.g. for consumer groups whose action is a
  budget); the bounds must be finite.

``aux`` is empty for every fixed policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping, resolve_entity_array
from jaxmarket.learners.base import (
    LEARNERS,
    Learner,
    LearnerDef,
    LearnerSpec,
    StaticArray,
    Transition,
)

# ----------------------------------------------------------------------------- helpers
# (shared with the bandit modules)


def resolve_hyper(fields: Mapping[str, Field], hyper: Mapping[str, Any] | None,
                  kind: str) -> dict[str, Any]:
    """Validate ``hyper`` against ``fields`` and fill defaults (idempotent, so a mapping
    already validated by the group loader passes through unchanged)."""
    return check_mapping(fields, hyper, f"learners.{kind}")


def entity_per_slot(field: Field, value: Any, where: str, spec: LearnerSpec) -> np.ndarray:
    """An ``entity`` hyper-parameter (number / per-product list / ``[A, P]``) as float32
    ``[A, P]``. In a spec the training loop tiled over several markets (slot ``m n + j``:
    agent ``j`` of market ``m``, no population), a one-market ``[n, P]`` array (one row
    per agent of the group, what a config can name) is every market's."""
    n, A = spec.agents_per_market, spec.num_agents
    if A != n and _one_market_rows(value, n) and np.array_equal(
            np.asarray(spec.index()) % max(spec.policies // spec.num_sessions, 1),
            np.arange(A) % n) and spec.policies == n * spec.num_sessions:
        one = resolve_entity_array(field, value, where, n, spec.num_products)
        return np.tile(one, (spec.num_markets, 1))
    return resolve_entity_array(field, value, where, A, spec.num_products)


def _one_market_rows(value: Any, n: int) -> bool:
    """``value`` is a list of ``n`` rows (a ``[n, P]`` or ``[n]`` array)."""
    return isinstance(value, (list, tuple)) and len(value) == n and all(
        isinstance(v, (list, tuple)) for v in value)


def entity_per_policy(field: Field, value: Any, where: str, spec: LearnerSpec) -> np.ndarray:
    """An ``entity`` hyper-parameter as float32 ``[num_policies, P]``: each policy takes
    the row of the first slot mapped to it (row 0 for a policy with no slot)."""
    per_slot = entity_per_slot(field, value, where, spec)
    index = np.asarray(spec.index())
    rows = np.zeros(spec.policies, dtype=np.int64)
    for slot in range(spec.num_agents - 1, -1, -1):  # static, config time only
        rows[index[slot]] = slot
    return per_slot[rows]


def bounds(spec: LearnerSpec) -> tuple[np.ndarray, np.ndarray]:
    low = np.asarray(spec.action_low, dtype=np.float32).reshape(spec.num_agents, spec.num_products)
    high = np.asarray(spec.action_high, dtype=np.float32).reshape(spec.num_agents,
                                                                 spec.num_products)
    return low, high


def _check_within(where: str, value: Any, arr: np.ndarray, spec: LearnerSpec) -> None:
    low, high = bounds(spec)
    if np.any(arr < low) or np.any(arr > high):
        raise ConfigError(where, value, "values within the group's action bounds "
                          f"[{float(low.min()):g}, {float(high.max()):g}]")


def _init_counter(key: jax.Array, spec: LearnerSpec) -> dict:
    del key, spec
    return {"t": jnp.zeros((), jnp.int32)}


def _count_steps(state: dict, batch: Transition) -> tuple[dict, dict]:
    steps = batch.reward.shape[0]
    return {"t": state["t"] + jnp.int32(steps)}, {}


# ----------------------------------------------------------------------------- constant

CONSTANT_FIELDS = {
    "value": Field(kind="entity", doc="the action: a number, one per product, or [A, P]"),
}


@dataclass(frozen=True)
class ConstantSettings:
    action: StaticArray            # [A, P] float32


def constant_act(settings: ConstantSettings, state, obs, key):
    del state, obs, key
    return jnp.asarray(settings.action.array), {}


def make_constant(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    h = resolve_hyper(CONSTANT_FIELDS, hyper, "constant")
    where = "learners.constant.value"
    value = entity_per_slot(CONSTANT_FIELDS["value"], h["value"], where, spec)
    _check_within(where, h["value"], value, spec)
    settings = ConstantSettings(action=StaticArray(value))
    return Learner(_init_counter, partial(constant_act, settings), _count_steps)


# ----------------------------------------------------------------------------- schedule

SCHEDULE_FIELDS = {
    "timestamps": Field(kind="ints", low=0, doc="strictly increasing step numbers"),
    "values": Field(kind="any", doc="one action per timestamp: a number, a per-product "
                                    "list or an [A, P] array each"),
}


@dataclass(frozen=True)
class ScheduleSettings:
    timestamps: tuple[int, ...]    # strictly increasing
    table: StaticArray             # [K, A, P] float32: the action from timestamps[k] on


def schedule_act(settings: ScheduleSettings, state, obs, key):
    del obs, key
    stamps = jnp.asarray(np.asarray(settings.timestamps, dtype=np.int64), dtype=jnp.int32)
    k = jnp.searchsorted(stamps, state["t"], side="right") - 1
    return jnp.asarray(settings.table.array)[jnp.maximum(k, 0)], {}


def schedule_settings(hyper: Mapping[str, Any], spec: LearnerSpec) -> ScheduleSettings:
    h = resolve_hyper(SCHEDULE_FIELDS, hyper, "schedule")
    stamps = np.asarray(h["timestamps"], dtype=np.int64)
    values = h["values"]
    if stamps.size == 0:
        raise ConfigError("learners.schedule.timestamps", h["timestamps"], "a non-empty list")
    if np.any(np.diff(stamps) <= 0):
        raise ConfigError("learners.schedule.timestamps", h["timestamps"],
                          "strictly increasing integers")
    if not isinstance(values, (list, tuple)) or len(values) != stamps.size:
        raise ConfigError("learners.schedule.values", values,
                          f"a list of {stamps.size} values (one per timestamp)")
    entity = Field(kind="entity")
    table = []
    for k, v in enumerate(values):
        where = f"learners.schedule.values[{k}]"
        arr = entity_per_slot(entity, v, where, spec)
        _check_within(where, v, arr, spec)
        table.append(arr)
    return ScheduleSettings(timestamps=tuple(int(t) for t in stamps),
                            table=StaticArray(np.stack(table)))


def make_schedule(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    settings = schedule_settings(hyper, spec)
    return Learner(_init_counter, partial(schedule_act, settings), _count_steps)


# ----------------------------------------------------------------------------- undercut

UNDERCUT_FIELDS = {
    "amount": Field(kind="entity", default=0.01,
                    doc="how far below the competitors' minimum price to quote"),
}


@dataclass(frozen=True)
class UndercutSettings:
    num_products: int
    amount: StaticArray            # [A, P] float32
    low: StaticArray               # [A, P] float32 action bounds
    high: StaticArray


def undercut_act(settings: UndercutSettings, state, obs, key):
    del state, key
    competitor_min = obs[:, :settings.num_products]
    amount = jnp.asarray(settings.amount.array)
    low, high = jnp.asarray(settings.low.array), jnp.asarray(settings.high.array)
    return jnp.clip(competitor_min - amount, low, high), {}


def make_undercut(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    h = resolve_hyper(UNDERCUT_FIELDS, hyper, "undercut")
    num_products = spec.num_products
    if spec.obs_dim < num_products:
        raise ConfigError("learners.undercut", f"obs_dim={spec.obs_dim}",
                          f"an observation whose first {num_products} features are the "
                          "competitor_prices summary 'min' (obs_dim >= num_products)")
    amount = entity_per_slot(UNDERCUT_FIELDS["amount"], h["amount"],
                             "learners.undercut.amount", spec)
    low, high = bounds(spec)
    settings = UndercutSettings(num_products=num_products, amount=StaticArray(amount),
                                low=StaticArray(low), high=StaticArray(high))
    return Learner(_init_counter, partial(undercut_act, settings), _count_steps)


# ----------------------------------------------------------------------------- random

RANDOM_FIELDS: dict[str, Field] = {}


@dataclass(frozen=True)
class RandomSettings:
    low: StaticArray               # [A, P] float32 finite action bounds
    high: StaticArray


def random_act(settings: RandomSettings, state, obs, key):
    del state, obs
    low, high = jnp.asarray(settings.low.array), jnp.asarray(settings.high.array)
    return jax.random.uniform(key, low.shape, minval=low, maxval=high), {}


def make_random(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    resolve_hyper(RANDOM_FIELDS, hyper, "random")
    low, high = bounds(spec)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError("learners.random", "infinite action bounds",
                          "finite action_low and action_high for every slot and product")
    settings = RandomSettings(low=StaticArray(low), high=StaticArray(high))
    return Learner(_init_counter, partial(random_act, settings), _count_steps)


# fixed rules learn nothing, so they play under either move order (an action out of turn
# is simply not taken up by the market), and the equilibrium solver counts their groups
# as part of the environment (``random`` draws with its key: the period is random)
_EITHER = ("simultaneous", "alternating")
LEARNERS.register(LearnerDef("constant", make_constant, CONSTANT_FIELDS,
                             doc="a constant action per slot and product", move_orders=_EITHER,
                             fixed_policy=True))
LEARNERS.register(LearnerDef("schedule", make_schedule, SCHEDULE_FIELDS,
                             doc="piecewise-constant actions switched at given steps",
                             move_orders=_EITHER, fixed_policy=True))
LEARNERS.register(LearnerDef("undercut", make_undercut, UNDERCUT_FIELDS,
                             doc="quote the competitors' minimum price minus an amount "
                                 "(observation must start with competitor_prices min)",
                             move_orders=_EITHER, fixed_policy=True))
LEARNERS.register(LearnerDef("random", make_random, RANDOM_FIELDS,
                             doc="uniform random actions within the action bounds",
                             move_orders=_EITHER, fixed_policy=True, random_policy=True))

__all__ = [
    "bounds",
    "constant_act",
    "ConstantSettings",
    "entity_per_policy",
    "entity_per_slot",
    "make_constant",
    "make_random",
    "make_schedule",
    "make_undercut",
    "random_act",
    "RandomSettings",
    "resolve_hyper",
    "schedule_act",
    "ScheduleSettings",
    "undercut_act",
    "UndercutSettings",
]
