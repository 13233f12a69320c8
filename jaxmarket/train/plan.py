"""One resolution step: ``resolve(config) -> RunPlan``.

Everything a run needs is computed here once, from the config as loaded, and every
:class:`~jaxmarket.config.errors.ConfigError` is raised here, before anything compiles
or touches the disk. ``train``, ``check``, ``sweep`` (per cell), ``collect`` and the
metric-name validation all consume the plan; nothing re-resolves the raw dict later.
The order (each step reads only what the steps above it produced)::

    config ─┬─ train:            -> TrainConfig          (train/config.py)
            ├─ market:           -> env, params          (built once)
            ├─ train.schedule    -> ScheduleEntry tuple  (values through the market's resolver)
            ├─ learners.*.population / mapping -> Population per group
            ├─ pbt blocks        -> PbtConfig per group  (train/pbt.py)
            ├─ learners.*.external_model -> ModelConfig per group (models/config.py)
            └─ learners:         -> LearnerSpec (seeds x markets folded in) and Learner per group
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.base import Learner, LearnerSpec
from jaxmarket.learners.controller import build_controller, group_learner_spec, resolve_learner
from jaxmarket.learners.population import (Population, league_opponents, resolve_population,
                                           split_learner_config)
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams, resolve_market, to_device
from jaxmarket.models.config import ModelConfig, poi_obs_spec, resolve_group_models
from jaxmarket.train.config import ScheduleEntry, TrainConfig, resolve_schedule, resolve_train
from jaxmarket.train.loop import metric_columns
from jaxmarket.train.pbt import PbtConfig, resolve_pbt, strip_pbt
from jaxmarket.train.slots import tile_spec


@dataclass(frozen=True)
class RunPlan:
    """A resolved run: static structure (hashable where it is compiled in) and the
    market's parameters. ``config`` is the config as loaded (what ``config.yaml`` holds);
    ``learner_config`` its ``learners:`` section with league opponents filled in and the
    pbt blocks removed (what the learners were built from)."""

    config: Mapping[str, Any]
    env: MarketEnv
    params: MarketParams
    train: TrainConfig
    seed: int
    learner_config: Mapping[str, Any]
    schedule: tuple[ScheduleEntry, ...]
    populations: Mapping[str, Population | None]
    pbt: Mapping[str, PbtConfig]
    models: Mapping[str, ModelConfig]
    specs: Mapping[str, LearnerSpec]
    learners: Mapping[str, Learner]
    # group -> (kind, settings with every default filled in), as the learner was built
    learner_settings: Mapping[str, tuple[str, dict]] = dataclasses.field(default_factory=dict)

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(self.env.agent_groups)

    @property
    def num_markets(self) -> int:
        """All markets of the run: seeds x markets per seed."""
        return self.train.num_seeds * self.train.num_envs

    @cached_property
    def metric_columns(self) -> tuple[str, ...]:
        """The ``metrics.csv`` column names, from the traced (not compiled) program."""
        return tuple(metric_columns(self))


def learners_template(env: MarketEnv) -> str:
    """A ready-to-paste ``learners:`` block for the scenario's agent groups."""
    lines = ["learners:"]
    for g in env.spec.agent_groups:
        what = {"price": "prices", "multiplier": "price multipliers", "budget": "budgets",
                "quantity": "quantities"}.get(g.action, g.action)
        kind = "ppo" if g.observation else "ppo_bandit"
        lines.append(f"  {g.name}: {{kind: {kind}}}   # {g.side}s, {g.count} agent(s) "
                     f"setting {what}")
    return "\n".join(lines)


