"""The whole training iteration as one readable function (PureJaxRL style).

``make_train(env, params, learners, specs, tcfg)`` returns ``(init, run_chunk)``:

* ``init(key) -> Runner``: reset ``num_seeds x num_envs`` markets, init every group's
  learner;
* ``run_chunk(runner, length) -> (runner, metrics)``: ``length`` iterations in one
  ``lax.scan``; an iteration collects ``rollout_length`` market steps (every agent group
  acts through its learner, the vmapped market steps, auto-resets) and then calls each
  learner's ``update`` on its group's time-major batch. ``metrics[name]`` is
  ``[length, ...]``: the market metrics ``reward/<g>`` (``[]``), ``price/<g>`` and
  ``traffic/<g>`` (``[P]``) are means over the rollout, seeds, markets and agents, and
  ``per_seed/<name>`` holds the same per seed (``[S]``, ``[S, P]``); ``learner/<g>/<m>``
  are the learners' own metrics, averaged over whatever axis they report.

Both are pure; the caller ``jit``s them. Seeds are not a ``vmap`` over the whole
program: they are folded into the agent axis. With ``S`` seeds of ``E`` markets each, a
group of ``A`` agents driven by ``K`` parameter sets is seen by its learner as
``S * E * A`` slots and ``S * K`` policies, ``policy_index[(s * E + e) * A + a] =
s * K + index[a]``: the markets of one seed share that seed's parameters, and seeds
never share anything (data, not a code path). This keeps learner-internal control flow
(``lax.cond`` on a buffer counter, say) a real branch: under a ``vmap`` over seeds its
predicate would be batched and both branches would run every step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.learners.base import Learner, LearnerSpec, Transition, materialize
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams
from jaxmarket.train.config import TrainConfig


PER_SEED = "per_seed/"   # prefix of the per-seed copies of the market metrics


@struct.dataclass
class Runner:
    env_state: Any       # MarketState batched [E]
    obs: Any             # dict group -> [E, A, D]
    learners: Any        # dict group -> learner state
    key: jax.Array       # raw uint32 key data (checkpoint friendly)
    iteration: jax.Array  # int32


def tile_spec(spec: LearnerSpec, num_envs: int, num_seeds: int = 1) -> LearnerSpec:
    """A group's spec seen across ``num_seeds x num_envs`` markets: slots
    ``S * E * A``, policies ``S * K``, seed ``s`` owning policies ``s*K .. s*K + K - 1``."""
    if num_envs == 1 and num_seeds == 1:
        return spec
    base = np.asarray(spec.index())
    per_seed = np.tile(base, num_envs)                                   # [E * A]
    index = (np.arange(num_seeds)[:, None] * spec.policies + per_seed[None]).ravel()
    markets = num_envs * num_seeds
    return dataclasses.replace(
        spec, num_agents=spec.num_agents * markets, num_policies=spec.policies * num_seeds,
        policy_index=tuple(int(i) for i in index), num_markets=markets, num_sessions=num_seeds,
        action_low=np.tile(spec.action_low, (markets, 1)),
        action_high=np.tile(spec.action_high, (markets, 1)))


def per_seed(x: jax.Array, num_seeds: int) -> jax.Array:
    """Policy-stacked leaf ``[S * K, ...]`` -> ``[S, K, ...]``."""
    x = jnp.asarray(x)
    return x.reshape((num_seeds, x.shape[0] // num_seeds) + x.shape[1:])


def make_train(env: MarketEnv, params: MarketParams, learners: dict[str, Learner],
               specs: dict[str, LearnerSpec], tcfg: TrainConfig):
    E, T = tcfg.num_envs * tcfg.num_seeds, tcfg.rollout_length   # E: all markets
    S = tcfg.num_seeds
    groups = env.agent_groups
    sizes = {g: env.num_agents(g) for g in groups}
    seller_groups = {g.name for g in env.spec.sellers}
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key: jax.Array) -> Runner:
        k_env, k_learn, k_run = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, E), params)
        lkeys = jax.random.split(k_learn, len(groups))
        lstates = {g: learners[g].init(lkeys[i], specs[g]) for i, g in enumerate(groups)}
        return Runner(env_state, obs, lstates, jax.random.key_data(k_run), jnp.zeros((), jnp.int32))

    def flat(x, g):   # [E, A, ...] -> [E * A, ...]
        return x.reshape((E * sizes[g],) + x.shape[2:])

    def market_step(lstates, carry, _):
        # ``lstates`` is read, never written, during a rollout (``act`` is pure): it is
        # closed over rather than carried, so the scan does not copy learner buffers.
        env_state, obs, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        akeys = jax.random.split(k_act, len(groups))
        actions, aux = {}, {}
        for i, g in enumerate(groups):  # static loop over groups (config), not agents
            a, aux[g] = learners[g].act(lstates[g], flat(obs[g], g), akeys[i])
            a = materialize(a)  # computed once, not inside each of the market's fusions
            actions[g] = a.reshape((E, sizes[g]) + a.shape[1:])
        next_obs, env_state, rewards, term, trunc, info = vstep(
            jax.random.split(k_step, E), env_state, actions, params)
        done = jnp.logical_or(term, trunc)
        batch = {g: Transition(obs=flat(obs[g], g), action=flat(actions[g], g),
                               reward=flat(rewards[g], g),
                               next_obs=flat(info["final_observation"][g], g),
                               done=jnp.repeat(done, sizes[g]), aux=aux[g]) for g in groups}
        metrics = {}
        for g in groups:
            served = (info["traffic"][g] if g in seller_groups
                      else info["queries"][g] - info["unserved"][g])
            price = info["prices"][g] if g in seller_groups else info["budgets"][g]
            for name, value in (("reward", rewards[g]), ("traffic", served), ("price", price)):
                # markets are seed-major (market = seed * num_envs + env): one mean per seed
                by_seed = value.reshape((S, -1) + value.shape[2:]).mean(1)   # [S] or [S, P]
                metrics[f"{name}/{g}"] = by_seed.mean(0)
                metrics[f"{PER_SEED}{name}/{g}"] = by_seed
        return (env_state, next_obs, key), (batch, metrics)

    def iteration(runner: Runner, _):
        key = jax.random.wrap_key_data(runner.key)
        lstates = runner.learners
        carry = (runner.env_state, runner.obs, key)
        if T == 1:  # one step: no loop (the learners see a [1, ...] time axis all the same)
            (env_state, obs, key), out = market_step(lstates, carry, None)
            traj, metrics = jax.tree.map(lambda x: x[None], out)
        else:
            (env_state, obs, key), (traj, metrics) = jax.lax.scan(
                functools.partial(market_step, lstates), carry, length=T)
        metrics = jax.tree.map(lambda x: x.mean(0), metrics)
        new_states = {}
        for g in groups:
            new_states[g], lm = learners[g].update(lstates[g], traj[g])
            for name, value in lm.items():
                metrics[f"learner/{g}/{name}"] = jnp.mean(value)
        runner = Runner(env_state, obs, new_states, jax.random.key_data(key), runner.iteration + 1)
        return runner, metrics

    def run_chunk(runner: Runner, length: int):
        return jax.lax.scan(iteration, runner, length=length)

    return init, run_chunk
