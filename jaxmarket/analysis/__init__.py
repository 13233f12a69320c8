"""Reading and analysing finished runs, above the engines that write them:

* :mod:`jaxmarket.analysis.runs`: a run directory back in Python (``load_run``,
  ``compare``, a run's final policy);
* :mod:`jaxmarket.analysis.impulse`: impulse responses of learned pricing strategies to a
  one-period deviation (``impulse_response``; to every grid price:
  ``impulse_response_all``);
* :mod:`jaxmarket.analysis.plots`: the plotting library behind ``python -m jaxmarket.plot``;
* :mod:`jaxmarket.analysis.equilibrium`: ``jaxmarket.equilibrium(config)``, a scenario's
  static equilibria.

The impulse-response API is also here, as ``jaxmarket.analysis.impulse_response``
(imported on first use)."""

from __future__ import annotations

import importlib

_IMPULSE = ("AllPricesResponse", "ImpulseResponse", "Strategies", "impulse_response",
            "impulse_response_all", "limit_cycles",
            "load_strategies", "strategies_from_npz", "strategies_from_run",
            "strategies_from_runner")

__all__ = list(_IMPULSE)


def __getattr__(name: str):
    if name in _IMPULSE:
        value = getattr(importlib.import_module("jaxmarket.analysis.impulse"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxmarket.analysis' has no attribute {name!r}")
