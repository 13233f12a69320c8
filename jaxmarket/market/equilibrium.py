"""Static (one-shot) equilibria of a market, computed on its own jitted reward.

The game: every *player* agent group (the groups whose actions are solved for) chooses
its actions ``[n, P]`` from an :class:`ActionSet` (a box ``[low, high]`` per agent and
product, or a grid of values per agent and product); the payoff of a joint action is the
reward :meth:`MarketEnv.step_env` gives each agent for **one period from the reset
state** (``reset(key(0))``, ``time = 0``: demand processes at their period-0 level, the
price history at the initial prices), every other agent group at its reset action or at
the ``fixed`` actions given for it (in a market whose distributor reads the last
period's prices, :attr:`MarketEnv.lagged`: the profile held, the same actions in force
before the period, :meth:`MarketEnv.held`). Alternating moves are evaluated as
simultaneous (the static game, :func:`static_game`). Where the period is random (a
demand process or a distributor that draws with its key, a fixed group that acts at
random) the payoff is the **mean over a fixed set of** ``samples`` **keys**
(:func:`sample_keys`; the same keys for every profile, so the game is deterministic and
its equilibria exact for that sample).

Two solutions per player group (:func:`solve`):

* ``nash`` -- a pure Nash equilibrium of all player agents, by Gauss-Seidel
  best-response iteration over the *cells* (agent, product) from the reset actions:
  each cell in turn moves to the value maximising its own agent's reward, the others
  held. A continuous cell's best response is a vectorised search (one ``vmap``ped batch
  of market steps) over ``coarse`` evenly spaced values of its bounds plus its current
  value, then ``levels - 1`` zooms of ``coarse + 1`` values spanning one spacing either
  side of the best so far (``coarse / 2``-fold finer each; with the defaults ~1.5e-8 of
  the range); a grid cell's is exact over its grid. Ties -- a flat maximum, a range of
  payoff-equivalent bids -- go to the tied value nearest the middle of the tied values,
  so the float32 plateau around a smooth optimum resolves to its centre. It stops
  (``converged``) when a sweep moves no cell by more than ``tol`` of its range or raises
  no cell's reward by more than :data:`GAIN_RTOL` relative (float32 rounding), or after
  ``max_sweeps``. Several products of one agent are optimised product by product.
* ``joint`` -- the group's joint optimum: its agents maximise the **sum of the group's
  rewards** as one player, every other player agent best-responding (with one player
  group: the maximum of the group's summed reward). Where two or more player groups are
  sellers, every seller group's ``joint`` is the industry's: all sellers maximise the sum
  of all sellers' rewards (:func:`cartels`), so the benchmark is the game's whatever the
  grouping of the firms into groups (each firm its own learner). From the Nash point, a symmetric
  search first (one value per product for all the group's agents, clipped to each
  agent's bounds), then coordinate ascent cell by cell on the sum (asymmetric sellers,
  budgets, several products), a cell moving only where the sum rises beyond float32
  rounding (:data:`JOINT_MARGIN`).

A solution of the iteration is checked before it is used (``nash_verified``,
``joint_verified``): every cell's best response to the others, a fresh search over its
whole set, may raise its objective by at most :data:`VERIFY_RTOL` relative. Where one
gains more (a discontinuous payoff such as Bertrand undercutting, where the iteration
stops on a point that is no equilibrium), ``converged`` is False and
``nash_deviation``/``joint_deviation`` name the agent, the value it moves to and its gain.

Grids (every player cell on a grid, at most ``max_table`` joint profiles) are solved
exactly on the table of every profile's rewards: every pure equilibrium (no agent gains
more than :data:`TABLE_RTOL` relative from any change of its own grid actions),
best-response iteration on the table (``nash``: the equilibrium it reaches from the
reset actions snapped to the grids) and the exact joint optimum (ties: the most even
split). Larger grids use the iteration with grid cells (no list of equilibria).

One program is compiled per game structure (:func:`_batch`: a batch of market steps);
the search runs on the host around it.

    sets = {"sellers": ActionSet.box(low, high)}
    result = solve(env, params, sets)
    result["sellers"]["nash"]          # [[p_0], [p_1]]
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.rewards import expected_reward, is_random
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams, freeze, thaw
from jaxmarket.market.state import current_actions

#: keys averaged over in a random period (unless ``samples`` is given)
DEFAULT_SAMPLES = 256
#: the relative rise of a group's summed reward a single cell's move must bring (the
#: coordinate ascent of the joint optimum; ~4 float32 ulps)
JOINT_MARGIN = 2.0 ** -22
#: converged: no best response raises its objective by more than this, relative
GAIN_RTOL = 2.0 ** -22
#: verified: no cell's best response (a fresh search over its whole set, the others held)
#: raises its objective by more than this, relative to the larger of the two values
VERIFY_RTOL = 1e-4
#: most pure equilibria listed (``num_pure_equilibria`` counts them all)
MAX_LISTED = 1000
#: relative tolerance of "no agent gains" on a table of float32 rewards
TABLE_RTOL = 1e-6


@dataclass(frozen=True)
class ActionSet:
    """One player group's actions: bounds ``low``/``high`` ``[n, P]`` and, for a discrete
    set, ``grid`` ``[n, P, G]`` (sorted values per agent and product)."""

    low: np.ndarray
    high: np.ndarray
    grid: np.ndarray | None = None

    @classmethod
    def box(cls, low: Any, high: Any) -> ActionSet:
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        if low.ndim != 2 or low.shape != high.shape:
            raise ValueError(f"ActionSet.box: low and high must be [n, P]; got {low.shape} "
                             f"and {high.shape}")
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError("ActionSet.box: the bounds must be finite to search them")
        return cls(low, high)

    @classmethod
    def from_grid(cls, grid: Any) -> ActionSet:
        grid = np.sort(np.asarray(grid, np.float32), axis=-1)
        if grid.ndim != 3 or grid.shape[-1] < 1:
            raise ValueError(f"ActionSet.from_grid: grid must be [n, P, G]; got {grid.shape}")
        return cls(grid[..., 0], grid[..., -1], grid)

    @property
    def discrete(self) -> bool:
        return self.grid is not None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.low.shape)


@dataclass(frozen=True)
class Search:
    """Settings of the search (see the module docstring)."""

    coarse: int = 64          # values per level of a continuous best response
    levels: int = 5           # the first search and levels - 1 zooms
    max_sweeps: int = 200
    tol: float = 1e-6         # converged: no cell moved by more than tol x its range
    max_table: int = 1 << 16  # most joint grid profiles tabulated exactly


DEFAULT_SEARCH = Search()


def is_deterministic(env: MarketEnv) -> bool:
    """Whether one period from the reset state is the same for every key (every demand
    process and the distributor declared deterministic on their definitions)."""
    spec = env.spec
    if not deterministic_demand(spec):
        return False
    options = dict(thaw(spec.distributor_options) or {})
    return DISTRIBUTORS[spec.distributor].is_deterministic(options)


def deterministic_demand(spec: Any) -> bool:
    """Whether every consumer group's demand process ignores its key
    (:attr:`DemandDef.deterministic`)."""
    return all(DEMANDS[c.demand_kind].deterministic for c in spec.consumers)


def outcomes(env: MarketEnv) -> tuple[tuple[float, MarketEnv], ...] | None:
    """A period's finitely many outcomes ``((probability, market), ...)``, each market
    deterministic: ``((1, env),)`` for a deterministic period, the distributor's declared
    outcomes (:attr:`DistributorDef.outcomes`, e.g. Cournot's demand shock) where the
    demand is deterministic, else None (a draw that is not finite)."""
    if is_deterministic(env):
        return ((1.0, env),)
    spec = env.spec
    if not deterministic_demand(spec):
        return None
    options = dict(thaw(spec.distributor_options) or {})
    found = DISTRIBUTORS[spec.distributor].outcome_options(options, spec.num_sellers)
    if found is None:
        return None
    return tuple((p, MarketEnv(dataclasses.replace(spec, distributor_options=freeze(o))))
                 for p, o in found)


def sample_keys(samples: int) -> jax.Array:
    """The ``samples`` keys a period's payoff is averaged over (key 0 alone for one)."""
    if samples == 1:
        return jax.random.key(0)[None]
    return jax.random.split(jax.random.key(0), samples)


def _expected(reward: Any) -> Any:
    """A frozen reward list's expectation over its noise terms (itself without any)."""
    return freeze(expected_reward(thaw(reward))) if is_random(thaw(reward)) else reward


def static_game(env: MarketEnv) -> MarketEnv:
    """The market whose one period is the static game: every seller moving every period,
    no observations (the payoff never reads them; markets that differ only in what
    their agents observe then share the compiled programs) and each reward's expectation
    over its own noise (:func:`~jaxmarket.combinators.rewards.expected_reward`: its mean
    0 terms left out)."""
    spec = env.spec
    plain = lambda gs: tuple(dataclasses.replace(g, observation=(), reward=_expected(g.reward))
                             if g.agent else g for g in gs)
    static = dataclasses.replace(spec, consumers=plain(spec.consumers),
                                 sellers=plain(spec.sellers), move_order="simultaneous")
    return env if static == spec else MarketEnv(static)


@dataclass(frozen=True)
class Structure:
    """The static part of a game (hashable: a static argument of the compiled programs,
    so games that differ only in parameters, bounds, grids or fixed actions share them)."""

    env: MarketEnv
    groups: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]
    # a period's finite outcomes ((probability, deterministic market), ...): the payoff
    # is their exact expectation (None: the mean over the sample keys)
    outcomes: tuple[tuple[float, MarketEnv], ...] | None = None


