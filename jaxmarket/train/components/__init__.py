"""The loop's optional features, one component each (protocol: ``base.Component``),
chained in a fixed order by :func:`chain`: the schedule sets the market's parameters,
populations map members to slots, PBT and the league act after the update (PBT first:
a league snapshot holds the members PBT just rewrote), external models last."""

from __future__ import annotations

from jaxmarket.train.components.base import Component, Step
from jaxmarket.train.components.league import League, snapshot_fields
from jaxmarket.train.components.models import Models
from jaxmarket.train.components.pbt import Pbt
from jaxmarket.train.components.population import Populations
from jaxmarket.train.components.schedule import Schedule

__all__ = ["Component", "League", "Models", "Pbt", "Populations", "Schedule", "Step",
           "snapshot_fields"]
