"""Offline algorithms built from a dataset: ``make_algo(name, dataset, **hyper)``.

The dataset decides what the networks look like: observation size, action size,
discrete (a grid of ``K`` actions, ``action_index``) or continuous (bounds from the
dataset's metadata, actions scaled to ``[-1, 1]``), observation standardisation and the
reward scale (``1 / std(rewards)``); hyperparameters are validated ``Field``s (a bad one
is a ``ConfigError`` naming ``algo.<name>.<field>``). Each algorithm module registers
itself in :data:`ALGOS` (``jaxmarket.offline.algos.common``); importing this package
imports them all."""

from __future__ import annotations

from typing import Any

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping

# the import order is the registration order, the order --algo errors list the kinds in
from jaxmarket.offline.algos import bc, cql, iql, td3bc  # noqa: F401, I001
from jaxmarket.offline.algos import bandit  # noqa: F401  (dm, dr)
from jaxmarket.offline.algos.common import (
    ALGOS,
    Algo,
    AlgoDef,
    device_data,
    infer_norm,
    sample_batch,
)
from jaxmarket.offline.dataset import Dataset

COMMON = {
    "normalize_obs": Field("bool", True, doc="standardise observations with dataset statistics"),
    "reward_scale": Field("float", None, optional=True, low=0.0, low_open=True,
                          doc="multiply rewards by this (default 1 / std of the rewards)"),
}


def make_algo(name: str, dataset: Dataset, **hyper: Any) -> Algo:
    """The algorithm ``name`` sized and normalised from ``dataset``."""
    if name not in ALGOS:
        raise ConfigError("--algo", name, "one of " + ", ".join(ALGOS))
    definition = ALGOS[name]
    fields = {**COMMON, **definition.fields}
    h = check_mapping(fields, hyper, f"algo.{name}", ignore=())
    norm = infer_norm(dataset, h["normalize_obs"], h["reward_scale"])
    return definition.make(norm, h, dataset)


__all__ = ["ALGOS", "COMMON", "Algo", "AlgoDef", "device_data", "make_algo", "sample_batch"]