def payoff(structure: Structure, x: jax.Array, data: Any) -> jax.Array:
    """Rewards ``[agents]`` of the player cells ``x [cells]`` for one period from the
    reset state, the mean over the sample keys (``data = (state, params, keys, fixed)``)."""
    env = structure.env
    state, params, keys, fixed = data
    acts, at = current_actions(env.spec, state), 0
    for g, (n, P) in zip(structure.groups, structure.shapes):   # groups: static structure
        acts[g] = x[at:at + n * P].reshape(n, P)
        at += n * P

    def one(key, others, env=env):
        joint = {**acts, **others}
        start = env.one_shot_state(state, joint, params)
        _, _, rewards, _, _ = env.step_env(key, start, joint, params)
        return jnp.concatenate([rewards[g] for g in structure.groups])

    def expected(env):
        if keys.shape[0] == 1:   # a deterministic period: no batch of keys to trace
            return one(keys[0], jax.tree.map(lambda a: a[0], fixed), env)
        return jax.vmap(lambda k, o: one(k, o, env))(keys, fixed).mean(axis=0)

    if structure.outcomes is not None:   # sum_k p_k reward_k over the draw's outcomes
        return sum(np.float32(p) * expected(e) for p, e in structure.outcomes)
    return expected(env)


@dataclass(frozen=True)
class Game:
    """The flattened game: cells (agent, product) of the player groups in order, their
    agents, the structure and the data of :func:`payoff`."""

    structure: Structure
    data: Any
    low: np.ndarray          # [N] float32
    high: np.ndarray         # [N]
    grid: np.ndarray         # [N, G] (a box cell: its bounds, the upper one repeated)
    is_grid: np.ndarray      # [N] bool
    cell_agent: np.ndarray   # [N] int: the agent (row of rewards) of each cell
    cell_group: np.ndarray   # [N] int: the group of each cell
    agent_group: np.ndarray  # [A] int
    start: np.ndarray        # [N] the reset actions, clipped (snapped) into the sets

    @property
    def groups(self) -> tuple[str, ...]:
        return self.structure.groups

    @property
    def cells(self) -> tuple[np.ndarray, ...]:
        """What the compiled iteration reads of the cells."""
        return self.low, self.high, self.grid, self.is_grid

    def split(self, x: Any) -> dict[str, np.ndarray]:
        x, out, at = np.asarray(x), {}, 0
        for g, (n, P) in zip(self.groups, self.structure.shapes):
            out[g] = x[at:at + n * P].reshape(n, P)
            at += n * P
        return out

    def split_agents(self, r: Any) -> dict[str, np.ndarray]:
        r, out, at = np.asarray(r), {}, 0
        for g, (n, _) in zip(self.groups, self.structure.shapes):
            out[g] = r[at:at + n]
            at += n
        return out


