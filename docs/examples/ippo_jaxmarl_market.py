"""IPPO, JaxMARL style, on a market through ``jaxmarket.adapters.make_jaxmarl_env``.

    python docs/examples/ippo_jaxmarl_market.py          # JAXMARKET_QUICK=1: shorter

The training code has the shape of JaxMARL's feed-forward IPPO for continuous actions
(``baselines/IPPO/ippo_ff_mabrax.py``): one flax actor-critic with a Gaussian head shared
by every agent, ``batchify``/``unbatchify`` between per-agent dicts and a
``[num_actors, ...]`` batch, ``jax.vmap(env.reset)`` / ``jax.vmap(env.step)`` over
``NUM_ENVS`` markets, GAE, clipped PPO epochs over shuffled minibatches, all inside one
jitted ``lax.scan``. It touches the environment only through the JaxMARL interface
(``env.agents``, ``env.num_agents``, ``env.action_space(a)``, ``env.observation_space(a)``,
``env.reset(key)``, ``env.step(key, state, actions)`` with ``dones["__all__"]``); the one
line that differs from a JaxMARL script is the one that makes the env::

    env = jaxmarl.make(config["ENV_NAME"], **config["ENV_KWARGS"])      # JaxMARL
    env = make_jaxmarl_env(config["ENV_NAME"], config["ENV_OVERRIDES"])   # here

The market is ``configs/logit_duopoly.yaml`` (two sellers ``sellers_0``, ``sellers_1``,
prices in ``[1, 2.5]``, profit rewards) with ``market.episode_length=1``: each step is
one pricing episode, and the observation is the seller's own price at the reset (1.75,
a constant: JaxMARL's ``batchify`` needs at least one feature). The policy starts at mean
0 (every price clipped up to 1 = cost, profit 0) and the independent learners should end
near the static Nash price ``jaxmarket.market.economics.nash_price() = 1.4729``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState

from jaxmarket.adapters import make_jaxmarl_env
from jaxmarket.market.economics import nash_price

QUICK = os.environ.get("JAXMARKET_QUICK") == "1"
CONFIG = dict(
    ENV_NAME=str(Path(__file__).resolve().parents[2] / "configs" / "logit_duopoly.yaml"),
    # JaxMARL's batchify needs at least one observation feature: the seller's own price
    ENV_OVERRIDES=["market.episode_length=1", "market.sellers[0].observation=[{kind: own_price}]"],
    NORMALIZE_ACTIONS=True,   # actions in [-1, 1] (the MABrax convention), mapped onto [1, 2.5]
    NUM_ENVS=32,
    NUM_STEPS=4,
    TOTAL_TIMESTEPS=40_000 if QUICK else 200_000,
    UPDATE_EPOCHS=4,
    NUM_MINIBATCHES=4,
    LR=3e-3,
    ANNEAL_LR=True,
    GAMMA=0.99,
    GAE_LAMBDA=0.95,
    CLIP_EPS=0.2,
    ENT_COEF=0.0,
    VF_COEF=0.5,
    MAX_GRAD_NORM=0.5,
    ACTIVATION="tanh",
    SEED=0,
)


class ActorCritic(nn.Module):
    action_dim: int
    activation: str = "tanh"
    hidden: Sequence[int] = (64, 64)

    @nn.compact
    def __call__(self, x):
        act = nn.relu if self.activation == "relu" else nn.tanh
        actor = x
        for h in self.hidden:
            actor = act(nn.Dense(h, kernel_init=orthogonal(np.sqrt(2)),
                                 bias_init=constant(0.0))(actor))
        mean = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01),
                        bias_init=constant(0.0))(actor)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        pi = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
        critic = x
        for h in self.hidden:
            critic = act(nn.Dense(h, kernel_init=orthogonal(np.sqrt(2)),
                                  bias_init=constant(0.0))(critic))
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)
        return pi, jnp.squeeze(value, axis=-1)


class Transition(NamedTuple):
    done: jnp.ndarray
    action: jnp.ndarray
    value: jnp.ndarray
    reward: jnp.ndarray
    log_prob: jnp.ndarray
    obs: jnp.ndarray


def batchify(x: dict, agents, num_actors):
    """Per-agent dict of ``[NUM_ENVS, ...]`` -> ``[num_actors, d]`` (agent-major),
    observations zero-padded to the largest size, as JaxMARL's ``batchify``."""
    width = max(x[a].reshape(x[a].shape[0], -1).shape[-1] for a in agents)
    rows = [x[a].reshape(x[a].shape[0], -1) for a in agents]
    rows = [jnp.pad(r, ((0, 0), (0, width - r.shape[-1]))) for r in rows]
    return jnp.stack(rows).reshape((num_actors, -1))


