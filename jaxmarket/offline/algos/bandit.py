"""One-step (contextual-bandit) learners for pricing logs: every row is a context ``x``
(the observation; empty for a plain bandit), an action and its reward.

* ``dm`` -- the direct method: a reward model ``r^(x, a)`` fitted by least squares
  (discrete: one output per grid action; continuous: ``(x, a)`` in, one output), and the
  greedy policy ``argmax_a r^(x, a)`` (continuous: over ``candidates`` evenly spaced
  actions between the bounds, all products moving together).
* ``dr`` -- a doubly-robust policy learner (discrete): the same reward model, and a
  softmax policy ``pi_theta(a | x)`` maximising the DR estimate of its value

      V_DR(theta) = mean_i [ sum_a pi_theta(a|x_i) r^(x_i, a)
                             + pi_theta(a_i|x_i) / mu_i (r_i - r^(x_i, a_i)) ]

  with ``mu_i = exp(log_probs_i)`` the logged propensities (required) and ``r^`` held
  fixed in the policy's gradient; an entropy bonus ``entropy`` keeps it from collapsing
  before the model is fitted. Its deterministic policy is the argmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.offline.algos.common import ALGOS, MLP, Algo, AlgoDef

DM_FIELDS = {
    "learning_rate": Field("float", 1e-3, low=0.0, low_open=True),
    "hidden": Field("ints", [64, 64], low=1),
    "candidates": Field("int", 101, low=2, doc="continuous: actions searched by the policy"),
}
DR_FIELDS = {
    "learning_rate": Field("float", 1e-3, low=0.0, low_open=True),
    "hidden": Field("ints", [64, 64], low=1),
    "entropy": Field("float", 1e-3, low=0.0),
}


def _reward_model(ds, hidden):
    discrete = ds.discrete
    K = len(ds.meta["action_values"]) if discrete else 1
    net = MLP(hidden, K)

    def predict_data(params, batch):   # r^(x_i, a_i)
        if discrete:
            out = net.apply(params, batch["obs"])
            return jnp.take_along_axis(out, batch["action_index"][:, None], 1)[:, 0]
        return net.apply(params, jnp.concatenate([batch["obs"], batch["actions"]], -1))[:, 0]

    def init(key):
        width = ds.obs_dim + (0 if discrete else ds.action_dim)
        return net.init(key, jnp.zeros((1, width)))

    return net, init, predict_data


def make_dm(norm, hyper, ds) -> Algo:
    discrete = ds.discrete
    net, init_model, predict_data = _reward_model(ds, tuple(hyper["hidden"]))
    opt = optax.adam(hyper["learning_rate"])
    values = jnp.asarray(ds.meta["action_values"], jnp.float32) if discrete else None
    cand = jnp.linspace(-1.0, 1.0, hyper["candidates"])[:, None] * jnp.ones((1, ds.action_dim))

    def init(key):
        p = init_model(key)
        return {"model": p, "opt": opt.init(p), "step": jnp.zeros((), jnp.int32)}

    def update(state, batch, key):
        del key
        loss, g = jax.value_and_grad(
            lambda p: ((predict_data(p, batch) - batch["rewards"]) ** 2).mean())(state["model"])
        upd, opt_state = opt.update(g, state["opt"], state["model"])
        return ({"model": optax.apply_updates(state["model"], upd), "opt": opt_state,
                 "step": state["step"] + 1}, {"model_loss": loss})

    def table(state, obs):   # r^(x, a) for every grid / candidate action: [B, K], reward units
        o = norm.obs(obs)
        if discrete:
            return net.apply(state["model"], o) / norm.reward_scale
        x = jnp.concatenate([jnp.repeat(o[:, None], cand.shape[0], 1),
                             jnp.broadcast_to(cand[None], (o.shape[0],) + cand.shape)], -1)
        return net.apply(state["model"], x)[..., 0] / norm.reward_scale

    def policy(state, obs):
        best = jnp.argmax(table(state, obs), -1)
        return values[best] if discrete else norm.from_unit(cand[best])

    def probs(state, obs):
        return jax.nn.one_hot(jnp.argmax(table(state, obs), -1), values.shape[0])

    def q_value(state, obs, action):
        if discrete:
            idx = jnp.argmin(((action[:, None, :] - values[None]) ** 2).sum(-1), 1)
            return jnp.take_along_axis(table(state, obs), idx[:, None], 1)[:, 0]
        x = jnp.concatenate([norm.obs(obs), norm.to_unit(action)], -1)
        return net.apply(state["model"], x)[:, 0] / norm.reward_scale

    return Algo("dm", init, update, policy, norm, hyper, discrete,
                probs if discrete else None, q_value, values, {"reward_table": table})


def make_dr(norm, hyper, ds) -> Algo:
    if not ds.discrete:
        raise ConfigError("--algo", "dr", "a discrete-action dataset (collect --grid K)")
    if np.isnan(np.asarray(ds["log_probs"])).any():
        raise ConfigError("--algo", "dr", "a dataset with behaviour log_probs on every row "
                          "(collect --grid K --epsilon E records them)")
    hidden = tuple(hyper["hidden"])
    model_net, init_model, predict_data = _reward_model(ds, hidden)
    values = jnp.asarray(ds.meta["action_values"], jnp.float32)
    K = values.shape[0]
    pi_net = MLP(hidden, K)
    opt = optax.adam(hyper["learning_rate"])

    def init(key):
        km, kp = jax.random.split(key)
        m, p = init_model(km), pi_net.init(kp, jnp.zeros((1, ds.obs_dim)))
        return {"model": m, "pi": p, "opt_model": opt.init(m), "opt_pi": opt.init(p),
                "step": jnp.zeros((), jnp.int32)}

    def update(state, batch, key):
        del key
        lm, gm = jax.value_and_grad(
            lambda p: ((predict_data(p, batch) - batch["rewards"]) ** 2).mean())(state["model"])
        upd, opt_m = opt.update(gm, state["opt_model"], state["model"])
        model = optax.apply_updates(state["model"], upd)
        r_hat = jax.lax.stop_gradient(model_net.apply(model, batch["obs"]))     # [B, K]
        r_data = jnp.take_along_axis(r_hat, batch["action_index"][:, None], 1)[:, 0]
        mu = jnp.exp(batch["log_probs"])

        def neg_value(p):
            pi = jax.nn.softmax(pi_net.apply(p, batch["obs"]), -1)
            pi_a = jnp.take_along_axis(pi, batch["action_index"][:, None], 1)[:, 0]
            v = (pi * r_hat).sum(-1) + pi_a / mu * (batch["rewards"] - r_data)
            ent = -(pi * jnp.log(pi + 1e-12)).sum(-1)
            return -(v + hyper["entropy"] * ent).mean()

        lp, gp = jax.value_and_grad(neg_value)(state["pi"])
        upd, opt_p = opt.update(gp, state["opt_pi"], state["pi"])
        return ({"model": model, "pi": optax.apply_updates(state["pi"], upd), "opt_model": opt_m,
                 "opt_pi": opt_p, "step": state["step"] + 1},
                {"model_loss": lm, "dr_value": -lp / norm.reward_scale})

    def probs(state, obs):
        return jax.nn.softmax(pi_net.apply(state["pi"], norm.obs(obs)), -1)

    def policy(state, obs):
        return values[jnp.argmax(pi_net.apply(state["pi"], norm.obs(obs)), -1)]

    def table(state, obs):
        return model_net.apply(state["model"], norm.obs(obs)) / norm.reward_scale

    return Algo("dr", init, update, policy, norm, hyper, True, probs, None, values,
                {"reward_table": table})


ALGOS.register(AlgoDef("dm", make_dm, DM_FIELDS, "direct-method reward model, greedy policy"))
ALGOS.register(AlgoDef("dr", make_dr, DR_FIELDS, "doubly-robust bandit policy (discrete, "
                       "needs propensities)"))
