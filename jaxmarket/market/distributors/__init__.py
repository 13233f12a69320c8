"""Query distributors (registry keyed by ``kind``); see ``base.py`` for the contract."""

from jaxmarket.market.distributors.base import (  # noqa: F401
    DISTRIBUTORS,
    Allocation,
    DistributorDef,
    Quotes,
    register,
)
