"""The whole training iteration as one readable function (PureJaxRL style).

``make_train(plan)`` returns ``(init, run_chunk)``:

* ``init(key) -> Runner``: reset ``num_seeds x num_envs`` markets, init every group's
  learner, then every component's state;
* ``run_chunk(runner, length) -> (runner, metrics)``: ``length`` iterations in one
  ``lax.scan``. An iteration reads top to bottom:

  1. **act**: every agent group acts through its learner (slots: :mod:`.slots`);
  2. **market step**: the vmapped market steps, auto-resets;
  3. **record**: the step's transitions and metrics (``rollout_length`` steps, a scan);
  4. **update**: each learner's ``update`` on its group's time-major batch.

Optional features are components (:mod:`jaxmarket.train.components`) whose hooks run
at named points of these sections; the plan says which are present. Both functions are
pure; the caller ``jit``s them. Metric names: :mod:`jaxmarket.train.metrics`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.errors import ConfigError
from jaxmarket.learners.base import Transition, materialize
from jaxmarket.market.spec import NEVER
from jaxmarket.train.components import COMPONENTS, Step
from jaxmarket.train.components.base import quoted, served
from jaxmarket.train.metrics import NONFINITE, PER_SEED, flatten_metrics
from jaxmarket.train.slots import SlotView


@struct.dataclass
class Runner:
    """The training state: one pytree (checkpointed leaf by leaf, in this order)."""

    env_state: Any       # MarketState batched [E]
    obs: Any             # dict group -> [E, A, D]
    learners: Any        # dict group -> learner state
    key: jax.Array       # raw uint32 key data (checkpoint friendly)
    iteration: jax.Array  # int32
    episodes: jax.Array = struct.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    # the market's parameters (MarketParams), carried as data rather than baked into the
    # compiled chunk as constants: scenarios that differ only in parameter values (a
    # sweep over a temperature, a budget) share one compiled program
    params: Any = None
    # component name -> that component's state (jaxmarket.train.components: each
    # documents its own)
    components: Any = struct.field(default_factory=dict)


def chain(plan) -> tuple:
    """The plan's components, in hook order: every registered component
    (:data:`~jaxmarket.train.components.COMPONENTS`) the plan uses."""
    return tuple(c for c in (make(plan) for make in COMPONENTS.values()) if c is not None)


def make_train(plan, components: tuple | None = None):
    """``(init, run_chunk)`` of a :class:`~jaxmarket.train.plan.RunPlan`;
    ``components`` defaults to :func:`chain` of the plan."""
    env, params, learners = plan.env, plan.params, plan.learners
    groups, E, T = plan.groups, plan.num_markets, plan.train.rollout_length
    S, view = plan.train.num_seeds, SlotView.of(plan)
    comps = chain(plan) if components is None else tuple(components)
    sellers = frozenset(g.name for g in env.spec.sellers)
    episodic = int(params.episode_length) < NEVER
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key: jax.Array) -> Runner:
        k_env, k_learn, k_run = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, E), params)
        lkeys = jax.random.split(k_learn, len(groups))
        lstates = {g: learners[g].init(lkeys[i], plan.specs[g]) for i, g in enumerate(groups)}
        runner = Runner(env_state, obs, lstates, jax.random.key_data(k_run),
                        jnp.zeros((), jnp.int32), params=params)
        for c in comps:
            runner = c.init(k_run, runner)
        return runner

    def assignment(runner) -> dict:
        """The slot order in force: what the components declare (none: identity)."""
        out = {}
        for c in comps:
            out.update(c.assignment(runner))
        return out

    def act(runner, params, env_state, obs, key):
        """Every group's learner acts on its slots; components add their seats."""
        keys = dict(zip(groups, jax.random.split(key, len(groups))))
        for c in comps:
            obs = c.observe(runner, params, obs, env_state=env_state)
        actions, learner_actions, aux = {}, {}, {}
        order = assignment(runner)
        for g in groups:   # static loop over groups (config), not agents
            a, aux[g] = learners[g].act(runner.learners[g], view.learner_view(obs[g], g, order),
                                        keys[g])
            learner_actions[g] = a = materialize(a)  # once, not inside the market's fusions
            actions[g] = view.market_actions(a, g, order)
        for c in comps:
            actions = c.act(runner, actions, obs, keys)
        return obs, actions, learner_actions, aux

    def record(step: Step) -> tuple[dict, dict]:
        """The market metrics and every component's (and its per-step outputs)."""
        metrics, outputs = market_metrics(step, groups, sellers, S), {}
        for c in comps:
            extra, outputs[c.name] = c.step_metrics(step)
            metrics.update(extra)
        return metrics, outputs

    def market_step(runner, params, carry, _):
        # ``runner.learners`` is read, never written, during a rollout (``act`` is pure):
        # it is closed over rather than carried, so the scan does not copy learner buffers.
        # The slot assignment is fixed within a rollout.
        env_state, env_obs, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        # 1. act
        obs, actions, learner_actions, aux = act(runner, params, env_state, env_obs, k_act)
        # 2. market step
        before = env_state
        next_obs, env_state, rewards, term, trunc, info = vstep(
            jax.random.split(k_step, E), env_state, actions, params)
        done = jnp.logical_or(term, trunc)
        final_obs = info["final_observation"]
        for c in comps:   # at the prices just quoted
            final_obs = c.observe(runner, params, final_obs, prices=info["prices"])
        # 3. record
        order = assignment(runner)
        batch = {g: learner_transition(view, g, order, obs[g], learner_actions[g],
                                       rewards[g], final_obs[g], done, aux[g]) for g in groups}
        step = Step(obs, env_obs, actions, rewards, info, done, before, batch, order, params)
        metrics, outputs = record(step)
        return (env_state, next_obs, key), (batch, metrics, outputs)

    def rollout(runner, params, key):
        carry = (runner.env_state, runner.obs, key)
        if T == 1:  # one step: no loop (the learners see a [1, ...] time axis all the same)
            carry, out = market_step(runner, params, carry, None)
            return carry, jax.tree.map(lambda x: x[None], out)
        return jax.lax.scan(functools.partial(market_step, runner, params), carry, length=T)

    def iteration(runner: Runner, _):
        params = runner.params
        for c in comps:
            params = c.market_params(params, runner.iteration)
        (env_state, obs, key), (traj, metrics, outputs) = rollout(
            runner, params, jax.random.wrap_key_data(runner.key))
        # an episode ends at each truncation; a market that never truncates counts each
        # iteration as one
        truncations = metrics.pop("episodes").sum().astype(jnp.int32)
        finished = truncations if episodic else jnp.ones((), jnp.int32)
        new = runner.replace(env_state=env_state, obs=obs, params=params,
                             episodes=runner.episodes + finished)
        metrics = jax.tree.map(lambda x: x.mean(0), metrics)
        for c in comps:
            new, traj, metrics = c.after_rollout(key, runner, new, traj, metrics,
                                                 outputs[c.name])
        # 4. update
        new_states = {}
        for g in groups:
            try:
                new_states[g], lm = learners[g].update(runner.learners[g], traj[g])
            except ConfigError as err:   # a setting the update's shapes refuse (traced)
                raise ConfigError(f"learners.{g}.{err.field}", err.value,
                                  err.allowed) from None
            for name, value in lm.items():
                metrics[f"learner/{g}/{name}"] = jnp.mean(value)
        new = new.replace(learners=new_states)
        for c in comps:
            new, metrics = c.after_update(key, runner, new, metrics)
        return new.replace(key=jax.random.key_data(key), iteration=runner.iteration + 1), metrics

    def run_chunk(runner: Runner, length: int):
        return jax.lax.scan(iteration, runner, length=length)

    return init, run_chunk


