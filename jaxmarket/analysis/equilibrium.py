"""``jaxmarket.equilibrium(config)``: the static equilibria of a scenario, from a config
(a YAML path or a loaded mapping, with dotted overrides) or a resolved plan
(:func:`jaxmarket.learners.equilibrium.equilibrium` solves it; docs/equilibrium.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxmarket.learners import equilibrium as static
from jaxmarket.market.equilibrium import DEFAULT_SEARCH, Search
from jaxmarket.train.plan import RunPlan, resolve


def equilibrium(config_or_plan: RunPlan | Mapping[str, Any] | str,
                overrides: list[str] | tuple[str, ...] | None = None, *,
                samples: int | None = None, search: Search = DEFAULT_SEARCH
                ) -> dict[str, dict]:
    """The static Nash equilibrium and joint optimum of every learning group of a config
    (a YAML path or a loaded mapping, with dotted ``overrides``) or of a resolved plan:
    ``{group: {"nash", "joint", "converged", "nash_reward", "joint_reward", ...}}``
    (:func:`jaxmarket.market.equilibrium.solve` lists the keys). ``samples``: keys a
    random period is averaged over (default: 1 for a deterministic period, else
    ``DEFAULT_SAMPLES``)."""
    if isinstance(config_or_plan, RunPlan):
        if overrides:
            raise ValueError("equilibrium: overrides apply to a config, not to a resolved plan")
        plan = config_or_plan
    else:
        plan = resolve(config_or_plan, tuple(overrides or ()), validate_only=True)
    return static.equilibrium(plan, samples=samples, search=search)


__all__ = ["equilibrium"]
