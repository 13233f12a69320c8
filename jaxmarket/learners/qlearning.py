"""Tabular Q-learning on a price grid (Calvano et al., AER 2020, "algorithmic collusion").

Each seller picks one of ``m`` prices ``grid = linspace(grid_low, grid_high, m)``. Its
state is what it observed: the last ``k`` (``memory``) price profiles of all ``n``
sellers of the market, ``obs [A, D]`` with ``D = k * n`` (one product). Every observed
price is snapped to its nearest grid index ``d_j`` and the state is the mixed-radix
number ``s = sum_j d_j m^(D-1-j)`` of those ``m^D`` possibilities (``make`` refuses
``m^D > 2^31 - 1``, so every state index fits in int32).

Update, for each transition ``(s, a, r, s')`` of a batch in time order::

    Q[s, a] <- (1 - alpha) Q[s, a] + alpha (r + delta (1 - done) max_a' Q[s', a'])

Exploration: with probability ``eps_t = exp(-beta t)`` a uniformly random price, else the
greedy ``argmax_a Q[s, a]`` (first index on ties); ``t`` counts the periods the learner
has learnt from. One uniform ``u`` per agent and period decides both: explore when
``u < eps_t``, and then play price ``floor(m u / eps_t)`` (``u / eps_t`` is uniform on
[0, 1) given ``u < eps_t``).

Sessions: the training loop folds ``S = spec.num_sessions`` independent runs into the
slot and policy axes (session ``s`` owns slots ``s*A/S .. (s+1)*A/S - 1`` and policies
``s*K .. s*K + K - 1``). Everything that is not a Q table is kept per session: ``step``,
``stable_periods`` and ``converged`` have shape ``[S]`` (shape ``[]`` for a one-session
spec, as the session engine uses under its own ``vmap`` over sessions).

Convergence (Calvano's rule, per session): after each period, an agent's greedy strategy
changed if the argmax of the Q row it just updated changed. A session's
``stable_periods`` counts consecutive periods in which no agent of that session changed
its greedy strategy; once it reaches ``convergence_window`` the session is
``converged``: it stops learning (``update`` leaves its Q tables, its ``t`` and its
counter unchanged, so its ``step`` is its period of convergence) and its agents act
greedily. The other sessions go on.

Initial Q (``q_init="random_rival"``): the discounted payoff of each price against
uniformly random rivals of the same market, the same in every state::

    Q0[s, a] = E_{a_-i ~ U(grid)} [ payoff_i(a, a_-i) ] / (1 - delta)

computed from the per-market ``LearnerSpec.payoff`` on all ``m^n`` joint grid actions
of one market's ``n = agents_per_market`` agents with ``vmap``; slot ``i`` gets the row
of agent ``i % n`` of its market, averaged onto policies.

Per-firm settings: ``learning_rate``, ``exploration_decay``, ``discount`` and ``q_init``
may be lists of one value per firm (firm ``i`` is agent ``i`` of its market; slot ``j``
plays firm ``j mod n``), so firm ``i`` updates with its own ``alpha_i``, ``delta_i``
(``r + delta_i max_a' Q[s', a']``), explores with ``exp(-beta_i t)`` and starts from
its own ``Q0`` (``random_rival``: ``/ (1 - delta_i)``). ``alpha`` and ``beta`` live in
the per-policy ``state.hyper`` arrays, ``delta`` is a per-slot constant array; a list of
equal values resolves to the number itself.

Parameters are stacked per policy; agents sharing a policy apply their updates of one
period together (their increments add up). The state keeps one packed table
``rows [num_policies, m^D, m + 1]``: columns ``0 .. m-1`` are ``Q[s, .]`` and column
``m`` caches ``greedy = argmax_a Q[s, a]`` (an integer below 2^24, stored exactly as
float32), rewritten with the one row that changes each period. Acting reads the cached
greedy index, updating reads the same row, so one period touches one memory row per
agent for ``s`` (and one for the bootstrap ``max_a' Q[s', a']``, which is next period's
``s``): the run is bound by memory latency, and this layout measured 5-30% faster
(noisy, shared machine) than separate ``q``, ``greedy`` and ``value`` arrays. ``state.q``,
``state.greedy`` and ``state.value`` give the usual views.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping
from jaxmarket.learners.base import (
    LEARNERS,
    Learner,
    LearnerDef,
    LearnerSpec,
    Transition,
    scatter_mean,
)
from jaxmarket.market.equilibrium import ActionSet

_INT32_MAX = np.iinfo(np.int32).max
# Largest number of joint actions evaluated for the random-rival initial Q.
_MAX_JOINT_ACTIONS = 1 << 22

HYPER_FIELDS: dict[str, Field] = {
    "grid_low": Field("any", default=None, optional=True,
                      doc="lowest grid price (null: the smallest action_low of the group); "
                          "a list [l_1, ..., l_n]: each firm's own (per-firm grids)"),
    "grid_high": Field("any", default=None, optional=True,
                       doc="highest grid price (null: the largest action_high of the "
                           "group); a list [h_1, ..., h_n]: each firm's own"),
    "grid_size": Field("int", default=15, low=2, doc="number of grid prices m (of each firm)"),
    "grid": Field("any", default=None, optional=True,
                  doc="an explicit grid of prices, strictly increasing (replaces "
                      "grid_low/grid_high/grid_size); a list of n such lists of one length: "
                      "each firm's own; {kind: calvano, xi: 0.1}: each firm i its own "
                      "grid_size prices from p_N,i - xi (p_M,i - p_N,i) to p_M,i + xi "
                      "(p_M,i - p_N,i), p_N and p_M the static game's Nash and "
                      "joint-optimum prices with prices free"),
    "memory": Field("int", default=1, low=0,
                    doc="price profiles remembered k (0: stateless, one state)"),
    "learning_rate": Field("firm_float", default=0.15, low=0.0, high=1.0, low_open=True,
                           doc="alpha; a list [alpha_1, ..., alpha_n]: each firm's own"),
    "discount": Field("firm_float", default=0.95, low=0.0, high=1.0,
                      doc="delta; a list [delta_1, ..., delta_n]: each firm's own"),
    "exploration_decay": Field("firm_float", default=4e-6, low=0.0,
                               doc="beta in eps_t = exp(-beta t); a list [beta_1, ..., "
                                   "beta_n]: each firm's own"),
    "epsilon": Field("any", default=None, optional=True,
                     doc="{start: eps0, decay: beta}: eps_t = eps0 exp(-beta t) (replaces "
                         "exploration_decay; start 0: always greedy)"),
    "boltzmann": Field("any", default=None, optional=True,
                       doc="{temperature: T0, decay: rho}: softmax exploration over Q(s, .) "
                           "at T_t = T0 rho^t (instead of eps-greedy)"),
    "convergence_window": Field("int", default=100_000, low=1,
                                doc="periods without any greedy change that mean converged"),
    "q_init": Field("any", default="random_rival",
                    doc="initial Q: random_rival (payoff against uniform rivals / "
                        "(1 - delta)), zero, {kind: constant, value: v} or "
                        "{kind: uniform, low: l, high: h} (independent draws per state "
                        "and action); a list of one per firm: each firm's own (uniform "
                        "only for every firm alike)"),
    "feedback": Field("choice", default="taken", choices=("taken", "full"),
                      doc="taken: learn from the action played; full: update every "
                          "action's Q of the visited state with the payoff it would have "
                          "earned against the rivals' actual actions (needs memory 0)"),
    "obs_grid": Field("any", default=None, optional=True,
                      doc="the grid observations are discretised on: {low, high, size} "
                          "(size: default grid_size); null: the action grid, allowed only "
                          "where every observed feature is on the action's scale (the "
                          "sellers' own actions: own_price, competitor_prices, history, a "
                          "price market's market_price)"),
    "target": Field("choice", default="simultaneous", choices=("simultaneous", "sequential"),
                    doc="sequential: Klein (2021)'s target for alternating moves, "
                        "Q(s,a) <- (1-alpha) Q + alpha [pi_t + delta pi_t+1 + ... + "
                        "delta^n max Q(s_t+n, .)] over the n periods until the next turn"),
}
EPSILON_FIELDS = {
    "start": Field("float", default=1.0, low=0.0, high=1.0, doc="eps0"),
    "decay": Field("float", default=4e-6, low=0.0, doc="beta"),
}
BOLTZMANN_FIELDS = {
    "temperature": Field("float", low=0.0, low_open=True, doc="T0"),
    "decay": Field("float", default=1.0, low=0.0, high=1.0, low_open=True, doc="rho"),
}
Q_INIT_FIELDS = {
    "random_rival": {},
    "zero": {},
    "constant": {"value": Field("float", doc="every Q(s, a) starts at this value")},
    "uniform": {"low": Field("float", doc="lowest initial Q"),
                "high": Field("float", doc="highest initial Q")},
}


@struct.dataclass
class QLearningState:
    """Learner state of one group across its sessions and markets. ``[S]`` below is
    ``[]`` when ``spec.num_sessions == 1``."""

    rows: jax.Array            # [num_policies, num_states, m + 1] float32: Q | greedy
    policy_index: jax.Array    # [A] int32 agent slot -> policy
    step: jax.Array            # [S] int32 periods learnt from (t of eps_t)
    stable_periods: jax.Array  # [S] int32 consecutive periods without a greedy change
    converged: jax.Array       # [S] bool
    # per-policy hyperparameters {name: [num_policies] float32}: learning_rate (alpha)
    # and exploration_decay (beta); PBT mutates them in-graph without recompiling
    hyper: Any = None
    # target: sequential -- each slot's pending update {s, a, acc, valid} ([A] each:
    # the state and action of its last turn, its discounted profits since, and whether
    # it has had a turn) and the period counter ``clock`` (int32 []); None otherwise
    pending: Any = None
    clock: Any = None

    @property
    def q(self) -> jax.Array:
        """``[num_policies, num_states, m]`` action values."""
        return self.rows[..., :-1]

    @property
    def greedy(self) -> jax.Array:
        """``[num_policies, num_states]`` int32 ``argmax_a q`` (first index on ties)."""
        return self.rows[..., -1].astype(jnp.int32)

    @property
    def value(self) -> jax.Array:
        """``[num_policies, num_states]`` ``max_a q``."""
        return jnp.max(self.q, axis=-1)

    def with_q(self, q: jax.Array) -> QLearningState:
        """This state holding action values ``q`` (its greedy column recomputed)."""
        return self.replace(rows=pack_rows(jnp.asarray(q, jnp.float32)))


@jax.jit   # one program where a learner is made op by op, not one per operation
def pack_rows(q: jax.Array) -> jax.Array:
    """``q [..., m]`` -> ``[..., m + 1]``: the values and their first argmax as float32."""
    greedy = jnp.argmax(q, axis=-1).astype(q.dtype)
    return jnp.concatenate([q, greedy[..., None]], axis=-1)


@struct.dataclass
class PriceGrid:
    """The static discretisation shared by act and update (numbers only)."""

    prices: jax.Array  # [m] float32
    low: float = struct.field(pytree_node=False)
    spacing: float = struct.field(pytree_node=False)
    radix: tuple[int, ...] = struct.field(pytree_node=False)  # m^(D-1-j), j < D
    # an explicit (not evenly spaced) grid: the m - 1 midpoints between its prices
    midpoints: tuple[float, ...] | None = struct.field(pytree_node=False, default=None)

    @property
    def size(self) -> int:
        return int(self.prices.shape[0])

    def nearest_index(self, price: jax.Array) -> jax.Array:
        """Index of the grid price nearest to each ``price`` (int32, clipped; on an
        explicit grid the upper price at an exact midpoint)."""
        if self.midpoints is not None:
            mid = jnp.asarray(self.midpoints, jnp.float32)
            return jnp.sum(price[..., None] >= mid, axis=-1).astype(jnp.int32)
        index = jnp.round((price - self.low) / self.spacing)
        return jnp.clip(index, 0, self.size - 1).astype(jnp.int32)

    def state_index(self, obs: jax.Array) -> jax.Array:
        """Mixed-radix state number of observations ``[..., D]`` -> ``[...]`` int32
        (state 0 for a stateless learner, ``D = 0`` digits)."""
        if not self.radix:
            return jnp.zeros(obs.shape[:-1], jnp.int32)
        digits = self.nearest_index(obs)
        return jnp.sum(digits * jnp.asarray(self.radix, dtype=jnp.int32), axis=-1)

    # one grid for every firm: the same calls as :class:`FirmGrids`'
    per_firm = False

    def slot_price(self, action: jax.Array) -> jax.Array:
        """The prices of grid indices ``[..., A]`` of agent slots."""
        return self.prices[action]

    def slot_index(self, price: jax.Array) -> jax.Array:
        """The nearest grid indices of prices ``[..., A]`` of agent slots."""
        return self.nearest_index(price)

    def profile_price(self, index: jax.Array) -> jax.Array:
        """The prices of a market's grid-index profiles ``[..., n]``."""
        return _profile_prices(self.prices, index)

    def profile_index(self, price: jax.Array) -> jax.Array:
        """The nearest grid indices of a market's price profiles ``[..., n]``."""
        return self.nearest_index(price)

    def firm_price(self, firm: jax.Array, index: jax.Array) -> jax.Array:
        """The price of grid index ``index`` of firm ``firm``."""
        return self.prices[index]

    def table(self, firms: int) -> np.ndarray:
        """``[firms, m]`` every firm's grid prices (float64)."""
        return np.broadcast_to(np.asarray(self.prices, np.float64), (firms, self.size)).copy()