def learner_transition(view: SlotView, g: str, assignment, obs, action, reward, next_obs,
                       done, aux) -> Transition:
    """One step of group ``g`` in its learner's slot order (market arrays ``[E, A, ...]``,
    ``done [E]``; ``action``: the learner's own, already in its order)."""
    return Transition(obs=view.learner_view(obs, g, assignment), action=action,
                      reward=view.learner_view(reward, g, assignment),
                      next_obs=view.learner_view(next_obs, g, assignment),
                      done=view.learner_done(done, g, assignment), aux=aux)


def market_metrics(step: Step, groups, sellers: frozenset, num_seeds: int) -> dict:
    """``reward/<g>``, ``traffic/<g>``, ``price/<g>``: means over markets and agents
    (and their per-seed copies ``per_seed/...``); ``episodes``: truncations this step.
    Quantity sellers: ``price/<g>`` is the clearing price (what a unit sold for: 0 in a
    period where nothing is sold) and ``quantity/<g>`` what they set.
    ``nonfinite_actions/<g>``: the action entries of the step that were NaN or +-inf
    (summed over markets, agents and products; the market kept the actions in force),
    not a ``metrics.csv`` column: the trainer's ``stop_on_nan`` and its
    ``nonfinite_actions.csv`` read it (docs/reliability.md, "Non-finite actions")."""
    metrics = {"episodes": step.done[0].astype(jnp.float32)}   # markets step in lockstep
    quantities = step.info.get("quantities", {})
    for g in groups:
        metrics[f"{NONFINITE}{g}"] = step.info["nonfinite_actions"][g].sum().astype(jnp.float32)
        values = [("reward", step.rewards[g]), ("traffic", served(step.info, g, sellers)),
                  ("price", quoted(step.info, g, sellers))]
        if g in quantities:   # quantity sellers: the clearing price, and what they set
            price = jnp.broadcast_to(step.info["market_price"][:, None, :], quantities[g].shape)
            values[2:] = [("price", price), ("quantity", quantities[g])]
        for name, value in values:
            # markets are seed-major (market = seed * num_envs + env): one mean per seed
            by_seed = value.reshape((num_seeds, -1) + value.shape[2:]).mean(1)   # [S] or [S, P]
            metrics[f"{name}/{g}"] = by_seed.mean(0)
            metrics[f"{PER_SEED}{name}/{g}"] = by_seed
    return metrics


