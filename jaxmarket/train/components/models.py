"""External models trained in-graph on each iteration's experience, with their POI
exploration bonus and POI observations (:mod:`jaxmarket.models.runtime` holds the model
side; this component plugs it into the loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import jax
import jax.numpy as jnp

from jaxmarket.learners.base import Transition
from jaxmarket.models.runtime import GroupModel
from jaxmarket.train.components.base import COMPONENTS, Component, Step
from jaxmarket.train.components.population import assignment_of
from jaxmarket.train.metrics import PER_SEED
from jaxmarket.train.slots import SlotView


@dataclass(frozen=True)
class Models(Component):
    """Owns ``{g: ...}`` (each group's model state, POI statistics, last ground-truth errors).

    * ``observe``: with ``poi_obs``, the POI field at ``k`` inputs appended to the
      group's observations;
    * ``step_metrics``: the model's inputs and targets of every step (its outputs);
    * ``after_rollout``: ``r + beta * normalize(poi)`` added to the rewards before any
      advantage, then the fit, the next iteration's sampled points and the
      ground-truth evaluation (``model/<g>/...``, ``poi/<g>/...``)."""

    models: Mapping[str, GroupModel]
    view: SlotView
    rollout_length: int
    name = "models"
    nan_checked = ("model",)   # the ground-truth errors: a diverging model stops the run

    @property
    def obs_models(self) -> dict[str, GroupModel]:
        return {g: m for g, m in self.models.items() if m.obs_settings is not None}

    @property
    def in_loop_only(self) -> bool:
        """Only with POI observations: without them ``observe`` hands the market's
        observations on unchanged, so a policy replayed outside the loop acts alike."""
        return bool(self.obs_models)

    def init(self, key, runner):
        # model states from a key of their own (fold_in): other streams unchanged
        mstates = {g: m.init(jax.random.fold_in(jax.random.fold_in(key, 6), i))
                   for i, (g, m) in enumerate(self.models.items())}
        return self.with_state(runner, mstates)

    def observe(self, runner, params, obs, env_state=None, prices=None):
        obs_models = self.obs_models
        if not obs_models:
            return obs
        obs = dict(obs)
        for g, m in obs_models.items():   # POI observations: k values appended
            at = m.prices_in_force(env_state, params) if prices is None else prices
            obs[g] = jnp.concatenate([obs[g], m.obs_features(self.state(runner)[g], at, obs[g])],
                                     axis=-1)
        return obs

    def step_metrics(self, step: Step):
        metrics, io = {}, {}
        for g, m in self.obs_models.items():   # poi/<g>/obs [k]: the appended values' means
            metrics[f"poi/{g}/obs"] = step.obs[g][..., -m.obs_settings["k"]:].mean((0, 1))
        info, rewards = step.info, step.rewards
        for g, m in self.models.items():   # the external models' inputs and targets
            io[g] = m.io(Transition(obs=step.env_obs[g], action=step.actions[g],
                                    reward=rewards[g], next_obs=info["final_observation"][g],
                                    done=jnp.broadcast_to(step.done[:, None], rewards[g].shape),
                                    aux={}), info, step.before, step.params)
        return metrics, io

    def after_rollout(self, key, old, new, traj, metrics, outputs):
        if not self.models:
            return new, traj, metrics
        metrics, traj, mstates = dict(metrics), dict(traj), dict(self.state(old))
        for g, m in self.models.items():
            io = outputs[g]
            x, y = m.per_seed(io["x"]), m.per_seed(io["y"])       # [S, N, d]
            if m.poi is not None:   # r + beta * normalize(poi), before any advantage
                xs = m.per_seed(io["xs"]) if "xs" in io else None   # poi target: state
                bonus, stats, pm = m.bonus(mstates[g], x, y, old.iteration, xs)
                bonus = jax.vmap(lambda b: self.view.learner_view(b, g, assignment_of(old)))(
                    m.to_market(bonus, self.rollout_length))         # [T, slots]
                traj[g] = traj[g].replace(reward=traj[g].reward + bonus)
                mstates[g] = {**mstates[g], "poi": stats}
                metrics.update({f"poi/{g}/{k}": v for k, v in pm.items()})
            mstates[g], loss = m.fit(mstates[g], x, y)
            if g in self.obs_models:   # the next iteration's replay / uniform points
                mstates[g] = m.refresh_obs(mstates[g], x, y, key)
            errors = m.maybe_evaluate(mstates[g], new.env_state, new.params, old.iteration)
            mstates[g] = {**mstates[g], "eval": errors}
            for name, v in (("loss", loss), ("heldout_error", errors["heldout"]),
                            ("random_error", errors["random"])):
                metrics[f"model/{g}/{name}"] = v.mean()
                metrics[f"{PER_SEED}model/{g}/{name}"] = v
        return self.with_state(new, mstates), traj, metrics


@COMPONENTS.register("models")
def from_plan(plan) -> Models | None:
    if not plan.models:
        return None
    tcfg = plan.train
    models = {g: GroupModel(plan.env, plan.params, g, cfg, tcfg.num_seeds, tcfg.num_envs)
              for g, cfg in plan.models.items()}
    return Models(models, SlotView.of(plan), tcfg.rollout_length)
