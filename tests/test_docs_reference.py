"""The API reference (docs/reference.md, rendered by mkdocstrings) covers the public Python
API: the package root's names, ``jaxmarket.analysis``, the adapters, the offline package,
the sweep API, the learner protocol and every registry and definition class a new
component is built from (docs/extending.md). A name is covered when a ``::: target``
line ends with it, or when its package is rendered whole and the object has a docstring
of its own (mkdocstrings leaves undocumented members out)."""

from __future__ import annotations

import importlib
import re

from conftest import ROOT

# the registries and the definitions an extension is built from (docs/extending.md)
EXTENDING = ["Registry", "Field", "DistributorDef", "Quotes", "Allocation", "DemandDef",
             "RewardDef", "ObservationDef", "LearnerDef", "ModelDef", "PoiDef", "AlgoDef",
             "Component", "COMPONENTS", "register_mapping"]


def targets() -> list[str]:
    return re.findall(r"^::: ([\w.]+)$", (ROOT / "docs" / "reference.md").read_text(), re.MULTILINE)


def covered(name: str, package: str | None = None) -> bool:
    found = targets()
    if any(t == name or t.endswith("." + name) for t in found):
        return True
    if package in found:
        obj = getattr(importlib.import_module(package), name)
        return bool(getattr(obj, "__doc__", None)) and obj.__doc__ is not type(obj).__doc__
    return False


def test_the_check_tells_covered_from_missing():
    assert covered("make") and covered("reservoir_add", "jaxmarket.offline")
    assert not covered("no_such_name") and not covered("reservoir_add")


def test_the_reference_covers_the_public_api():
    import jaxmarket.adapters
    import jaxmarket.offline
    missing = [n for n in jaxmarket.__all__ if not covered(n)]
    missing += [n for n in jaxmarket.adapters.__all__ if not covered(n, "jaxmarket.adapters")]
    missing += [n for n in jaxmarket.offline.__all__ if not covered(n, "jaxmarket.offline")]
    missing += [n for n in ("impulse_response", "make_sweep", "run_sweep", "plot_data")
                if not covered(n)]
    missing += [n for n in EXTENDING if not covered(n, "jaxmarket.learners.base")]
    assert "jaxmarket.learners.base" in targets()        # the learner protocol
    assert not missing, missing