def host_outputs(components) -> tuple[str, ...]:
    """The chunk-output prefixes that are components' host data, not metrics."""
    return tuple(c.host_prefix for c in components if c.host_prefix)


class Traced:
    """A plan's training program traced once, abstractly (nothing compiled), on first
    use of each part: ``runner`` (the state's shapes), ``iteration`` (one iteration's
    jaxpr and its output shapes), ``metric_columns``. The memory estimate
    (:mod:`jaxmarket.train.memory`) and the metric-name checks read the same trace."""

    def __init__(self, plan):
        self.plan = plan

    @functools.cached_property
    def components(self) -> tuple:
        return chain(self.plan)

    @functools.cached_property
    def functions(self) -> tuple:
        """``(init, run_chunk)`` of :func:`make_train`."""
        return make_train(self.plan, self.components)

    @functools.cached_property
    def runner(self) -> Runner:
        return jax.eval_shape(self.functions[0], jax.random.key(0))

    @functools.cached_property
    def iteration(self) -> tuple:
        """``(closed jaxpr, (runner, metrics) shapes)`` of a one-iteration chunk."""
        run_chunk = self.functions[1]
        return jax.make_jaxpr(lambda r: run_chunk(r, 1), return_shape=True)(self.runner)

    @functools.cached_property
    def metric_columns(self) -> tuple[str, ...]:
        """The ``metrics.csv`` column names."""
        metrics = self.iteration[1][1]
        skip = (PER_SEED,) + host_outputs(self.components)
        zeros = {k: np.zeros(v.shape, np.float32) for k, v in metrics.items()
                 if not k.startswith(skip)}
        return tuple(k for k in flatten_metrics(zeros, 0)[0] if k != "iteration")


def metric_columns(plan) -> list[str]:
    """The ``metrics.csv`` column names of a plan, from the traced (not compiled)
    training program."""
    return list(Traced(plan).metric_columns)
