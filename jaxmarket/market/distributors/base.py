"""The distributor contract: one signature, one registry (:data:`DISTRIBUTORS`) keyed by ``kind``.

A distributor allocates the queries consumers send among sellers:

    allocate(key, quotes: Quotes, params: dict[str, Array], options: Mapping) -> Allocation

* ``quotes`` holds everything about the market at this step (flat over groups: all
  sellers of all seller groups stacked on the ``S`` axis, all consumers on ``C``);
* ``params`` the distributor's numeric settings as arrays (vmappable: sweeps and domain
  randomisation batch them);
* ``options`` its static settings (changing them recompiles).

Conservation (exact up to float rounding), for every product ``p``::

    sum_s traffic[s, p] + sum_c unserved[c, p] == sum_c sent[c, p]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import struct

from jaxmarket.config.fields import Field
from jaxmarket.config.registry import Registry


@struct.dataclass
class Quotes:
    """What a distributor sees at one step. Shapes: ``S`` sellers, ``C`` consumers,
    ``P`` products, all groups stacked."""

    price: jax.Array          # [S, P] a seller's action: a price, or a multiplier
    is_multiplier: jax.Array  # [S] bool: True where ``price`` is a multiplier of base_price
    budget: jax.Array         # [C, P] most a consumer pays per query
    queries: jax.Array        # [C, P] queries the consumer wants served this step
    base_price: jax.Array     # [C, P] the consumer's base price (multiplier sellers quote m * base)
    quality: jax.Array        # [S, P] logit quality a_i
    reliability: jax.Array    # [S, P] probability a query succeeds, in [0, 1]
    latency: jax.Array        # [S, P] response time (seconds), >= 0
    freshness: jax.Array      # [S, P] blocks behind chain head, >= 0 (0 = fresh)
    stake: jax.Array          # [S, P] allocated stake, >= 0
    # [S, P] the quoted prices in force before this step's actions (the last period's;
    # at the first step the reset prices); None where the caller has none (a rule that
    # reads it, ``DistributorDef.lagged``, then raises)
    previous: jax.Array | None = None

    def quoted_price_dense(self) -> jax.Array:
        """[C, S, P] the price seller s charges consumer c: m_s * base_c or p_s."""
        mult = self.price[None, :, :] * self.base_price[:, None, :]
        return jnp.where(self.is_multiplier[None, :, None], mult, self.price[None, :, :])

    def quoted_price_shared(self) -> jax.Array:
        """[S, P] quoted prices when base prices are the same for every consumer of a
        product (checked at config load for the non-dense distributors)."""
        return jnp.where(self.is_multiplier[:, None], self.price * self.base_price[0][None, :],
                         self.price)


@struct.dataclass
class Allocation:
    """The outcome of one step of distribution."""

    traffic: jax.Array   # [S, P] queries each seller served
    fees: jax.Array      # [S, P] money each seller received (auctions: the winner's payment)
    unserved: jax.Array  # [C, P] queries sent but served by nobody
    spend: jax.Array     # [C, P] money each consumer paid
    sent: jax.Array      # [C, P] queries actually sent (a rule may withhold queries)


AllocateFn = Callable[[jax.Array, Quotes, Mapping[str, jax.Array], Mapping[str, Any]], Allocation]


@dataclass(frozen=True)
class DistributorDef:
    """A registry entry.

    ``params``: numeric settings (become float32 arrays in MarketParams, vmappable);
    ``options``: static settings; ``dense``: True when it materialises a
    consumers x sellers x products array (then base prices may differ per consumer);
    ``actions``: the seller action kinds (``SELLER_FIELDS["action"]``) it accepts,
    checked at config load; ``deterministic``: False when ``allocate`` uses its key
    (the allocation is random), or a function of the resolved options (a dict with
    defaults filled in) saying so for one configuration (use :meth:`is_deterministic`);
    ``check``: an optional ``check(values, where)`` of the resolved params and options
    that raises :class:`ConfigError` (cross-field rules a ``Field`` cannot state);
    ``check_when``: the options without which ``check`` has nothing to check (empty:
    always); the commands' quick checks leave a config to the full validation only where
    one of them is set;
    ``lagged``: whether the allocation reads the last period's prices
    (``quotes.previous``; a bool or a function of the resolved options, use
    :meth:`is_lagged`);
    ``auction``: a sealed-bid auction (every seller's quoted price is its bid, the fees
    are what the winners pay): a run of its market reports the auction metrics
    (``auction/revenue``, ``auction/winning_bid``, ``auction/win_share/<g>/<j>``).
    """

    kind: str
    allocate: AllocateFn
    params: Mapping[str, Field] = field(default_factory=dict)
    options: Mapping[str, Field] = field(default_factory=dict)
    dense: bool = False
    actions: tuple[str, ...] = ("price", "multiplier")
    deterministic: bool | Callable[[Mapping[str, Any]], bool] = True
    check: Callable[[Mapping[str, Any], str], None] | None = None
    check_when: tuple[str, ...] = ()
    # a random rule with finitely many outcomes per period: ``outcomes(options,
    # num_sellers)`` (defaults filled in; the market's sellers, or None where unknown) ->
    # ``((probability, options), ...)``, each ``options`` making the rule deterministic;
    # None where the draw is not finite (the expectation is then sampled)
    outcomes: Callable[[Mapping[str, Any], int | None],
                       tuple[tuple[float, Mapping[str, Any]], ...] | None] | None = None
    auction: bool = False
    # whether ``allocate`` reads ``quotes.previous`` (the last period's prices) under
    # these options: a bool, or a function of the resolved options (use :meth:`is_lagged`)
    lagged: bool | Callable[[Mapping[str, Any]], bool] = False

    def is_lagged(self, options: Mapping[str, Any] | None = None) -> bool:
        """Whether the allocation depends on the last period's prices (``quotes.previous``)
        under these options (defaults filled in)."""
        if callable(self.lagged):
            given = dict(options or {})
            full = {k: given.get(k, f.default) for k, f in self.options.items()}
            return bool(self.lagged(full))
        return bool(self.lagged)

    def outcome_options(self, options: Mapping[str, Any] | None = None,
                        num_sellers: int | None = None
                        ) -> tuple[tuple[float, dict], ...] | None:
        """``((probability, options), ...)`` of a period's finitely many outcomes (the
        options given, defaults filled in, updated with each outcome's) in a market of
        ``num_sellers`` sellers, or None."""
        if self.outcomes is None:
            return None
        given = dict(options or {})
        full = {k: given.get(k, f.default) for k, f in self.options.items()}
        out = self.outcomes(full, num_sellers)
        return None if out is None else tuple((float(p), {**given, **o}) for p, o in out)

    def is_deterministic(self, options: Mapping[str, Any] | None = None) -> bool:
        """Whether ``allocate`` ignores its key for these options (defaults filled in)."""
        if callable(self.deterministic):
            given = dict(options or {})
            full = {k: given.get(k, f.default) for k, f in self.options.items()}
            return bool(self.deterministic(full))
        return bool(self.deterministic)


# every distributor module registers its kinds: DISTRIBUTORS.register(DistributorDef(...))
DISTRIBUTORS: Registry[DistributorDef] = Registry("distributor")
