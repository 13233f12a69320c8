"""The protocol of a loop component: one optional feature of the training iteration.

A component is a frozen dataclass holding its static settings (resolved from the
:class:`~jaxmarket.train.plan.RunPlan`) and owning one entry of the
:class:`~jaxmarket.train.loop.Runner`'s ``components`` mapping, under its ``name``
(:meth:`Component.state`, :meth:`Component.with_state`). The loop skeleton
(:func:`jaxmarket.train.loop.make_train`) calls every component's hooks, in the order
of the chain (:data:`COMPONENTS`, registration order), at named points of an iteration; each hook is a pure
function that returns what it changes. The defaults do nothing, so a component defines
only the hooks it needs::

    init(key, runner) -> runner                  once, from the run's key (fold_in its own)
    market_params(params, iteration) -> params   before the rollout
    observe(runner, params, obs, env_state=, prices=) -> obs    before acting, and on the
                                                 final observations (prices just quoted)
    act(runner, actions, obs, keys) -> actions   after the learners acted (market order)
    step_metrics(step) -> (metrics, outputs)     after each market step (Step below)
    after_rollout(key, old, new, traj, metrics, outputs) -> (new, traj, metrics)
    after_update(key, old, new, metrics) -> (new, metrics)   after the learners' updates
    assignment(runner) -> {group: (gather, scatter)}   the slot order in force (populations)

Chunk outputs whose name starts with the component's ``host_prefix`` are its own
host-side data, not metrics: the host pops them after every chunk and hands them to the
component's :class:`HostOutput` (``host(plan, run_dir)``), which writes the component's
files in the run directory.

``old`` is the runner at the start of the iteration, ``new`` the one being built;
``metrics`` are the iteration's (means over its rollout), ``outputs[name]`` what this
component's ``step_metrics`` returned at every step, stacked ``[T, ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import jax
from flax import struct

from jaxmarket.config.registry import Registry


#: ``name -> from_plan(plan) -> Component | None``: the loop's components, in hook order
#: (registration order). ``from_plan`` returns None where the plan does not use it.
COMPONENTS: Registry[Callable[[Any], "Component | None"]] = Registry("loop component")


@struct.dataclass
class Step:
    """One market step of the rollout, as the step hooks see it.

    ``obs``: the observations the learners acted on (components' features appended),
    ``env_obs``: the market's own; ``actions``: every group's market actions ``[E, A, P]``;
    ``batch``: every group's :class:`~jaxmarket.learners.base.Transition` in its learner's
    slot order; ``before``: the market state the step started from; ``assignment``:
    the population assignment in force."""

    obs: Any
    env_obs: Any
    actions: Any
    rewards: Any
    info: Any
    done: jax.Array
    before: Any
    batch: Any
    assignment: Any
    params: Any


@dataclass(frozen=True)
class Component:
    """Base class: every hook is the identity. ``name`` keys the component's step
    outputs (the name it is registered under in :data:`COMPONENTS`)."""

    name = "component"
    #: chunk outputs under this prefix are the component's host data (None: it has none)
    host_prefix: ClassVar[str | None] = None
    #: its metric families (``<family>/...``) whose non-finite values stop a run under
    #: ``train.stop_on_nan``, beside the market's
    nan_checked: ClassVar[tuple[str, ...]] = ()

    def state(self, runner: Any, default: Any = None) -> Any:
        """This component's entry of ``runner.components``."""
        return runner.components.get(self.name, default)

    def with_state(self, runner: Any, value: Any) -> Any:
        """``runner`` with this component's entry of ``runner.components`` set."""
        return runner.replace(components={**runner.components, self.name: value})

    @property
    def in_loop_only(self) -> bool:
        """Whether it acts or observes inside the training loop (a policy replayed
        outside the loop cannot reproduce it)."""
        return type(self).act is not Component.act or type(self).observe is not Component.observe

    def assignment(self, runner: Any) -> dict:
        return {}

    def host(self, plan: Any, run_dir: Any) -> "HostOutput | None":
        return None

    def init(self, key: jax.Array, runner: Any) -> Any:
        return runner

    def market_params(self, params: Any, iteration: jax.Array) -> Any:
        return params

    def observe(self, runner: Any, params: Any, obs: dict, env_state: Any = None,
                prices: Any = None) -> dict:
        return obs

    def act(self, runner: Any, actions: dict, obs: dict, keys: dict) -> dict:
        return actions

    def step_metrics(self, step: Step) -> tuple[dict, Any]:
        return {}, None

    def after_rollout(self, key: jax.Array, old: Any, new: Any, traj: dict, metrics: dict,
                      outputs: Any) -> tuple[Any, dict, dict]:
        return new, traj, metrics

    def after_update(self, key: jax.Array, old: Any, new: Any, metrics: dict
                     ) -> tuple[Any, dict]:
        return new, metrics


class HostOutput:
    """A component's files in the run directory, written by the host (process 0 of a
    distributed run) between chunks:

    * ``start(runner, iteration)``: before the first chunk of a start or resume at
      ``iteration`` (drop rows after it; write headers);
    * ``chunk(runner, outputs, iteration, length)``: after the chunk of ``length``
      iterations that started at ``iteration``; ``outputs`` are the chunk outputs under
      the component's ``host_prefix`` (``[length, ...]`` each).
    """

    def start(self, runner: Any, iteration: int) -> None:
        pass

    def chunk(self, runner: Any, outputs: dict, iteration: int, length: int) -> None:
        pass


def quoted(info: dict, g: str, sellers: frozenset) -> jax.Array:
    """A group's actions in force after a step: sellers' prices, consumers' budgets."""
    return info["prices"][g] if g in sellers else info["budgets"][g]


def served(info: dict, g: str, sellers: frozenset) -> jax.Array:
    """A group's traffic: queries a seller served, or a consumer group got served."""
    return info["traffic"][g] if g in sellers else info["queries"][g] - info["unserved"][g]
