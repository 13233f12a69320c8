"""What reward and observation components see of one agent group after a step."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class GroupView:
    """Arrays of one group, leading agent axis ``n``; ``P`` products.

    Seller groups: ``action`` is the price or multiplier, ``price`` the quoted price
    (multiplier x base price of the first consumer for multiplier sellers), ``traffic``
    the queries served, ``fees`` the money received, ``cost``/``value`` per-query cost
    and valuation. Consumer groups: ``action`` is the budget, ``traffic`` the queries
    served (sent - unserved), ``fees`` the money spent, ``sent``/``budget``.
    Market-wide: ``all_prices`` [S, P] quoted prices of every seller, ``self_index`` [n]
    positions of this group's agents in it, ``budgets`` [C, P], ``time``,
    ``price_history`` [K, S, P] (most recent first), ``last_reward`` [n],
    ``market_price`` [P] the last period's average price paid per served query (sum of
    consumers' spend / sum of served queries; 0 where nothing was served: at reset, or
    when every query went unserved); ``None`` in views built by hand without it.
    ``key``: the group's random key of this step for reward terms that draw (``noise``),
    set by the market's step where the group's reward has one, else ``None``.
    """

    action: jax.Array
    price: jax.Array
    traffic: jax.Array
    fees: jax.Array
    cost: jax.Array
    value: jax.Array
    sent: jax.Array
    budget: jax.Array
    all_prices: jax.Array
    self_index: jax.Array
    budgets: jax.Array
    time: jax.Array
    episode_length: jax.Array
    price_history: jax.Array
    last_reward: jax.Array
    market_price: Any = None
    key: Any = None
