"""Behaviour policies with known propensities: noise around a base policy's action.

* :func:`truncated_gaussian` -- continuous: ``a = mu + sigma z`` per product with ``z`` a
  standard normal truncated so that ``a`` stays within ``[low, high]``; the exact log
  density of the action taken is

      log pi_b(a | s) = sum_p [ log phi(z_p) - log sigma - log(Phi(beta_p) - Phi(alpha_p)) ]

  with ``alpha = (low - mu) / sigma``, ``beta = (high - mu) / sigma``.
* :func:`epsilon_grid` -- discrete: ``K`` evenly spaced actions ``v_k = low + k (high -
  low) / (K - 1)`` (all products move together); with probability ``1 - epsilon`` the grid
  point nearest the base action, otherwise one drawn uniformly, so

      pi_b(k | s) = (1 - epsilon) [k = k*(s)] + epsilon / K.

Both return ``(action, {"log_probs": [A], ...})`` for :func:`jaxmarket.offline.scenario.make_step`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr
from jax.scipy.stats import norm

from jaxmarket.config.errors import ConfigError


def truncated_gaussian(sigma: float, low: np.ndarray, high: np.ndarray):
    """Noise of standard deviation ``sigma`` (before truncation) around the base action;
    ``low``/``high`` are the ``[A, P]`` bounds of the slots."""
    if not sigma > 0:
        raise ConfigError("--noise", sigma, "a number > 0")
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError("--noise", sigma, "a group with finite action bounds")
    low, high = jnp.asarray(low), jnp.asarray(high)

    def wrap(obs, key, base, aux):
        del obs, aux
        mu = jnp.clip(base, low, high)
        alpha, beta = (low - mu) / sigma, (high - mu) / sigma
        z = jax.random.truncated_normal(key, alpha, beta, mu.shape, jnp.float32)
        action = jnp.clip(mu + sigma * z, low, high)
        log_prob = (norm.logpdf(z) - jnp.log(sigma) - log_mass(alpha, beta)).sum(-1)
        return action, {"log_probs": log_prob}

    return wrap


def log_mass(alpha: jax.Array, beta: jax.Array) -> jax.Array:
    """``log(Phi(beta) - Phi(alpha))``, stable in both tails."""
    # upper tail: Phi(b) - Phi(a) = Phi(-a) - Phi(-b); use whichever side is smaller
    flip = alpha > 0
    a, b = jnp.where(flip, -beta, alpha), jnp.where(flip, -alpha, beta)
    lb, la = log_ndtr(b), log_ndtr(a)
    return lb + jnp.log1p(-jnp.exp(jnp.minimum(la - lb, -1e-12)))


def grid_values(low: np.ndarray, high: np.ndarray, size: int) -> np.ndarray:
    """``[K, P]`` evenly spaced actions between one slot's bounds ``low``/``high [P]``."""
    frac = np.linspace(0.0, 1.0, size, dtype=np.float32)[:, None]
    return (np.asarray(low, np.float32)[None] + frac * (np.asarray(high, np.float32)
                                                         - np.asarray(low, np.float32))[None])


def epsilon_grid(size: int, epsilon: float, low: np.ndarray, high: np.ndarray):
    """Epsilon-greedy over ``size`` grid actions around the base action. Every slot must
    have the same bounds (one grid for the dataset)."""
    if not (isinstance(size, int) and size >= 2):
        raise ConfigError("--grid", size, "an integer >= 2")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError("--epsilon", epsilon, "a number in [0, 1]")
    low, high = np.asarray(low), np.asarray(high)
    if not (np.all(low == low[:1]) and np.all(high == high[:1])):
        raise ConfigError("--grid", size, "a group whose agents share the same action bounds")
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError("--grid", size, "a group with finite action bounds")
    values = grid_values(low[0], high[0], size)
    table = jnp.asarray(values)

    def wrap(obs, key, base, aux):
        del obs, aux
        greedy = jnp.argmin(((base[:, None, :] - table[None]) ** 2).sum(-1), axis=1)   # [A]
        k_explore, k_pick = jax.random.split(key)
        explore = jax.random.uniform(k_explore, greedy.shape) < epsilon
        index = jnp.where(explore, jax.random.randint(k_pick, greedy.shape, 0, size), greedy)
        prob = (1.0 - epsilon) * (index == greedy) + epsilon / size
        return table[index], {"log_probs": jnp.log(prob).astype(jnp.float32),
                              "action_index": index.astype(jnp.int32),
                              "greedy_index": greedy.astype(jnp.int32)}

    return wrap, values


__all__ = ["epsilon_grid", "grid_values", "log_mass", "truncated_gaussian"]
