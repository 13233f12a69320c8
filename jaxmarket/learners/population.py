"""Populations: ``K`` parameter sets ("members") per seed for one agent group, and the
mapping that says which member drives which agent slot (sample-factory's
``AgentPolicyMapping``, in-graph).

Config, inside a group's learner::

    learners:
      sellers:
        kind: ppo_bandit
        population: 4                     # K members per seed
        mapping: sync                     # or {kind: resample, every: 10, mix_in_env: false}
                                          # or {kind: table, table: [[0, 1], [2, 3], ...]}

With ``E = train.num_envs`` markets per seed of ``A`` agents each:

* ``sync``: every agent of market ``e`` is driven by member ``e mod K`` (each member gets
  the same experience per iteration; ``K`` must divide ``E``). Static.
* ``resample``: every ``every`` episodes (and after each of the first ``first``
  episodes) each seed draws a new *balanced* assignment: a random permutation of its
  markets (``mix_in_env: false``: all agents of a market share a member) or of its
  ``E * A`` slots (``mix_in_env: true``: each agent its own draw), dealt to the members in
  equal shares of ``E / K`` markets' worth of slots. An episode is ``episode_length``
  steps; a market without one counts each iteration as an episode.
* ``table``: an explicit ``[E, A]`` array of members, the same in every seed. Static.
* ``league`` (fictitious self-play): agent 0 of every market (the *live seat*) is driven
  by member ``e mod K`` and learns; the group's other agents are frozen *snapshots* of
  that member drawn from a pool. Every ``snapshot_every`` iterations (after the update)
  the members' current parameters enter the pool of ``pool_size`` (a ring: the oldest
  leaves); the pool starts with the initial parameters. Each iteration each market draws
  its opponents' snapshot: the newest with probability ``latest_prob``, else uniformly
  from the pool. The learner sees only the live seats (``E`` slots per seed); the
  opponents' actions are computed under every pool entry and the drawn one kept (cost:
  ``pool_size`` extra ``act`` evaluations per opponent seat and step). The pool, its
  count and the draws are part of the runner (checkpointed). With ``opponents: <group>``
  every agent of this group learns (member ``e mod K``) and *all* agents of the other
  group play the snapshots (that group takes no learner of its own; same action bounds
  and observation size, and a multiple of this group's agent count per market).
* a custom mapping registered from Python (sample-factory's TODO)::

      jaxmarket.register_mapping("stripes", lambda key, episode, market, agent, K:
                                 (market + agent + episode) % K)

  and selected by name (``mapping: stripes`` or ``{kind: stripes, every: 1}``; ``every``
  and ``first`` as for ``resample``). ``fn(key, episode, market, agent, K) -> member`` is
  jittable and called on scalars (vmapped over the seed's ``E`` markets and ``A``
  agents; ``key`` is one key per seed and draw, ``episode`` the episodes completed).
  Members must get equal shares, ``E A / K`` slots per seed (checked on the first draw
  before compiling); a later unbalanced draw is *repaired*: the slots past a member's
  share, in slot order, move to the members with room, and ``mapping/<group>/repaired``
  counts them.

Design: the learner sees its slots in a fixed *member-grouped* order (slot ``j`` of
seed ``s`` is driven by member ``s K + layout[j]``, ``layout[j] = (j // A) mod K`` for
``sync``/``resample``), so its ``policy_index`` is static and the broadcast fast path
(:class:`jaxmarket.learners.base.SlotLayout`) applies. A changing mapping moves *data*:
observations, rewards and ``next_obs`` are gathered from market order into that order
(``learner[j] = market[gather[j]]``) and actions scattered back
(``market[i] = learner[scatter[i]]``), never parameters. The two index arrays are part of
the training runner's state, so they are checkpointed and resumed bit-identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping
from jaxmarket.config.registry import Registry

KEYS = ("population", "mapping")
MAPPINGS = ("sync", "resample", "table")   # and "league", and the registered ones
# the mappings registered from Python: name -> fn(key, episode, market, agent, K)
CUSTOM_MAPPINGS: Registry[Callable] = Registry("population mapping")


def register_mapping(name: str, fn: Callable) -> Callable:
    """Register a custom agent -> member mapping under ``name`` (usable as
    ``learners.<group>.mapping: name``). ``fn(key, episode, market, agent, K) -> member``
    must be jittable: a pure function of a key, the completed-episode count, the market
    index within the seed, the agent index within the group and the population size,
    returning an integer in ``[0, K)``. Returns ``fn`` (usable as a decorator factory's
    result). A thin call into :data:`CUSTOM_MAPPINGS` (``CUSTOM_MAPPINGS.register(name,
    fn)``) that refuses the built-in names."""
    if not isinstance(name, str) or not name or name in MAPPINGS or name == "league":
        raise ValueError(f"register_mapping: name {name!r} must be a new, non-empty string "
                         f"(built-in mappings: {', '.join(MAPPINGS)}, league)")
    if not callable(fn):
        raise TypeError(f"register_mapping: fn for {name!r} must be callable")
    return CUSTOM_MAPPINGS.register(name, fn)


LEAGUE_FIELDS = {
    "snapshot_every": Field("int", 10, low=1, doc="iterations between pool snapshots"),
    "pool_size": Field("int", 8, low=1, doc="snapshots kept (a ring)"),
    "latest_prob": Field("float", 0.5, low=0.0, high=1.0,
                         doc="chance that a market's opponents are the newest snapshot"),
    "opponents": Field("any", "self",
                       doc="who plays the snapshots: self (the group's agents 1..) or "
                           "another agent group's name (all its agents)"),
}

RESAMPLE_FIELDS = {
    "every": Field("int", 10, low=1, doc="episodes between draws"),
    "first": Field("int", 5, low=0, doc="draw after each of the first episodes too"),
    "mix_in_env": Field("bool", False, doc="a draw per agent instead of per market"),
    "balanced": Field("bool", True, doc="every member gets the same number of slots"),
}


@dataclass(frozen=True)
class Population:
    """A group's population: ``size`` members per seed and how they map onto slots."""

    size: int
    kind: str = "sync"
    every: int = 10
    first: int = 5
    mix_in_env: bool = False
    table: tuple[tuple[int, ...], ...] | None = None
    snapshot_every: int = 10          # league
    pool_size: int = 8
    latest_prob: float = 0.5
    opponents: str = "self"

    @property
    def league(self) -> bool:
        return self.kind == "league"

    @property
    def live_seats_only(self) -> bool:
        """A league against itself: the learner sees agent 0 of each market only."""
        return self.kind == "league" and self.opponents == "self"

    @property
    def dynamic(self) -> bool:
        return self.kind == "resample" or self.custom

    @property
    def custom(self) -> bool:
        return self.kind in CUSTOM_MAPPINGS

    def layout(self, num_envs: int, num_agents: int) -> np.ndarray:
        """``[E * A]`` member of each slot of one seed, in the learner's slot order."""
        if self.kind == "table":
            return np.asarray(self.table, np.int64).reshape(-1)
        if self.live_seats_only:             # the live seats only: one per market
            return np.arange(num_envs) % self.size
        slot = np.arange(num_envs * num_agents)
        return (slot // num_agents) % self.size


def split_learner_config(raw: Any) -> tuple[Any, dict]:
    """A group's learner config -> (the learner's own settings, the population keys)."""
    if not isinstance(raw, Mapping):
        return raw, {}
    own = {k: v for k, v in raw.items() if k not in KEYS}
    return own, {k: raw[k] for k in KEYS if k in raw}


def resolve_population(keys: Mapping[str, Any], where: str, num_envs: int,
                       num_agents: int) -> Population | None:
    """Validate ``population``/``mapping`` of ``learners.<group>`` (``where``) against the
    train section's ``num_envs`` and the group's ``num_agents``; ``None`` without a
    ``population`` (one parameter set per agent position, today's default)."""
    if "population" not in keys:
        if "mapping" in keys:
            raise ConfigError(f"{where}.mapping", keys["mapping"],
                              "a mapping only together with population: K")
        return None
    size = keys["population"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"{where}.population", size, "an integer >= 1 (members per seed)")
    raw = keys.get("mapping", "sync")
    kind = raw if isinstance(raw, str) else raw.get("kind") if isinstance(raw, Mapping) else None
    if kind not in MAPPINGS + ("league",) and kind not in CUSTOM_MAPPINGS:
        raise ConfigError(f"{where}.mapping", raw, "one of " + ", ".join(
            MAPPINGS + ("league",) + tuple(CUSTOM_MAPPINGS)) + " (a name, or a mapping with a 'kind' key; "
            "custom ones come from jaxmarket.register_mapping)")
    opts = {k: v for k, v in raw.items() if k != "kind"} if isinstance(raw, Mapping) else {}
    if kind == "table":
        return _table(opts, where, size, num_envs, num_agents)
    if kind == "sync" and opts:
        raise ConfigError(f"{where}.mapping.{next(iter(opts))}", next(iter(opts.values())),
                          "no settings for mapping sync")
    if num_envs % size:
        raise ConfigError(f"{where}.population", size,
                          f"a divisor of train.num_envs ({num_envs}) for mapping {kind}: "
                          "every member drives the same number of markets")
    if kind == "sync":
        return Population(size, "sync")
    if kind == "league":
        h = check_mapping(LEAGUE_FIELDS, opts, f"{where}.mapping")
        if not isinstance(h["opponents"], str):
            raise ConfigError(f"{where}.mapping.opponents", h["opponents"],
                              "self or the name of another agent group")
        if h["opponents"] != "self":      # the other group is checked by the trainer
            return Population(size, "league", snapshot_every=h["snapshot_every"],
                              pool_size=h["pool_size"], latest_prob=h["latest_prob"],
                              opponents=h["opponents"])
        if num_agents < 2:
            raise ConfigError(f"{where}.mapping", raw, "a group of >= 2 agents per market for "
                              f"mapping league (agent 0 learns, the others play snapshots; "
                              f"this group has {num_agents})")
        return Population(size, "league", snapshot_every=h["snapshot_every"],
                          pool_size=h["pool_size"], latest_prob=h["latest_prob"])
    if kind in CUSTOM_MAPPINGS:
        h = check_mapping({k: RESAMPLE_FIELDS[k] for k in ("every", "first")}, opts,
                          f"{where}.mapping")
        pop = Population(size, kind, every=h["every"], first=h["first"])
        _check_custom(pop, f"{where}.mapping", num_envs, num_agents)
        return pop
    h = check_mapping(RESAMPLE_FIELDS, opts, f"{where}.mapping")
    if not h["balanced"]:
        raise ConfigError(f"{where}.mapping.balanced", False,
                          "true (i.i.d. draws give members unequal slot counts, which needs "
                          "per-slot parameter gathers; not supported)")
    return Population(size, "resample", every=h["every"], first=h["first"],
                      mix_in_env=h["mix_in_env"])


def league_opponents(env, params, config: dict) -> dict:
    """Leagues whose snapshots another group plays (``learners.<g>.mapping: {kind:
    league, opponents: <h>}``): check ``h`` and give it a placeholder learner (its actions
    come from the snapshots). The config as the learner builders then see it."""
    learners = config.get("learners")
    if not isinstance(learners, dict):
        return config
    learners = dict(learners)
    for g, raw in list(learners.items()):
        mapping = raw.get("mapping") if isinstance(raw, dict) else None
        if not (isinstance(mapping, dict) and mapping.get("kind") == "league"):
            continue
        h, field = mapping.get("opponents", "self"), f"learners.{g}.mapping.opponents"
        if h == "self" or not isinstance(h, str) or g not in env.agent_groups:
            continue          # self-play, or an error resolve_population names
        if h == g or h not in env.agent_groups:
            raise ConfigError(field, h, "self or another agent group: " + ", ".join(
                x for x in env.agent_groups if x != g))
        if h in learners:
            raise ConfigError(f"learners.{h}", learners[h], f"no learner: its agents play "
                              f"the league snapshots of learners.{g} (remove this entry)")
        (low_g, high_g), (low_h, high_h) = (env.action_bounds(x, params) for x in (g, h))
        lows = np.concatenate([np.ravel(low_g), np.ravel(low_h)])
        highs = np.concatenate([np.ravel(high_g), np.ravel(high_h)])
        if not (np.all(lows == lows[0]) and np.all(highs == highs[0])):
            raise ConfigError(field, h, f"a group with the same action bounds as {g} "
                              "(its agents play the snapshots of its members)")
        obs_g, obs_h = (env.observation_shape(x, params)[-1] for x in (g, h))
        if obs_g != obs_h:
            raise ConfigError(field, h, f"a group with the same observation size as {g} "
                              f"({obs_g}; {h} has {obs_h})")
        if env.num_agents(h) % env.num_agents(g):
            raise ConfigError(field, h, f"a group whose agents per market ({env.num_agents(h)}) "
                              f"are a multiple of {g}'s ({env.num_agents(g)})")
        learners[h] = {"kind": "constant", "value": float(lows[0])}
    return {**config, "learners": learners}


def _table(opts: Mapping[str, Any], where: str, size: int, num_envs: int,
           num_agents: int) -> Population:
    if set(opts) != {"table"}:
        extra = sorted(set(opts) - {"table"})
        field = f"{where}.mapping.{extra[0]}" if extra else f"{where}.mapping.table"
        raise ConfigError(field, opts.get(extra[0]) if extra else "<missing>",
                          f"mapping table takes one setting, table: a [{num_envs}, "
                          f"{num_agents}] array of members")
    table = opts["table"]
    allowed = (f"a [{num_envs}, {num_agents}] array (train.num_envs x agents) of integers "
               f"in [0, {size - 1}]")
    try:
        arr = np.asarray(table)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.mapping.table", table, allowed) from None
    if arr.shape != (num_envs, num_agents) or arr.dtype.kind not in "iu":
        raise ConfigError(f"{where}.mapping.table", table, allowed + f" (got shape {list(arr.shape)})")
    if arr.min() < 0 or arr.max() >= size:
        raise ConfigError(f"{where}.mapping.table", table, allowed)
    return Population(size, "table", table=tuple(tuple(int(x) for x in row) for row in arr))


def custom_members(key: jax.Array, pop: Population, episode: jax.Array, num_seeds: int,
                   num_envs: int, num_agents: int) -> jax.Array:
    """``[S, E, A]`` int32: the registered ``fn``'s member of every slot, ``fn(fold_in(key,
    s), episode, e, a, K)``, clipped to ``[0, K)``."""
    fn = CUSTOM_MAPPINGS[pop.kind]
    K = pop.size
    keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.arange(num_seeds))
    market, agent = jnp.arange(num_envs), jnp.arange(num_agents)
    per_agent = jax.vmap(lambda k, e, a: fn(k, episode, e, a, K), in_axes=(None, None, 0))
    per_market = jax.vmap(per_agent, in_axes=(None, 0, None))
    members = jax.vmap(per_market, in_axes=(0, None, None))(keys, market, agent)
    return jnp.clip(jnp.asarray(members).astype(jnp.int32), 0, K - 1)


