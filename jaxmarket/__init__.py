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
from jaxmarket.train.equilibrium import equilibrium

try:
    __version__ = version("jaxmarket")     # pyproject's version, from the installed metadata
except PackageNotFoundError:              # a source tree that was never pip-installed
    __version__ = "unknown"

__all__ = ["ConfigError", "MarketEnv", "MarketParams", "MarketSpec", "MarketState",
           "equilibrium", "load_config", "make", "register_mapping", "resolve_market"]

# runs back in Python (jaxmarket.train.runs, docs/runs.md): imported on first use, since
# the training side (orbax, rich) added about 8% to `import jaxmarket` (4.7 s of 57 s,
# -X importtime on a loaded 2-core machine)
RUNS = ("load_run", "compare")
__all__ += list(RUNS)


def __getattr__(name: str):
    if name in RUNS:
        from jaxmarket.train import runs
        return getattr(runs, name)
    if name == "analysis":   # jaxmarket.analysis.impulse_response (train/analysis.py), as RUNS
        from jaxmarket.train import analysis
        return analysis
    raise AttributeError(f"module 'jaxmarket' has no attribute {name!r}")

