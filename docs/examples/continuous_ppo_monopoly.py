"""Continuous-action PPO, PureJaxRL style, pricing the logit monopoly through the gymnax view.

    python docs/examples/continuous_ppo_monopoly.py            # JAXMARKET_QUICK=1: shorter

The learner is ordinary continuous-control code: a flax actor-critic with a Gaussian
head, optax adam, GAE, minibatch epochs, rollouts as a ``lax.scan`` over ``vmap``-ed
environments, and actions clipped to ``[-1, 1]`` before they reach the environment (the
``ClipAction`` wrapper of PureJaxRL, the Brax convention). It knows nothing about prices:
``SingleAgentEnv(..., normalize_actions=True)`` maps ``a`` in ``[-1, 1]`` to
``low + (a + 1) / 2 * (high - low)`` of the seller's bounds (``[1, 2.5]`` here). Without
the flag the same code can only post prices in ``[-1, 1]``, which the market clips up to
``low = 1 = cost``: every step earns exactly 0 and there is nothing to learn from
(``main(normalize_actions=False)`` shows it).

The scenario is ``configs/logit_monopoly.yaml`` (group ``seller``, one agent, one
product, no observation features) with ``market.episode_length=1``: a monopolist's
profit does not depend on past prices, so each step is one pricing episode (``done``
every step, GAE reduces to ``reward - value``) and gymnax's ``LogWrapper`` reports each
step's profit as an episode return. Theory (``jaxmarket.market.economics.monopoly_price``):
``p* = c + mu (1 + W(exp((a - c - mu - a0) / mu))) = 1.8020``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState
from gymnax.wrappers.purerl import GymnaxWrapper, LogWrapper

import jaxmarket
from jaxmarket.market.economics import monopoly_price
from jaxmarket.adapters.single_agent import SingleAgentEnv

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "logit_monopoly.yaml"
QUICK = os.environ.get("JAXMARKET_QUICK") == "1"

PPO = dict(
    NUM_ENVS=64,          # markets stepped in parallel (vmap)
    NUM_STEPS=4,          # rollout length per update (lax.scan)
    UPDATE_EPOCHS=4,
    NUM_MINIBATCHES=4,
    LR=3e-3,
    ANNEAL_LR=True,       # linear decay to 0
    STD_MIN=0.005,        # floor of the policy std (see ActorCritic)
    GAMMA=0.99,           # no effect here: every step ends an episode
    GAE_LAMBDA=0.95,
    CLIP_EPS=0.2,
    ENT_COEF=0.0,
    VF_COEF=0.5,
    MAX_GRAD_NORM=0.5,
    HIDDEN=64,
)


class ActorCritic(nn.Module):
    """Two tanh MLPs: a Gaussian policy (state-independent log std) and a value head.

    The std is floored at ``std_min`` (PureJaxRL has no floor). The profit is smooth at
    its peak, so once the mean is there the standardised advantages (``adv / adv.std()``,
    scale free) keep pushing the log std down at a constant rate, and no entropy bonus
    balances that. Unfloored, the std fell to ~3e-4 within 400k steps, where the rewards
    of a rollout differ by less than float32 resolves; the standardised advantages were
    then noise, the mean random-walked and ended at 1.33 instead of 1.80. The floor
    (0.005, i.e. a price std of 0.0037 on [1, 2.5]) biases the mean by ~std^2: nothing.
    """
    action_dim: int
    hidden: int = 64
    std_min: float = 0.005

    @nn.compact
    def __call__(self, x):
        def mlp(h, out, out_scale):
            for _ in range(2):
                h = nn.tanh(nn.Dense(self.hidden, kernel_init=orthogonal(np.sqrt(2)),
                                     bias_init=constant(0.0))(h))
            return nn.Dense(out, kernel_init=orthogonal(out_scale), bias_init=constant(0.0))(h)

        mean = mlp(x, self.action_dim, 0.01)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        log_std = jnp.maximum(log_std, np.log(self.std_min))
        value = mlp(x, 1, 1.0)
        return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std)), value[..., 0]


class ClipAction(GymnaxWrapper):
    """Clip continuous actions to ``[low, high]`` (default ``[-1, 1]``) before stepping."""

    def __init__(self, env, low: float = -1.0, high: float = 1.0):
        super().__init__(env)
        self.low, self.high = low, high

    def reset(self, key, params=None):
        return self._env.reset(key, params)

    def step(self, key, state, action, params=None):
        return self._env.step(key, state, jnp.clip(action, self.low, self.high), params)


class VecEnv(GymnaxWrapper):
    """``reset`` / ``step`` over a leading batch of keys, states and actions."""

    def reset(self, keys, params=None):
        return jax.vmap(self._env.reset, in_axes=(0, None))(keys, params)

    def step(self, keys, state, action, params=None):
        return jax.vmap(self._env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array


def make_env(normalize_actions: bool = True, overrides: Sequence[str] = ()):
    """The monopoly seller as a gymnax env: (view, params)."""
    env, params = jaxmarket.make(CONFIG, ["market.episode_length=1", *overrides])
    view = SingleAgentEnv(env, "seller", agent=0, params=params,
                          normalize_actions=normalize_actions)
    return view, params


def make_train(view, params, config: dict[str, Any], num_updates: int):
    """A jittable ``train(key) -> (train_state, metrics)``; metrics per update: the mean
    reward of its rollout, the policy's mean action and std after it."""
    env = VecEnv(ClipAction(LogWrapper(view)))
    n_envs, n_steps = config["NUM_ENVS"], config["NUM_STEPS"]
    batch_size = n_envs * n_steps
    minibatch_size = batch_size // config["NUM_MINIBATCHES"]
    assert minibatch_size * config["NUM_MINIBATCHES"] == batch_size
    network = ActorCritic(view.action_space(params).shape[0], config["HIDDEN"],
                          config["STD_MIN"])

    def loss_fn(net_params, batch: Transition, gae, targets):
        pi, value = network.apply(net_params, batch.obs)
        log_prob = pi.log_prob(batch.action)
        value_clipped = batch.value + jnp.clip(value - batch.value,
                                               -config["CLIP_EPS"], config["CLIP_EPS"])
        value_loss = 0.5 * jnp.maximum(jnp.square(value - targets),
                                       jnp.square(value_clipped - targets)).mean()
        ratio = jnp.exp(log_prob - batch.log_prob)
        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
        clipped = jnp.clip(ratio, 1.0 - config["CLIP_EPS"], 1.0 + config["CLIP_EPS"])
        actor_loss = -jnp.minimum(ratio * gae, clipped * gae).mean()
        entropy = pi.entropy().mean()
        return actor_loss + config["VF_COEF"] * value_loss - config["ENT_COEF"] * entropy

    def train(key):
        key, k_init, k_reset = jax.random.split(key, 3)
        obs_shape = view.observation_space(params).shape
        steps_per_update = config["UPDATE_EPOCHS"] * config["NUM_MINIBATCHES"]
        lr = (optax.linear_schedule(config["LR"], 0.0, num_updates * steps_per_update)
              if config["ANNEAL_LR"] else config["LR"])
        tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                         optax.adam(lr, eps=1e-5))
        state = TrainState.create(apply_fn=network.apply, tx=tx,
                                  params=network.init(k_init, jnp.zeros(obs_shape)))
        obs, env_state = env.reset(jax.random.split(k_reset, n_envs), params)

        def env_step(carry, _):
            state, env_state, obs, key = carry
            key, k_act, k_step = jax.random.split(key, 3)
            pi, value = network.apply(state.params, obs)
            action = pi.sample(seed=k_act)           # unclipped: ClipAction clips it
            log_prob = pi.log_prob(action)
            obs_next, env_state, reward, terminated, truncated, _ = env.step(
                jax.random.split(k_step, n_envs), env_state, action, params)
            done = jnp.logical_or(terminated, truncated)
            return (state, env_state, obs_next, key), Transition(done, action, value, reward,
                                                                 log_prob, obs)

        def gae(traj: Transition, last_value):
            def backward(carry, t: Transition):
                adv, next_value = carry
                not_done = 1.0 - t.done
                delta = t.reward + config["GAMMA"] * next_value * not_done - t.value
                adv = delta + config["GAMMA"] * config["GAE_LAMBDA"] * not_done * adv
                return (adv, t.value), adv

            _, advantages = jax.lax.scan(backward, (jnp.zeros_like(last_value), last_value),
                                         traj, reverse=True)
            return advantages, advantages + traj.value

        def update_epoch(carry, _):
            state, batch, key = carry
            key, k_perm = jax.random.split(key)
            perm = jax.random.permutation(k_perm, batch_size)
            minibatches = jax.tree.map(
                lambda x: x.reshape((batch_size,) + x.shape[2:])[perm].reshape(
                    (config["NUM_MINIBATCHES"], minibatch_size) + x.shape[2:]), batch)

            def minibatch(state, mb):
                traj, advantages, targets = mb
                grads = jax.grad(loss_fn)(state.params, traj, advantages, targets)
                return state.apply_gradients(grads=grads), None

            state, _ = jax.lax.scan(minibatch, state, minibatches)
            return (state, batch, key), None

        def update(carry, _):
            carry, traj = jax.lax.scan(env_step, carry, None, n_steps)
            state, env_state, obs, key = carry
            _, last_value = network.apply(state.params, obs)
            advantages, targets = gae(traj, last_value)
            (state, _, key), _ = jax.lax.scan(update_epoch, (state, (traj, advantages, targets),
                                                             key), None, config["UPDATE_EPOCHS"])
            pi, _ = network.apply(state.params, obs[0])
            metrics = {"reward": traj.reward.mean(), "mean_action": pi.mean()[0],
                       "std": pi.stddev()[0]}
            return (state, env_state, obs, key), metrics

        (state, *_), metrics = jax.lax.scan(update, (state, env_state, obs, key), None,
                                            num_updates)
        return state, metrics

    return train


