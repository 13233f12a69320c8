"""The multi-agent market environment (gymnax 1.0 style, dict-per-group API).

    env, params = jaxmarket.make("configs/logit_duopoly.yaml")
    obs, state = env.reset(key, params)
    obs, state, rewards, terminated, truncated, info = env.step(key, state, actions, params)

``obs``, ``actions`` and ``rewards`` are dicts keyed by agent-group name with a leading
agent axis. One step: actions -> prices/multipliers/budgets (clipped to bounds; a NaN or
+-inf entry keeps the action in force, flagged in ``info["nonfinite_actions"]``) ->
demand process -> distributor -> state -> rewards -> observations, then finished
episodes auto-reset (``terminated`` is always False: a market has no terminal state;
``truncated`` when ``time >= episode_length``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.combinators.observations import build_observation
from jaxmarket.combinators.rewards import build_reward, is_random
from jaxmarket.combinators.saturate import MONEY_MAX, PRICE_MAX, cap, money
from jaxmarket.combinators.view import GroupView
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS, Allocation, Quotes
from jaxmarket.market.spec import GroupSpec, MarketParams, MarketSpec, thaw
from jaxmarket.market.state import ACTION_FIELDS, MarketState

if TYPE_CHECKING:
    from gymnax.environments import spaces


def _spaces():
    """gymnax's ``spaces``, imported on first use: importing ``gymnax.environments``
    imports every gymnax environment (matplotlib, seaborn: over a second of start-up),
    which only :meth:`MarketEnv.action_space`, :meth:`MarketEnv.observation_space` and
    the adapters need (the rest of the package reads :meth:`MarketEnv.action_bounds` and
    :meth:`MarketEnv.observation_shape`)."""
    from gymnax.environments import spaces
    return spaces


#: the constant a step's key is folded with for the reward terms' draws
REWARD_STREAM = 0x5EED


class MarketEnv:
    """Stateless environment over a static :class:`MarketSpec` (hashable, so methods
    jit with ``self`` static)."""

    def __init__(self, spec: MarketSpec):
        self.spec = spec
        self._reward = {g.name: build_reward(thaw(g.reward), g.count, f"{g.name}.reward", g.side)
                        for g in spec.agent_groups}
        # the groups whose reward draws (a noise term): their views carry a key
        self._random_reward = {g.name for g in spec.agent_groups if is_random(thaw(g.reward))}
        self._observe = {g.name: build_observation(thaw(g.observation), f"{g.name}.observation",
                                                   g.side)
                         for g in spec.agent_groups}
        self._distributor = DISTRIBUTORS[spec.distributor]
        self._options = dict(thaw(spec.distributor_options) or {})
        # the distributor reads the last period's prices (``Quotes.previous``)
        self._lagged = self._distributor.is_lagged(self._options)

    @property
    def lagged(self) -> bool:
        """Whether a period's allocation reads the last period's prices (the
        distributor's ``is_lagged``): a period then depends on the prices in force before
        it, not on the current ones alone."""
        return self._lagged

    def held(self, state: MarketState, actions: dict, params: MarketParams) -> MarketState:
        """``state`` with ``actions`` already in force (:meth:`apply_actions`): the state
        from which a step of the same actions plays a profile held for a second period
        (the one-shot game of a lagged market, :attr:`lagged`; every other market's step
        ignores the prices in force before it)."""
        return self.apply_actions(state, actions, params)

    def one_shot_state(self, state: MarketState, actions: dict,
                       params: MarketParams) -> MarketState:
        """The state a one-shot step of ``actions`` starts from (the static game's):
        ``state``, or in a lagged market (:attr:`lagged`) ``state`` with the same actions
        already in force (:meth:`held`: the profile held two periods)."""
        return self.held(state, actions, params) if self._lagged else state

    def __hash__(self) -> int:
        return hash(self.spec)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MarketEnv) and other.spec == self.spec

    # ------------------------------------------------------------------ info
    @property
    def agent_groups(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.spec.agent_groups)

    def num_agents(self, group: str) -> int:
        return self.spec.group(group).count

    def _bounds(self, g: GroupSpec, params: MarketParams):
        if g.side == "seller":
            p = params.sellers[g.name]
            return p.low, p.high
        p = params.consumers[g.name]
        return p.budget_low, p.budget_high

    def action_bounds(self, group: str, params: MarketParams) -> tuple[Any, Any]:
        """``(low, high)`` of :meth:`action_space` (each ``[n_agents, P]``), without
        gymnax: what the plan, the learners and the benchmarks read of the space."""
        g = self.spec.group(group)
        if not g.agent:
            raise ValueError(f"group {group!r} is not an agent group: {self.agent_groups}")
        return self._bounds(g, params)

    def observation_shape(self, group: str, params: MarketParams) -> tuple[int, ...]:
        """``[n_agents, D]``: the shape of :meth:`observation_space`, without gymnax."""
        obs = jax.eval_shape(lambda k: self.reset(k, params)[0], jax.random.key(0))[group]
        return tuple(obs.shape)

    def action_space(self, group: str, params: MarketParams) -> spaces.Box:
        """Box [n_agents, P] between the group's bounds (prices, multipliers or budgets)."""
        low, high = self.action_bounds(group, params)
        shape = (self.spec.group(group).count, self.spec.num_products)
        return _spaces().Box(low, high, shape, jnp.float32)

    def observation_space(self, group: str, params: MarketParams) -> spaces.Box:
        """Box [n_agents, D] (unbounded)."""
        return _spaces().Box(-jnp.inf, jnp.inf, self.observation_shape(group, params),
                             jnp.float32)

    # ------------------------------------------------------------------ reset
    def reset_env(self, key: jax.Array, params: MarketParams) -> tuple[dict, MarketState]:
        spec, P = self.spec, self.spec.num_products
        zeros = lambda g: jnp.zeros((g.count, P), jnp.float32)  # noqa: E731
        prices = {g.name: jnp.asarray(params.sellers[g.name].initial, jnp.float32)
                  for g in spec.sellers if g.action == "price"}
        mults = {g.name: jnp.asarray(params.sellers[g.name].initial, jnp.float32)
                 for g in spec.sellers if g.action == "multiplier"}
        quantities = {g.name: jnp.asarray(params.sellers[g.name].initial, jnp.float32)
                      for g in spec.sellers if g.action == "quantity"}
        budgets = {}
        for g in spec.consumers:
            c = params.consumers[g.name]
            b = jnp.asarray(c.budget, jnp.float32)
            budgets[g.name] = jnp.clip(b, c.budget_low, c.budget_high) if g.agent else b
        demand = {g.name: DEMANDS[g.demand_kind].init(params.consumers[g.name].demand, (g.count, P))
                  for g in spec.consumers}
        state = MarketState(
            prices=prices, multipliers=mults, quantities=quantities, budgets=budgets,
            queries={g.name: zeros(g) for g in spec.consumers},
            traffic={g.name: zeros(g) for g in spec.sellers},
            fees={g.name: zeros(g) for g in spec.sellers},
            unserved={g.name: zeros(g) for g in spec.consumers},
            spend={g.name: zeros(g) for g in spec.consumers},
            demand=demand,
            last_reward={g.name: jnp.zeros((g.count,), jnp.float32) for g in spec.agent_groups},
            price_history=jnp.zeros((spec.history, spec.num_sellers, P), jnp.float32),
            time=jnp.zeros((), jnp.int32),
        )
        hist = jnp.broadcast_to(self._quoted_prices(state, params)[None], state.price_history.shape)
        state = state.replace(price_history=hist)
        return self.get_obs(state, params), state

    @partial(jax.jit, static_argnums=(0,))
    def reset(self, key: jax.Array, params: MarketParams) -> tuple[dict, MarketState]:
        return self.reset_env(key, params)

    # ------------------------------------------------------------------ step
    def _seller_action(self, state: MarketState, g: GroupSpec) -> jax.Array:
        return getattr(state, ACTION_FIELDS[g.action])[g.name]

    def _quotes(self, state: MarketState, params: MarketParams, queries: dict) -> Quotes:
        spec = self.spec
        cat = lambda xs: jnp.concatenate(xs, axis=0)  # noqa: E731
        sp = [params.sellers[g.name] for g in spec.sellers]
        cp = [params.consumers[g.name] for g in spec.consumers]
        return Quotes(
            price=cat([self._seller_action(state, g) for g in spec.sellers]),
            is_multiplier=jnp.asarray(np.concatenate(
                [np.full(g.count, g.action == "multiplier") for g in spec.sellers])),
            budget=cat([state.budgets[g.name] for g in spec.consumers]),
            queries=cat([queries[g.name] for g in spec.consumers]),
            base_price=cat([c.base_price for c in cp]),
            quality=cat([s.quality for s in sp]), reliability=cat([s.reliability for s in sp]),
            latency=cat([s.latency for s in sp]), freshness=cat([s.freshness for s in sp]),
            stake=cat([s.stake for s in sp]),
        )

    def _quoted_prices(self, state: MarketState, params: MarketParams) -> jax.Array:
        """[S, P] quoted prices (multipliers x the first consumer's base price), saturated
        at PRICE_MAX / S (a multiplier of 1e30 x a base of 1e30; any sum over the
        sellers stays finite). The cap is on the operands (``cap``: no op between the
        multiply and what adds it up), so prices below it are bit for bit the products."""
        base = params.consumers[self.spec.consumers[0].name].base_price[0]
        bound = PRICE_MAX / self.spec.num_sellers
        quotes = []
        for g in self.spec.sellers:
            action = self._seller_action(state, g)
            if g.action == "multiplier":
                quotes.append(action * cap(base, action, bound))
            else:
                quotes.append(jnp.minimum(action, bound) * 1.0)
        return jnp.concatenate(quotes, axis=0)

    def apply_actions(self, state: MarketState, actions: dict, params: MarketParams) -> MarketState:
        """Actions -> prices / multipliers / quantities / budgets, clipped to the group's
        bounds. With ``move_order: alternating`` seller ``s`` (flat seller index) takes its
        action only when ``state.time % num_sellers == s`` and otherwise keeps the one in
        force (consumer agents always act).

        **Non-finite actions.** An entry that is NaN, +inf or -inf (of a price,
        multiplier, budget or quantity alike) is no action: the agent keeps that entry's
        action in force (its price, multiplier, budget or quantity in ``state``, which is
        finite and within the bounds), as a seller that does not move this period does.
        Why this rule: a non-finite action is a malfunction (a diverged learner, a bug),
        not a choice; NaN has no direction to clip towards, and clipping +-inf to a bound
        would put a price jump that nobody chose into the rivals' observations, rewards and
        the run's collusion measures. One rule for all three values keeps the market on
        the last actions actually taken. :meth:`step` flags every such entry in
        ``info["nonfinite_actions"]`` (see :meth:`nonfinite_actions`); applied in the
        graph (a select before the clip), so no value is read back to the host."""
        new = {f: dict(getattr(state, f)) for f in ACTION_FIELDS.values()}
        alternating = self.spec.move_order == "alternating"
        for g in self.spec.agent_groups:
            if g.name not in actions:
                raise KeyError(f"actions has no entry for agent group {g.name!r}; "
                               f"expected keys {self.agent_groups}")
            low, high = self._bounds(g, params)
            a = jnp.asarray(actions[g.name], jnp.float32)
            in_force = new[ACTION_FIELDS[g.action]][g.name]
            a = jnp.clip(jnp.where(jnp.isfinite(a), a, in_force), low, high)
            if alternating and g.side == "seller":
                turn = state.time % self.spec.num_sellers
                mover = jnp.arange(g.offset, g.offset + g.count) == turn      # [n]
                a = jnp.where(mover[:, None], a, new[ACTION_FIELDS[g.action]][g.name])
            new[ACTION_FIELDS[g.action]][g.name] = a
        return state.replace(**new)

    def nonfinite_actions(self, state: MarketState, actions: dict) -> dict:
        """``{group: [n, P] bool}``: True where the entry of ``actions[group]`` is NaN or
        +-inf (the entries :meth:`apply_actions` replaces by the action in force);
        ``.sum()`` counts them. An action given with a broadcast shape (a scalar, ``[P]``)
        is flagged on every entry it fills."""
        return {g.name: jnp.broadcast_to(
                    ~jnp.isfinite(jnp.asarray(actions[g.name], jnp.float32)),
                    getattr(state, ACTION_FIELDS[g.action])[g.name].shape)
                for g in self.spec.agent_groups if g.name in actions}

    def step_env(self, key: jax.Array, state: MarketState, actions: dict, params: MarketParams):
        spec = self.spec
        k_demand, k_dist = jax.random.split(key)
        nonfinite = self.nonfinite_actions(state, actions)
        # the prices in force before this step's actions, for a rule on the last period's
        # (``DistributorDef.lagged``; unused otherwise, so not computed)
        previous = self._quoted_prices(state, params) if self._lagged else None
        state = self.apply_actions(state, actions, params)
        # demand processes
        queries, demand = {}, {}
        dkeys = jax.random.split(k_demand, len(spec.consumers))
        for i, g in enumerate(spec.consumers):
            c = params.consumers[g.name]
            queries[g.name], demand[g.name] = DEMANDS[g.demand_kind].step(
                dkeys[i], state.time, state.demand[g.name], c.demand, c.queries)
        quotes = self._quotes(state, params, queries).replace(previous=previous)
        alloc: Allocation = self._distributor.allocate(k_dist, quotes, params.distributor,
                                                       self._options)
        split = lambda x, g: x[g.offset:g.offset + g.count]  # noqa: E731
        new_hist = state.price_history
        quoted = self._quoted_prices(state, params)
        if spec.history > 0:
            new_hist = jnp.concatenate([quoted[None], state.price_history[:-1]], axis=0)
        state = state.replace(
            queries={g.name: split(alloc.sent, g) for g in spec.consumers},
            traffic={g.name: split(alloc.traffic, g) for g in spec.sellers},
            fees={g.name: split(alloc.fees, g) for g in spec.sellers},
            unserved={g.name: split(alloc.unserved, g) for g in spec.consumers},
            spend={g.name: split(alloc.spend, g) for g in spec.consumers},
            demand=demand, price_history=new_hist, time=state.time + 1,
        )
        rewards = {g.name: self._reward[g.name](self._reward_view(key, i, state, params, g,
                                                                  quoted))
                   for i, g in enumerate(spec.agent_groups)}
        state = state.replace(last_reward=rewards)
        obs = self.get_obs(state, params, quoted)
        terminated = jnp.zeros((), bool)
        info = {"traffic": state.traffic, "fees": state.fees, "unserved": state.unserved,
                "spend": state.spend, "queries": state.queries, "budgets": state.budgets,
                "prices": {g.name: split(quoted, g) for g in spec.sellers},
                "nonfinite_actions": nonfinite}
        quantity_groups = [g for g in spec.sellers if g.action == "quantity"]
        if quantity_groups:   # a quantity market: what each sold, and at what price
            info["quantities"] = {g.name: state.quantities[g.name] for g in quantity_groups}
            info["market_price"] = self._market_price(state)
        return obs, state, rewards, terminated, info

    def is_truncated(self, state: MarketState, params: MarketParams) -> jax.Array:
        return state.time >= params.episode_length

    @partial(jax.jit, static_argnums=(0,))
    def step(self, key: jax.Array, state: MarketState, actions: dict, params: MarketParams):
        """One market step with auto-reset: returns
        ``(obs, state, rewards, terminated, truncated, info)``; ``info`` holds the
        pre-reset ``traffic``/``fees`` (sellers), ``unserved``/``spend``/``queries``
        (consumers) and quoted ``prices`` per group; ``nonfinite_actions`` per agent group,
        ``[n, P]`` bool, True where the action entry was NaN or +-inf and the action in
        force was kept (:meth:`apply_actions`); in a market with quantity sellers also
        their ``quantities`` per group and the clearing ``market_price`` [P]."""
        k_step, k_reset = jax.random.split(key)
        obs_st, state_st, rewards, terminated, info = self.step_env(k_step, state, actions, params)
        truncated = self.is_truncated(state_st, params)
        done = jnp.logical_or(terminated, truncated)
        obs_re, state_re = self.reset_env(k_reset, params)
        state = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), state_re, state_st)
        obs = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), obs_re, obs_st)
        info = {**info, "final_observation": obs_st}
        return obs, state, rewards, terminated, truncated, info

    # ------------------------------------------------------------------ views
    def view(self, state: MarketState, params: MarketParams, g: GroupSpec,
             quoted: jax.Array | None = None) -> GroupView:
        """What reward/observation components see of group ``g``."""
        quoted = self._quoted_prices(state, params) if quoted is None else quoted
        budgets = jnp.concatenate([state.budgets[c.name] for c in self.spec.consumers], axis=0)
        zeros = jnp.zeros((g.count, self.spec.num_products), jnp.float32)
        common = dict(all_prices=quoted, budgets=budgets, time=state.time,
                      episode_length=params.episode_length, price_history=state.price_history,
                      last_reward=state.last_reward.get(g.name, jnp.zeros((g.count,))),
                      self_index=jnp.arange(g.offset, g.offset + g.count),
                      market_price=self._market_price(state))
        if g.side == "seller":
            p = params.sellers[g.name]
            return GroupView(action=self._seller_action(state, g),
                             price=quoted[g.offset:g.offset + g.count],
                             traffic=state.traffic[g.name], fees=state.fees[g.name],
                             cost=p.cost, value=p.value, sent=zeros, budget=zeros, **common)
        sent = state.queries[g.name]
        return GroupView(action=state.budgets[g.name], price=zeros,
                         traffic=sent - state.unserved[g.name], fees=state.spend[g.name],
                         cost=zeros, value=zeros, sent=sent, budget=state.budgets[g.name],
                         **{**common, "self_index": jnp.zeros((g.count,), jnp.int32)})

    def _reward_view(self, key: jax.Array, index: int, state: MarketState,
                     params: MarketParams, g: GroupSpec, quoted: jax.Array) -> GroupView:
        """The view group ``g``'s reward sees: with the key ``fold_in(fold_in(key,
        REWARD_STREAM), index)`` (``key`` the step's own, ``index`` the group's place
        among the agent groups) where its reward draws; folding leaves every other
        stream of the step as it is."""
        view = self.view(state, params, g, quoted)
        if g.name not in self._random_reward:
            return view
        return view.replace(key=jax.random.fold_in(jax.random.fold_in(key, REWARD_STREAM),
                                                   index))

    def _market_price(self, state: MarketState) -> jax.Array:
        """[P] sum_c spend / sum_c (sent - unserved) over every consumer; 0 where nothing
        was served. Saturating: the sums at MONEY_MAX (overflow only past ~340 consumers
        near it), the ratio at PRICE_MAX (a saturated spend over a tiny served count)."""
        cons = self.spec.consumers
        spend = money(sum(state.spend[c.name].sum(0) for c in cons))
        served = jnp.minimum(sum((state.queries[c.name] - state.unserved[c.name]).sum(0)
                                 for c in cons), MONEY_MAX)
        price = jnp.where(served > 0, spend / jnp.where(served > 0, served, 1.0), 0.0)
        return jnp.minimum(price, PRICE_MAX)

    def get_obs(self, state: MarketState, params: MarketParams,
                quoted: jax.Array | None = None) -> dict:
        quoted = self._quoted_prices(state, params) if quoted is None else quoted
        return {g.name: self._observe[g.name](self.view(state, params, g, quoted))
                for g in self.spec.agent_groups}
