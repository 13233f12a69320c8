"""jaxmarket: a JAX-accelerated, vectorised simulator of query markets."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jaxmarket")     # pyproject's version, from the installed metadata
except PackageNotFoundError:              # a source tree that was never pip-installed
    __version__ = "unknown"

# the public names and the module each lives in, imported on first use (PEP 562): a
# command reads its config and answers a config error before jax, flax, optax or orbax
# are imported (docs/configuration.md, "Start-up")
_HOMES = {
    "ConfigError": "jaxmarket.config.errors",
    "MarketEnv": "jaxmarket.market.env",
    "MarketParams": "jaxmarket.market.spec",
    "MarketSpec": "jaxmarket.market.spec",
    "MarketState": "jaxmarket.market.state",
    "equilibrium": "jaxmarket.analysis.equilibrium",
    "load_config": "jaxmarket.config.loader",
    "make": "jaxmarket.market.scenario",
    "register_mapping": "jaxmarket.learners.population",
    "resolve_market": "jaxmarket.market.spec",
    # runs back in Python (jaxmarket.analysis.runs, docs/runs.md)
    "load_run": "jaxmarket.analysis.runs",
    "compare": "jaxmarket.analysis.runs",
}

__all__ = ["ConfigError", "MarketEnv", "MarketParams", "MarketSpec", "MarketState", "compare",
           "equilibrium", "load_config", "load_run", "make", "register_mapping",
           "resolve_market"]
assert sorted(__all__) == sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value   # once: later reads skip this hook
        return value
    if name == "analysis":   # the subpackage: jaxmarket.analysis.impulse_response
        return importlib.import_module("jaxmarket.analysis")
    raise AttributeError(f"module 'jaxmarket' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"analysis"})