def policy_price(view, params, train_state) -> float:
    """The price the market posts when the policy plays its mean action (clipped to
    ``[-1, 1]`` like during training), read from a real step's ``info["prices"]``."""
    obs, env_state = view.reset(jax.random.key(0), params)
    pi, _ = train_state.apply_fn(train_state.params, obs)
    action = jnp.clip(pi.mean(), -1.0, 1.0)
    *_, info = view.step(jax.random.key(1), env_state, action, params)
    return float(info["prices"][view.group][view.agent, 0])


def run(total_steps: int = 400_000, seed: int = 0, normalize_actions: bool = True,
        overrides: Sequence[str] = (), config: dict[str, Any] | None = None) -> dict:
    """Train; returns the learned price and, per update, the rollout's mean reward
    (``reward``), the policy's mean action and std (in ``[-1, 1]`` action units)."""
    config = {**PPO, **(config or {})}
    view, params = make_env(normalize_actions, overrides)
    num_updates = max(1, total_steps // (config["NUM_ENVS"] * config["NUM_STEPS"]))
    train = jax.jit(make_train(view, params, config, num_updates))
    state, metrics = jax.block_until_ready(train(jax.random.key(seed)))
    return {"price": policy_price(view, params, state),
            **{k: np.asarray(v) for k, v in metrics.items()}}


def closed_form_price(overrides: Sequence[str] = ()) -> float:
    """``economics.monopoly_price`` from the scenario's own quality, cost, outside quality
    and logit temperature."""
    _, params = jaxmarket.make(CONFIG, list(overrides))
    seller, dist = params.sellers["seller"], params.distributor
    assert float(dist["price_sensitivity"]) == 1.0
    scalar = lambda x: float(np.ravel(x)[0])  # noqa: E731
    return monopoly_price(scalar(seller.quality), scalar(seller.cost),
                          scalar(dist["outside_quality"]), scalar(dist["temperature"]))


def main(total_steps: int = 400_000, seed: int = 0, **kwargs) -> float:
    """The learned price (the market price of the policy's mean action)."""
    return run(total_steps, seed, **kwargs)["price"]


if __name__ == "__main__":
    steps = 100_000 if QUICK else 400_000
    out = run(steps)
    p_star = closed_form_price()
    print(f"learned price {out['price']:.4f}   closed-form monopoly price {p_star:.4f}   "
          f"(difference {out['price'] - p_star:+.5f}; policy std {out['std'][-1]:.4f}, mean "
          f"profit of the last rollout {out['reward'][-1]:.4f})")
    stuck = run(steps // 4, normalize_actions=False)
    print(f"without normalize_actions: price {stuck['price']:.4f}, largest mean profit of "
          f"any update {stuck['reward'].max():.4f}")
