"""A scenario ready to roll without training: env, params, each agent group's learner and
its (initial or trained) state, over ``train.num_envs x train.num_seeds`` markets.

Shared by ``collect`` (record the behaviour) and the simulator evaluator (roll a learned
policy for one group while the others follow the scenario). Learner states come from
``init`` or, for a trained run directory, from its last checkpoint; ``act`` is called,
``update`` never is (the policies are fixed while they are observed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.learners.base import materialize
from jaxmarket.train.loop import chain
from jaxmarket.train.plan import resolve
from jaxmarket.train.trainer import Trainer


@dataclasses.dataclass
class Scenario:
    config: dict
    env: Any
    params: Any
    learners: dict
    specs: dict
    num_markets: int
    states: dict          # group -> learner state

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(self.env.agent_groups)

    def size(self, group: str) -> int:
        return self.env.num_agents(group)

    def bounds(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        """The group's action bounds ``[A, P]`` of one market."""
        space = self.env.action_space(group, self.params)
        shape = (self.size(group), self.env.spec.num_products)
        return (np.broadcast_to(np.asarray(space.low, np.float32), shape),
                np.broadcast_to(np.asarray(space.high, np.float32), shape))


def load_scenario(config: str | Path | dict | None = None, policy_dir: str | Path | None = None,
                  overrides: list[str] | tuple[str, ...] = (), seed: int | None = None) -> Scenario:
    """The scenario of ``config`` (a YAML path or mapping), or of the trained run
    ``policy_dir`` with its learners' last checkpointed states."""
    if policy_dir is not None:
        run = Path(policy_dir)
        if not (run / "config.yaml").is_file():
            raise ConfigError("--policy", str(run), "a run directory holding config.yaml "
                              "(python -m jaxmarket.train --run-dir DIR)")
        if config is not None:
            raise ConfigError("--config", str(config), "no scenario file with --policy (the "
                              "run directory's config.yaml is used)")
        config = load_config(run / "config.yaml", list(overrides))
    elif config is None:
        raise ConfigError("--config", None, "a scenario file (or --policy RUN_DIR)")
    else:
        config = load_config(config, list(overrides))
    if seed is not None:
        config = {**config, "seed": int(seed)}
    plan = resolve(config)
    env, params, learners, specs, tcfg = plan.env, plan.params, plan.learners, plan.specs, plan.train
    if any(p is not None and p.dynamic for p in plan.populations.values()):
        raise ConfigError("learners", "a resampled population",
                          "static populations only (collect does not redraw assignments)")
    hooked = [c.name for c in chain(plan) if c.in_loop_only]
    if hooked:
        raise ConfigError("learners", ", ".join(hooked),
                          "a scenario without components that act or observe inside the "
                          "training loop only (league opponents, external-model "
                          "observations): collect calls the learners' act alone")
    if policy_dir is not None:
        if not (Path(policy_dir) / "checkpoints").is_dir():
            raise ConfigError("--policy", str(policy_dir), "a run with at least one checkpoint")
        trainer = Trainer(plan, Path(policy_dir))
        runner, step = trainer.restore()
        if step == 0:
            raise ConfigError("--policy", str(policy_dir), "a run with at least one checkpoint")
        states = runner.learners
    else:
        key = jax.random.fold_in(jax.random.key(int(config.get("seed", 0))), 7)
        keys = jax.random.split(key, len(env.agent_groups))
        states = {g: learners[g].init(keys[i], specs[g]) for i, g in enumerate(env.agent_groups)}
    return Scenario(config, env, params, learners, specs,
                    tcfg.num_envs * tcfg.num_seeds, states)


# what one step records per group, besides obs / action / reward / next obs / flags
SELLER_INFO = ("traffic", "fees", "prices")
CONSUMER_INFO = ("queries", "unserved", "spend", "budgets")


def make_step(sc: Scenario, override: dict[str, Callable] | None = None):
    """``step(carry, key) -> (carry, rows)`` for all ``num_markets`` markets.

    ``carry = (env_state [E], obs {g: [E, A, D]}, t [E], episode [E])``; ``override[g](obs [E*A, D],
    key, base_action [E*A, P], base_aux) -> (action, extra dict)`` replaces group ``g``'s
    action (behaviour noise, a learned policy). ``rows[g]`` holds ``[E*A, ...]`` arrays."""
    env, params, E = sc.env, sc.params, sc.num_markets
    override = override or {}
    groups = sc.groups
    sellers = {g.name for g in env.spec.sellers}
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    lows = {g: jnp.asarray(np.tile(sc.bounds(g)[0], (E, 1))) for g in groups}
    highs = {g: jnp.asarray(np.tile(sc.bounds(g)[1], (E, 1))) for g in groups}

    def step(carry, key):
        env_state, obs, t, episode = carry
        k_act, k_step = jax.random.split(key)
        akeys = jax.random.split(k_act, 2 * len(groups))
        actions, rows = {}, {}
        for i, g in enumerate(groups):          # static loop over groups
            n = sc.size(g)
            flat_obs = obs[g].reshape((E * n,) + obs[g].shape[2:])
            a, aux = sc.learners[g].act(sc.states[g], flat_obs, akeys[2 * i])
            extra = {}
            if g in override:
                a, extra = override[g](flat_obs, akeys[2 * i + 1], a, aux)
            elif "log_prob" in aux:
                extra = {"log_probs": aux["log_prob"].astype(jnp.float32)}
            a = materialize(jnp.clip(a, lows[g], highs[g]))
            actions[g] = a.reshape((E, n) + a.shape[1:])
            rows[g] = {"observations": flat_obs, "actions": a, **extra}
        next_obs, env_state, rewards, term, trunc, info = vstep(
            jax.random.split(k_step, E), env_state, actions, params)
        for g in groups:
            n = sc.size(g)
            def rep(x, n=n):   # [E] -> [E * n]
                return jnp.repeat(x, n)

            r = rows[g]
            r["rewards"] = rewards[g].reshape(E * n)
            fin = info["final_observation"][g]
            r["next_observations"] = fin.reshape((E * n,) + fin.shape[2:])
            r["terminals"] = rep(term)
            r["timeouts"] = rep(jnp.logical_and(trunc, jnp.logical_not(term)))
            r["stream"] = jnp.arange(E * n, dtype=jnp.int32)
            r["step"] = rep(t)
            r["episode"] = rep(episode)
            r.setdefault("log_probs", jnp.full((E * n,), jnp.nan, jnp.float32))
            for name in (SELLER_INFO if g in sellers else CONSUMER_INFO):
                x = info[name][g]
                r[f"info/{name}"] = x.reshape((E * n,) + x.shape[2:])
        done = jnp.logical_or(term, trunc)
        t = jnp.where(done, 0, t + 1)
        return (env_state, next_obs, t, episode + done.astype(jnp.int32)), rows

    def reset(key):
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, E), params)
        return env_state, obs, jnp.zeros((E,), jnp.int32), jnp.zeros((E,), jnp.int32)

    return reset, step


__all__ = ["Scenario", "load_scenario", "make_step"]