def resolve(config: Mapping[str, Any] | str, overrides: tuple[str, ...] | list[str] = ()
            ) -> RunPlan:
    """The :class:`RunPlan` of a config (a loaded mapping, or a YAML path with dotted
    overrides); every config error is raised here."""
    raw = load_config(config, overrides)
    config = strip_pbt(raw)   # the pbt blocks: resolve_pbt below
    tcfg, seed = resolve_train_section(config)
    spec, params = resolve_market(config["market"])
    env, params = MarketEnv(spec), to_device(params)
    if "learners" not in config:
        if not env.agent_groups:
            raise ConfigError("market", "<no agent groups>", "at least one agent group to train "
                              "(a seller group, or a consumer group with agent: true)")
        raise ConfigError("learners", "<missing>", "a learners: section mapping each agent group "
                          "to a learner (docs/learners.md), e.g.\n" + learners_template(env))
    config = league_opponents(env, params, config)   # groups that play snapshots
    learner_config = config["learners"]
    base = group_specs(env, params, learner_config)
    build_controller(env, params, learner_config, specs=base)   # names, kinds, settings first
    schedule = resolve_schedule(config, tcfg, (spec, params))
    populations = resolve_populations(env, params, config, tcfg)
    pbt = resolve_pbt(raw, populations)
    models = resolve_group_models(env, params, learner_config, populations)
    specs = {g: tile_spec(s, tcfg.num_envs, tcfg.num_seeds, populations.get(g))
             for g, s in base.items()}
    learners = build_controller(env, params, learner_config, specs=specs)
    settings = {g: resolve_learner(learner_config[g], f"learners.{g}") for g in env.agent_groups}
    plan = RunPlan(raw, env, params, tcfg, seed, learner_config, schedule, populations,
                   {g: c for g, c in pbt.items() if c is not None}, models, specs, learners,
                   settings)
    if tcfg.early_stop is not None and tcfg.early_stop["metric"] not in plan.metric_columns:
        raise ConfigError("train.early_stop.metric", tcfg.early_stop["metric"],
                          "one of the metrics: " + ", ".join(plan.metric_columns))
    return plan


def resolve_train_section(config: Mapping) -> tuple[TrainConfig, int]:
    """``train:`` and ``seed`` (all a market-only file has besides its market)."""
    tcfg = resolve_train(config.get("train"))
    seed = config.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    return tcfg, seed


def group_specs(env: MarketEnv, params: MarketParams, learner_config: Any
                ) -> dict[str, LearnerSpec]:
    """Each group's own :class:`LearnerSpec` (one market), with the POI observation
    features its external model appends (``external_model.poi_obs``)."""
    if not isinstance(learner_config, Mapping):
        return {}   # build_controller names the error
    return {g: poi_obs_spec(learner_config.get(g), group_learner_spec(env, params, g),
                            f"learners.{g}") for g in env.agent_groups}


def resolve_populations(env: MarketEnv, params: MarketParams, config: Mapping,
                        tcfg: TrainConfig) -> dict[str, Population | None]:
    """``learners.<group>.population`` / ``mapping`` of every group, validated."""
    out = {}
    learners = config["learners"] if isinstance(config["learners"], Mapping) else {}
    for g in env.agent_groups:
        _, keys = split_learner_config(learners.get(g))
        pop = resolve_population(keys, f"learners.{g}", tcfg.num_envs, env.num_agents(g))
        if pop is not None and pop.kind == "resample" and pop.mix_in_env:
            space = env.action_space(g, params)
            if not (np.all(space.low == space.low[:1]) and np.all(space.high == space.high[:1])):
                raise ConfigError(f"learners.{g}.mapping.mix_in_env", True,
                                  "false when the group's agents have different action bounds "
                                  "(a member then moves between agent positions)")
        out[g] = pop
    return out


def with_train(plan: RunPlan, **changes: Any) -> RunPlan:
    """``plan`` with ``train:`` settings changed that touch nothing else the plan
    resolved (the run's length and stop rules, as ``--resume`` may change them)."""
    allowed = {"num_iterations", "early_stop", "stop_on_nan", "checkpoint_every"}
    assert set(changes) <= allowed, set(changes) - allowed
    return dataclasses.replace(plan, train=dataclasses.replace(plan.train, **changes))


__all__ = ["RunPlan", "resolve", "resolve_populations", "resolve_train_section",
           "learners_template", "with_train"]
