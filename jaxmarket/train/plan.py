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
from jaxmarket.config.fields import INT32_MAX
from jaxmarket.config.loader import load_config
from jaxmarket.config.precheck import check_groups, check_work
from jaxmarket.learners.base import LEARNERS, Learner, LearnerSpec
from jaxmarket.learners.controller import (build_controller, check_controller,
                                           group_learner_spec, learners_template,
                                           resolve_learner)
from jaxmarket.learners.population import (Population, league_opponents, resolve_population,
                                           split_learner_config)
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams, resolve_market, to_device
from jaxmarket.models.config import ModelConfig, poi_obs_spec, resolve_group_models
from jaxmarket.train.config import ScheduleEntry, TrainConfig, resolve_schedule, resolve_train
from jaxmarket.train.loop import Traced
from jaxmarket.train.memory import MemoryEstimate, check_memory, estimate, lcm, probe_dims
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
    # the memory the run needs (jaxmarket.train.memory), checked against the device's
    memory: MemoryEstimate | None = dataclasses.field(default=None, compare=False)
    # a validate-only plan of a large run (resolve(validate_only=True)): the probe's plan
    # (a few markets: its train, specs, learners, populations are the probe's; memory is
    # the run's); it must not train
    probe: bool = False
    # the training program traced once (jaxmarket.train.loop.Traced): what the memory
    # estimate and the metric columns read
    traced: Traced | None = dataclasses.field(default=None, compare=False, repr=False)

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
        return (self.traced or Traced(self)).metric_columns


# Above this many agent slots (all groups, seeds x markets x agents) the plan's learners
# are not built to size the run: a probe of PROBE_SEEDS x PROBE_ENVS markets is (the
# learners' builders do per-slot work in Python), and its shapes are scaled
PROBE_SLOTS = 4096
PROBE_SEEDS, PROBE_ENVS = 11, 13


def resolve(config: Mapping[str, Any] | str, overrides: tuple[str, ...] | list[str] = (),
            *, validate_only: bool = False, estimate_memory: bool = True) -> RunPlan:
    """The :class:`RunPlan` of a config (a loaded mapping, or a YAML path with dotted
    overrides); every config error is raised here, a run that cannot fit in the
    device's memory included (``plan.memory``). ``validate_only`` (``check``): a run
    above ``PROBE_SLOTS`` slots keeps its probe's specs and learners (``plan.probe``), so
    validating it does no work that grows with its size. ``estimate_memory=False``: the
    training loop is neither traced nor its memory estimated (``plan.memory`` and
    ``plan.traced`` None), for a run the loop does not play (the session engine checks
    its own estimate, :func:`jaxmarket.sessions.run.session_plan`)."""
    raw = load_config(config, overrides)
    config = strip_pbt(raw)   # the pbt blocks: resolve_pbt below
    tcfg, seed = resolve_train_section(config)
    check_groups(config["market"])   # the work budget: before any group is read
    spec, params = resolve_market(config["market"])
    env, params = MarketEnv(spec), to_device(params)
    if "learners" not in config:
        if not env.agent_groups:
            raise ConfigError("market", "<no agent groups>", "at least one agent group to train "
                              "(a seller group, or a consumer group with agent: true)")
        raise ConfigError("learners", "<missing>", "a learners: section mapping each agent group "
                          "to a learner (docs/learners.md), e.g.\n" + learners_template(env))
    check_work_budget(env, config["learners"], tcfg)   # before anything is built or traced
    config = league_opponents(env, params, config)   # groups that play snapshots
    learner_config = config["learners"]
    base = group_specs(env, params, learner_config)
    check_controller(env, params, learner_config, specs=base)   # names, kinds, settings first
    check_sizes(base, tcfg)
    schedule = resolve_schedule(config, tcfg, (spec, params))
    populations = resolve_populations(env, params, config, tcfg)
    pbt = resolve_pbt(raw, populations)
    models = resolve_group_models(env, params, learner_config, populations)
    check_minibatches(base, populations, learner_config, tcfg)
    parts = (raw, env, params, seed, learner_config, schedule,
             {g: c for g, c in pbt.items() if c is not None}, models, base)
    slots = sum(s.num_agents for s in base.values()) * tcfg.num_envs * tcfg.num_seeds
    probe = _probe(parts, config, tcfg) if slots > PROBE_SLOTS else None
    if probe is None:
        plan = _assemble(parts, tcfg, populations)
        if estimate_memory:
            traced = Traced(plan)
            plan = dataclasses.replace(plan, memory=estimate(plan, traced=traced),
                                       traced=traced)
    else:
        memory = None
        if estimate_memory:
            memory = estimate(probe, tcfg, probe_dims(probe, tcfg.num_envs, tcfg.num_seeds))
            check_memory(memory)
        plan = dataclasses.replace(probe if validate_only else
                                   _assemble(parts, tcfg, populations), memory=memory,
                                   probe=validate_only)
    if plan.memory is not None:
        check_memory(plan.memory)
    if tcfg.early_stop is not None and tcfg.early_stop["metric"] not in plan.metric_columns:
        raise ConfigError("train.early_stop.metric", tcfg.early_stop["metric"],
                          "one of the metrics: " + ", ".join(plan.metric_columns))
    return plan


def _assemble(parts: tuple, tcfg: TrainConfig, populations: Mapping) -> RunPlan:
    """The plan at ``tcfg``'s size: the tiled specs and the learners built on them."""
    raw, env, params, seed, learner_config, schedule, pbt, models, base = parts
    specs = {g: tile_spec(s, tcfg.num_envs, tcfg.num_seeds, populations.get(g))
             for g, s in base.items()}
    learners = build_controller(env, params, learner_config, specs=specs)
    settings = {g: resolve_learner(learner_config[g], f"learners.{g}") for g in env.agent_groups}
    return RunPlan(raw, env, params, tcfg, seed, learner_config, schedule, populations,
                   pbt, models, specs, learners, settings)


