"""Offline algorithms built from a dataset: ``make_algo(name, dataset, **hyper)``.

The dataset decides what the networks look like: observation size, action size,
discrete (a grid of ``K`` actions, ``action_index``) or continuous (bounds from the
dataset's metadata, actions scaled to ``[-1, 1]``), observation standardisation and the
reward scale (``1 / std(rewards)``); hyperparameters are validated ``Field``s (a bad one
is a ``ConfigError`` naming ``algo.<name>.<field>``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping
from jaxmarket.offline.algos import bandit, bc, cql, iql, td3bc
from jaxmarket.offline.algos.common import Algo, device_data, infer_norm, sample_batch
from jaxmarket.offline.dataset import Dataset


class AlgoDef(NamedTuple):
    make: Callable
    fields: dict
    doc: str


COMMON = {
    "normalize_obs": Field("bool", True, doc="standardise observations with dataset statistics"),
    "reward_scale": Field("float", None, optional=True, low=0.0, low_open=True,
                          doc="multiply rewards by this (default 1 / std of the rewards)"),
}

ALGOS: dict[str, AlgoDef] = {
    "bc": AlgoDef(bc.make, bc.FIELDS, "behaviour cloning (continuous or discrete)"),
    "cql": AlgoDef(cql.make, cql.FIELDS, "conservative Q-learning (continuous or discrete)"),
    "iql": AlgoDef(iql.make, iql.FIELDS, "implicit Q-learning (continuous or discrete)"),
    "td3_bc": AlgoDef(td3bc.make, td3bc.FIELDS, "TD3+BC (continuous)"),
    "dm": AlgoDef(bandit.make_dm, bandit.DM_FIELDS, "direct-method reward model, greedy policy"),
    "dr": AlgoDef(bandit.make_dr, bandit.DR_FIELDS, "doubly-robust bandit policy (discrete, "
                  "needs propensities)"),
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


__all__ = ["ALGOS", "Algo", "device_data", "make_algo", "sample_batch"]