def unbatchify(x: jnp.ndarray, agents, num_envs, num_agents):
    x = x.reshape((num_agents, num_envs, -1))
    return {a: x[i] for i, a in enumerate(agents)}


def make_train(config):
    env = make_jaxmarl_env(config["ENV_NAME"], config["ENV_OVERRIDES"],   # the only env line
                           normalize_actions=config["NORMALIZE_ACTIONS"])
    config = dict(config)
    config["NUM_ACTORS"] = env.num_agents * config["NUM_ENVS"]
    config["NUM_UPDATES"] = config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    config["MINIBATCH_SIZE"] = config["NUM_ACTORS"] * config["NUM_STEPS"] // config["NUM_MINIBATCHES"]

    def linear_schedule(count):
        frac = 1.0 - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"])) \
            / config["NUM_UPDATES"]
        return config["LR"] * frac

    def train(rng):
        network = ActorCritic(env.action_space(env.agents[0]).shape[0], config["ACTIVATION"])
        obs_width = max(int(np.prod(env.observation_space(a).shape)) for a in env.agents)
        rng, _rng = jax.random.split(rng)
        params = network.init(_rng, jnp.zeros((obs_width,)))
        lr = linear_schedule if config["ANNEAL_LR"] else config["LR"]
        tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                         optax.adam(learning_rate=lr, eps=1e-5))
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)

        rng, _rng = jax.random.split(rng)
        obsv, env_state = jax.vmap(env.reset)(jax.random.split(_rng, config["NUM_ENVS"]))

        def _update_step(runner_state, unused):
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state
                obs_batch = batchify(last_obs, env.agents, config["NUM_ACTORS"])
                rng, _rng = jax.random.split(rng)
                pi, value = network.apply(train_state.params, obs_batch)
                action = pi.sample(seed=_rng)
                log_prob = pi.log_prob(action)
                env_act = unbatchify(action, env.agents, config["NUM_ENVS"], env.num_agents)
                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, config["NUM_ENVS"])
                obsv, env_state, reward, done, info = jax.vmap(env.step)(rng_step, env_state,
                                                                         env_act)
                transition = Transition(
                    batchify({a: done[a] for a in env.agents}, env.agents,
                             config["NUM_ACTORS"]).squeeze(-1),
                    action, value,
                    batchify(reward, env.agents, config["NUM_ACTORS"]).squeeze(-1),
                    log_prob, obs_batch)
                return (train_state, env_state, obsv, rng), transition

            runner_state, traj_batch = jax.lax.scan(_env_step, runner_state, None,
                                                    config["NUM_STEPS"])
            train_state, env_state, last_obs, rng = runner_state
            _, last_val = network.apply(train_state.params,
                                        batchify(last_obs, env.agents, config["NUM_ACTORS"]))

            def _get_advantages(carry, t):
                gae, next_value = carry
                delta = t.reward + config["GAMMA"] * next_value * (1 - t.done) - t.value
                gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * (1 - t.done) * gae
                return (gae, t.value), gae

            _, advantages = jax.lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val),
                                         traj_batch, reverse=True)
            targets = advantages + traj_batch.value

            def _update_epoch(update_state, unused):
                def _update_minibatch(train_state, batch):
                    traj, gae, targets = batch

                    def _loss_fn(params):
                        pi, value = network.apply(params, traj.obs)
                        log_prob = pi.log_prob(traj.action)
                        value_clipped = traj.value + (value - traj.value).clip(
                            -config["CLIP_EPS"], config["CLIP_EPS"])
                        value_loss = 0.5 * jnp.maximum(jnp.square(value - targets),
                                                       jnp.square(value_clipped - targets)).mean()
                        ratio = jnp.exp(log_prob - traj.log_prob)
                        g = (gae - gae.mean()) / (gae.std() + 1e-8)
                        actor_loss = -jnp.minimum(
                            ratio * g,
                            jnp.clip(ratio, 1 - config["CLIP_EPS"], 1 + config["CLIP_EPS"]) * g,
                        ).mean()
                        entropy = pi.entropy().mean()
                        return (actor_loss + config["VF_COEF"] * value_loss
                                - config["ENT_COEF"] * entropy)

                    grads = jax.grad(_loss_fn)(train_state.params)
                    return train_state.apply_gradients(grads=grads), None

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = config["MINIBATCH_SIZE"] * config["NUM_MINIBATCHES"]
                permutation = jax.random.permutation(_rng, batch_size)
                batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]),
                                     (traj_batch, advantages, targets))
                minibatches = jax.tree.map(
                    lambda x: jnp.take(x, permutation, axis=0).reshape(
                        [config["NUM_MINIBATCHES"], -1] + list(x.shape[1:])), batch)
                train_state, _ = jax.lax.scan(_update_minibatch, train_state, minibatches)
                return (train_state, traj_batch, advantages, targets, rng), None

            update_state = (train_state, traj_batch, advantages, targets, rng)
            update_state, _ = jax.lax.scan(_update_epoch, update_state, None,
                                           config["UPDATE_EPOCHS"])
            train_state, rng = update_state[0], update_state[-1]
            # per agent: mean reward of the rollout
            rewards = traj_batch.reward.reshape(config["NUM_STEPS"], env.num_agents, -1)
            metric = {"reward": rewards.mean(axis=(0, 2))}
            return (train_state, env_state, last_obs, rng), metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, None,
                                            config["NUM_UPDATES"])
        return {"runner_state": runner_state, "metrics": metric}

    return env, train