def make_game(env: MarketEnv, params: MarketParams, action_sets: Mapping[str, ActionSet],
              fixed: Mapping[str, Any] | None = None, samples: int = 1) -> Game:
    """The one-shot game of ``action_sets``' groups (see the module docstring).
    ``fixed``: actions of other agent groups, ``[n, P]`` or one per key
    ``[samples, n, P]`` (the rest hold their reset actions)."""
    env = static_game(env)
    spec = env.spec
    exact = outcomes(env)
    exact = None if exact is None or len(exact) == 1 else exact
    groups = tuple(action_sets)
    for g in groups:
        n, P = env.num_agents(g), spec.num_products
        if action_sets[g].shape != (n, P):
            raise ValueError(f"equilibrium: the action set of {g!r} is {action_sets[g].shape}; "
                             f"the group's actions are [{n}, {P}]")
    _, state = env.reset(jax.random.key(0), params)   # jitted: one program
    held = current_actions(spec, state)
    fixed_k = {g: jnp.broadcast_to(jnp.asarray(a, jnp.float32),
                                   (samples,) + tuple(held[g].shape))
               for g, a in (fixed or {}).items()}
    shapes = tuple(action_sets[g].shape for g in groups)
    sizes = [n * P for n, P in shapes]
    G = max([s.grid.shape[-1] for s in action_sets.values() if s.discrete] or [2])
    low = np.concatenate([action_sets[g].low.ravel() for g in groups]).astype(np.float32)
    high = np.concatenate([action_sets[g].high.ravel() for g in groups]).astype(np.float32)
    grid = np.concatenate([_padded_grid(action_sets[g], G) for g in groups]).astype(np.float32)
    is_grid = np.concatenate([np.full(k, action_sets[g].discrete) for g, k in zip(groups, sizes)])
    cell_agent = np.concatenate([np.repeat(np.arange(n), P) + sum(s[0] for s in shapes[:i])
                                 for i, (n, P) in enumerate(shapes)])
    cell_group = np.concatenate([np.full(k, i) for i, k in enumerate(sizes)])
    agent_group = np.concatenate([np.full(n, i) for i, (n, _) in enumerate(shapes)])
    start = np.concatenate([np.asarray(held[g], np.float32).ravel() for g in groups])
    start = _snap(np.clip(start, low, high), grid, is_grid)
    return Game(Structure(env, groups, shapes, exact),
                (state, params, sample_keys(samples), fixed_k),
                low, high, grid, is_grid, cell_agent, cell_group, agent_group, start)


