"""Off-policy estimators for bandit-shaped logs (one-step pricing logs).

Each logged row ``i`` has a context ``x_i``, an action ``a_i`` drawn from the behaviour
policy with known propensity ``mu_i = mu(a_i | x_i)``, and a reward ``r_i``. For a target
policy ``pi`` with importance weights ``w_i = pi(a_i | x_i) / mu_i`` and a reward model
``r^(x, a)``:

    IPS    V = (1/n) sum_i w_i r_i
    SNIPS  V = sum_i w_i r_i / sum_i w_i
    DM     V = (1/n) sum_i sum_a pi(a | x_i) r^(x_i, a)
    DR     V = DM + (1/n) sum_i w_i (r_i - r^(x_i, a_i))
    ESS      = (sum_i w_i)^2 / sum_i w_i^2          (effective sample size)

IPS and DR are unbiased when the propensities are right (DR also when only the reward
model is); SNIPS is consistent with lower variance; DM is biased by the model's error.
All are plain array expressions (jittable, ``vmap``-able over seeds).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.algos import make_algo
from jaxmarket.offline.fit import fit


def ope_estimates(rewards: jax.Array, behaviour_prob: jax.Array, target_probs: jax.Array,
                  action_index: jax.Array, reward_table: jax.Array | None = None) -> dict:
    """All estimators at once. ``target_probs`` and ``reward_table`` are ``[n, K]``
    (``pi(. | x_i)`` and ``r^(x_i, .)``); without a table only IPS, SNIPS and ESS."""
    rewards = jnp.asarray(rewards, jnp.float32)
    pi_a = jnp.take_along_axis(target_probs, action_index[:, None], 1)[:, 0]
    w = pi_a / behaviour_prob
    out = {"ips": (w * rewards).mean(),
           "snips": (w * rewards).sum() / jnp.maximum(w.sum(), 1e-30),
           "ess": w.sum() ** 2 / jnp.maximum((w ** 2).sum(), 1e-30)}
    if reward_table is not None:
        dm_rows = (target_probs * reward_table).sum(-1)
        r_hat_a = jnp.take_along_axis(reward_table, action_index[:, None], 1)[:, 0]
        out["dm"] = dm_rows.mean()
        out["dr"] = (dm_rows + w * (rewards - r_hat_a)).mean()
    return out


def bias_rmse(estimates: np.ndarray, truth: float) -> dict[str, float]:
    """Bias and RMSE of repeated estimates of a known value."""
    e = np.asarray(estimates, np.float64)
    return {"bias": float(e.mean() - truth), "rmse": float(np.sqrt(((e - truth) ** 2).mean()))}


class BanditOPE:
    """Evaluator: IPS, SNIPS, DM, DR and ESS of the algorithm's policy on a discrete
    dataset with logged propensities; the DM/DR reward model is a ``dm`` algorithm fitted
    once on the dataset (``model_steps`` updates, hyperparameters ``model``) unless
    ``reward_table(obs) -> [n, K]`` is given."""

    def __init__(self, dataset, reward_table: Any = None, model_steps: int = 2000, seed: int = 0,
                 model: dict | None = None):
        if not dataset.discrete:
            raise ConfigError("evaluator ope", "a continuous dataset",
                              "a discrete dataset with propensities (collect --grid K)")
        logp = np.asarray(dataset["log_probs"], np.float64)
        if np.isnan(logp).any():
            raise ConfigError("evaluator ope", "missing log_probs",
                              "behaviour log-probabilities on every row")
        self.obs = jnp.asarray(dataset["observations"], jnp.float32)
        self.rewards = jnp.asarray(dataset["rewards"], jnp.float32)
        self.mu = jnp.asarray(np.exp(logp), jnp.float32)
        self.index = jnp.asarray(dataset["action_index"], jnp.int32)
        if reward_table is None:
            dm = make_algo("dm", dataset, **(model or {}))
            state = fit(dm, dataset, stop=model_steps, chunk=model_steps, seed=seed).state
            reward_table = jax.jit(lambda o: dm.extras["reward_table"](state, o))
        self.table = jnp.asarray(reward_table(self.obs))
        self._cache: dict[int, Any] = {}

    def __call__(self, algo, state) -> dict[str, float]:
        if algo.probs is None:
            raise ConfigError("evaluator ope", algo.name, "an algorithm with action probabilities")
        fn = self._cache.get(id(algo))
        if fn is None:
            fn = jax.jit(lambda s: ope_estimates(self.rewards, self.mu, algo.probs(s, self.obs),
                                                 self.index, self.table))
            self._cache[id(algo)] = fn
        return {k: float(v) for k, v in fn(state).items()}


__all__ = ["BanditOPE", "bias_rmse", "ope_estimates"]
