"""The market state pytree (``flax.struct``): everything that changes step to step, and
:func:`current_actions`, every agent group's action in force."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

from jaxmarket.market.spec import MarketSpec


@struct.dataclass
class MarketState:
    """Per-group dicts of arrays with a leading agent/entity axis, ``P`` products::

        prices[g]      [n, P] posted prices of price-setting seller groups
        multipliers[g] [n, P] price multipliers of multiplier seller groups
        quantities[g]  [n, P] quantities of quantity-setting (Cournot) seller groups
        budgets[g]     [n, P] consumer budgets (agents choose theirs)
        queries[g]     [n, P] queries consumers sent last step
        traffic[g]     [n, P] queries each seller served last step
        fees[g]        [n, P] money each seller received last step
        unserved[g]    [n, P] consumer queries nobody served last step
        spend[g]       [n, P] money each consumer paid last step
        demand[g]      demand-process state of consumer group g
        last_reward[g] [n]    reward of agent group g last step
        price_history  [K, S, P] quoted prices of all sellers, most recent first
        time           int32 steps since reset

    ``g`` is a group's name and ``n`` its count; ``S`` counts all sellers.
    """

    prices: Any
    multipliers: Any
    quantities: Any
    budgets: Any
    queries: Any
    traffic: Any
    fees: Any
    unserved: Any
    spend: Any
    demand: Any
    last_reward: Any
    price_history: jax.Array
    time: jax.Array


# a group's action kind (``GroupSpec.action``) -> the MarketState field that holds it
ACTION_FIELDS = {"price": "prices", "multiplier": "multipliers", "budget": "budgets",
                 "quantity": "quantities"}


def current_actions(spec: MarketSpec, state: MarketState) -> dict[str, jax.Array]:
    """Every agent group's action in force, ``{group: [n, P]}`` in ``spec.agent_groups``
    order: its prices, multipliers, quantities or budgets (:data:`ACTION_FIELDS`). Passed back to
    ``env.step`` it holds every agent where it is (``spec``: ``env.spec``)."""
    return {g.name: getattr(state, ACTION_FIELDS[g.action])[g.name] for g in spec.agent_groups}
