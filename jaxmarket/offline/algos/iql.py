"""Implicit Q-learning (Kostrikov et al. 2022), continuous and discrete actions.

    L_V  = E[ L2_tau(min_i Q'_i(s, a) - V(s)) ]           expectile tau (0.7)
    L_Q  = E[ (r + gamma (1 - terminal) V(s') - Q_i(s, a))^2 ]
    L_pi = -E[ exp(beta (min_i Q'_i(s, a) - V(s))) log pi(a | s) ]   weights clipped at 100

``Q'`` is a Polyak-averaged target critic. Only dataset actions enter the critic: no
out-of-distribution action is ever evaluated. The continuous policy is a Gaussian with
a tanh mean and a state-independent log-std (its mean is the deterministic policy); the
discrete one a softmax over the dataset's action grid (its argmax)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxmarket.config.fields import Field
from jaxmarket.offline.algos.common import (
    ALGOS,
    MLP,
    Algo,
    AlgoDef,
    Critic,
    expectile_loss,
    polyak,
)

FIELDS = {
    "learning_rate": Field("float", 3e-4, low=0.0, low_open=True),
    "hidden": Field("ints", [256, 256], low=1),
    "gamma": Field("float", 0.99, low=0.0, high=1.0),
    "expectile": Field("float", 0.7, low=0.5, high=1.0, low_open=False),
    "beta": Field("float", 3.0, low=0.0),
    "tau": Field("float", 0.005, low=0.0, high=1.0, low_open=True),
}


class GaussianActor(nn.Module):
    hidden: tuple
    action_dim: int

    @nn.compact
    def __call__(self, obs):
        mean = jnp.tanh(MLP(self.hidden, self.action_dim)(obs))
        log_std = self.param("log_std", nn.initializers.constant(-1.0), (self.action_dim,))
        return mean, jnp.clip(log_std, -5.0, 2.0)


def make(norm, hyper, ds) -> Algo:
    discrete = ds.discrete
    hidden = tuple(hyper["hidden"])
    K = len(ds.meta["action_values"]) if discrete else 0
    values = jnp.asarray(ds.meta["action_values"], jnp.float32) if discrete else None
    critic = MLP(hidden, K) if discrete else Critic(hidden, 2)
    vnet = MLP(hidden, 1)
    actor = MLP(hidden, K) if discrete else GaussianActor(hidden, ds.action_dim)
    opt = optax.adam(hyper["learning_rate"])
    gamma, tau_e, beta, tau = hyper["gamma"], hyper["expectile"], hyper["beta"], hyper["tau"]

    def q_all(params, obs, batch):   # Q(s, a_data): [n, B] (discrete: one head)
        if discrete:
            q = critic.apply(params, obs)
            return jnp.take_along_axis(q, batch["action_index"][:, None], 1)[:, 0][None]
        return critic.apply(params, obs, batch["actions"])

    def init(key):
        kq, kv, kp = jax.random.split(key, 3)
        o = jnp.zeros((1, ds.obs_dim))
        q = critic.init(kq, o) if discrete else critic.init(kq, o, jnp.zeros((1, ds.action_dim)))
        v, p = vnet.init(kv, o), actor.init(kp, o)
        return {"q": q, "q_target": q, "v": v, "pi": p, "opt_q": opt.init(q),
                "opt_v": opt.init(v), "opt_pi": opt.init(p), "step": jnp.zeros((), jnp.int32)}

    def update(state, batch, key):
        del key
        q_t = q_all(state["q_target"], batch["obs"], batch).min(0)

        def v_loss(v):
            return expectile_loss(q_t - vnet.apply(v, batch["obs"])[:, 0], tau_e).mean()

        def q_loss(q):
            nv = vnet.apply(state["v"], batch["next_obs"])[:, 0]
            target = batch["rewards"] + gamma * (1.0 - batch["terminals"]) * nv
            return ((q_all(q, batch["obs"], batch) - target[None]) ** 2).mean()

        adv = q_t - vnet.apply(state["v"], batch["obs"])[:, 0]
        weight = jnp.minimum(jnp.exp(beta * adv), 100.0)

        def pi_loss(p):
            if discrete:
                logits = actor.apply(p, batch["obs"])
                logp = -optax.softmax_cross_entropy_with_integer_labels(logits, batch["action_index"])
            else:
                mean, log_std = actor.apply(p, batch["obs"])
                z = (batch["actions"] - mean) / jnp.exp(log_std)
                logp = (-0.5 * z ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
            return -(weight * logp).mean()

        out, metrics = dict(state), {}
        for name, fn in (("v", v_loss), ("q", q_loss), ("pi", pi_loss)):
            loss, g = jax.value_and_grad(fn)(state[name])
            upd, out[f"opt_{name}"] = opt.update(g, state[f"opt_{name}"], state[name])
            out[name] = optax.apply_updates(state[name], upd)
            metrics[f"{name}_loss"] = loss
        out["q_target"] = polyak(state["q_target"], out["q"], tau)
        out["step"] = state["step"] + 1
        return out, metrics

    def policy(state, obs):
        o = norm.obs(obs)
        if discrete:
            return values[jnp.argmax(actor.apply(state["pi"], o), -1)]
        return norm.from_unit(actor.apply(state["pi"], o)[0])

    def probs(state, obs):
        return jax.nn.softmax(actor.apply(state["pi"], norm.obs(obs)), -1)

    def q_value(state, obs, action):   # environment units in, reward units out
        o = norm.obs(obs)
        if discrete:
            q = critic.apply(state["q"], o)
            idx = jnp.argmin(((action[:, None, :] - values[None]) ** 2).sum(-1), 1)
            return jnp.take_along_axis(q, idx[:, None], 1)[:, 0] / norm.reward_scale
        return critic.apply(state["q"], o, norm.to_unit(action)).min(0) / norm.reward_scale

    return Algo("iql", init, update, policy, norm, hyper, discrete,
                probs if discrete else None, q_value, values)


ALGOS.register(AlgoDef("iql", make, FIELDS, "implicit Q-learning (continuous or discrete)"))
