"""The ``train:`` section and the ``learners:`` section, validated before compiling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping

TRAIN_FIELDS = {
    "num_iterations": Field("int", 1000, low=1, doc="learner updates per seed"),
    "rollout_length": Field("int", 1, low=1, doc="market steps collected per update"),
    "num_envs": Field("int", 1, low=1, doc="markets per seed (their agents share policies)"),
    "num_seeds": Field("int", 1, low=1, doc="independent runs, vmapped"),
    "chunk_size": Field("int", 100, low=1, doc="iterations per compiled chunk"),
    "checkpoint_every": Field("int", 1, low=1, doc="chunks between checkpoints"),
    "stop_on_nan": Field("bool", True, doc="stop when a metric is not finite"),
    "early_stop": Field("any", None, optional=True,
                        doc="{metric: NAME, above: X} or {metric: NAME, below: X}"),
}


@dataclass(frozen=True)
class TrainConfig:
    num_iterations: int
    rollout_length: int
    num_envs: int
    num_seeds: int
    chunk_size: int
    checkpoint_every: int
    stop_on_nan: bool
    early_stop: Any
    # group -> Population (or None): filled from the learners: section by prepare()
    populations: Any = None
    # group -> jaxmarket.train.pbt.PbtConfig: filled from the pbt blocks by prepare()
    pbt: Any = None


def resolve_train(raw: Any, where: str = "train") -> TrainConfig:
    vals = check_mapping(TRAIN_FIELDS, raw or {}, where, ignore=())
    stop = vals["early_stop"]
    if stop is not None:
        ok = (isinstance(stop, dict) and isinstance(stop.get("metric"), str)
              and len(set(stop) & {"above", "below"}) == 1 and set(stop) <= {"metric", "above", "below"})
        if not ok:
            raise ConfigError(f"{where}.early_stop", stop,
                              "{metric: NAME, above: NUMBER} or {metric: NAME, below: NUMBER}")
    return TrainConfig(**vals)


def resolve_training(config: dict) -> TrainConfig:
    """Validate ``train:`` and ``learners:`` (group names against the market)."""
    from jaxmarket import make
    from jaxmarket.learners.controller import build_controller

    tcfg = resolve_train(config.get("train"))
    if "seed" in config:
        if not isinstance(config["seed"], int) or isinstance(config["seed"], bool) or config["seed"] < 0:
            raise ConfigError("seed", config["seed"], "an integer >= 0")
    from jaxmarket.train.pbt import strip_pbt

    config = strip_pbt(config)   # pbt blocks are validated by prepare(), not the learners
    if "learners" in config:
        from jaxmarket.train.run import league_opponents
        env, params = make(config)
        config = league_opponents(env, params, config)   # groups that play snapshots
        build_controller(env, params, config["learners"])
    return tcfg
