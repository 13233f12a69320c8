"""The loop's optional features, one component each (protocol: ``base.Component``),
registered in :data:`~jaxmarket.train.components.base.COMPONENTS` in hook order (the
imports below fix it): the schedule sets the market's parameters, populations map
members to slots, PBT and the league act after the update (PBT first: a league
snapshot holds the members PBT just rewrote), external models last. A component
registered later (yours) comes after these."""

from __future__ import annotations

from jaxmarket.train.components.base import COMPONENTS, Component, Step
# imported in hook order: each module registers its component as it is imported
from jaxmarket.train.components.schedule import Schedule  # isort: skip
from jaxmarket.train.components.population import Populations  # isort: skip
from jaxmarket.train.components.pbt import Pbt  # isort: skip
from jaxmarket.train.components.league import League, snapshot_fields  # isort: skip
from jaxmarket.train.components.models import Models  # isort: skip
from jaxmarket.train.components.auction import Auction  # isort: skip

__all__ = ["Auction", "COMPONENTS", "Component", "League", "Models", "Pbt", "Populations",
           "Schedule", "Step", "snapshot_fields"]