def main(config: dict = CONFIG) -> dict:
    """Train; returns the agents' names, the per-update mean ``reward``
    ``[NUM_UPDATES, num_agents]`` and each agent's learned ``price``: the market price of
    the final policy's mean action on its last observation."""
    env, train = make_train(config)
    out = jax.jit(train)(jax.random.key(config["SEED"]))
    train_state, _, last_obs, _ = out["runner_state"]
    obs = batchify(last_obs, env.agents, env.num_agents * config["NUM_ENVS"])
    pi, _ = train_state.apply_fn(train_state.params,
                                 obs.reshape(env.num_agents, config["NUM_ENVS"], -1)[:, 0])
    mean = {a: pi.mean()[i][None] for i, a in enumerate(env.agents)}       # [1, P] each
    price = [float(env.market_action(g, mean[a])[0, 0])
             for g, names in env.agent_classes.items() for a in names]
    return {"agents": env.agents, "reward": np.asarray(out["metrics"]["reward"]),
            "price": np.asarray(price)}


if __name__ == "__main__":
    result = main()
    first, last = result["reward"][:10].mean(0), result["reward"][-10:].mean(0)
    print("agents", result["agents"])
    print("mean profit, first 10 updates", np.round(first, 4), " last 10", np.round(last, 4))
    print("learned prices", np.round(result["price"], 4), f"  static Nash price {nash_price():.4f}")
