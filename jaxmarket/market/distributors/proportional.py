"""``proportional``: shares proportional to ``price ** -exponent`` among affordable sellers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.fields import Field
from jaxmarket.market.distributors.base import DISTRIBUTORS, Allocation, DistributorDef, Quotes
from jaxmarket.market.distributors.prefix_softmax import (
    NO_ELIGIBLE,
    _prefix_softmax,
    clean_price,
    f32,
    resolve_options,
    with_defaults,
)

PRICE_FLOOR = 1e-30

PARAMS = {
    "exponent": Field(kind="float", default=1.0, low=0.0, low_open=True,
                      doc="r in share ~ p^-r (> 0)"),
}
OPTIONS = {"no_eligible": NO_ELIGIBLE}


def allocate(key: jax.Array, quotes: Quotes, params: Mapping[str, jax.Array],
             options: Mapping[str, Any]) -> Allocation:
    """Inverse-price shares among eligible sellers.

    Per consumer ``c`` and product, among sellers with quoted price ``p_s <= b_c``::

        share_cs = [p_s <= b_c] max(p_s, 1e-30)^-r / sum_{j: p_j <= b_c} max(p_j, 1e-30)^-r

    i.e. the logit kernel with ``u_s = -r log(max(p_s, 1e-30))`` and no outside option
    (``r`` = ``exponent``). Free sellers (price 0) count as priced 1e-30, so they take
    practically everything. ``traffic``/``fees``/``spend`` as in ``logit``; consumers
    with no eligible seller follow ``no_eligible`` ("unserved" or "withhold").
    Same kernel as ``logit``: no consumer x seller array once ``C * S > 1024``.
    """
    del key
    opt = resolve_options(OPTIONS, options, "proportional")
    return _allocate(quotes, with_defaults(PARAMS, params),
                     np.bool_(opt["no_eligible"] == "withhold"))


@jax.jit
def _allocate(quotes: Quotes, prm: Mapping[str, jax.Array], withhold) -> Allocation:
    price = clean_price(quotes.quoted_price_shared())
    u = -f32(prm["exponent"]) * jnp.log(jnp.maximum(price, PRICE_FLOOR))
    return _prefix_softmax(u, price, quotes.budget, quotes.queries, 0.0, np.bool_(False),
                           withhold)


PROPORTIONAL = DISTRIBUTORS.register(DistributorDef(
    kind="proportional", allocate=allocate, params=PARAMS, options=OPTIONS, dense=False))