@struct.dataclass
class FirmGrids:
    """Each firm its own grid of ``m`` prices (per-firm grids). Firm ``f`` is the agent
    ``f`` of its market: agent slot ``i`` is firm ``i mod F``. A state digit ``d`` (an
    observed price) is snapped on the grid of firm ``digit_firm[d]``, whose price it is
    (:attr:`LearnerSpec.obs_firms`)::

        evenly spaced:  index_f(p) = clip(round((p - low_f) / spacing_f), 0, m - 1)
        explicit:       index_f(p) = #{k : p >= (g_f[k] + g_f[k+1]) / 2}
    """

    prices: jax.Array  # [F, m] float32
    low: tuple[float, ...] = struct.field(pytree_node=False)       # [F]
    spacing: tuple[float, ...] = struct.field(pytree_node=False)   # [F]
    radix: tuple[int, ...] = struct.field(pytree_node=False)       # m^(D-1-j), j < D
    digit_firm: tuple[int, ...] = struct.field(pytree_node=False)  # [D]
    # explicit grids: each firm's m - 1 midpoints
    midpoints: tuple[tuple[float, ...], ...] | None = struct.field(pytree_node=False,
                                                                   default=None)
    per_firm = True

    @property
    def size(self) -> int:
        return int(self.prices.shape[-1])

    @property
    def firms(self) -> int:
        return int(self.prices.shape[0])

    def nearest_index(self, price: jax.Array, firm: Any) -> jax.Array:
        """Index of the nearest price on firm ``firm``'s grid (``firm`` an int array
        broadcasting against ``price``; int32, clipped)."""
        if self.midpoints is not None:
            mid = jnp.asarray(self.midpoints, jnp.float32)[firm]         # [..., m - 1]
            return jnp.sum(price[..., None] >= mid, axis=-1).astype(jnp.int32)
        low = jnp.asarray(self.low, jnp.float32)[firm]
        spacing = jnp.asarray(self.spacing, jnp.float32)[firm]
        index = jnp.round((price - low) / spacing)
        return jnp.clip(index, 0, self.size - 1).astype(jnp.int32)

    def state_index(self, obs: jax.Array) -> jax.Array:
        """Mixed-radix state number of observations ``[..., D]``, digit ``d`` snapped on
        firm ``digit_firm[d]``'s grid."""
        if not self.radix:
            return jnp.zeros(obs.shape[:-1], jnp.int32)
        digits = self.nearest_index(obs, np.asarray(self.digit_firm, np.int32))
        return jnp.sum(digits * jnp.asarray(self.radix, dtype=jnp.int32), axis=-1)

    def _slot_firms(self, slots: int) -> np.ndarray:
        return np.arange(slots, dtype=np.int32) % self.firms

    def slot_price(self, action: jax.Array) -> jax.Array:
        return self.prices[self._slot_firms(action.shape[-1]), action]

    def slot_index(self, price: jax.Array) -> jax.Array:
        return self.nearest_index(price, self._slot_firms(price.shape[-1]))

    def profile_price(self, index: jax.Array) -> jax.Array:
        return _profile_prices(self.prices, index)

    def profile_index(self, price: jax.Array) -> jax.Array:
        return self.nearest_index(price, np.arange(self.firms, dtype=np.int32))

    def firm_price(self, firm: jax.Array, index: jax.Array) -> jax.Array:
        return self.prices[firm, index]

    def table(self, firms: int) -> np.ndarray:
        return np.asarray(self.prices, np.float64).copy()


