"""d3rlpy-style scorers over a (held-out) dataset, as evaluators ``fn(algo, state)``
returning a JAX scalar: jittable, so they also run inside ``fit``'s compiled chunk
(``graph_evaluators``):

* ``action_difference`` -- continuous: ``mean_i ||pi(s_i) - a_i||_2`` (environment units);
  discrete: the fraction of rows where the greedy action differs from the logged one.
* ``value_estimate``    -- ``mean_i Q(s_i, pi(s_i))`` over initial states (``step == 0``,
  else all rows), in reward units; algorithms with a critic only.
* ``td_error``          -- ``mean_i (Q(s_i, a_i) - r_i - gamma (1 - terminal_i)
  Q(s'_i, pi(s'_i)))^2``; algorithms with a critic only.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError


def _arrays(dataset, limit):
    n = min(len(dataset), limit)
    take = lambda k: jnp.asarray(np.asarray(dataset[k])[:n], jnp.float32)
    return {k: take(k) for k in ("observations", "actions", "rewards", "next_observations",
                                 "terminals")}, np.asarray(dataset["step"])[:n]


def action_difference(dataset, limit: int = 65536):
    d, _ = _arrays(dataset, limit)

    def score(algo, state):
        a = algo.policy(state, d["observations"])
        if algo.discrete:
            return jnp.mean(jnp.any(jnp.abs(a - d["actions"]) > 1e-6, -1))
        return jnp.mean(jnp.linalg.norm(a - d["actions"], axis=-1))

    return score


def value_estimate(dataset, limit: int = 65536):
    d, step = _arrays(dataset, limit)
    first = np.flatnonzero(step == 0)
    s0 = d["observations"][first] if first.size else d["observations"]

    def score(algo, state):
        if algo.q_value is None:
            raise ConfigError("evaluator value", algo.name, "an algorithm with a critic")
        return algo.q_value(state, s0, algo.policy(state, s0)).mean()

    return score


def td_error(dataset, gamma: float = 0.99, limit: int = 65536):
    d, _ = _arrays(dataset, limit)

    def score(algo, state):
        if algo.q_value is None:
            raise ConfigError("evaluator td", algo.name, "an algorithm with a critic")
        q = algo.q_value(state, d["observations"], d["actions"])
        nq = algo.q_value(state, d["next_observations"],
                          algo.policy(state, d["next_observations"]))
        y = d["rewards"] + gamma * (1.0 - d["terminals"]) * nq
        return jnp.mean((q - y) ** 2)

    return score


__all__ = ["action_difference", "td_error", "value_estimate"]
