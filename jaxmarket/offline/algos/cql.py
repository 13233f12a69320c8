"""Conservative Q-learning (Kumar et al. 2020), CQL(H), continuous and discrete.

Continuous (SAC backbone: tanh-Gaussian actor, twin critics, Polyak targets, fixed
entropy temperature ``alpha``)::

    y     = r + gamma (1 - terminal) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
    L_Q   = E[(Q_i(s, a) - y)^2]
            + cql_alpha E_s[ log sum_j exp(Q_i(s, a_j) - log q(a_j)) - Q_i(s, a) ]
    L_pi  = E[alpha log pi(a~|s) - min_i Q_i(s, a~)],   a~ ~ pi(s)

the ``a_j`` being ``num_samples`` uniform actions (``log q = -P log 2``) and as many
policy actions at ``s`` and ``s'`` (``log q = log pi``): the log-sum-exp pushes down the
value of actions the data does not support, the ``-Q(s, a)`` term keeps the data's up.

Discrete (double-DQN backbone over the dataset's action grid)::

    L_Q = E[(Q(s, a) - r - gamma (1 - terminal) Q'(s', argmax_b Q(s', b)))^2]
          + cql_alpha E[log sum_b exp Q(s, b) - Q(s, a)]
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxmarket.config.fields import Field
from jaxmarket.offline.algos.common import ALGOS, MLP, Algo, AlgoDef, Critic, polyak

FIELDS = {
    "learning_rate": Field("float", 3e-4, low=0.0, low_open=True),
    "actor_learning_rate": Field("float", 1e-4, low=0.0, low_open=True),
    "hidden": Field("ints", [256, 256], low=1),
    "gamma": Field("float", 0.99, low=0.0, high=1.0),
    "tau": Field("float", 0.005, low=0.0, high=1.0, low_open=True),
    "alpha": Field("float", 0.1, low=0.0, doc="entropy temperature (continuous)"),
    "cql_alpha": Field("float", 1.0, low=0.0, doc="weight of the conservative penalty"),
    "num_samples": Field("int", 10, low=1, doc="sampled actions per state (continuous)"),
}


class TanhGaussianActor(nn.Module):
    hidden: tuple
    action_dim: int

    @nn.compact
    def __call__(self, obs):
        out = MLP(self.hidden, 2 * self.action_dim)(obs)
        mean, log_std = jnp.split(out, 2, -1)
        return mean, jnp.clip(log_std, -5.0, 2.0)


def tanh_sample(mean, log_std, key):
    """``a = tanh(mean + std eps)`` and ``log pi(a)`` (change of variables)."""
    eps = jax.random.normal(key, mean.shape)
    pre = mean + jnp.exp(log_std) * eps
    logp = (-0.5 * eps ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
    logp = logp - (2.0 * (jnp.log(2.0) - pre - jax.nn.softplus(-2.0 * pre))).sum(-1)
    return jnp.tanh(pre), logp


def make(norm, hyper, ds) -> Algo:
    if ds.discrete:
        return make_discrete(norm, hyper, ds)
    hidden, P = tuple(hyper["hidden"]), ds.action_dim
    critic, actor = Critic(hidden, 2), TanhGaussianActor(hidden, P)
    opt_q, opt_pi = optax.adam(hyper["learning_rate"]), optax.adam(hyper["actor_learning_rate"])
    gamma, tau, alpha = hyper["gamma"], hyper["tau"], hyper["alpha"]
    cql_alpha, N = hyper["cql_alpha"], hyper["num_samples"]

    def init(key):
        kq, kp = jax.random.split(key)
        o = jnp.zeros((1, ds.obs_dim))
        q = critic.init(kq, o, jnp.zeros((1, P)))
        p = actor.init(kp, o)
        return {"q": q, "q_target": q, "pi": p, "opt_q": opt_q.init(q), "opt_pi": opt_pi.init(p),
                "step": jnp.zeros((), jnp.int32)}

    def sample(p, obs, key, n):   # n actions per state: [n, B, P], [n, B]
        mean, log_std = actor.apply(p, obs)
        keys = jax.random.split(key, n)
        return jax.vmap(lambda k: tanh_sample(mean, log_std, k))(keys)

    def q_many(q, obs, acts):     # acts [n, B, P] -> [2, n, B], one flat critic call
        n, B = acts.shape[:2]
        flat_obs = jnp.broadcast_to(obs[None], (n,) + obs.shape).reshape(n * B, -1)
        return critic.apply(q, flat_obs, acts.reshape(n * B, -1)).reshape(2, n, B)

    def update(state, batch, key):
        k_next, k_rand, k_cur, k_nxt, k_pi = jax.random.split(key, 5)
        B = batch["obs"].shape[0]
        a2, logp2 = sample(state["pi"], batch["next_obs"], k_next, 1)
        q2 = critic.apply(state["q_target"], batch["next_obs"], a2[0]).min(0)
        y = batch["rewards"] + gamma * (1.0 - batch["terminals"]) * (q2 - alpha * logp2[0])
        rand = jax.random.uniform(k_rand, (N, B, P), minval=-1.0, maxval=1.0)
        a_cur, lp_cur = sample(state["pi"], batch["obs"], k_cur, N)
        a_nxt, lp_nxt = sample(state["pi"], batch["next_obs"], k_nxt, N)
        a_cur, lp_cur, a_nxt, lp_nxt = jax.tree.map(jax.lax.stop_gradient,
                                                    (a_cur, lp_cur, a_nxt, lp_nxt))

        def q_loss(q):
            qd = critic.apply(q, batch["obs"], batch["actions"])                   # [2, B]
            td = ((qd - jax.lax.stop_gradient(y)[None]) ** 2).mean()
            acts = jnp.concatenate([rand, a_cur, a_nxt], 0)                       # [3N, B, P]
            correction = jnp.concatenate([jnp.full((N, B), -P * jnp.log(2.0)), lp_cur, lp_nxt])
            cat = q_many(q, batch["obs"], acts) - correction[None]                # [2, 3N, B]
            gap = jax.scipy.special.logsumexp(cat, axis=1) - qd
            return td + cql_alpha * gap.mean(), (td, gap.mean())

        (_, (td, gap)), g = jax.value_and_grad(q_loss, has_aux=True)(state["q"])
        upd, opt_q_state = opt_q.update(g, state["opt_q"], state["q"])
        q_new = optax.apply_updates(state["q"], upd)

        def pi_loss(p):
            a, logp = sample(p, batch["obs"], k_pi, 1)
            return (alpha * logp[0] - critic.apply(q_new, batch["obs"], a[0]).min(0)).mean()

        lp, gp = jax.value_and_grad(pi_loss)(state["pi"])
        upd, opt_pi_state = opt_pi.update(gp, state["opt_pi"], state["pi"])
        out = {"q": q_new, "q_target": polyak(state["q_target"], q_new, tau),
               "pi": optax.apply_updates(state["pi"], upd), "opt_q": opt_q_state,
               "opt_pi": opt_pi_state, "step": state["step"] + 1}
        return out, {"td_loss": td, "cql_gap": gap, "pi_loss": lp}

    def policy(state, obs):
        mean, _ = actor.apply(state["pi"], norm.obs(obs))
        return norm.from_unit(jnp.tanh(mean))

    def q_value(state, obs, action):
        return critic.apply(state["q"], norm.obs(obs), norm.to_unit(action)).min(0) / norm.reward_scale

    return Algo("cql", init, update, policy, norm, hyper, False, None, q_value, None)


def make_discrete(norm, hyper, ds) -> Algo:
    hidden = tuple(hyper["hidden"])
    values = jnp.asarray(ds.meta["action_values"], jnp.float32)
    net = MLP(hidden, values.shape[0])
    opt = optax.adam(hyper["learning_rate"])
    gamma, tau, cql_alpha = hyper["gamma"], hyper["tau"], hyper["cql_alpha"]

    def init(key):
        q = net.init(key, jnp.zeros((1, ds.obs_dim)))
        return {"q": q, "q_target": q, "opt_q": opt.init(q), "step": jnp.zeros((), jnp.int32)}

    def update(state, batch, key):
        del key
        best = jnp.argmax(net.apply(state["q"], batch["next_obs"]), -1)
        q2 = jnp.take_along_axis(net.apply(state["q_target"], batch["next_obs"]), best[:, None], 1)[:, 0]
        y = batch["rewards"] + gamma * (1.0 - batch["terminals"]) * q2

        def loss(q):
            qs = net.apply(q, batch["obs"])
            qa = jnp.take_along_axis(qs, batch["action_index"][:, None], 1)[:, 0]
            td = ((qa - y) ** 2).mean()
            gap = (jax.scipy.special.logsumexp(qs, -1) - qa).mean()
            return td + cql_alpha * gap, (td, gap)

        (_, (td, gap)), g = jax.value_and_grad(loss, has_aux=True)(state["q"])
        upd, opt_state = opt.update(g, state["opt_q"], state["q"])
        q_new = optax.apply_updates(state["q"], upd)
        return ({"q": q_new, "q_target": polyak(state["q_target"], q_new, tau), "opt_q": opt_state,
                 "step": state["step"] + 1}, {"td_loss": td, "cql_gap": gap})

    def probs(state, obs):
        q = net.apply(state["q"], norm.obs(obs))
        return jax.nn.one_hot(jnp.argmax(q, -1), values.shape[0])

    def policy(state, obs):
        return values[jnp.argmax(net.apply(state["q"], norm.obs(obs)), -1)]

    def q_value(state, obs, action):
        q = net.apply(state["q"], norm.obs(obs))
        idx = jnp.argmin(((action[:, None, :] - values[None]) ** 2).sum(-1), 1)
        return jnp.take_along_axis(q, idx[:, None], 1)[:, 0] / norm.reward_scale

    return Algo("cql", init, update, policy, norm, hyper, True, probs, q_value, values)


ALGOS.register(AlgoDef("cql", make, FIELDS, "conservative Q-learning (continuous or discrete)"))