def max_and_argmax(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(max, first argmax)`` over the last axis (int32 index), as ``jnp.max`` /
    ``jnp.argmax``. For short rows it is written as a running comparison over the
    columns: elementwise across rows, several times faster on XLA:CPU than the variadic
    reduction behind ``jnp.argmax``."""
    width = rows.shape[-1]
    if width > 64:
        return jnp.max(rows, axis=-1), jnp.argmax(rows, axis=-1).astype(jnp.int32)
    best = rows[..., 0]
    index = jnp.zeros(best.shape, jnp.int32)
    for j in range(1, width):
        better = rows[..., j] > best  # strict: ties keep the first index, like argmax
        best = jnp.where(better, rows[..., j], best)
        index = jnp.where(better, j, index)
    return best, index


def make_grid(hyper: Mapping[str, Any], spec: LearnerSpec) -> PriceGrid | FirmGrids:
    """Validate the spec against Q-learning's assumptions and build the price grid (each
    firm's own, :class:`FirmGrids`, where the settings give per-firm grids)."""
    hyper = {"grid": None, "grid_low": None, "grid_high": None, "obs_grid": None, **hyper}
    low, high, m, num_digits = grid_bounds(hyper, spec)
    form = grid_form(hyper, spec)
    if form.per_firm:
        return firm_grids(form.low, form.high, m, digit_firms(hyper, spec, num_digits, form),
                          form.values)
    return price_grid(low, high, m, num_digits, form.values)


@jax.jit   # called op by op when a game's tables are made: one program, not one per op
def _profile_prices(prices: jax.Array, index: jax.Array) -> jax.Array:
    """The prices of grid-index profiles ``index [..., n]``: ``prices [m]`` one grid for
    every firm, or ``prices [n, m]`` each firm its own (firm ``i`` reads row ``i``)."""
    if prices.ndim == 1:
        return prices[index]
    return prices[np.arange(prices.shape[0]), index]


def _error(field: str, value: Any, allowed: str) -> ConfigError:
    """A q_learning setting's error (``build_learner`` names the agent group)."""
    return ConfigError(f"learners.q_learning.{field}", value, allowed)


@dataclass(frozen=True)
class GridForm:
    """The grid settings resolved: one grid for the group (``low``, ``high`` floats,
    ``values`` an explicit grid or None) or each firm its own (``per_firm``: ``low``,
    ``high`` tuples over the ``F`` firms, ``values`` the firms' explicit grids or None);
    ``field``: the setting that asked for per-firm grids (for errors)."""

    low: Any
    high: Any
    m: int
    values: Any = None
    per_firm: bool = False
    field: str = "grid"


#: the rule of Calvano et al. (AER 2020) for ``grid: {kind: calvano, xi: ...}``
CALVANO_GRID_FIELDS = {"kind": Field("choice", choices=("calvano",),
                                     doc="calvano: each firm's grid from its p_N, p_M"),
                       "xi": Field("float", default=0.1, low=0.0,
                                   doc="the widening xi of [p_N - xi (p_M - p_N), "
                                       "p_M + xi (p_M - p_N)]")}


def _number(x: Any) -> bool:
    return (isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
            and math.isfinite(float(x)) and abs(float(x)) <= np.finfo(np.float32).max)


def _firm_bounds(spec: LearnerSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(low [F], high [F])``: each firm's action bounds (the first market's agents)."""
    n = spec.agents_per_market
    low = np.asarray(spec.action_low, np.float64).reshape(spec.num_agents, -1)[:n, 0]
    high = np.asarray(spec.action_high, np.float64).reshape(spec.num_agents, -1)[:n, 0]
    return low, high


def _firm_values(field: str, value: Any, firms: int) -> tuple[float, ...] | None:
    """A per-firm ``grid_low``/``grid_high``: None for null or a number (the group's), the
    ``F`` numbers of a list."""
    if value is None or _number(value):
        return None
    if isinstance(value, (list, tuple)) and len(value) == firms and all(map(_number, value)):
        return tuple(float(v) for v in value)
    raise _error(field, value, f"a number, null, or a list of {firms} numbers: one per firm "
                 f"(agent of a market) of the group")


def grid_form(hyper: Mapping[str, Any], spec: LearnerSpec) -> GridForm:
    """``grid``, ``grid_low``, ``grid_high`` and ``grid_size`` resolved and checked
    (:class:`GridForm`): an explicit grid, a list of one explicit grid per firm, the
    Calvano rule ``{kind: calvano, xi}`` (each firm ``i``'s ``m`` prices
    ``linspace(p_N,i - xi (p_M,i - p_N,i), p_M,i + xi (p_M,i - p_N,i), m)``, ``p_N``,
    ``p_M`` the static game's free-price Nash and joint-optimum prices,
    :attr:`LearnerSpec.static_prices`), or bounds ``grid_low``/``grid_high`` (numbers:
    one grid; a list of ``F`` numbers in either: each firm's own, a number standing for
    every firm). Every price must lie within its firm's action bounds."""
    firms = spec.agents_per_market
    lo_f, hi_f = _firm_bounds(spec)
    grid, m = hyper.get("grid"), hyper["grid_size"]

    def within(field: str, value: Any, lows, highs) -> None:
        bad = [i for i in range(firms) if lows[i] < lo_f[i] or highs[i] > hi_f[i]]
        if bad:
            i = bad[0]
            raise _error(field, value, f"prices within each firm's action bounds (the market "
                         f"would clip the others): firm {i}'s grid spans [{lows[i]:.6g}, "
                         f"{highs[i]:.6g}], its bounds are [{lo_f[i]:.6g}, {hi_f[i]:.6g}] "
                         f"(widen market.sellers' low/high)")

    if isinstance(grid, Mapping):
        rule = check_mapping(CALVANO_GRID_FIELDS, grid, "learners.q_learning.grid")
        for field in ("grid_low", "grid_high"):
            if hyper.get(field) is not None:
                raise _error(field, hyper[field], "null with grid: {kind: calvano} (the rule "
                             "sets each firm's lowest and highest price)")
        if spec.static_prices is None:
            raise _error("grid", dict(grid), "an explicit grid or grid_low/grid_high: this "
                         "group's market gives no static game to compute p_N, p_M from")
        try:
            nash, joint = spec.static_prices()
        except ValueError as err:
            raise _error("grid", dict(grid), f"an explicit grid or grid_low/grid_high: {err}"
                         ) from None
        nash, joint = np.asarray(nash, np.float64), np.asarray(joint, np.float64)
        width = joint - nash
        if np.any(width <= 0):
            i = int(np.argmax(width <= 0))
            raise _error("grid", dict(grid), f"an explicit grid or grid_low/grid_high: the "
                         f"rule needs p_M,i > p_N,i, and firm {i} has p_N = {nash[i]:.6g}, "
                         f"p_M = {joint[i]:.6g}")
        lows = tuple(float(x) for x in nash - rule["xi"] * width)
        highs = tuple(float(x) for x in joint + rule["xi"] * width)
        within("grid", dict(grid), lows, highs)
        return GridForm(lows, highs, m, None, True, "grid")
    if grid is not None:
        if not isinstance(grid, (list, tuple)) or not grid:
            raise _error("grid", grid, "a list of prices, a list of one price list per firm, "
                         "or {kind: calvano, xi: 0.1}")
        if all(isinstance(g, (list, tuple)) for g in grid):
            if len(grid) != firms:
                raise _error("grid", grid, f"one list of prices, or {firms} lists: one per "
                             f"firm (agent of a market) of the group")
            for g in grid:
                if len(g) < 2 or not all(map(_number, g)) or np.any(np.diff(
                        np.asarray(g, np.float64)) <= 0):
                    raise _error("grid", grid, "lists of at least 2 strictly increasing "
                                 "prices, one per firm")
            if len({len(g) for g in grid}) != 1:
                raise _error("grid", grid, "per-firm grids of one length (every firm has the "
                             "same number of prices m: the Q tables are [states, m])")
            values = tuple(tuple(float(v) for v in g) for g in grid)
            lows, highs = tuple(v[0] for v in values), tuple(v[-1] for v in values)
            within("grid", grid, lows, highs)
            return GridForm(lows, highs, len(values[0]), values, True, "grid")
        if not all(map(_number, grid)):
            raise _error("grid", grid, "a list of prices, a list of one price list per firm, "
                         "or {kind: calvano, xi: 0.1}")
        values = np.asarray(grid, np.float64)
        if values.size < 2 or np.any(np.diff(values) <= 0):
            raise _error("grid", grid, "a list of at least 2 strictly increasing prices")
        lo, hi = float(np.min(spec.action_low)), float(np.max(spec.action_high))
        if values[0] < lo or values[-1] > hi:
            raise _error("grid", grid, f"prices within the group's action bounds [{lo:g}, "
                         f"{hi:g}] (the market would clip the others)")
        return GridForm(float(values[0]), float(values[-1]), int(values.size), grid)
    low, high = hyper.get("grid_low"), hyper.get("grid_high")
    low_f, high_f = _firm_values("grid_low", low, firms), _firm_values("grid_high", high, firms)
    if low_f is None and high_f is None:
        low = float(np.min(spec.action_low)) if low is None else float(low)
        high = float(np.max(spec.action_high)) if high is None else float(high)
        if not high > low:
            raise _error("grid_high", high, f"a price above grid_low ({low})")
        return GridForm(low, high, m)
    lows = low_f or tuple(float(x) for x in (lo_f if low is None else [low] * firms))
    highs = high_f or tuple(float(x) for x in (hi_f if high is None else [high] * firms))
    field = "grid_low" if low_f is not None else "grid_high"
    for i in range(firms):
        if not highs[i] > lows[i]:
            raise _error("grid_high", high, f"a price above grid_low for every firm: firm "
                         f"{i} has grid_low {lows[i]:g}, grid_high {highs[i]:g}")
    within(field, low if field == "grid_low" else high, lows, highs)
    return GridForm(lows, highs, m, None, True, field)


def digit_firms(hyper: Mapping[str, Any], spec: LearnerSpec, num_digits: int,
                form: GridForm) -> tuple[int, ...]:
    """Per-firm grids: the firm whose grid each state digit is snapped on
    (:attr:`LearnerSpec.obs_firms`); a ConfigError where the state is not the sellers'
    own prices (a stateless learner has no digit)."""
    if hyper.get("obs_grid") is not None:
        raise _error("obs_grid", hyper["obs_grid"], f"null with per-firm grids ({form.field}: "
                     f"each observed price is snapped on its own firm's grid)")
    if num_digits == 0:
        return ()
    firms = spec.obs_firms
    if firms is None or len(firms) != num_digits:
        value = hyper.get(form.field)
        raise _error(form.field, dict(value) if isinstance(value, Mapping) else value,
                     "one grid for the whole group: per-firm grids need memory 0, or the "
                     "observation [{kind: history, k: memory}] of a market whose sellers are "
                     "all this group's (each observed price is then snapped on its firm's grid)")
    return tuple(int(f) for f in firms)


def grid_bounds(hyper: Mapping[str, Any], spec: LearnerSpec) -> tuple[float, float, int, int]:
    """``(grid_low, grid_high, grid_size, num_digits)`` of :func:`make_grid`, validated
    (an explicit ``grid`` gives its first and last price and its length; per-firm grids
    the lowest and highest price of any firm)."""
    if spec.num_products != 1:
        raise _error("kind", "q_learning", f"a learner for one product per seller; this "
                     f"group has num_products={spec.num_products}")
    memory = hyper["memory"]
    periods = spec.obs_periods
    if memory == 0:
        num_digits = 0   # stateless: the observation is ignored
    elif periods is not None and memory != periods:
        held = (f"or {periods}, the periods the group's observation holds (its state is the "
                "whole observation)" if periods else "(the group observes nothing)")
        raise _error("memory", memory, f"0 (stateless) {held}; a memory of {memory} "
                     f"period(s) needs the observation [{{kind: history, k: {memory}}}]")
    elif spec.obs_dim <= 0 or spec.obs_dim % memory != 0:
        raise _error("memory", memory, f"observations of the last memory={memory} price "
                     f"profiles of all sellers (obs_dim = memory * num_sellers); got "
                     f"obs_dim={spec.obs_dim}")
    else:
        num_digits = spec.obs_dim
    form = grid_form(hyper, spec)
    m = form.m
    if form.per_firm:
        low, high = min(form.low), max(form.high)
    else:
        low, high = form.low, form.high
    if num_digits * np.log(m) >= np.log(_INT32_MAX + 1.0):
        raise _error("grid_size" if hyper.get("grid") is None else "grid", m,
                     f"grid_size^(memory * num_sellers) below 2^31: {m}^{num_digits} states "
                     f"do not fit in int32 (nor in memory); lower grid_size or memory")
    return low, high, m, num_digits


def price_grid(low: float, high: float, m: int, num_digits: int,
               values: Any = None) -> PriceGrid:
    """The grid of ``m`` prices ``linspace(low, high, m)`` (or the explicit ``values``)
    for states of ``num_digits`` observed prices."""
    radix = tuple(int(m) ** (num_digits - 1 - j) for j in range(num_digits))
    if values is not None:
        v = np.asarray(values, np.float64)
        return PriceGrid(prices=jnp.asarray(v, dtype=jnp.float32), low=float(v[0]),
                         spacing=float(np.min(np.diff(v))), radix=radix,
                         midpoints=tuple(float(x) for x in (v[1:] + v[:-1]) / 2))
    prices = jnp.asarray(np.linspace(low, high, m), dtype=jnp.float32)
    return PriceGrid(prices=prices, low=low, spacing=(high - low) / (m - 1), radix=radix)


def firm_grids(low: tuple[float, ...], high: tuple[float, ...], m: int,
               digit_firm: tuple[int, ...], values: Any = None) -> FirmGrids:
    """Each firm ``f``'s ``m`` prices ``linspace(low_f, high_f, m)`` (or its explicit
    ``values[f]``), state digit ``d`` on firm ``digit_firm[d]``'s grid."""
    num_digits = len(digit_firm)
    radix = tuple(int(m) ** (num_digits - 1 - j) for j in range(num_digits))
    if values is not None:
        v = np.asarray(values, np.float64)                                  # [F, m]
        return FirmGrids(prices=jnp.asarray(v, jnp.float32), low=tuple(float(x) for x in v[:, 0]),
                         spacing=tuple(float(x) for x in np.min(np.diff(v, axis=1), axis=1)),
                         radix=radix, digit_firm=digit_firm,
                         midpoints=tuple(tuple(float(x) for x in row)
                                         for row in (v[:, 1:] + v[:, :-1]) / 2))
    prices = np.stack([np.linspace(lo, hi, m) for lo, hi in zip(low, high)])
    return FirmGrids(prices=jnp.asarray(prices, jnp.float32), low=tuple(low),
                     spacing=tuple((hi - lo) / (m - 1) for lo, hi in zip(low, high)),
                     radix=radix, digit_firm=digit_firm)


def _check_joint_actions(m: int, agents_per_market: int) -> None:
    if m ** agents_per_market > _MAX_JOINT_ACTIONS:
        raise _error("q_init", "random_rival", f"an initial Q that does not evaluate all "
                     f"{m}^{agents_per_market} joint prices of a market (too many): zero, "
                     f"constant or uniform")


def random_rival_q(payoff: Any, grid: jax.Array, agents_per_market: int,
                   discount: float | tuple[float, ...]) -> jax.Array:
    """``[n, m]`` (``n = agents_per_market``): each agent's mean payoff of each grid price
    against uniformly random grid prices of the other agents of its market, divided by
    ``1 - discount``. ``payoff`` is the per-market one-shot payoff ``[n, 1] -> [n]``;
    ``grid`` ``[m]``, or ``[n, m]`` each agent's own grid (agent ``i`` plays
    ``grid[i, a_i]``); ``discount``: one ``delta``, or a tuple of each agent's own
    ``delta_i`` (row ``i`` divided by ``1 - delta_i``)."""
    m = int(grid.shape[-1])
    n = agents_per_market
    _check_joint_actions(m, n)
    num_joint = m ** n
    joint = np.indices((m,) * n).reshape(n, -1).T  # [J, n]
    joint = jnp.asarray(joint, dtype=jnp.int32)
    prices = _profile_prices(grid, joint)   # [J, n]
    rewards = jax.vmap(payoff)(prices[..., None])  # [J, n]
    own_price = jax.nn.one_hot(joint, m, dtype=rewards.dtype)  # [J, n, m]
    mean_payoff = jnp.einsum("ja,jam->am", rewards, own_price) / (num_joint // m)
    if isinstance(discount, tuple):
        return mean_payoff / np.asarray([1.0 - d for d in discount], np.float32)[:, None]
    return mean_payoff / (1.0 - discount)


def session_layout(spec: LearnerSpec) -> tuple[int, int]:
    """``(slots per session, policies per session)``, checking that ``spec`` folds its
    sessions as the training loop does: contiguous slot blocks, contiguous policy blocks,
    and no slot driven by another session's policy."""
    sessions, slots, policies = spec.num_sessions, spec.num_agents, spec.policies
    if sessions < 1 or slots % sessions or policies % sessions:
        raise ValueError(f"q_learning: {slots} agent slots and {policies} policies do not "
                         f"split into num_sessions={sessions} equal sessions")
    if spec.num_markets < 1 or slots % spec.num_markets:
        raise ValueError(f"q_learning: {slots} agent slots do not split into "
                         f"num_markets={spec.num_markets} equal markets")
    slots_per_session, policies_per_session = slots // sessions, policies // sessions
    index = np.asarray(spec.index())
    if np.any(index // policies_per_session != np.arange(slots) // slots_per_session):
        raise ValueError("q_learning: policy_index lets a session drive another session's "
                         "policies; sessions must not share parameters")
    return slots_per_session, policies_per_session


@dataclass(frozen=True)
class QLearningSettings:
    """Q-learning's resolved settings (static)."""

    grid_low: float             # the price grid: linspace(grid_low, grid_high, grid_size)
    grid_high: float
    grid_size: int              # m
    num_digits: int             # D = obs_dim: observed prices per state (0: stateless)
    # alpha, delta, beta: one float for every firm, or a tuple of one per firm (firm i is
    # agent i of its market: slot j plays firm j % agents_per_market's)
    learning_rate: float | tuple[float, ...]        # alpha
    discount: float | tuple[float, ...]             # delta
    exploration_decay: float | tuple[float, ...]    # beta
    convergence_window: int
    q_init: str | tuple[str, ...]   # a kind, or one per firm (then q_init_args: one per firm)
    num_sessions: int
    num_slots: int
    slots_per_session: int
    exclusive_policies: bool    # no two agents share a Q table
    # what ``init`` uses when it is given no spec: the make-time spec's
    policy_index: tuple[int, ...]
    num_policies: int
    agents_per_market: int
    payoff: Any = None
    grid_values: tuple[float, ...] | None = None   # an explicit grid (else the linspace)
    epsilon_start: float = 1.0                      # eps0 of eps_t = eps0 exp(-beta t)
    boltzmann: tuple[float, float] | None = None    # (T0, rho): T_t = T0 rho^t
    q_init_args: tuple = ()                         # constant: (v,); uniform: (low, high)
    feedback: str = "taken"                         # "taken" | "full"
    target: str = "simultaneous"                    # "simultaneous" | "sequential"
    turns: tuple[int, int] | None = None            # LearnerSpec.turns: (n, first)
    obs_grid: tuple[float, float, int] | None = None  # (low, high, size); None: the action grid
    # per-firm grids (:class:`FirmGrids`): each firm's lowest and highest price, its
    # explicit prices (else evenly spaced), and the firm of each state digit; None: one grid
    firm_low: tuple[float, ...] | None = None
    firm_high: tuple[float, ...] | None = None
    firm_values: tuple[tuple[float, ...], ...] | None = None
    digit_firm: tuple[int, ...] = ()

    @property
    def per_firm(self) -> bool:
        return self.firm_low is not None

    @property
    def obs_size(self) -> int:
        """Values per observed feature (the action grid's m unless ``obs_grid``)."""
        return self.grid_size if self.obs_grid is None else self.obs_grid[2]

    @property
    def num_states(self) -> int:
        return self.obs_size ** self.num_digits

    @property
    def session_shape(self) -> tuple[int, ...]:
        """Per-session quantities: shape [S], or [] for one session (the benchmark's
        vmapped path, which then runs exactly the single-session code)."""
        return () if self.num_sessions == 1 else (self.num_sessions,)

    @property
    def turn_period(self) -> int:
        """Periods between two turns of a slot (1: it moves every period)."""
        return 1 if self.turns is None else self.turns[0]

    def slot_phase(self) -> np.ndarray:
        """``[A]`` int32: slot ``i`` moves in periods ``t = phase_i (mod turn_period)``."""
        within = np.arange(self.num_slots) % self.agents_per_market
        first = 0 if self.turns is None else self.turns[1]
        return ((first + within) % self.turn_period).astype(np.int32)


def grid_of(settings: QLearningSettings) -> PriceGrid | FirmGrids:
    """The action grid: one for the group, or each firm's own (:class:`FirmGrids`)."""
    if settings.per_firm:
        return firm_grids(settings.firm_low, settings.firm_high, settings.grid_size,
                          settings.digit_firm, settings.firm_values)
    return price_grid(settings.grid_low, settings.grid_high, settings.grid_size,
                      settings.num_digits, settings.grid_values)


def obs_grid_of(settings: QLearningSettings) -> PriceGrid:
    """The grid whose :meth:`PriceGrid.state_index` numbers the states: the action grid,
    or ``obs_grid``'s ``linspace(low, high, size)``."""
    if settings.obs_grid is None:
        return grid_of(settings)
    low, high, size = settings.obs_grid
    return price_grid(low, high, size, settings.num_digits)


def obs_grid_settings(value: Any, hyper: Mapping[str, Any], spec: LearnerSpec,
                      num_digits: int) -> tuple[float, float, int] | None:
    """``obs_grid`` resolved: ``(low, high, size)``, or None for the action grid where
    the observation is on the action's scale (a ConfigError where it is not)."""
    if value is None:
        if num_digits > 0 and spec.obs_scale is not None:
            raise _error("obs_grid", None, f"a grid {{low, high, size}} for the observations: "
                         f"{spec.obs_scale} is not on the action grid's scale, and snapping "
                         f"it to the action grid would merge distinct states")
        return None
    if not isinstance(value, Mapping) or not {"low", "high"} <= set(value) or \
            not set(value) <= {"low", "high", "size"}:
        raise _error("obs_grid", value, "{low: L, high: H, size: N} (size: default grid_size)")
    low, high = value["low"], value["high"]
    size = value.get("size", hyper["grid_size"])
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in (low, high))
    if not numbers or not high > low:
        raise _error("obs_grid", value, "finite numbers low < high")
    if not isinstance(size, int) or isinstance(size, bool) or size < 2:
        raise _error("obs_grid.size", size, "an integer >= 2")
    if num_digits * np.log(size) >= np.log(_INT32_MAX + 1.0):
        raise _error("obs_grid.size", size, f"size^(memory * num_sellers) below 2^31 "
                     f"({size}^{num_digits} states)")
    return float(low), float(high), int(size)


def per_slot(settings: QLearningSettings, x: jax.Array) -> jax.Array:
    """A per-session array ``[S]`` -> per slot ``[A]`` (slots are contiguous per session)."""
    if settings.num_sessions == 1:
        return x  # a scalar broadcasts
    return jnp.repeat(x, settings.slots_per_session, total_repeat_length=settings.num_slots)


def slot_values(settings: QLearningSettings, value: float | tuple[float, ...],
                power: int = 1) -> Any:
    """A per-firm setting ``v`` raised to ``power`` for each slot: the float ``v^power``
    itself where every firm shares it (played exactly as before per-firm settings), else
    ``[A]`` float32 constants, slot ``j`` taking firm ``j mod n``'s ``v_f^power``."""
    if not isinstance(value, tuple):
        return value if power == 1 else value ** power
    firm = np.arange(settings.num_slots) % settings.agents_per_market
    return np.asarray([value[f] ** power for f in firm], np.float32)


def policy_values(value: float | tuple[float, ...], index: Any, firms: int,
                  policies: int) -> np.ndarray | None:
    """``[K]`` float32: each policy's value of a per-firm setting from the firms of the
    slots it drives (slot ``j``: firm ``j mod n``; a policy no slot drives: firm 0's);
    None where one policy is driven by firms with different values."""
    index = np.asarray(index, np.int64)
    if not isinstance(value, tuple):
        return np.full((policies,), value, np.float32)
    slot = np.asarray(value, np.float32)[np.arange(index.size) % firms]
    out = np.full((policies,), slot[0], np.float32)
    out[index] = slot
    return out if np.array_equal(out[index], slot) else None


def any_per_session(settings: QLearningSettings, x: jax.Array) -> jax.Array:
    """``[A]`` bool -> ``[S]``: whether any slot of each session is set."""
    if settings.num_sessions == 1:
        return jnp.any(x)
    return jnp.any(x.reshape(settings.num_sessions, settings.slots_per_session), axis=-1)


def slot_epsilon(settings: QLearningSettings, state: QLearningState) -> jax.Array:
    """``[A]`` exploration probability of each slot: ``eps0 exp(-beta_k t_s)`` with its
    policy's ``beta_k`` and its session's ``t_s`` (0 once the session converged)."""
    beta_slot = state.hyper["exploration_decay"][state.policy_index]
    t = per_slot(settings, state.step.astype(jnp.float32))
    eps = jnp.exp(-beta_slot * t)
    if settings.epsilon_start != 1.0:
        eps = settings.epsilon_start * eps
    return jnp.where(per_slot(settings, state.converged), 0.0, eps)


def slot_temperature(settings: QLearningSettings, state: QLearningState) -> jax.Array:
    """``[A]`` Boltzmann temperature ``T0 rho^t_s`` of each slot (0 once converged)."""
    t0, rho = settings.boltzmann
    t = per_slot(settings, state.step.astype(jnp.float32))
    temperature = t0 * jnp.exp(t * np.float32(np.log(rho)))
    return jnp.where(per_slot(settings, state.converged), 0.0, temperature)


def _per_session_mean(settings: QLearningSettings, x: jax.Array) -> jax.Array:
    if settings.num_sessions == 1:
        return jnp.mean(x)
    return jnp.mean(x.reshape(settings.num_sessions, settings.slots_per_session), axis=-1)


def epsilon(settings: QLearningSettings, state: QLearningState) -> jax.Array:
    """``[S]`` mean exploration probability of each session's slots (0 once
    converged; the session's ``exp(-beta t)`` when its policies share one beta)."""
    return _per_session_mean(settings, slot_epsilon(settings, state))


def initial_q(settings: QLearningSettings, key: jax.Array, payoff: Any, n: int,
              index: jax.Array, policies: int) -> jax.Array:
    """``[K, num_states, m]`` initial action values of ``q_init``."""
    m, num_states = settings.grid_size, settings.num_states
    shape = (policies, num_states, m)
    if settings.q_init == "uniform":
        low, high = settings.q_init_args
        return jax.random.uniform(key, shape, jnp.float32, low, high)
    if isinstance(settings.q_init, tuple):   # each firm its own kind (none uniform)
        rival = (random_rival_q(payoff, grid_of(settings).prices, n, settings.discount)
                 if "random_rival" in settings.q_init else None)            # [n, m]
        per_market = jnp.stack([
            rival[i] if kind == "random_rival" else
            jnp.full((m,), args[0] if kind == "constant" else 0.0, jnp.float32)
            for i, (kind, args) in enumerate(zip(settings.q_init, settings.q_init_args))])
        per_slot_rows = jnp.tile(per_market, (settings.num_slots // n, 1))  # slot i: i % n
        per_policy = scatter_mean(per_slot_rows, index, policies)
    elif settings.q_init == "random_rival":
        per_market = random_rival_q(payoff, grid_of(settings).prices, n,
                                    settings.discount)                     # [n, m]
        per_slot_rows = jnp.tile(per_market, (settings.num_slots // n, 1))  # slot i: i % n
        per_policy = scatter_mean(per_slot_rows, index, policies)
    else:
        value = settings.q_init_args[0] if settings.q_init == "constant" else 0.0
        per_policy = jnp.full((policies, m), value, jnp.float32)
    return per_policy.astype(jnp.float32)


def init(settings: QLearningSettings, key: jax.Array,
         spec: LearnerSpec | None = None) -> QLearningState:
    """The initial state; the key is used by ``q_init: uniform`` only."""
    m, num_states = settings.grid_size, settings.num_states
    if spec is None:
        index = jnp.asarray(settings.policy_index, dtype=jnp.int32)
        payoff, n, policies = settings.payoff, settings.agents_per_market, settings.num_policies
    else:
        if (spec.num_sessions, spec.num_agents) != (settings.num_sessions, settings.num_slots):
            raise ValueError(f"q_learning: init got a spec with {spec.num_agents} slots in "
                             f"{spec.num_sessions} sessions; the learner was made for "
                             f"{settings.num_slots} slots in {settings.num_sessions}")
        index = spec.index()
        payoff, n, policies = spec.payoff, spec.agents_per_market, spec.policies
    q0 = initial_q(settings, key, payoff, n, index, policies)
    if q0.ndim == 3:
        rows = pack_rows(q0)
    else:
        row = pack_rows(q0)                                                # [K, m + 1]
        rows = jnp.array(jnp.broadcast_to(row[:, None, :], (policies, num_states, m + 1)))
    shape = settings.session_shape
    pending = clock = None
    if settings.target == "sequential":
        slots = settings.num_slots
        pending = {"s": jnp.zeros((slots,), jnp.int32), "a": jnp.zeros((slots,), jnp.int32),
                   "acc": jnp.zeros((slots,), jnp.float32),
                   "valid": jnp.zeros((slots,), bool)}
        clock = jnp.zeros((), jnp.int32)
    return QLearningState(
        rows=rows, policy_index=index, step=jnp.zeros(shape, jnp.int32),
        stable_periods=jnp.zeros(shape, jnp.int32), converged=jnp.zeros(shape, bool),
        hyper={name: _hyper(settings, name, index, n, policies) for name in PBT_HYPERPARAMS},
        pending=pending, clock=clock)


def _hyper(settings: QLearningSettings, name: str, index: Any, firms: int,
           policies: int) -> jax.Array:
    """``[K]`` float32 initial ``state.hyper[name]``: the one value, or each policy's
    firm's (as :func:`policy_values`)."""
    value = getattr(settings, name)
    if not isinstance(value, tuple):
        return jnp.full((policies,), value, jnp.float32)
    # slot j writes firm j mod n's value into its policy (qlearning_settings checked that
    # the slots of a policy agree; ``index`` may be traced)
    slot = np.asarray(value, np.float32)[np.arange(np.shape(index)[0]) % firms]
    return jnp.full((policies,), slot[0], jnp.float32).at[index].set(jnp.asarray(slot))


def act(settings: QLearningSettings, state: QLearningState, obs: jax.Array, key: jax.Array):
    grid, m = grid_of(settings), settings.grid_size
    num_agents = obs.shape[0]
    s = obs_grid_of(settings).state_index(obs)              # [A]: the state update writes
    if settings.boltzmann is not None:
        # softmax over Q(s, .) / T_t, written as (Q - max Q) / T so that a temperature
        # that has decayed to (almost) zero is greedy play (first index on ties)
        q = state.rows[state.policy_index, s, :m]                          # [A, m]
        temperature = jnp.broadcast_to(slot_temperature(settings, state), (num_agents,))[:, None]
        logits = (q - jnp.max(q, axis=-1, keepdims=True)) / jnp.maximum(temperature, 1e-30)
        greedy = state.rows[state.policy_index, s, m].astype(jnp.int32)
        sampled = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
        action = jnp.where(temperature[:, 0] > 0, sampled, greedy)
        return grid.slot_price(action)[:, None], {"action_index": action}
    greedy = state.rows[state.policy_index, s, m].astype(jnp.int32)
    eps = slot_epsilon(settings, state)                     # [A]
    # One uniform per agent decides both whether to explore (u < eps) and, given that
    # it does, which price: u / eps is then uniform on [0, 1).
    u = jax.random.bits(key, (num_agents,), jnp.uint32).astype(jnp.float32) * 2.0**-32
    explore = u < eps
    random_action = jnp.minimum((u / jnp.maximum(eps, 1e-30) * m).astype(jnp.int32), m - 1)
    action = jnp.where(explore, random_action, greedy)
    return grid.slot_price(action)[:, None], {"action_index": action}


def sequential_target(settings: QLearningSettings, state: QLearningState, s, a, r):
    """Klein (2021)'s update under alternating moves, for one period ``t`` (the clock).

    A slot moving in this period updates the state-action of its previous turn
    ``t - n`` with the profits it earned since, discounted from that turn, and
    ``delta^n max_a' Q(s_t, a')``::

        Q(s_t-n, a_t-n) <- (1 - alpha) Q + alpha [sum_k<n delta^k pi_t-n+k + delta^n max Q(s_t, .)]

    (``n = 2``: Klein's ``pi_t + delta pi_t+1 + delta^2 max Q(s_t+2, .)``), then starts
    a pending update from ``(s_t, a_t)``; the other slots add ``delta^k pi_t`` to theirs.
    Returns ``(state with its new pending and clock, row state, action, target, moved)``:
    ``moved`` marks the slots whose update is due.
    """
    n, m, pending = settings.turn_period, settings.grid_size, state.pending
    phase = jnp.asarray(settings.slot_phase())
    lag = jnp.mod(state.clock - phase, n)                   # [A]: 0 in the slot's turn
    mover = lag == 0
    value_now = jnp.max(state.rows[state.policy_index, s, :m], axis=-1)
    delta_n = slot_values(settings, settings.discount, n)           # delta^n (per slot)
    target = pending["acc"] + np.float32(delta_n) * value_now
    due = mover & pending["valid"]
    weight = jnp.power(np.float32(slot_values(settings, settings.discount)),
                       lag.astype(jnp.float32))
    new_pending = {"s": jnp.where(mover, s, pending["s"]),
                   "a": jnp.where(mover, a, pending["a"]),
                   "acc": jnp.where(mover, r, pending["acc"] + weight * r),
                   "valid": pending["valid"] | mover}
    state = state.replace(pending=new_pending, clock=state.clock + 1)
    return state, pending["s"], pending["a"], target, due


def learn_one_period(settings: QLearningSettings, state: QLearningState, period):
    """One period's update of every slot (``period = (s, a, r, s', done, cf)``, ``cf``
    the ``[A, m]`` counterfactual payoffs under full feedback, else None)."""
    m = settings.grid_size
    s, a, r, s_next, done, cf = period                      # each [A]
    policy = state.policy_index
    learning_session = ~state.converged                     # [S]
    learning = per_slot(settings, learning_session)         # [A]
    if settings.target == "sequential":
        state, s, a, target, due = sequential_target(settings, state, s, a, r)
        learning = learning & due
    row = state.rows[policy, s]                             # [A, m + 1]
    old_greedy = row[:, m].astype(jnp.int32)
    row = row[:, :m]
    is_action = jnp.arange(m, dtype=jnp.int32) == a[:, None]  # [A, m]
    alpha_slot = state.hyper["learning_rate"][policy]
    if settings.target != "sequential":
        next_value = jnp.max(state.rows[policy, s_next, :m], axis=-1)
        continuation = slot_values(settings, settings.discount) * jnp.where(done, 0.0,
                                                                            next_value)
        target = r + continuation
    if cf is not None:   # every action of the row: what it would have earned
        payoffs = jnp.where(is_action, r[:, None], cf)
        targets = payoffs + continuation[:, None]           # the same continuation value
        increment = jnp.where(jnp.expand_dims(learning, -1), alpha_slot[:, None] * (targets - row),
                              0.0)
        new_row = row + increment
    else:
        q_sa = jnp.take_along_axis(row, a[:, None], axis=-1)[:, 0]
        increment = jnp.where(learning, alpha_slot * (target - q_sa), 0.0)
        new_row = jnp.where(is_action, (q_sa + increment)[:, None], row)
    if settings.exclusive_policies:
        _, new_greedy = max_and_argmax(new_row)
        new_rows = jnp.concatenate([new_row, new_greedy.astype(jnp.float32)[:, None]], -1)
        # a whole row per agent: its values and its greedy index
        rows = state.rows.at[policy, s].set(new_rows, unique_indices=True)
    else:  # agents sharing a policy may update the same entry: increments add up
        if cf is not None:
            rows = state.rows.at[policy, s, :m].add(increment)
        else:
            rows = state.rows.at[policy, s, a].add(increment)
        _, new_greedy = max_and_argmax(rows[policy, s, :m])
        # agents on the same (policy, state) row write the same greedy index
        rows = rows.at[policy, s, m].set(new_greedy.astype(jnp.float32))
    changed = (new_greedy != old_greedy) & learning
    stable = jnp.where(any_per_session(settings, changed), 0, state.stable_periods + 1)
    stable = jnp.where(learning_session, stable, state.stable_periods)
    step = jnp.where(learning_session & (state.step < _INT32_MAX), state.step + 1,
                     state.step)
    converged = state.converged | (stable >= settings.convergence_window)
    new_state = state.replace(rows=rows, step=step,
                              stable_periods=stable, converged=converged)
    return new_state, jnp.sum(changed)


def counterfactual_payoffs(settings: QLearningSettings, actions: jax.Array) -> jax.Array:
    """``[T, A, m]``: the payoff each slot would have earned with each grid price while
    the others of its market played their actual ``actions [T, A, 1]`` -- the market's
    one-shot payoff (``LearnerSpec.payoff``), ``vmap``ped over periods and markets,
    slots and grid prices::

        cf[t, i, a] = payoff_i(p_a, p_-i,t)
    """
    n, m = settings.agents_per_market, settings.grid_size
    grid = grid_of(settings)
    num_periods, num_slots = actions.shape[:2]
    profiles = actions.reshape(num_periods * (num_slots // n), n, 1)

    def deviation(profile: jax.Array, j: jax.Array, a: jax.Array) -> jax.Array:
        return settings.payoff(profile.at[j, 0].set(grid.firm_price(j, a)))[j]

    over_grid = jax.vmap(deviation, (None, None, 0))
    over_slots = jax.vmap(over_grid, (None, 0, None))
    cf = jax.vmap(over_slots, (0, None, None))(profiles, jnp.arange(n), jnp.arange(m))
    return cf.reshape(num_periods, num_slots, m).astype(jnp.float32)


def update(settings: QLearningSettings, state: QLearningState, batch: Transition):
    grid, states = grid_of(settings), obs_grid_of(settings)
    s = states.state_index(batch.obs)                       # [T, A]
    s_next = states.state_index(batch.next_obs)
    aux = batch.aux if isinstance(batch.aux, Mapping) else {}
    a = aux.get("action_index")
    a = grid.slot_index(batch.action[..., 0]) if a is None else a.astype(jnp.int32)
    cf = (counterfactual_payoffs(settings, batch.action) if settings.feedback == "full"
          else None)
    periods = (s, a, batch.reward.astype(jnp.float32), s_next, batch.done.astype(bool), cf)
    one_period = partial(learn_one_period, settings)
    if batch.reward.shape[0] == 1:  # one period: no loop
        state, changes = one_period(state, jax.tree.map(lambda x: x[0], periods))
        changes = changes[None]
    else:
        state, changes = jax.lax.scan(one_period, state, periods)
    metrics = {"greedy_changes": jnp.sum(changes), "stable_periods": state.stable_periods,
               "converged": state.converged}
    if settings.boltzmann is not None:
        metrics["temperature"] = _per_session_mean(settings, slot_temperature(settings, state))
    else:
        metrics["epsilon"] = epsilon(settings, state)
    return state, metrics


def _sub_settings(fields: Mapping[str, Field], value: Any, name: str,
                  ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    return check_mapping(fields, value, f"learners.q_learning.{name}", ignore=ignore)


def exploration_settings(hyper: Mapping[str, Any], firms: int) -> dict[str, Any]:
    """``exploration_decay`` / ``epsilon`` / ``boltzmann`` -> settings fields."""
    if hyper["epsilon"] is not None and hyper["boltzmann"] is not None:
        raise _error("boltzmann", hyper["boltzmann"], "null when epsilon is set (one "
                     "exploration rule: epsilon-greedy or Boltzmann)")
    out = {"exploration_decay": firm_setting("exploration_decay", hyper["exploration_decay"],
                                             firms)}
    if hyper["epsilon"] is not None:
        if isinstance(out["exploration_decay"], tuple):
            raise _error("exploration_decay", hyper["exploration_decay"], "its default with "
                         "epsilon (epsilon.decay, one for every firm, replaces it)")
        eps = _sub_settings(EPSILON_FIELDS, hyper["epsilon"], "epsilon")
        out.update(exploration_decay=eps["decay"], epsilon_start=eps["start"])
    if hyper["boltzmann"] is not None:
        b = _sub_settings(BOLTZMANN_FIELDS, hyper["boltzmann"], "boltzmann")
        out["boltzmann"] = (b["temperature"], b["decay"])
    return out


def q_init_settings(value: Any) -> tuple[str, tuple[float, ...]]:
    """``q_init`` (a kind, or a mapping ``{kind, ...}``) -> ``(kind, args)``."""
    allowed = ("random_rival, zero, {kind: constant, value: v} or "
               "{kind: uniform, low: l, high: h}")
    kind = value.get("kind") if isinstance(value, Mapping) else value
    if not isinstance(kind, str) or kind not in Q_INIT_FIELDS:
        raise _error("q_init", value, allowed)
    if Q_INIT_FIELDS[kind] and not isinstance(value, Mapping):
        raise _error("q_init", value, f"{{kind: {kind}, "
                     + ", ".join(f"{k}: ..." for k in Q_INIT_FIELDS[kind]) + "}")
    args = _sub_settings(Q_INIT_FIELDS[kind], value if isinstance(value, Mapping) else {},
                         "q_init", ignore=("kind",))
    if kind == "uniform" and not args["high"] > args["low"]:
        raise _error("q_init.high", args["high"], f"a value above low ({args['low']})")
    return kind, tuple(float(v) for v in args.values())


#: the settings a list may give per firm (besides q_init and the grid's)
FIRM_SETTINGS = ("learning_rate", "discount", "exploration_decay")


def firm_setting(field: str, value: Any, firms: int) -> float | tuple[float, ...]:
    """A checked per-firm setting: a number (every firm's), or a list of ``F`` numbers
    (``F`` firms: the agents of a market), each firm's own; a list of ``F`` equal
    numbers is that number (it plays exactly as the number does)."""
    if not isinstance(value, (list, tuple)):
        return float(value)
    if len(value) != firms:
        raise _error(field, list(value), f"a number, or a list of {firms} numbers: one per "
                     f"firm (agent of a market) of the group")
    values = tuple(float(v) for v in value)
    return values[0] if len(set(values)) == 1 else values


def firm_q_init(value: Any, firms: int) -> tuple[Any, tuple]:
    """``q_init`` resolved (:func:`q_init_settings`): one kind, or a list of ``F`` (one per
    firm: ``(kinds, args)`` tuples of ``F``; equal entries are the one kind). Per-firm
    kinds are random_rival, zero and constant (uniform draws only alike for every firm)."""
    if not isinstance(value, (list, tuple)):
        return q_init_settings(value)
    if len(value) != firms:
        raise _error("q_init", list(value), f"one initial Q, or a list of {firms}: one per "
                     f"firm (agent of a market) of the group")
    parsed = [q_init_settings(v) for v in value]
    if len(set(parsed)) == 1:
        return parsed[0]
    if any(kind == "uniform" for kind, _ in parsed):
        raise _error("q_init", list(value), "one q_init for every firm where one is uniform, "
                     "or per-firm kinds among random_rival, zero and {kind: constant, ...}")
    return tuple(k for k, _ in parsed), tuple(a for _, a in parsed)


def check_feedback(hyper: Mapping[str, Any], spec: LearnerSpec) -> None:
    """``feedback: full`` and ``target: sequential`` against the market."""
    if spec.turns is not None and hyper["target"] != "sequential":
        raise _error("target", hyper["target"], "sequential under market.move_order: "
                     "alternating (a seller's price stands for several periods: Klein "
                     "2021's target)")
    if hyper["feedback"] != "full":
        return
    if hyper["memory"] != 0:
        raise _error("feedback", "full", f"taken, or memory: 0 (a counterfactual price "
                     f"would change the remembered state; memory={hyper['memory']})")
    if hyper["target"] == "sequential":
        raise _error("feedback", "full", "taken under target: sequential")
    if spec.payoff is None or spec.payoff_caveat is not None:
        why = spec.payoff_caveat or "the market provides no one-shot payoff"
        raise _error("feedback", "full", f"taken: the market cannot evaluate this group's "
                     f"counterfactual payoffs ({why})")


def qlearning_settings(hyper: Mapping[str, Any], spec: LearnerSpec) -> QLearningSettings:
    """Validate ``hyper`` against ``spec`` (nothing traced) and resolve the settings."""
    hyper = check_mapping(HYPER_FIELDS, hyper, "learners.q_learning")
    low, high, m, num_digits = grid_bounds(hyper, spec)
    slots = spec.index().tolist()
    slots_per_session, _ = session_layout(spec)
    firms = spec.agents_per_market
    per_firm = {name: firm_setting(name, hyper[name], firms) for name in FIRM_SETTINGS}
    for name in ("learning_rate", "exploration_decay"):   # state.hyper: one per policy
        if policy_values(per_firm[name], slots, firms, spec.policies) is None:
            raise _error(name, list(per_firm[name]), "one value for every firm where firms "
                         "share a Q table (policy)")
    q_init, q_init_args = firm_q_init(hyper["q_init"], firms)
    kinds = q_init if isinstance(q_init, tuple) else (q_init,) * firms
    discounts = per_firm["discount"]
    discounts = discounts if isinstance(discounts, tuple) else (discounts,) * firms
    if "random_rival" in kinds:
        if spec.payoff is None:
            raise _error("q_init", q_init, "zero, constant or uniform: random_rival needs "
                         "the market's one-shot payoff (LearnerSpec.payoff)")
        if any(k == "random_rival" and d >= 1.0 for k, d in zip(kinds, discounts)):
            raise _error("q_init", q_init, "zero, constant or uniform with discount 1: "
                         "random_rival needs discount < 1")
        _check_joint_actions(m, spec.agents_per_market)
    check_feedback(hyper, spec)
    form = grid_form(hyper, spec)
    grid = None if form.per_firm else form.values
    firm = {}
    if form.per_firm:
        firm = dict(firm_low=tuple(form.low), firm_high=tuple(form.high),
                    firm_values=form.values,
                    digit_firm=digit_firms(hyper, spec, num_digits, form))
    return QLearningSettings(
        grid_low=low, grid_high=high, grid_size=m, num_digits=num_digits,
        learning_rate=per_firm["learning_rate"], discount=per_firm["discount"],
        convergence_window=hyper["convergence_window"], q_init=q_init,
        num_sessions=spec.num_sessions, num_slots=spec.num_agents,
        slots_per_session=slots_per_session,
        exclusive_policies=len(set(slots)) == len(slots),
        policy_index=tuple(int(i) for i in slots), num_policies=spec.policies,
        agents_per_market=spec.agents_per_market, payoff=spec.payoff,
        grid_values=None if grid is None else tuple(float(v) for v in grid),
        q_init_args=q_init_args, feedback=hyper["feedback"], target=hyper["target"],
        turns=spec.turns, obs_grid=obs_grid_settings(hyper["obs_grid"], hyper, spec, num_digits),
        **firm, **exploration_settings(hyper, firms))


def make(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    settings = qlearning_settings(hyper, spec)
    return Learner(init=partial(init, settings), act=partial(act, settings),
                   update=partial(update, settings))


def equilibrium_actions(hyper: Mapping[str, Any], spec: LearnerSpec, n: int) -> ActionSet:
    """The static game's actions of one market's ``n`` agents: the price grid, for every
    agent and product (per-firm grids: each agent its own)."""
    prices = grid_of(qlearning_settings(hyper, spec)).table(n)                 # [n, m]
    return ActionSet.from_grid(np.broadcast_to(prices[:, None, :],
                                               (n, spec.num_products, prices.shape[-1])))


def convergence(state: QLearningState) -> dict:
    """Each session's convergence rule: ``converged``, ``stable_periods`` and ``step``
    (a converged session's period count stops at its convergence)."""
    return {"converged": state.converged, "stable_periods": state.stable_periods,
            "step": state.step}


# the per-policy hyperparameters of ``state.hyper`` (what PBT may mutate)
PBT_HYPERPARAMS = ("learning_rate", "exploration_decay")

Q_LEARNING = LEARNERS.register(LearnerDef(
    kind="q_learning", make=make, hyper_fields=HYPER_FIELDS, doc=__doc__.split("\n\n")[0],
    move_orders=("simultaneous", "alternating"),
    # a replaced member copies its Q tables (with their greedy column) and hyper; the
    # session's period count is shared
    pbt_hyperparams=PBT_HYPERPARAMS, member_fields=("rows", "hyper"),
    action_set=equilibrium_actions, snapshot=lambda state: {"rows": state.rows},
    convergence=convergence))
