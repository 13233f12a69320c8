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

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.fields import Field
from jaxmarket.config.registry import Registry


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
    # POI observations (learners.<g>.external_model.poi_obs with emb_size > 0): the last
    # k observation features go through a learned Dense(size) + tanh of the policy
    obs_embed: tuple[int, int] | None = None
    # Alternating moves (market.move_order: alternating): (n, first) -- the market's n
    # sellers move in turn, seller k only in periods t = k (mod n), and slot j of each
    # market is seller first + j (None: everyone moves every period)
    turns: tuple[int, int] | None = None
    # Why ``payoff`` is *not* the exact one-shot payoff of a period against the actual
    # actions (another agent group moves too, stochastic demand, a random distributor),
    # or None when it is: what counterfactual ("full feedback") updates rely on
    payoff_caveat: str | None = None
    # Which observed features are not on the scale of the group's actions (named, for
    # an error), or None when all are: a tabular learner may then snap them to its
    # action grid
    obs_scale: str | None = field(default=None, compare=False)
    # How many periods the observation spans: the largest k of its history components,
    # else 1 (an observation of the current period) or 0 (none); None: not known (a
    # spec built by hand). A tabular learner's memory must be this many periods
    obs_periods: int | None = field(default=None, compare=False)
    # Which agent of its market each observed feature is the price of (the same for
    # every observer: a price history of this group's own sellers, one product), or
    # None where a feature is anything else: a tabular learner with each firm's own grid
    # snaps feature d on firm obs_firms[d]'s grid
    obs_firms: tuple[int, ...] | None = field(default=None, compare=False)
    # ``static_prices() -> (nash [n], joint [n])``: the static one-shot game's Nash and
    # joint-profit-maximising prices of one market's agents (first product) with prices
    # free (not on a grid), solved on demand from the market
    # (:func:`jaxmarket.learners.controller.static_prices`); None: not known
    static_prices: Any = field(default=None, compare=False)

    @property
    def agents_per_market(self) -> int:
        return self.num_agents // self.num_markets

    @property
    def policies(self) -> int:
        return self.num_agents if self.num_policies is None else self.num_policies

    def index(self) -> jax.Array:
        if self.policy_index is None:
            return jnp.asarray(np.arange(self.num_agents, dtype=np.int32) % self.policies)
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