def _padded_grid(s: ActionSet, G: int) -> np.ndarray:
    n, P = s.shape
    if s.grid is None:
        return np.concatenate([s.low.reshape(-1, 1), np.repeat(s.high.reshape(-1, 1), G - 1, 1)], 1)
    grid = s.grid.reshape(n * P, -1)
    return np.concatenate([grid, np.repeat(grid[:, -1:], G - grid.shape[1], 1)], 1)


def _snap(x: np.ndarray, grid: np.ndarray, is_grid: np.ndarray) -> np.ndarray:
    nearest = grid[np.arange(len(x)), np.argmin(np.abs(grid - x[:, None]), axis=1)]
    return np.where(is_grid, nearest, x).astype(np.float32)


# ----------------------------------------------------------------------- the iteration

@partial(jax.jit, static_argnums=0)
def _batch(structure: Structure, xs: jax.Array, data: Any) -> jax.Array:
    """Rewards ``[B, A]`` of ``B`` joint actions ``xs [B, N]``: the one compiled program
    of a game (every search level, every table chunk is a batch of the same size)."""
    return jax.vmap(lambda x: payoff(structure, x, data))(xs)


def _width(game: Game, search: Search) -> int:
    """Values per search level (the last: the current value), the batch size."""
    return max(search.coarse, game.grid.shape[1]) + 1


def _evaluate(game: Game, xs: np.ndarray, width: int) -> np.ndarray:
    """Rewards ``[len(xs), A]`` (float64) in batches of ``width`` rows."""
    rows = len(xs)
    pad = (-rows) % width
    xs = np.concatenate([xs, np.repeat(xs[-1:], pad, 0)]).astype(np.float32)
    out = [np.asarray(_batch(game.structure, xs[i:i + width], game.data), np.float64)
           for i in range(0, len(xs), width)]
    return np.concatenate(out)[:rows]


def _choose(values: np.ndarray, obj: np.ndarray) -> int:
    """Index of the maximiser of ``obj`` nearest the middle of the tied maximisers'
    values (a plateau resolves to its centre)."""
    tied = obj >= obj.max()
    mid = 0.5 * (values[tied].min() + values[tied].max())
    return int(np.argmin(np.where(tied, np.abs(values - mid), np.inf)))


