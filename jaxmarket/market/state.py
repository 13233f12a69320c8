"""The market state pytree (``flax.struct``): everything that changes step to step."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class MarketState:
    """Per-group dicts of arrays with a leading agent/entity axis, ``P`` products.

    prices[g]      [n, P] posted prices of price-setting seller groups
    multipliers[g] [n, P] price multipliers of multiplier seller groups
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
    """

    prices: Any
    multipliers: Any
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