def every_field(state: Any) -> dict:
    """``{field: value}`` of every field of a ``flax.struct`` learner state."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


#: the keys of a :attr:`LearnerDef.convergence` report, ``[S]`` (or ``[]``) each
CONVERGENCE_KEYS = ("converged", "stable_periods", "step")


@dataclass(frozen=True)
class LearnerDef:
    """Registry entry: ``make(hyper, spec) -> Learner`` with ``hyper`` validated
    against ``hyper_fields`` (a ``ConfigError`` names ``learners.<group>.<field>``).

    The other fields declare what the training loop's features may do with the learner
    (each feature reads them here, never the kind's name):

    * ``pbt_hyperparams``: the hyperparameters the learner keeps per policy in
      ``state.hyper`` (``{name: [policies] array}``, read by ``update``) that PBT may
      mutate (docs/pbt.md); empty: PBT does not apply to the learner. ``member_fields``:
      the state fields a replaced PBT member copies from its source, those whose leaves
      are policy-stacked (the rest, e.g. sample buffers or a session's step, stay).
    * ``action_set(hyper, spec, n) -> ActionSet``
      (:class:`jaxmarket.market.equilibrium.ActionSet`): what one market's ``n`` agents of
      the group can play, for the static equilibrium (docs/equilibrium.md); None: the
      box of the group's action bounds.
    * ``fixed_policy``: the learner learns nothing (a fixed rule), so the equilibrium
      solver treats its group as part of the environment; ``random_policy``: a fixed
      policy whose ``act`` draws with its key (the period is then random).
    * ``snapshot(state) -> {field: value}``: the part of the state a league snapshot
      freezes, what ``act`` reads of the members (docs/populations.md); the default
      freezes every field.
    * ``convergence(state) -> {"converged", "stable_periods", "step"}`` (``[S]`` or
      ``[]`` each: whether each session converged, its counter of stable periods, and
      the period it converged at): the run summary's ``convergence`` section; None: the
      learner keeps no convergence rule.
    * ``readout(hyper, spec, state) -> {name: [A, P]}``: per slot and product, what the
      run summary reports of the trained learner beyond the action in force (the
      discrete bandits' ``recent_median``, the median price of a slot's last pulls):
      ``agents[group]["<name>_<action>"]``; None or ``{}``: nothing.
    """

    kind: str
    make: Callable[[Mapping[str, Any], LearnerSpec], Learner]
    hyper_fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""
    # the market move orders (``market.move_order``) the learner handles: one that
    # assumes its action takes effect every period refuses "alternating" at config time
    move_orders: tuple[str, ...] = ("simultaneous",)
    pbt_hyperparams: tuple[str, ...] = ()
    member_fields: tuple[str, ...] = ("params", "opt_state", "hyper")
    action_set: Callable[[Mapping[str, Any], LearnerSpec, int], Any] | None = None
    fixed_policy: bool = False
    random_policy: bool = False
    snapshot: Callable[[Any], dict] = every_field
    convergence: Callable[[Any], Mapping[str, Any]] | None = None
    readout: Callable[[Mapping[str, Any], LearnerSpec, Any], Mapping[str, Any]] | None = None

    def members(self, state: Any) -> dict:
        """``{field: value}`` of :attr:`member_fields`: what a replaced PBT member copies
        (and, in ``hyper``, mutates)."""
        return {f: getattr(state, f) for f in self.member_fields}


# kind -> LearnerDef; each learner module registers its kinds, and the package's
# __init__ imports every learner module (importing any jaxmarket.learners module fills it)
LEARNERS: Registry[LearnerDef] = Registry("learner")


class StaticArray:
    """A read-only numpy array that is hashable and compares by value (dtype, shape,
    bytes): the form array-valued constants take in a learner's static settings (a frozen
    dataclass that may serve as a ``jax.jit`` static argument). ``np.asarray(x)`` and
    ``x.array`` give the array."""

    __slots__ = ("array", "_hash")

    def __init__(self, value: Any, dtype: Any = None):
        array = np.array(value, dtype=dtype)   # a copy of its own
        array.flags.writeable = False
        self.array = array
        self._hash: int | None = None

    def _key(self) -> tuple:
        return self.array.dtype.str, self.array.shape, self.array.tobytes()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, StaticArray) and (
            self is other or self._key() == other._key())

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._key())
        return self._hash

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy:
            return np.array(self.array, dtype=dtype)
        return self.array if dtype is None else self.array.astype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def __repr__(self) -> str:
        return f"StaticArray({self.array.dtype}{list(self.array.shape)})"


def gather_policies(params: Any, policy_index: jax.Array) -> Any:
    """Per-slot view of policy-stacked parameters: ``x[policy_index]`` on every leaf."""
    return jax.tree.map(lambda x: x[policy_index], params)


class SlotLayout:
    """How a group's ``A`` slots map onto its policy-stacked parameters, in a form that
    lets per-slot arrays meet parameters by broadcasting instead of a gather.

    When the slots tile the way the training loop folds them -- ``S`` sessions of ``M``
    markets of ``n`` agents, slot ``a`` of session ``s`` driven by policy
    ``s K + base[a % n]`` (``K`` policies per session, ``base`` the one-market map; or
    the map of a block of ``g`` markets that repeats, as a population's ``sync`` layout
    does with ``g = K``: then ``M`` and ``n`` below are ``M / g`` and ``g n``) --
    :meth:`split` reshapes a per-slot array ``[..., A, *rest]`` to
    ``[..., S, M, n, *rest]`` and :meth:`params` a policy-stacked one ``[S K, *rest]`` to
    ``[S, 1, n, *rest]``, which broadcasts against it. The gradient of that broadcast is
    a sum over the markets; the gradient of ``x[policy_index]`` is a scatter-add over
    every slot, and elementwise work on ``[A, P]`` views built by broadcast-and-reshape
    also fuses badly: a Gaussian bandit's PPO loss at 32 policies x 1024 markets x 8
    products took 147 ms per gradient this way against 315-330 ms with per-slot views
    (XLA:CPU). Any other layout falls back to ``S = M = 1, n = A`` and a gather.
    """

    def __init__(self, spec: LearnerSpec):
        index = np.asarray(spec.index())
        A, N, S = spec.num_agents, spec.policies, spec.num_sessions
        self.num_slots = A
        self.shape = (1, 1, A)
        self.tiled = False
        self._base: np.ndarray | None = index
        self._policies_per_session = N
        if S >= 1 and N % S == 0 and spec.num_markets % S == 0 and A % spec.num_markets == 0:
            M, n, K = spec.num_markets // S, A // spec.num_markets, N // S
            slot = np.arange(A)
            # the smallest block of g markets whose map repeats: g = 1 for one policy per
            # agent position; g = K when market e is driven by member e mod K (a
            # population's sync layout)
            # (g = M would be one block of every slot: a gather in disguise, not tried)
            for g in (g for g in range(1, M + 1) if M % g == 0 and (g == 1 or g < M)):
                Mg, ng = M // g, n * g
                base = index[:ng]
                if np.array_equal(index, (slot // (Mg * ng)) * K + base[slot % ng]):
                    self.shape = (S, Mg, ng)
                    self.tiled = True
                    self._policies_per_session = K
                    self._base = None if np.array_equal(base, np.arange(ng)) else base
                    break

    def _key(self) -> tuple:
        base = None if self._base is None else tuple(int(i) for i in self._base)
        return self.num_slots, self.shape, self.tiled, self._policies_per_session, base

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, SlotLayout) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def one_policy_per_column(self) -> bool:
        """Slot ``(s, m, j)`` of :meth:`split` is driven by policy ``s n + j``: every
        column ``j`` of a session has a policy of its own, the same in every market."""
        return self.tiled and self._base is None and self.shape[2] == self._policies_per_session

    def split(self, x: jax.Array, axis: int = 0) -> jax.Array:
        """Per-slot ``x`` with the slot axis at ``axis`` -> that axis split into
        ``(S, M, n)``."""
        axis = axis % x.ndim
        return x.reshape(x.shape[:axis] + self.shape + x.shape[axis + 1:])

    def merge(self, x: jax.Array, axis: int = 0) -> jax.Array:
        """Inverse of :meth:`split`: axes ``axis .. axis + 2`` -> one slot axis."""
        axis = axis % x.ndim
        return x.reshape(x.shape[:axis] + (self.num_slots,) + x.shape[axis + 3:])

    def params(self, x: jax.Array) -> jax.Array:
        """Policy-stacked ``x [policies, *rest]`` -> ``[S, 1, n, *rest]``, broadcastable
        against :meth:`split` arrays (values ``x[policy_index]``)."""
        rest = x.shape[1:]
        S = self.shape[0]
        if not self.tiled:  # general mapping: a gather
            return x[jnp.asarray(self._base, jnp.int32)].reshape((1, 1, self.num_slots) + rest)
        x = x.reshape((S, self._policies_per_session) + rest)
        if self._base is not None:
            x = x[:, jnp.asarray(self._base, jnp.int32)]
        return x[:, None]

    def view(self, x: jax.Array) -> jax.Array:
        """``x[policy_index]`` as a per-slot array ``[A, *rest]``."""
        rest = x.shape[1:]
        return jnp.broadcast_to(self.params(x), self.shape + rest).reshape(
            (self.num_slots,) + rest)


def materialize(x: jax.Array) -> jax.Array:
    """``x`` unchanged, but computed once into a buffer of its own.

    XLA fuses cheap elementwise producers into *every* consumer and recomputes them
    there. For a sampled action that is costly: a Gaussian bandit's ``jax.random.normal``
    (threefry and an inverse-erf polynomial) ended up inside each of the market's
    ``[consumers, sellers]`` broadcast fusions and ran ~30 times per draw, more than half
    of a bench_b training iteration. ``jax.lax.optimization_barrier`` does not stop this
    on XLA:CPU (it is expanded before fusion); a reduction does, since XLA never
    duplicates a reduction into its consumers. The reduction here,
    ``max(x, x - 1) = x``, is exact for every float (``inf``, ``nan`` and values whose
    ``x - 1`` rounds to ``x`` included; subnormals are flushed to zero, as by any
    arithmetic on XLA:CPU)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    return jnp.max(jnp.stack([x, x - 1]), axis=0)


@partial(jax.jit, static_argnums=2)   # one program where it runs op by op
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
