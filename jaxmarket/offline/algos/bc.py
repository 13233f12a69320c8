"""Behaviour cloning: continuous ``min ||pi(s) - a||^2`` (tanh head in ``[-1, 1]``);
discrete ``min -log softmax(f(s))[a]``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxmarket.config.fields import Field
from jaxmarket.offline.algos.common import ALGOS, MLP, Algo, AlgoDef

FIELDS = {
    "learning_rate": Field("float", 3e-4, low=0.0, low_open=True),
    "hidden": Field("ints", [256, 256], low=1),
}


def make(norm, hyper, ds) -> Algo:
    discrete = ds.discrete
    values = jnp.asarray(ds.meta["action_values"], jnp.float32) if discrete else None
    out = len(ds.meta["action_values"]) if discrete else ds.action_dim
    net = MLP(tuple(hyper["hidden"]), out)
    opt = optax.adam(hyper["learning_rate"])

    def init(key):
        params = net.init(key, jnp.zeros((1, ds.obs_dim)))
        return {"params": params, "opt": opt.init(params), "step": jnp.zeros((), jnp.int32)}

    def loss_fn(params, batch):
        out = net.apply(params, batch["obs"])
        if discrete:
            return optax.softmax_cross_entropy_with_integer_labels(out, batch["action_index"]).mean()
        return ((jnp.tanh(out) - batch["actions"]) ** 2).sum(-1).mean()

    def update(state, batch, key):
        del key
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
        upd, opt_state = opt.update(grads, state["opt"], state["params"])
        return ({"params": optax.apply_updates(state["params"], upd), "opt": opt_state,
                 "step": state["step"] + 1}, {"loss": loss})

    def probs(state, obs):
        return jax.nn.softmax(net.apply(state["params"], norm.obs(obs)), -1)

    def policy(state, obs):
        out = net.apply(state["params"], norm.obs(obs))
        if discrete:
            return values[jnp.argmax(out, -1)]
        return norm.from_unit(jnp.tanh(out))

    return Algo("bc", init, update, policy, norm, hyper, discrete,
                probs if discrete else None, None, values)


ALGOS.register(AlgoDef("bc", make, FIELDS, "behaviour cloning (continuous or discrete)"))
