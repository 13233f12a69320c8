"""``make``: a scenario file (or mapping) and dotted overrides -> ``(env, params)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxmarket.config.loader import load_config
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams, resolve_market, to_device


def make(source: str | Path | Mapping[str, Any],
         overrides: Sequence[str] = ()) -> tuple[MarketEnv, MarketParams]:
    """Build ``(env, params)`` from a scenario file (or mapping) and dotted overrides.

    >>> env, params = make("configs/logit_duopoly.yaml", ["market.num_products=4"])
    """
    config = load_config(source, overrides)
    spec, params = resolve_market(config["market"])
    return MarketEnv(spec), to_device(params)