def assignment_from_members(members: jax.Array, size: int) -> tuple[jax.Array, jax.Array,
                                                                     jax.Array]:
    """Members ``[S, E, A]`` of the market slots -> ``(gather, scatter, repaired)``.

    The learner's slot order gives member ``k`` the slots ``j`` with ``(j // A) mod K =
    k``; its ``r``-th of them is ``j = ((r // A) K + k) A + r mod A``. Market slot ``i``
    with member ``m_i`` and rank ``r_i`` among the seed's slots of that member (in slot
    order) goes to that slot while ``r_i < E A / K`` (the member's share); the slots
    past their member's share ("overflow", ``repaired`` counts them over all seeds) take
    the learner slots left free, both in increasing order."""
    S, E, A = members.shape
    K, n = size, E * A
    m = members.reshape(S, n)
    onehot = jax.nn.one_hot(m, K, dtype=jnp.int32)                        # [S, n, K]
    rank = jnp.take_along_axis(jnp.cumsum(onehot, axis=1), m[..., None], axis=2)[..., 0] - 1
    share = n // K
    fits = rank < share
    target = ((rank // A) * K + m) * A + rank % A                           # [S, n]
    target = jnp.where(fits, target, n)                                    # n: dropped
    rows = jnp.arange(S)[:, None]
    taken = jnp.zeros((S, n + 1), bool).at[rows, target].set(True)[:, :n]
    free = jnp.argsort(taken, axis=1, stable=True)                         # free slots first
    overflow_rank = jnp.cumsum(~fits, axis=1) - 1
    target = jnp.where(fits, target, jnp.take_along_axis(free, jnp.maximum(overflow_rank, 0),
                                                         axis=1))
    offset = (jnp.arange(S) * n)[:, None]
    scatter = (target + offset).reshape(-1).astype(jnp.int32)
    gather = jnp.zeros_like(scatter).at[scatter].set(jnp.arange(S * n, dtype=jnp.int32))
    return gather, scatter, jnp.sum(~fits).astype(jnp.int32)


def _check_custom(pop: Population, where: str, num_envs: int, num_agents: int) -> None:
    """The registered fn traces to integer members and its first draw is balanced."""
    fn = CUSTOM_MAPPINGS[pop.kind]
    try:
        out = jax.eval_shape(lambda k, t: fn(k, t, jnp.int32(0), jnp.int32(0), pop.size),
                             jax.random.key(0), jnp.int32(0))
    except Exception as exc:   # noqa: BLE001 - any tracing failure is the user's fn
        raise ConfigError(where, pop.kind, f"a jittable fn(key, episode, market, agent, K) "
                          f"(tracing it failed: {type(exc).__name__}: {exc})".replace("\n", " "))
    if out.shape != () or not jnp.issubdtype(out.dtype, jnp.integer):
        raise ConfigError(where, pop.kind, "a fn(key, episode, market, agent, K) returning one "
                          f"integer member (it returned {out.dtype}{list(out.shape)})")
    members = np.asarray(custom_members(jax.random.key(0), pop, jnp.int32(0), 1, num_envs,
                                        num_agents))
    counts = np.bincount(members.ravel(), minlength=pop.size)
    if np.any(counts != counts[0]):
        raise ConfigError(where, pop.kind, f"a mapping that gives each of the {pop.size} "
                          f"members {num_envs * num_agents // pop.size} of a seed's "
                          f"{num_envs * num_agents} slots (its first draw gives "
                          f"{counts.tolist()})")


def draw_assignment(key: jax.Array, pop: Population, num_seeds: int, num_envs: int,
                    num_agents: int, episode: jax.Array | int = 0
                    ) -> tuple[jax.Array, jax.Array]:
    """A balanced random assignment as ``(gather, scatter)``, each ``[S * E * A]`` int32:
    learner slot ``j`` reads market slot ``gather[j]``; market slot ``i`` is learner slot
    ``scatter[i]`` (its inverse). Seed ``s``'s slots stay within seed ``s``. A custom
    mapping's draw (after ``episode`` episodes) goes through
    :func:`assignment_from_members`."""
    E, A = num_envs, num_agents
    if pop.custom:
        members = custom_members(key, pop, jnp.asarray(episode, jnp.int32), num_seeds, E, A)
        return assignment_from_members(members, pop.size)[:2]
    keys = jax.random.split(key, num_seeds)
    if pop.mix_in_env:
        perm = jax.vmap(lambda k: jax.random.permutation(k, E * A))(keys)          # [S, E A]
    else:
        markets = jax.vmap(lambda k: jax.random.permutation(k, E))(keys)            # [S, E]
        perm = (markets[:, :, None] * A + jnp.arange(A)[None, None]).reshape(num_seeds, E * A)
    gather = (perm + (jnp.arange(num_seeds) * E * A)[:, None]).reshape(-1).astype(jnp.int32)
    scatter = jnp.zeros_like(gather).at[gather].set(jnp.arange(gather.size, dtype=jnp.int32))
    return gather, scatter


def identity_assignment(num_slots: int) -> tuple[jax.Array, jax.Array]:
    ident = jnp.arange(num_slots, dtype=jnp.int32)
    return ident, ident


def episodes_trigger_draw(pop: Population, before: jax.Array, after: jax.Array) -> jax.Array:
    """Whether the episodes completed in ``(before, after]`` call for a new draw: after
    each of the first ``first`` episodes, then whenever a multiple of ``every`` is passed."""
    early = (after > before) & (before < pop.first)
    periodic = (after // pop.every) > (before // pop.every)
    return early | periodic


__all__ = ["Population", "resolve_population", "split_learner_config", "draw_assignment",
           "identity_assignment", "episodes_trigger_draw", "MAPPINGS", "register_mapping",
           "assignment_from_members", "custom_members", "league_opponents"]
