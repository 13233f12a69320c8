"""TD3+BC (Fujimoto & Gu 2021), continuous actions::

    y    = r + gamma (1 - terminal) min_i Q'_i(s', clip(pi'(s') + clip(noise), -1, 1))
    L_Q  = E[(Q_i(s, a) - y)^2]
    L_pi = -lambda E[Q_1(s, pi(s))] + E[(pi(s) - a)^2],   lambda = bc_alpha / mean|Q_1(s, a)|

the actor and the targets updated every ``policy_delay`` critic steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.offline.algos.common import ALGOS, MLP, Algo, AlgoDef, Critic, polyak

FIELDS = {
    "learning_rate": Field("float", 3e-4, low=0.0, low_open=True),
    "hidden": Field("ints", [256, 256], low=1),
    "gamma": Field("float", 0.99, low=0.0, high=1.0),
    "tau": Field("float", 0.005, low=0.0, high=1.0, low_open=True),
    "bc_alpha": Field("float", 2.5, low=0.0),
    "policy_noise": Field("float", 0.2, low=0.0),
    "noise_clip": Field("float", 0.5, low=0.0),
    "policy_delay": Field("int", 2, low=1),
}


def make(norm, hyper, ds) -> Algo:
    if ds.discrete:
        raise ConfigError("--algo", "td3_bc", "a continuous-action dataset (this one is "
                          "discrete: use bc, cql, iql or dr)")
    hidden, P = tuple(hyper["hidden"]), ds.action_dim
    critic, actor = Critic(hidden, 2), MLP(hidden, P)
    opt = optax.adam(hyper["learning_rate"])
    gamma, tau = hyper["gamma"], hyper["tau"]

    def act(p, obs):
        return jnp.tanh(actor.apply(p, obs))

    def init(key):
        kq, kp = jax.random.split(key)
        o = jnp.zeros((1, ds.obs_dim))
        q, p = critic.init(kq, o, jnp.zeros((1, P))), actor.init(kp, o)
        return {"q": q, "q_target": q, "pi": p, "pi_target": p, "opt_q": opt.init(q),
                "opt_pi": opt.init(p), "step": jnp.zeros((), jnp.int32)}

    def update(state, batch, key):
        noise = jnp.clip(hyper["policy_noise"] * jax.random.normal(key, batch["actions"].shape),
                         -hyper["noise_clip"], hyper["noise_clip"])
        a2 = jnp.clip(act(state["pi_target"], batch["next_obs"]) + noise, -1.0, 1.0)
        q2 = critic.apply(state["q_target"], batch["next_obs"], a2).min(0)
        y = batch["rewards"] + gamma * (1.0 - batch["terminals"]) * q2

        def q_loss(q):
            return ((critic.apply(q, batch["obs"], batch["actions"]) - y[None]) ** 2).mean()

        lq, g = jax.value_and_grad(q_loss)(state["q"])
        upd, opt_q_state = opt.update(g, state["opt_q"], state["q"])
        q_new = optax.apply_updates(state["q"], upd)

        def pi_loss(p):
            a = act(p, batch["obs"])
            q = critic.apply(q_new, batch["obs"], a)[0]
            lam = hyper["bc_alpha"] / jax.lax.stop_gradient(jnp.abs(q).mean() + 1e-6)
            return -lam * q.mean() + ((a - batch["actions"]) ** 2).sum(-1).mean()

        def actor_step(_):
            lp, gp = jax.value_and_grad(pi_loss)(state["pi"])
            upd, opt_pi_state = opt.update(gp, state["opt_pi"], state["pi"])
            pi = optax.apply_updates(state["pi"], upd)
            # reported x policy_delay (0 on the other steps): its mean over a chunk is the
            # mean actor loss, and a NaN still shows
            return (pi, opt_pi_state, polyak(state["pi_target"], pi, tau),
                    polyak(state["q_target"], q_new, tau), lp * hyper["policy_delay"])

        def skip(_):
            return (state["pi"], state["opt_pi"], state["pi_target"], state["q_target"],
                    jnp.zeros((), jnp.float32))

        pi, opt_pi_state, pi_t, q_t, lp = jax.lax.cond(
            (state["step"] + 1) % hyper["policy_delay"] == 0, actor_step, skip, None)
        return ({"q": q_new, "q_target": q_t, "pi": pi, "pi_target": pi_t, "opt_q": opt_q_state,
                 "opt_pi": opt_pi_state, "step": state["step"] + 1},
                {"q_loss": lq, "pi_loss": lp})

    def policy(state, obs):
        return norm.from_unit(act(state["pi"], norm.obs(obs)))

    def q_value(state, obs, action):
        return critic.apply(state["q"], norm.obs(obs), norm.to_unit(action)).min(0) / norm.reward_scale

    return Algo("td3_bc", init, update, policy, norm, hyper, False, None, q_value, None)


ALGOS.register(AlgoDef("td3_bc", make, FIELDS, "TD3+BC (continuous)"))
