"""jaxmarket: a JAX-accelerated, vectorised simulator of query markets."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.population import register_mapping
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.scenario import make
from jaxmarket.market.spec import MarketParams, MarketSpec, resolve_market
from jaxmarket.market.state import MarketState

try:
    __version__ = version("jaxmarket")     # pyproject's version, from the installed metadata
except PackageNotFoundError:              # a source tree that was never pip-installed
    __version__ = "unknown"

__all__ = ["ConfigError", "MarketEnv", "MarketParams", "MarketSpec", "MarketState",
           "load_config", "make", "register_mapping", "resolve_market"]