def _probe(parts: tuple, config: Mapping, tcfg: TrainConfig) -> RunPlan:
    """The run at the probe's size: ``PROBE_SEEDS`` seeds of ``PROBE_ENVS x L`` markets
    (``L``: the least common multiple of the population sizes, so every population still
    divides the markets); a mapping tied to the run's markets (a table) keeps them."""
    env, params, learner_config = parts[1], parts[2], parts[4]
    sizes = [p.size for p in resolve_populations(env, params, config, tcfg).values()
             if p is not None]
    for envs in (PROBE_ENVS * lcm(sizes), tcfg.num_envs):
        small = dataclasses.replace(tcfg, num_envs=envs, num_seeds=PROBE_SEEDS)
        pops = resolve_populations(env, params, config, small)
        probe_config = probe_minibatches(parts[8], pops, learner_config, small)
        try:
            plan = _assemble(parts[:4] + (probe_config,) + parts[5:], small, pops)
        except ConfigError:
            if envs == tcfg.num_envs:
                raise
            continue
        # the probe traces with its own minibatches; it reports the run's settings
        return dataclasses.replace(plan, learner_config=learner_config, learner_settings={
            g: resolve_learner(learner_config[g], f"learners.{g}") for g in env.agent_groups})
    raise AssertionError("unreachable")


def _per_market(spec: LearnerSpec, pop: Any) -> int:
    return 1 if pop is not None and pop.live_seats_only else spec.num_agents


def probe_minibatches(base: Mapping[str, LearnerSpec], populations: Mapping,
                      learner_config: Mapping, probe: TrainConfig) -> Mapping:
    """The learner config the probe is built with: a group's ``num_minibatches`` becomes
    the largest divisor of ``rollout_length x agents per market`` not above it, so the
    probe's minibatches still hold whole markets (a minibatch axis that is a multiple of
    the probe's markets, which the memory estimate scales to the run's) and never
    outnumber the probe's samples (a valid run's minibatches can)."""
    out = dict(learner_config)
    for g, spec in base.items():
        _, hyper = resolve_learner(learner_config[g], f"learners.{g}")
        wanted = hyper.get("num_minibatches")
        if wanted is None:
            continue
        per_sample_set = probe.rollout_length * _per_market(spec, populations.get(g))
        fit = max(d for d in range(1, min(wanted, per_sample_set) + 1) if per_sample_set % d == 0)
        if fit != wanted:
            out[g] = {**learner_config[g], "num_minibatches": fit}
    return out


def check_minibatches(base: Mapping[str, LearnerSpec], populations: Mapping,
                      learner_config: Mapping, tcfg: TrainConfig) -> None:
    """A learner that splits each update's samples (``rollout_length`` x its slots) into
    ``num_minibatches`` gets at least one sample per minibatch (before anything is
    traced: the memory estimate traces the program)."""
    for g, spec in base.items():
        _, hyper = resolve_learner(learner_config[g], f"learners.{g}")
        wanted = hyper.get("num_minibatches")
        if wanted is None:
            continue
        per_market = _per_market(spec, populations.get(g))
        slots = per_market * tcfg.num_seeds * tcfg.num_envs
        samples = tcfg.rollout_length * slots
        if wanted > samples:
            raise ConfigError(f"learners.{g}.num_minibatches", wanted,
                              f"at most the {samples} samples of an update (train.rollout_length"
                              f" {tcfg.rollout_length} x {slots} agent slots: train.num_seeds x "
                              f"train.num_envs x the group's agents per market); raise "
                              f"train.rollout_length or train.num_envs, or lower it")


def check_sizes(base: Mapping[str, LearnerSpec], tcfg: TrainConfig) -> None:
    """Every slot, policy and market index of the run fits int32 (jax's integers)."""
    S, E = tcfg.num_seeds, tcfg.num_envs
    if S * E > INT32_MAX:
        raise ConfigError("train.num_envs", E, f"train.num_seeds x train.num_envs <= "
                          f"{INT32_MAX} (int32 market indices; num_seeds is {S})")
    for g, spec in base.items():
        if S * E * spec.num_agents > INT32_MAX:
            raise ConfigError("train.num_envs", E, f"train.num_seeds x train.num_envs x agents "
                              f"<= {INT32_MAX} (int32 slot indices; group {g} has "
                              f"{spec.num_agents} agents per market, num_seeds is {S})")


def check_work_budget(env: MarketEnv, learner_config: Any, tcfg: TrainConfig) -> None:
    """The run's sizes against the work budget (``fields.MAX_MARKET_AGENTS``,
    ``fields.WORK_BUDGET``; docs/configuration.md, "Sizes and the work budget"): the
    quick checks' own function on the market's groups, so both raise one message."""
    groups = [{"name": g.name, "side": g.side, "count": g.count, "agent": g.agent}
              for g in env.spec.groups]
    check_work(vars(tcfg), env.spec.num_products, groups, learner_config, _epochs_field)


def _epochs_field(kind: str) -> Any:
    """The registered learner kind's ``update_epochs`` Field (None: it has none)."""
    return LEARNERS[kind].hyper_fields.get("update_epochs") if kind in LEARNERS else None


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
            low, high = env.action_bounds(g, params)
            if not (np.all(low == low[:1]) and np.all(high == high[:1])):
                raise ConfigError(f"learners.{g}.mapping.mix_in_env", True,
                                  "false when the group's agents have different action bounds "
                                  "(a member then moves between agent positions)")
        out[g] = pop
    return out


__all__ = ["RunPlan", "resolve", "resolve_populations", "resolve_train_section"]
