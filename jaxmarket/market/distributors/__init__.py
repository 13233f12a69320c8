"""Query distributors (the registry :data:`DISTRIBUTORS`, keyed by ``kind``); see ``base.py``
for the contract.

Importing this package registers every kind in :data:`DISTRIBUTORS`: ``logit``,
``proportional``, ``cheapest``, ``first_price``, ``second_price``, ``isa_2022``,
``isa_greedy``, ``mixed_price``, ``cournot``, ``linear`` (see ``docs/distributors.md``).
"""

from jaxmarket.market.distributors import (  # noqa: F401  (registration side effects)
    auctions,
    cheapest,
    cournot,
    isa,
    isa_greedy,
    linear,
    logit,
    proportional,
)
from jaxmarket.market.distributors.base import (  # noqa: F401
    DISTRIBUTORS,
    Allocation,
    DistributorDef,
    Quotes,
)
