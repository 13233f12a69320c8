"""The learner protocol: three pure functions over a learner-state pytree.

    init(key, spec: LearnerSpec) -> state
    act(state, obs, key) -> (action, aux)          obs [A, D] -> action [A, P]
    update(state, batch: Transition) -> (state, metrics)

``A`` is the number of agent slots of the group the learner drives. Every learner keeps
its trainable parameters stacked on a leading *policy* axis ``[num_policies, ...]`` and
an explicit ``policy_index`` ``[A]`` (int32) saying which parameter set drives which agent
slot; with the default identity mapping each agent has its own parameters. Populations,
self-play and agent-to-policy mappings are therefore data, not code paths: ``act`` does
``params_for_slots = tree_map(lambda x: x[policy_index], params)`` and ``vmap``s over
slots; ``update`` gathers per-slot gradients/statistics back onto policies (a
``segment_sum`` over ``policy_index``).

``aux`` is a dict of per-agent arrays the learner needs later (log-probabilities,
value estimates, discrete action indices); the training loop stores it in the
``Transition`` unchanged. All functions are jittable and contain no Python loop over
agents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.fields import Field


@dataclass(frozen=True)
class LearnerSpec:
    """Static description of the agent group a learner drives."""

    num_agents: int                 # agent slots A
    obs_dim: int                    # D (0 for bandits)
    num_products: int               # P: actions are [A, P]
    action_low: np.ndarray          # [A, P] float32
    action_high: np.ndarray         # [A, P] float32
    num_policies: int | None = None  # parameter sets; None -> num_agents
    policy_index: tuple[int, ...] | None = None  # slot -> policy; None -> identity
    # Optional one-shot payoff of a joint action *in one market*, provided by the market
    # when a learner needs it (e.g. Q-learning's initial Q):
    # payoff(actions [agents_per_market, P]) -> rewards [agents_per_market], holding every
    # other group at its reset state. Jittable.
    payoff: Any = field(default=None, compare=False)
    # The training loop folds independent runs ("sessions", i.e. seeds) and markets into
    # the slot and policy axes: slots = num_markets * agents_per_market, ordered market by
    # market; the markets of session s are s*M/S .. (s+1)*M/S - 1 and its policies
    # s*K .. s*K + K - 1 (K = policies // num_sessions). Nothing may be shared across
    # sessions: learners that keep statistics over several policies (a convergence
    # counter, say) keep them per session.
    num_markets: int = 1
    num_sessions: int = 1

    @property
    def agents_per_market(self) -> int:
        return self.num_agents // self.num_markets

    @property
    def policies(self) -> int:
        return self.num_agents if self.num_policies is None else self.num_policies

    def index(self) -> jax.Array:
        if self.policy_index is None:
            return jnp.arange(self.num_agents, dtype=jnp.int32) % self.policies
        return jnp.asarray(self.policy_index, dtype=jnp.int32)


@struct.dataclass
class Transition:
    """A batch of experience for one group, time-major: ``[T, A, ...]``."""

    obs: jax.Array        # [T, A, D]
    action: jax.Array     # [T, A, P]
    reward: jax.Array     # [T, A]
    next_obs: jax.Array   # [T, A, D]
    done: jax.Array       # [T, A] episode ended after this step
    aux: Any              # dict of [T, A, ...] arrays returned by ``act``


class Learner(NamedTuple):
    init: Callable[[jax.Array, LearnerSpec], Any]
    act: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, dict]]
    update: Callable[[Any, Transition], tuple[Any, dict]]


@dataclass(frozen=True)
class LearnerDef:
    """Registry entry: ``make(hyper, spec) -> Learner`` with ``hyper`` validated
    against ``hyper_fields`` (a ``ConfigError`` names ``learners.<group>.<field>``)."""

    kind: str
    make: Callable[[Mapping[str, Any], LearnerSpec], Learner]
    hyper_fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""


LEARNERS: dict[str, LearnerDef] = {}


def register(definition: LearnerDef) -> LearnerDef:
    LEARNERS[definition.kind] = definition
    return definition


def gather_policies(params: Any, policy_index: jax.Array) -> Any:
    """Per-slot view of policy-stacked parameters: ``x[policy_index]`` on every leaf."""
    return jax.tree.map(lambda x: x[policy_index], params)


def scatter_mean(values: Any, policy_index: jax.Array, num_policies: int) -> Any:
    """Average per-slot values ``[A, ...]`` onto policies ``[num_policies, ...]``
    (policies with no slot get zeros)."""
    counts = jax.ops.segment_sum(jnp.ones_like(policy_index, dtype=jnp.float32), policy_index,
                                 num_segments=num_policies)

    def one(x):
        total = jax.ops.segment_sum(x, policy_index, num_segments=num_policies)
        shape = (num_policies,) + (1,) * (x.ndim - 1)
        return total / jnp.maximum(counts, 1.0).reshape(shape)

    return jax.tree.map(one, values)
