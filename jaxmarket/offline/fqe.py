"""Fitted Q evaluation (Le et al. 2019): the discounted value of a fixed policy ``pi``
from logged transitions alone.

    Q_{k+1} = argmin_Q E_D[(Q(s, a) - r - gamma (1 - terminal) E_{a' ~ pi(s')} Q_k(s', a'))^2]

by minibatch gradient steps on a network ``Q`` whose target copy ``Q_k`` is synced every
``target_every`` steps (continuous actions: ``a' = pi(s')``, a deterministic policy;
discrete: the expectation ``sum_b pi(b | s') Q_k(s', b)`` over the action grid). The
estimate is the mean of ``Q(s_0, pi(s_0))`` over the dataset's initial states (rows with
``step == 0``; every row if there are none). Timeouts are not terminal: a market that
is cut off still has a future, so the target bootstraps through them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.algos.common import MLP, device_data, infer_norm
from jaxmarket.offline.dataset import Dataset


def make_fqe(dataset: Dataset, gamma: float = 0.9, steps: int = 5000, batch_size: int = 256,
             hidden: tuple[int, ...] = (128, 128), learning_rate: float = 1e-3,
             target_every: int = 100):
    """``run(policy_fn, key) -> (estimate, metrics)`` (pure; ``policy_fn(obs) -> action``
    in environment units, or ``-> probs [B, K]`` for a discrete dataset)."""
    if not 0.0 <= gamma < 1.0:
        raise ConfigError("fqe.gamma", gamma, "a number in [0, 1)")
    for name, value in (("steps", steps), ("target_every", target_every),
                        ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"fqe.{name}", value, "an integer >= 1")
    norm = infer_norm(dataset)
    data = device_data(dataset, norm)
    discrete = dataset.discrete
    K = len(dataset.meta["action_values"]) if discrete else 0
    net = MLP(tuple(hidden), K if discrete else 1)
    opt = optax.adam(learning_rate)
    first = np.flatnonzero(np.asarray(dataset["step"]) == 0)
    s0 = jnp.asarray(dataset["observations"][first if first.size else slice(None)], jnp.float32)
    raw_next = jnp.asarray(dataset["next_observations"], jnp.float32)
    data = {**data, "raw_next": raw_next}

    def q(params, obs_n, act_unit_or_probs):
        if discrete:
            return (net.apply(params, obs_n) * act_unit_or_probs).sum(-1)
        return net.apply(params, jnp.concatenate([obs_n, act_unit_or_probs], -1))[:, 0]

    def target_input(policy, raw_obs):
        out = policy(raw_obs)
        return out if discrete else norm.to_unit(out)

    def run(policy: Callable, key: jax.Array):
        k_init, k_run = jax.random.split(key)
        width = dataset.obs_dim + (0 if discrete else dataset.action_dim)
        params = net.init(k_init, jnp.zeros((1, width)))
        # the policy's action at every next state, once (it does not change during FQE)
        next_in = jax.lax.stop_gradient(target_input(policy, data["raw_next"]))

        def step(carry, inp):
            params, target, opt_state = carry
            k, i = inp
            idx = jax.random.randint(k, (batch_size,), 0, data["rewards"].shape[0])
            b = jax.tree.map(lambda x: x[idx], data)
            y = b["rewards"] + gamma * (1.0 - b["terminals"]) * q(target, b["next_obs"], next_in[idx])
            taken = jax.nn.one_hot(b["action_index"], K) if discrete else b["actions"]

            def loss(p):
                return ((q(p, b["obs"], taken) - y) ** 2).mean()

            lv, g = jax.value_and_grad(loss)(params)
            upd, opt_state = opt.update(g, opt_state, params)
            params = optax.apply_updates(params, upd)
            target = jax.tree.map(lambda t, p: jnp.where((i + 1) % target_every == 0, p, t),
                                  target, params)
            return (params, target, opt_state), lv

        (params, _, _), losses = jax.lax.scan(
            step, (params, params, opt.init(params)),
            (jax.random.split(k_run, steps), jnp.arange(steps)))
        est = q(params, norm.obs(s0), target_input(policy, s0)).mean() / norm.reward_scale
        return est, {"loss": losses[-100:].mean()}

    return run


def fqe_value(dataset: Dataset, policy: Callable, gamma: float = 0.9, seed: int = 0,
              **kw: Any) -> float:
    """The FQE estimate of ``policy``'s discounted value (see the module docstring)."""
    run = make_fqe(dataset, gamma, **kw)
    est, _ = jax.jit(lambda k: run(policy, k))(jax.random.key(seed))
    return float(est)


class FQE:
    """Evaluator: FQE of the algorithm's current policy (discrete: its ``probs``)."""

    def __init__(self, dataset: Dataset, gamma: float = 0.9, seed: int = 0, **kw: Any):
        self._run = make_fqe(dataset, gamma, **kw)
        self.discrete = dataset.discrete
        self.key = jax.random.key(seed)
        self._cache: dict[int, Callable] = {}

    def __call__(self, algo, state) -> float:
        fn = self._cache.get(id(algo))
        if fn is None:
            pick = algo.probs if self.discrete else algo.policy
            if pick is None:
                raise ConfigError("evaluator fqe", algo.name, "an algorithm with action "
                                  "probabilities on a discrete dataset")
            fn = jax.jit(lambda s, k: self._run(lambda obs: pick(s, obs), k)[0])
            self._cache[id(algo)] = fn
        return float(fn(state, self.key))


__all__ = ["FQE", "fqe_value", "make_fqe"]