def _assign(game: Game, x: np.ndarray, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``[len(values), N]``: ``x`` with the masked cells at each value (clipped into their
    bounds, snapped onto their grids)."""
    vals = np.clip(values[:, None], game.low, game.high)
    nearest = np.argmin(np.abs(game.grid[None] - vals[..., None]), axis=-1)    # [V, N]
    snapped = game.grid[np.arange(len(x)), nearest]
    return np.where(mask, np.where(game.is_grid, snapped, vals), x).astype(np.float32)


def _best_response(game: Game, search: Search, x, mask, w):
    """The value of the masked cells maximising ``w . rewards``: a search over ``width``
    values (a grid cell: its grid) and zooms; ``(value, objective, rewards)``."""
    width = _width(game, search)
    first = int(np.argmax(mask))
    lo, hi = float(game.low[mask].min()), float(game.high[mask].max())
    if game.is_grid[first]:
        values = np.unique(game.grid[first])
        levels = 1
    else:
        values = np.append(np.linspace(lo, hi, width - 1), x[first])
        levels = search.levels
    h = (hi - lo) / (width - 2)
    unit = np.linspace(-1.0, 1.0, width)      # width odd (even coarse): 0 included
    v = o = rv = None
    for k in range(levels):
        if k:
            values = np.clip(v + h * unit, lo, hi)   # a zoom around the best so far
            h = 2.0 * h / (width - 1)
        values = values.astype(np.float32)   # what the market is given
        rewards = _evaluate(game, _assign(game, x, mask, values), width)
        obj = rewards @ w
        i = _choose(values, obj)
        if k == 0 or obj[i] >= o:
            v, o, rv = float(values[i]), float(obj[i]), rewards[i]
    return v, o, rv


def _iteration(game: Game, search: Search, x, r, masks, weights, margin=0.0):
    """Gauss-Seidel sweeps over the coordinates (``masks [C, N]``: the cells each sets
    to one value; ``weights [C, A]``: its objective over the agents' rewards) until a
    sweep moves no coordinate by more than ``tol`` of its range, or raises no objective
    by more than :data:`GAIN_RTOL` relative (float32 rounding: every coordinate was at
    a best response up to it), or ``max_sweeps``. A coordinate moves only where its
    objective rises by ``margin`` relative (does not fall, at 0); ``r``: the rewards at
    ``x``, or None. ``(x, r, sweeps, converged, gain)``, ``gain`` the last sweep's
    largest rise of an objective."""
    x = np.asarray(x, np.float32).copy()
    span = np.maximum(game.high - game.low, 1e-30)
    sweeps = 0
    while sweeps < search.max_sweeps:
        delta, gain, rel, known, sweeps = 0.0, 0.0, 0.0, r is not None, sweeps + 1
        for mask, w in zip(masks, weights):   # Gauss-Seidel: one coordinate after another
            v, o, rv = _best_response(game, search, x, mask, w)
            now = None if r is None else float(r @ w)
            if now is None or o >= now + margin * abs(now):
                new = _assign(game, x, mask, np.array([v]))[0]
                delta = max(delta, float(np.max(np.abs(new - x) / span)))
                x, r = new, rv
            if now is not None:
                gain = max(gain, o - now)
                rel = max(rel, (o - now) / max(abs(now), 1e-30))
        converged = delta <= search.tol or (known and rel <= GAIN_RTOL)
        if converged:
            break
    return x, r, sweeps, bool(converged), gain


def _own_weights(game: Game) -> np.ndarray:
    """Each cell's objective: its own agent's reward ``[N, A]``."""
    w = np.zeros((len(game.low), len(game.agent_group)), np.float32)
    w[np.arange(len(game.low)), game.cell_agent] = 1.0
    return w


def cartels(game: Game) -> dict[Any, tuple[int, ...]]:
    """The coalitions whose joint optimum is solved: each player group (key: its index)
    and, where two or more player groups are sellers, the industry (key ``"industry"``:
    every seller group together, maximising the sum of all sellers' rewards), whose
    optimum is every seller group's ``joint`` (the game's benchmark, whatever the
    grouping of the sellers into groups)."""
    out: dict[Any, tuple[int, ...]] = {gi: (gi,) for gi in range(len(game.groups))}
    sellers = tuple(gi for gi, g in enumerate(game.groups)
                    if game.structure.env.spec.group(g).side == "seller")
    if len(sellers) > 1:
        out["industry"] = sellers
    return out


def joint_of(game: Game, gi: int) -> Any:
    """The key of :func:`cartels` whose optimum is group ``gi``'s ``joint``."""
    members = cartels(game)
    return "industry" if gi in members.get("industry", ()) else gi


def _cartel_weights(game: Game, groups: tuple[int, ...]) -> np.ndarray:
    """Cells of the ``groups``: their summed reward; every other cell its own agent's."""
    w = _own_weights(game)
    inside = np.isin(game.agent_group, groups).astype(np.float32)
    w[np.isin(game.cell_group, groups)] = inside
    return w


def _iterate(game: Game, search: Search) -> dict[str, Any]:
    N = len(game.low)
    cells = np.eye(N, dtype=bool)
    nash, nash_r, sweeps, converged, gain = _iteration(game, search, game.start, None, cells,
                                                       _own_weights(game))
    out = {"nash": nash, "nash_reward": nash_r, "nash_sweeps": sweeps,
           "nash_converged": converged, "nash_gain": gain, "joint": {}}
    product = np.concatenate([np.tile(np.arange(P), n) for n, P in game.structure.shapes])
    for key, members in cartels(game).items():
        w = _cartel_weights(game, members)
        inside = np.isin(game.cell_group, members)
        # symmetric: one value per product for the whole cartel (a cell's row of the mask)
        blocks = cells | (inside[:, None] & inside[None] & (product[:, None] == product[None]))
        xs, rs, s1, _, _ = _iteration(game, search, nash, nash_r, blocks, w)
        # then cell by cell, only where the sum rises beyond float32 rounding (a ridge
        # of equal sums, a flat top, stays where the symmetric search left it)
        xj, rj, s2, ok, _ = _iteration(game, search, xs, rs, cells, w, margin=JOINT_MARGIN)
        out["joint"][key] = (xj, rj, s1 + s2, ok)
    return out


def _deviation(game: Game, search: Search, x, r, weights) -> dict[str, Any] | None:
    """A check of a solution ``x`` (rewards ``r``) before it is used: each cell's best
    response to the others (a fresh search over the cell's whole set, objective
    ``weights[c] . rewards``). None where no cell gains more than :data:`VERIFY_RTOL`
    relative; else the largest gain, ``{"agent", "cell", "to", "gain"}`` (the best
    response iteration stopped on a point that is not a solution: a discontinuous
    payoff, a cycle)."""
    worst = None
    cells = np.eye(len(game.low), dtype=bool)
    for c, (mask, w) in enumerate(zip(cells, weights)):   # the cells of one game
        v, o, _ = _best_response(game, search, x, mask, w)
        now = float(np.asarray(r) @ w)
        gain = o - now
        if gain > VERIFY_RTOL * max(abs(now), abs(o), 1e-12) and (
                worst is None or gain > worst["gain"]):
            worst = {"agent": int(game.cell_agent[c]), "cell": c, "to": v,
                     "from": float(x[c]), "gain": float(gain)}
    return worst


# ------------------------------------------------------------------------- the table

def _table(game: Game, search: Search) -> tuple[np.ndarray, list[np.ndarray]]:
    """Rewards ``[G_1, ..., G_N, A]`` (float64) of every joint grid profile, and each
    cell's grid values."""
    values = [np.unique(game.grid[c]) for c in range(len(game.low))]
    sizes = [len(v) for v in values]
    profiles = np.array(list(itertools.product(*values)), np.float32).reshape(-1, len(sizes))
    rewards = _evaluate(game, profiles, _width(game, search))
    return rewards.reshape(sizes + [-1]), values


def _stable(table: np.ndarray, axes: tuple[int, ...], objective: np.ndarray) -> np.ndarray:
    """Profiles where ``objective`` cannot rise (beyond the tolerance) by changing the
    cells ``axes`` together."""
    best = objective.max(axis=axes, keepdims=True)
    return objective >= best - TABLE_RTOL * np.maximum(1.0, np.abs(best))


def _table_solve(game: Game, search: Search) -> dict[str, Any]:
    table, values = _table(game, search)
    N, A = len(game.low), len(game.agent_group)
    axes_of = [tuple(np.flatnonzero(game.cell_agent == a)) for a in range(A)]
    stable_agent = [_stable(table, axes_of[a], table[..., a]) for a in range(A)]
    nash_mask = np.logical_and.reduce(stable_agent)
    index = tuple(int(np.argmin(np.abs(values[c] - game.start[c]))) for c in range(N))
    index, sweeps, _ = _table_iteration(table, game.cell_agent, index, search.max_sweeps)
    equilibria = np.argwhere(nash_mask)
    if not nash_mask[index] and len(equilibria):   # a cycle: the equilibrium nearest its end
        index = tuple(equilibria[np.argmin(np.abs(equilibria - np.asarray(index)).sum(1))])
    value = lambda idx: np.array([values[c][i] for c, i in enumerate(idx)], np.float32)
    out = {"nash": value(index), "nash_reward": table[index], "nash_sweeps": sweeps,
           "nash_converged": bool(nash_mask[index]), "nash_gain": 0.0, "joint": {},
           "pure_equilibria": [value(e) for e in equilibria[:MAX_LISTED]],
           "num_pure_equilibria": len(equilibria)}
    for key, groups in cartels(game).items():
        members = np.flatnonzero(np.isin(game.agent_group, groups))
        total = table[..., members].sum(-1)
        cartel = _stable(table, tuple(np.flatnonzero(np.isin(game.cell_group, groups))), total)
        others = [stable_agent[a] for a in range(A) if game.agent_group[a] not in groups]
        ok = np.logical_and.reduce([cartel] + others)
        if ok.any():   # the best total; ties: the most even split of it
            top = np.where(ok, total, -np.inf)
            tied = top >= top.max() - TABLE_RTOL * max(1.0, abs(top.max()))
            spread = np.ptp(table[..., members], axis=-1)
            best = np.unravel_index(np.argmin(np.where(tied, spread, np.inf)), total.shape)
            out["joint"][key] = (value(best), table[best], 0, True)
        else:
            out["joint"][key] = (value(index), table[index], 0, False)
    return out


def _table_iteration(table, cell_agent, index, max_sweeps):
    """Gauss-Seidel best responses on the table, cell by cell (ties: the middle tied
    index); ``(index, sweeps, converged)``."""
    index = list(index)
    for sweep in range(1, max_sweeps + 1):
        moved = False
        for c, a in enumerate(cell_agent):   # the cells of the (small) tabulated game
            row = table[tuple(index[:c]) + (slice(None),) + tuple(index[c + 1:]) + (a,)]
            best = row.max()
            tied = np.flatnonzero(row >= best - TABLE_RTOL * max(1.0, abs(best)))
            choice = int(tied[np.argmin(np.abs(tied - tied.mean()))])
            moved |= choice != index[c]
            index[c] = choice
        if not moved:
            return tuple(index), sweep, True
    return tuple(index), max_sweeps, False


# --------------------------------------------------------------------------- the API

def solve(env: MarketEnv, params: MarketParams, action_sets: Mapping[str, ActionSet], *,
          fixed: Mapping[str, Any] | None = None, samples: int | None = None,
          search: Search = DEFAULT_SEARCH, continuous: bool = True) -> dict[str, dict[str, Any]]:
    """Static Nash equilibrium and each group's joint optimum (module docstring) of the
    groups of ``action_sets`` (``{group: ActionSet}``). ``fixed``: the actions of other
    agent groups (``[n, P]`` or ``[samples, n, P]``; the rest hold their reset
    actions); ``samples``: keys the payoff is averaged over (default 1 where the
    period is deterministic, else :data:`DEFAULT_SAMPLES`).

    Returns per group: ``nash`` and ``joint`` (``[n][P]`` lists), ``nash_reward`` and
    ``joint_reward`` (``[n]``: each agent's reward there), ``converged`` (both found and
    verified), ``nash_verified``, ``joint_verified`` (with ``nash_deviation``,
    ``joint_deviation`` where not: module docstring), ``at_bounds`` (only where a solution
    puts an agent on a bound of its set: :func:`_at_bounds`), and
    ``nash_converged``, ``joint_converged``, ``nash_sweeps``, ``joint_sweeps``,
    ``nash_gain`` (the largest improvement a cell found in the last sweep), ``samples``,
    ``action_set`` (``"grid"`` or ``"box"``); on a tabulated grid also
    ``pure_equilibria`` (every pure equilibrium, ``[K][n][P]``: this group's part of
    each; the first :data:`MAX_LISTED`) and ``num_pure_equilibria``. Where a group is
    on a grid and ``continuous``, ``continuous`` holds the same solution (``nash``,
    ``joint``, their rewards, ``converged``, the checks) of the game in which every grid is replaced
    by the interval it spans: the continuous benchmarks of the literature (Calvano et
    al.'s ``p_N``, ``p_M``)."""
    exact = outcomes(static_game(env))
    if samples is None:
        samples = 1 if exact is not None else DEFAULT_SAMPLES
    out = _solve(make_game(env, params, action_sets, fixed, samples), search)
    if continuous and any(s.discrete for s in action_sets.values()):
        boxes = {g: ActionSet(s.low, s.high) for g, s in action_sets.items()}
        free_params, free_sets = free_game(env, params, action_sets)
        free = make_game(env, free_params, free_sets, fixed, samples)
        box = _solve(make_game(env, params, boxes, fixed, samples), search, free=free)
        # the interval's solution where it is the free game's too; else the free game's,
        # the interval's kept beside it as "bounded"
        held = all(not box[g].get("free_deviation") for g in action_sets)
        solved = box if held else _solve(free, search)
        # a free solution on the edge of the wide box has no interior optimum (a linear
        # demand's cartel prices one firm out without bound): the interval's is used
        edge = None if held else next((e for g in action_sets
                                       for e in solved[g].get("at_bounds", ())), None)
        if edge is not None:
            solved, held = box, True
        keys = ("nash", "joint", "nash_reward", "joint_reward", "converged", "nash_verified",
                "joint_verified", "nash_deviation", "joint_deviation", "at_bounds")
        for g, s in action_sets.items():
            if s.discrete:
                out[g]["continuous"] = {k: solved[g][k] for k in keys if k in solved[g]}
                if edge is not None:
                    out[g]["continuous"]["free_unbounded"] = (
                        f"with prices free the {edge['solution']} price of agent "
                        f"{edge['agent']} goes to the edge {edge['value']:.6g} of the "
                        "searched prices (no interior optimum): the grid's interval is used")
                if not held:
                    out[g]["continuous"]["prices"] = "free"
                    out[g]["bounded"] = {k: box[g][k] for k in keys if k in box[g]}
    expectation = ("exact: the probability-weighted mean over the "
                   f"{len(exact)} outcomes of the distributor's draw"
                   if exact is not None and len(exact) > 1 else "deterministic period"
                   if exact is not None and samples == 1 else
                   f"sampled: the mean over {samples} keys")
    for g, s in action_sets.items():
        out[g].update(samples=samples, action_set="grid" if s.discrete else "box",
                      expectation=expectation)
    return out


def _at_bounds(game: Game, gi: int, solutions: Mapping[str, np.ndarray]) -> list[dict]:
    """The cells of group ``gi`` that a solution puts on a bound of their set (a box's
    edge, a grid's first or last value): there the bounds bind, and the solution is the
    bounded game's, not the free one's. ``[{"solution", "agent", "bound", "value"}]``."""
    cells = np.flatnonzero(game.cell_group == gi)
    first = int(np.flatnonzero(game.agent_group == gi)[0])
    span = np.maximum(game.high - game.low, 1e-30)
    out = []
    for what, x in solutions.items():
        x = np.asarray(x, np.float64)
        for c in cells:   # the group's cells: a handful of agents x products
            for bound, edge in (("low", game.low[c]), ("high", game.high[c])):
                if abs(x[c] - edge) <= 1e-6 * span[c]:
                    out.append({"solution": what, "agent": int(game.cell_agent[c]) - first,
                                "bound": bound, "value": float(edge)})
    return out


#: the free game of a grid group searches [0, high + FREE_WIDTH (high - low)]
FREE_WIDTH = 4.0


def free_game(env: MarketEnv, params: MarketParams, action_sets: Mapping[str, ActionSet]
              ) -> tuple[MarketParams, dict[str, ActionSet]]:
    """The game with the prices of every seller group on a grid free (Calvano et al.'s
    ``p_N``, ``p_M`` are the static game's, not the grid's): the market's bounds of those
    groups widened to ``[0, high + FREE_WIDTH (high - low)]`` (``high``, ``low``: the
    grid's interval), and that box as their action sets; every other group as it is."""
    sellers = dict(params.sellers)
    sets: dict[str, ActionSet] = {}
    for g, s in action_sets.items():
        if not s.discrete or env.spec.group(g).side != "seller":
            sets[g] = ActionSet(s.low, s.high)
            continue
        low = np.zeros_like(s.low)
        high = (s.high + FREE_WIDTH * (s.high - s.low)).astype(np.float32)
        sellers[g] = sellers[g].replace(low=jnp.asarray(low), high=jnp.asarray(high))
        sets[g] = ActionSet(low, high)
    return params.replace(sellers=sellers), sets


def _solve(game: Game, search: Search, free: Game | None = None) -> dict[str, dict[str, Any]]:
    """The solutions of ``game`` (:func:`solve`'s keys); ``free``: the same game with
    wider bounds, where each solution is checked again (``free_deviation``: a profitable
    move outside ``game``'s bounds, or None)."""
    profiles = np.prod([len(np.unique(game.grid[c])) for c in range(len(game.low))],
                       dtype=np.float64)
    tabulate = bool(np.all(game.is_grid)) and profiles <= search.max_table
    found = _table_solve(game, search) if tabulate else _iterate(game, search)
    nash_r = game.split_agents(found["nash_reward"])
    nash = game.split(found["nash"])
    # a table's solutions are exact (every profile compared); an iteration's are checked
    nash_dev = None if tabulate else _deviation(game, search, found["nash"],
                                                found["nash_reward"], _own_weights(game))
    out = {}
    members = cartels(game)
    for gi, g in enumerate(game.groups):
        key = joint_of(game, gi)
        xj, rj, sweeps, ok = found["joint"][key]
        joint_dev = None if tabulate else _deviation(game, search, xj, rj,
                                                     _cartel_weights(game, members[key]))
        res = {"nash": nash[g].tolist(), "joint": game.split(xj)[g].tolist(),
               "converged": bool(found["nash_converged"] and ok and nash_dev is None
                                 and joint_dev is None),
               "nash_reward": nash_r[g].tolist(),
               "joint_reward": game.split_agents(rj)[g].tolist(),
               "nash_converged": found["nash_converged"], "joint_converged": ok,
               "nash_sweeps": found["nash_sweeps"], "joint_sweeps": sweeps,
               "nash_gain": found["nash_gain"],
               "nash_verified": nash_dev is None, "joint_verified": joint_dev is None}
        for what, dev in (("nash", nash_dev), ("joint", joint_dev)):
            if dev is not None:
                res[f"{what}_deviation"] = dev
        if free is not None:   # the same cells, wider sets: the same payoffs inside
            res["free_deviation"] = (
                _deviation(free, search, found["nash"], found["nash_reward"],
                           _own_weights(free))
                or _deviation(free, search, xj, rj, _cartel_weights(free, members[key])))
        edges = _at_bounds(game, gi, {"nash": found["nash"], "joint": xj})
        if edges:
            res["at_bounds"] = edges
        if "pure_equilibria" in found:
            res["pure_equilibria"] = [game.split(e)[g].tolist() for e in found["pure_equilibria"]]
            res["num_pure_equilibria"] = found["num_pure_equilibria"]
        out[g] = res
    return out


__all__ = [
    "DEFAULT_SAMPLES",
    "DEFAULT_SEARCH",
    "ActionSet",
    "Game",
    "Search",
    "is_deterministic",
    "make_game",
    "sample_keys",
    "solve",
    "static_game",
]
