"""What every offline algorithm shares: the :class:`Algo` protocol, normalisation
inferred from a dataset, small flax networks and device-side minibatch sampling.

An algorithm is five pure pieces (all jittable, no Python loop over a batch)::

    init(key) -> state
    update(state, batch, key) -> (state, metrics)      batch: normalised arrays [B, ...]
    policy(state, obs [B, D]) -> action [B, P]          deterministic, environment units
    probs(state, obs [B, D]) -> [B, K]                  discrete algorithms only
    q_value(state, obs, action) -> [B]                  where the algorithm has a critic

``Norm`` maps the dataset's units to what the networks see: observations standardised
(mean and std over the dataset), actions to ``[-1, 1]`` between the dataset's action
bounds, rewards multiplied by ``reward_scale`` (``1 / std(rewards)`` by default), so one
set of default hyperparameters fits markets whose profits are 0.01 or 100.

Every algorithm module registers an :class:`AlgoDef` in :data:`ALGOS` (the offline
algorithm kinds ``make_algo`` and ``--algo`` accept), as ``ALGOS.register(AlgoDef(...))``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.config.registry import Registry
from jaxmarket.offline.dataset import Dataset


@struct.dataclass
class Norm:
    obs_mean: jax.Array
    obs_std: jax.Array
    act_low: jax.Array
    act_high: jax.Array
    reward_scale: jax.Array   # scalar float32 (an array: folds of a grid search differ)

    def obs(self, x):
        return (x - self.obs_mean) / self.obs_std

    def to_unit(self, a):
        span = self.act_high - self.act_low
        return jnp.where(span > 0, 2.0 * (a - self.act_low) / jnp.where(span > 0, span, 1.0) - 1.0,
                         0.0)

    def from_unit(self, u):
        return self.act_low + (jnp.clip(u, -1.0, 1.0) + 1.0) * 0.5 * (self.act_high - self.act_low)


def infer_norm(ds: Dataset, normalize_obs: bool = True, reward_scale: float | None = None) -> Norm:
    """Observation statistics, action bounds and reward scale from the dataset."""
    obs = np.asarray(ds["observations"], np.float64)
    mean = obs.mean(0) if normalize_obs and len(obs) else np.zeros(obs.shape[1])
    std = obs.std(0) if normalize_obs and len(obs) else np.ones(obs.shape[1])
    std = np.where(std > 1e-6, std, 1.0)
    low = np.asarray(ds.meta.get("action_low", np.min(ds["actions"], 0)), np.float32).reshape(-1)
    high = np.asarray(ds.meta.get("action_high", np.max(ds["actions"], 0)), np.float32).reshape(-1)
    if reward_scale is None:
        sd = float(np.std(np.asarray(ds["rewards"], np.float64)))
        reward_scale = 1.0 / sd if sd > 1e-8 else 1.0
    return Norm(jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32),
                jnp.asarray(low), jnp.asarray(high), jnp.asarray(reward_scale, jnp.float32))


def raw_data(ds: Dataset) -> dict[str, jax.Array]:
    """The dataset's training fields as device arrays, in dataset units."""
    d = {"obs": jnp.asarray(ds["observations"], jnp.float32),
         "next_obs": jnp.asarray(ds["next_observations"], jnp.float32),
         "actions": jnp.asarray(ds["actions"], jnp.float32),
         "rewards": jnp.asarray(ds["rewards"], jnp.float32),
         "terminals": jnp.asarray(ds["terminals"], jnp.float32),
         "log_probs": jnp.asarray(ds["log_probs"], jnp.float32)}
    if ds.discrete:
        d["action_index"] = jnp.asarray(ds["action_index"], jnp.int32)
    return d


def normalise(raw: dict[str, jax.Array], norm: Norm) -> dict[str, jax.Array]:
    """:func:`raw_data` rows -> what the networks see (elementwise, so normalising
    rows before or after a gather gives the same numbers)."""
    return {**raw, "obs": norm.obs(raw["obs"]), "next_obs": norm.obs(raw["next_obs"]),
            "actions": norm.to_unit(raw["actions"]), "rewards": raw["rewards"] * norm.reward_scale}


def device_data(ds: Dataset, norm: Norm) -> dict[str, jax.Array]:
    """The dataset as normalised device arrays (what minibatches are drawn from)."""
    return normalise(raw_data(ds), norm)


def sample_batch(key: jax.Array, data: dict, batch_size: int) -> dict:
    """``batch_size`` rows drawn uniformly with replacement, on device."""
    n = jax.tree.leaves(data)[0].shape[0]
    idx = jax.random.randint(key, (batch_size,), 0, n)
    return jax.tree.map(lambda x: x[idx], data)


class MLP(nn.Module):
    hidden: Sequence[int]
    out: int

    @nn.compact
    def __call__(self, x):
        if x.shape[-1] == 0:   # no observation (a bandit): one constant input feature
            x = jnp.ones(x.shape[:-1] + (1,), x.dtype)
        for h in self.hidden:
            x = nn.relu(nn.Dense(h)(x))
        return nn.Dense(self.out)(x)


class Critic(nn.Module):
    """``n`` independent Q(s, a) heads (ensembled with ``nn.vmap``): ``[n, B]``."""
    hidden: Sequence[int]
    n: int = 2

    @nn.compact
    def __call__(self, obs, action):
        ens = nn.vmap(MLP, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=None, out_axes=0, axis_size=self.n)
        return ens(self.hidden, 1)(jnp.concatenate([obs, action], -1))[..., 0]


class Algo(NamedTuple):
    name: str
    init: Callable
    update: Callable
    policy: Callable
    norm: Norm
    hyper: dict
    discrete: bool = False
    probs: Callable | None = None
    q_value: Callable | None = None
    action_values: Any = None     # [K, P] for discrete algorithms
    extras: Any = None            # e.g. {"reward_table": fn(state, obs) -> [B, K]}


@dataclasses.dataclass(frozen=True)
class AlgoDef:
    """One offline algorithm kind: ``make(norm, hyper, dataset) -> Algo``, its
    hyperparameter ``Field``s (besides the common ones) and a one-line description."""

    kind: str
    make: Callable
    fields: dict
    doc: str


ALGOS: Registry[AlgoDef] = Registry("offline algorithm")


def polyak(target: Any, online: Any, tau: float) -> Any:
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def expectile_loss(diff: jax.Array, tau: float) -> jax.Array:
    weight = jnp.where(diff > 0, tau, 1.0 - tau)
    return weight * diff ** 2


__all__ = [
    "ALGOS",
    "MLP",
    "Algo",
    "AlgoDef",
    "Critic",
    "Norm",
    "device_data",
    "expectile_loss",
    "infer_norm",
    "polyak",
    "sample_batch",
]
