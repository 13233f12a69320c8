"""Gaussian-policy bandits over continuous actions (prices or multipliers).

Kinds: ``vpg_bandit``, ``ppo_bandit`` and ``rolling_ppo_bandit``.

Policy. Each policy holds, per product ``p``, a mean ``mu_p`` and a log-stddev
``log_sigma_p`` (parameters stacked ``[num_policies, P]``; slot ``a`` uses policy
``policy_index[a]``). ``act`` draws ``z_p ~ Normal(mu_p, sigma_p)`` independently per
product and returns

    action_p = clip(z_p, low_p, high_p)           (scaled: false)
    action_p = clip(exp(z_p), low_p, high_p)      (scaled: true, a log-space Gaussian)

together with ``aux = {"sample": z [A, P], "log_prob": sum_p log N(z_p; mu_p, sigma_p) [A]}``.
The log-probability is the behaviour log-probability of the exact pre-clip sample that
produced the returned action (clipping and ``exp`` do not depend on the parameters, so
their Jacobian drops out of every gradient and ratio below). With ``scaled`` the mean,
its bounds and the stddev live in log-action space.

Buffer. Per slot the learner keeps the last samples ``(z, log_prob_old, reward)`` of the
transitions passed to ``update`` -- and only those: ``act`` never writes to the state, so
an environment reset's action (which never went through ``act``/``update``) cannot enter
it. When every policy drives one seller position of every market of its session (the
training loop's layout for independent sellers) and the buffer is not a rolling window,
the samples are stored per policy, as ``d = z - c`` and ``d**2`` about a centre ``c`` (the
policy's mean when the buffer's first sample was written): the update's log-probabilities
are then one matrix-vector product per policy (see ``features_coef``), the same
numbers to float rounding. ``update`` consumes a time-major batch step by step
(``lax.scan`` over ``T``):

* ``vpg_bandit`` / ``ppo_bandit``: append; once ``buffer_length`` samples are stored,
  update on the whole buffer and clear it.
* ``rolling_ppo_bandit``: the buffer is a FIFO window of the last ``buffer_length``
  samples; after every appended step the policy is updated on the whole window (while
  it fills, on the samples stored so far).

Update. With ``n`` the samples in a slot's buffer, the advantage is the reward
standardised within that slot's buffer,

    adv_i = (r_i - mean(r)) / (std(r) + 1e-8)        (population std over the buffer),

``logp_i = sum_p log N(z_ip; mu_p, sigma_p)`` under the current parameters, and per slot

    VPG:  L = -mean_i(adv_i * logp_i)
    PPO:  L = -mean_i(min(rho_i * adv_i, clip(rho_i, 1 - eps, 1 + eps) * adv_i)),
          rho_i = exp(logp_i - logp_old_i)            (logp_old stored from ``act``)
    both: L += -entropy_coef * sum_p (log sigma_p + 0.5 log(2 pi e))
              + pullback_coef * sum_p (mu_p - initial_mean_p)^2

The per-slot losses are averaged over the slots of each policy and summed over policies;
one optax step (``adam`` or ``sgd``, ``learning_rate``) is taken per update for VPG and
``update_epochs`` full-buffer steps for PPO. After each step the parameters are projected:
``mu`` is clipped to ``[mean_low, mean_high]`` (a non-finite mean is reset to
``initial_mean``); a stddev that is non-finite or below ``stddev_low`` is reset to
``stddev_fallback`` when given (exactly that value, independent of ``pullback_coef``),
otherwise raised to ``stddev_low`` (non-finite: reset to ``initial_stddev``); finally
``sigma <= stddev_high``.

Defaults. ``initial_mean``: the middle of the action bounds (scaled: ``log`` of it);
``initial_stddev``: a quarter of the action range (scaled: 0.5); ``mean_low``/``mean_high``:
the action bounds (scaled: their logs, the lower bound floored at ``1e-6 * max(high, 1)``).
The defaults need finite action bounds; give the values explicitly otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.learners.base import (
    LEARNERS,
    Learner,
    LearnerDef,
    LearnerSpec,
    SlotLayout,
    StaticArray,
    Transition,
    materialize,
)
from jaxmarket.learners.fixed import bounds, entity_per_policy, resolve_hyper

_LOG_2PI = math.log(2.0 * math.pi)
_ADV_EPS = 1e-8


def _common_fields(buffer_length: int, learning_rate: float) -> dict[str, Field]:
    return {
        "learning_rate": Field(kind="float", default=learning_rate, low=0.0, low_open=True),
        "optimizer": Field(kind="choice", default="adam", choices=("adam", "sgd")),
        "buffer_length": Field(kind="int", default=buffer_length, low=1,
                               doc="samples per slot kept; the update uses the whole buffer"),
        "initial_mean": Field(kind="entity", default=None, optional=True,
                              doc="initial policy mean (log-space when scaled)"),
        "initial_stddev": Field(kind="entity", default=None, optional=True, low=0.0,
                                low_open=True, doc="initial policy stddev"),
        "mean_low": Field(kind="entity", default=None, optional=True,
                          doc="lower bound on the mean (default: action_low)"),
        "mean_high": Field(kind="entity", default=None, optional=True,
                           doc="upper bound on the mean (default: action_high)"),
        "stddev_low": Field(kind="float", default=1e-3, low=0.0, low_open=True),
        "stddev_high": Field(kind="float", default=None, optional=True, low=0.0,
                             low_open=True),
        "stddev_fallback": Field(kind="float", default=None, optional=True, low=0.0,
                                 low_open=True,
                                 doc="stddev to reset to when it collapses or is non-finite"),
        "scaled": Field(kind="bool", default=False, doc="log-space Gaussian: action = exp(z)"),
        "entropy_coef": Field(kind="float", default=0.0, low=0.0),
        "pullback_coef": Field(kind="float", default=0.0, low=0.0,
                               doc="weight of (mean - initial_mean)^2 in the loss"),
    }


_PPO_EXTRA = {
    "clip_eps": Field(kind="float", default=0.2, low=0.0, low_open=True, high=1.0),
    "update_epochs": Field(kind="int", default=4, low=1),
}

VPG_FIELDS = _common_fields(buffer_length=32, learning_rate=0.005)
PPO_FIELDS = {**_common_fields(buffer_length=32, learning_rate=0.005), **_PPO_EXTRA}
ROLLING_PPO_FIELDS = {**_common_fields(buffer_length=64, learning_rate=0.002), **_PPO_EXTRA}


@struct.dataclass
class GaussianBanditState:
    params: dict            # {"mean": [N, P], "log_std": [N, P]}  (N = num_policies)
    opt_state: Any
    initial_mean: jax.Array  # [N, P] pull-back target and reset value
    buf_sample: jax.Array   # [L, A, P] pre-clip samples z; with one policy per seller
                            # position (``features``): [N, L, M, 2P], (d, d**2), d = z - centre
    buf_logp: jax.Array     # [L, A] behaviour log-probabilities from ``act`` ([N, L, M])
    buf_reward: jax.Array   # [L, A] ([N, L, M])
    count: jax.Array        # () int32: valid samples in the buffer (same for every slot)
    steps: jax.Array        # () int32: transitions received so far
    updates: jax.Array      # () int32: parameter updates performed so far
    # per-policy hyperparameters {name: [N] float32} (PBT mutates them in-graph, so a new
    # value never recompiles): learning_rate, entropy_coef, pullback_coef (+ clip_eps)
    hyper: Any = None
    # [N, P]: the policies' means when the buffer's first sample was written (the centre
    # of the feature buffer); None for the other layouts
    centre: Any = None
    # the feature buffer's (field, policy axis, market axis, row axis): how --devices
    # splits arrays stored per policy (jaxmarket.train.devices.runner_shardings); static
    market_axes: Any = struct.field(pytree_node=False, default=None)


def normal_log_prob(x: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """Elementwise ``log N(x; mean, exp(log_std))``."""
    return -0.5 * jnp.square((x - mean) * jnp.exp(-log_std)) - log_std - 0.5 * _LOG_2PI


@jax.custom_vjp
def centred_log_prob(d: jax.Array, d2: jax.Array, delta: jax.Array,
                     log_std: jax.Array) -> jax.Array:
    """``sum_p log N(x_p; mean_p, exp(log_std_p))`` over the last axis, from the samples
    centred once per update: ``d = x - c`` and ``d2 = d**2`` (``c`` a fixed centre, the
    mean when the update started) with ``delta = mean - c``::

        sum_p log N = -1/2 sum_p w_p (d2 - 2 d delta_p + delta_p**2) - sum_p log_std_p
                      - P/2 log(2 pi),       w = exp(-2 log_std)

    ``delta``/``log_std`` broadcast against ``d``. The gradient is written out as sums over
    the axes they broadcast along (one pass of multiply-adds over the buffer per sum,
    where autodiff of the elementwise form made XLA:CPU write several buffer-sized
    temporaries): ``d/d delta = w (sum g d - delta sum g)`` and ``d/d log_std =
    w (sum g d2 - 2 delta sum g d + delta**2 sum g) - sum g`` for the cotangent ``g``.
    Centring keeps the expansion exact to float rounding: ``d - delta`` is a deviation
    from the current mean, not a difference of two large numbers."""
    w = jnp.exp(-2.0 * log_std)
    q = (d2 * w - 2.0 * d * (delta * w)).sum(-1) + (jnp.square(delta) * w).sum(-1)
    return -0.5 * q - log_std.sum(-1) - 0.5 * _LOG_2PI * d.shape[-1]


def _centred_fwd(d, d2, delta, log_std):
    return centred_log_prob(d, d2, delta, log_std), (d, d2, delta, log_std)


def _centred_bwd(res, g):
    d, d2, delta, log_std = res
    shape = jnp.broadcast_shapes(delta.shape, log_std.shape)
    lead = d.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape[:-1])
                                      if n == 1 and d.shape[lead + i] != 1)
    gx = g[..., None]

    def total(x):
        return x.sum(axes).reshape(shape[:-1] + x.shape[-1:])

    sg, sgd, sgd2 = total(gx), total(gx * d), total(gx * d2)
    w = jnp.exp(-2.0 * log_std)
    d_delta = w * (sgd - delta * sg)
    d_log_std = w * (sgd2 - 2.0 * delta * sgd + jnp.square(delta) * sg) - sg
    return (jnp.zeros_like(d), jnp.zeros_like(d2), _unbroadcast(d_delta, delta.shape),
            _unbroadcast(d_log_std, log_std.shape))


def _unbroadcast(x: jax.Array, shape: tuple) -> jax.Array:
    """``x`` (of the broadcast shape) summed over the axes along which an input of
    ``shape`` was broadcast: that input's cotangent."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axes).reshape(shape)


centred_log_prob.defvjp(_centred_fwd, _centred_bwd)


def standardised(reward: jax.Array, mask: jax.Array, axis: int = 0) -> jax.Array:
    """``(r - mean) / (std + 1e-8)`` over the valid (``mask``) entries of ``axis``; zero
    where invalid. ``reward``: ``[L, A]`` (``axis`` 0) or ``[N, L, M]`` (``axis`` 1);
    ``mask`` has the whole ``axis`` and broadcasts against ``reward``."""
    n = jnp.maximum(mask.sum(axis, keepdims=True), 1.0)
    mean = (reward * mask).sum(axis, keepdims=True) / n
    var = (jnp.square(reward - mean) * mask).sum(axis, keepdims=True) / n
    return mask * (reward - mean) / (jnp.sqrt(var) + _ADV_EPS)


@dataclass(frozen=True)
class GaussianBanditSettings:
    """A Gaussian bandit's resolved settings (static): what ``init``, ``act`` and
    ``update`` read, validated by :func:`gaussian_bandit_settings`."""

    kind: str
    algo: str                       # "vpg" | "ppo"
    rolling: bool                   # a FIFO window updated after every step
    num_agents: int                 # A
    num_products: int               # P
    num_policies: int               # N
    length: int                     # buffer_length L
    scaled: bool                    # log-space Gaussian: action = exp(z)
    optimizer: str                  # "adam" | "sgd"
    epochs: int                     # optimiser steps per update
    hyper: tuple[tuple[str, float], ...]   # initial per-policy hyper-parameters
    init_mean: StaticArray          # [N, P] float32
    init_log_std: StaticArray       # [N, P] float32
    mean_low: StaticArray           # [N, P] bounds of the mean
    mean_high: StaticArray
    std_low: float
    std_high: float                 # inf: no upper bound
    fallback: float | None          # stddev_fallback
    low: StaticArray                # [A, P] float32 action bounds
    high: StaticArray
    slot_weight: StaticArray        # [A] float32: 1 / (slots of the slot's policy)
    layout: SlotLayout              # slots [A] as [S, M, n]; parameters broadcast over M
    # one policy per (session, agent position), the layout of independent sellers (and
    # not a rolling window, whose policy moves between its samples): the buffer holds
    # each policy's samples together, as features whose products with the parameters
    # give the log-probabilities (``features_coef``)
    features: bool

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape of ``buf_logp`` and ``buf_reward``."""
        _, M, _ = self.layout.shape
        return (self.num_policies, self.length, M) if self.features \
            else (self.length, self.num_agents)


def _opt(settings: GaussianBanditSettings) -> optax.GradientTransformation:
    # unit step size: the per-policy learning rate (state.hyper) scales the update,
    # ``lr * (-u)``, bit for bit what ``optax.adam(lr)`` computes as ``u * -lr``
    return (optax.adam if settings.optimizer == "adam" else optax.sgd)(1.0)


def init(settings: GaussianBanditSettings, key, spec=None) -> GaussianBanditState:
    del key, spec
    init_mean = settings.init_mean.array
    P, features = settings.num_products, settings.features
    _, M, _ = settings.layout.shape
    # fresh arrays (jnp.array copies): a donated state must not delete constants
    params = {"mean": jnp.array(init_mean), "log_std": jnp.array(settings.init_log_std.array)}
    return GaussianBanditState(
        params=params,
        opt_state=_opt(settings).init(params),
        initial_mean=jnp.asarray(init_mean),
        buf_sample=jnp.zeros(
            (settings.num_policies, settings.length, M, 2 * P) if features
            else (settings.length, settings.num_agents, P), jnp.float32),
        buf_logp=jnp.zeros(settings.row_shape, jnp.float32),
        buf_reward=jnp.zeros(settings.row_shape, jnp.float32),
        count=jnp.zeros((), jnp.int32),
        steps=jnp.zeros((), jnp.int32),
        updates=jnp.zeros((), jnp.int32),
        hyper={name: jnp.full((settings.num_policies,), value, jnp.float32)
               for name, value in settings.hyper},
        centre=jnp.array(init_mean) if features else None,
        market_axes=(("buf_sample", 0, 2, 1), ("buf_logp", 0, 2, 1),
                     ("buf_reward", 0, 2, 1)) if features else None,
    )


def act(settings: GaussianBanditSettings, state: GaussianBanditState, obs, key):
    del obs
    layout = settings.layout
    mean = layout.params(state.params["mean"])               # [S, 1, n, P]
    log_std = layout.params(state.params["log_std"])
    noise = jax.random.normal(key, layout.shape + (settings.num_products,), mean.dtype)
    # computed once: it feeds the log-prob, the action and the buffer write
    z = materialize(mean + jnp.exp(log_std) * noise)        # [S, M, n, P]
    log_prob = layout.merge(normal_log_prob(z, mean, log_std).sum(-1))   # [A]
    z = layout.merge(z)                                      # [A, P]
    value = jnp.exp(z) if settings.scaled else z
    action = jnp.clip(value, jnp.asarray(settings.low.array), jnp.asarray(settings.high.array))
    return action, {"sample": z, "log_prob": log_prob}


def slot_hyper(settings: GaussianBanditSettings, state: GaussianBanditState, name: str):
    """A per-policy hyper-parameter ``[N]`` -> per slot ``[A]``."""
    return settings.layout.view(state.hyper[name][:, None])[:, 0]


def centred(settings: GaussianBanditSettings, state: GaussianBanditState):
    """The buffer's samples about the update's starting mean: ``d``, ``d**2``
    (``[L, S, M, n, P]``, computed once per update, read by every epoch)."""
    layout = settings.layout
    d = layout.split(state.buf_sample, axis=1) - layout.params(state.params["mean"])
    return d, jnp.square(d)


def slots_loss(settings: GaussianBanditSettings, params, state: GaussianBanditState,
               mask, d, d2):
    """The loss of the per-slot buffer ``[L, A, P]`` (module docstring)."""
    layout = settings.layout
    delta = layout.params(params["mean"] - jax.lax.stop_gradient(state.params["mean"]))
    log_std = layout.params(params["log_std"])                # [S, 1, n, P]
    logp = layout.merge(centred_log_prob(d, d2, delta, log_std), axis=1)   # [L, A]
    mean, log_std = layout.view(params["mean"]), layout.view(params["log_std"])
    adv = standardised(state.buf_reward, mask)
    n = jnp.maximum(mask.sum(0), 1.0)
    if settings.algo == "vpg":
        surrogate = adv * logp
    else:
        ratio = jnp.exp(logp - state.buf_logp)
        clip_eps = slot_hyper(settings, state, "clip_eps")
        surrogate = jnp.minimum(ratio * adv,
                                jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    pg = -(surrogate * mask).sum(0) / n                       # [A]
    entropy = (log_std + 0.5 * (_LOG_2PI + 1.0)).sum(-1)      # [A]
    pull = jnp.square(mean - layout.view(state.initial_mean)).sum(-1)   # [A]
    per_slot = (pg - slot_hyper(settings, state, "entropy_coef") * entropy
                + slot_hyper(settings, state, "pullback_coef") * pull)
    return (jnp.asarray(settings.slot_weight.array) * per_slot).sum()


def project(settings: GaussianBanditSettings, params, initial_mean):
    """The parameters after a step, projected onto the allowed means and stddevs."""
    mean = params["mean"]
    mean_low = jnp.asarray(settings.mean_low.array, jnp.float32)
    mean_high = jnp.asarray(settings.mean_high.array, jnp.float32)
    mean = jnp.where(jnp.isfinite(mean), jnp.clip(mean, mean_low, mean_high), initial_mean)
    std = jnp.exp(params["log_std"])
    std_low, fallback = settings.std_low, settings.fallback
    bad = ~jnp.isfinite(std) | (std < std_low)
    if fallback is not None:
        std = jnp.where(bad, jnp.float32(fallback), std)
    else:
        std = jnp.where(jnp.isfinite(std), jnp.maximum(std, std_low),
                        jnp.exp(jnp.asarray(settings.init_log_std.array)))
    std = jnp.minimum(std, settings.std_high)
    return {"mean": mean, "log_std": jnp.log(std)}


def update_slots(settings: GaussianBanditSettings, state: GaussianBanditState):
    """One update on the per-slot buffer ``[L, A, P]``."""
    length = settings.length
    mask = (jnp.arange(length) < state.count).astype(jnp.float32)[:, None]
    mask = jnp.broadcast_to(mask, (length, settings.num_agents))
    d, d2 = centred(settings, state)
    return optimise(settings, state, jax.value_and_grad(
        lambda params: slots_loss(settings, params, state, mask, d, d2)))


def policy_rows(settings: GaussianBanditSettings, x):
    """One step's per-slot ``[A]`` -> ``[N, 1, M]``: each policy's slots together
    (policy ``s n + j`` drives the slots ``(s, m, j)`` of every market ``m``)."""
    _, M, _ = settings.layout.shape
    return jnp.swapaxes(settings.layout.split(x), 1, 2).reshape((settings.num_policies, 1, M))


def features_row(settings: GaussianBanditSettings, sample, centre):
    """One step's samples ``[A, P]`` -> ``[N, 1, M, 2P]``: ``(d, d**2)`` with
    ``d = z - centre`` of each policy, policy-major (written into the buffer at
    every step, where the transpose is of one step's samples, in cache)."""
    S, M, n = settings.layout.shape
    P = settings.num_products
    d = settings.layout.split(sample) - centre.reshape(S, 1, n, P)   # [S, M, n, P]
    f = jnp.concatenate([d, jnp.square(d)], axis=-1)                # [S, M, n, 2P]
    return jnp.swapaxes(f, 1, 2).reshape((settings.num_policies, 1, M, 2 * P))


def features_coef(settings: GaussianBanditSettings, params, centre):
    """The log-probability's coefficients: ``sum_p log N(z_p; mean_p,
    exp(log_std_p)) = F . coef + const`` for ``F = (d, d**2)``, ``d = z - centre``.
    With ``delta = mean - centre`` and ``w = exp(-2 log_std)``,

        coef = [w delta, -w/2]                                   [N, 2P]
        const = -sum_p (w delta**2 / 2 + log_std) - P/2 log(2 pi)   [N]

    so the log-probabilities of a policy's samples are one matrix-vector product,
    and the gradient's sums over them another (``F^T g``). (The same sums written
    elementwise took XLA:CPU ~4x as long.) The centre keeps the expansion exact to
    float rounding: ``d`` is a deviation from the mean, not a difference of two
    large numbers."""
    delta = params["mean"] - centre                                       # [N, P]
    w = jnp.exp(-2.0 * params["log_std"])
    coef = jnp.concatenate([w * delta, -0.5 * w], axis=1)                 # [N, 2P]
    const = -(0.5 * w * jnp.square(delta) + params["log_std"]).sum(1) \
        - 0.5 * _LOG_2PI * settings.num_products                          # [N]
    return coef, const


def _regulariser(state: GaussianBanditState, params):
    entropy = (params["log_std"] + 0.5 * (_LOG_2PI + 1.0)).sum(1)
    pull = jnp.square(params["mean"] - state.initial_mean).sum(1)
    return (-state.hyper["entropy_coef"] * entropy
            + state.hyper["pullback_coef"] * pull).sum()


def features_value_and_grad(settings: GaussianBanditSettings, state: GaussianBanditState,
                            F, adv, weight, params):
    """The loss of :func:`update_slots` and its gradient on the feature buffer
    (``F [N, K, 2P]``), the sum over samples written as ``F^T g`` with ``g`` = d loss /
    d log-probability: ``-weight adv`` (VPG) and ``-weight adv ratio`` where the clipped
    objective follows the ratio, else 0 (PPO)."""
    highest = jax.lax.Precision.HIGHEST
    N, K = settings.num_policies, F.shape[1]
    (coef, const), coef_grad = jax.vjp(
        lambda p: features_coef(settings, p, state.centre), params)
    logp = (jnp.einsum("nkf,nf->nk", F, coef, precision=highest)
            + const[:, None]).reshape(state.buf_logp.shape)          # [N, L, M]
    if settings.algo == "vpg":
        surrogate, slope = adv * logp, adv
    else:
        ratio = jnp.exp(logp - state.buf_logp)
        eps = state.hyper["clip_eps"][:, None, None]
        clipped = jnp.clip(ratio, 1.0 - eps, 1.0 + eps) * adv
        follows = (ratio * adv <= clipped) | ((ratio > 1.0 - eps) & (ratio < 1.0 + eps))
        surrogate = jnp.minimum(ratio * adv, clipped)
        slope = jnp.where(follows, adv * ratio, 0.0)
    g = (-weight * slope).reshape((N, K))                                # [N, K]
    grads, = coef_grad((jnp.einsum("nkf,nk->nf", F, g, precision=highest), g.sum(1)))
    reg, reg_grads = jax.value_and_grad(partial(_regulariser, state))(params)
    loss = -(weight * surrogate).sum() + reg
    return loss, jax.tree.map(jnp.add, grads, reg_grads)


def update_features(settings: GaussianBanditSettings, state: GaussianBanditState):
    """One update on the feature buffer ``[N, L, M, 2P]``."""
    length = settings.length
    _, M, _ = settings.layout.shape
    valid = (jnp.arange(length) < state.count).astype(jnp.float32)[:, None]  # [L, 1]
    # each sample's weight in its policy's loss: the mean over the policy's M
    # slots of the mean over the valid buffer rows
    weight = (valid / (jnp.maximum(valid.sum(), 1.0) * M)).reshape(1, -1, 1)  # [1,L,1]
    adv = standardised(state.buf_reward, valid.reshape(1, -1, 1), axis=1)  # [N, L, M]
    # rows and markets merge into one sample axis for the products below, rows
    # the major part: split over devices by rows (when the policies do not divide),
    # each device holds a block of it and the sums over it are partial sums and an
    # all-reduce; split by markets (the minor part), GSPMD regathers it here
    F = state.buf_sample.reshape((settings.num_policies, M * length,
                                  2 * settings.num_products))            # [N, K, 2P]
    return optimise(settings, state,
                    partial(features_value_and_grad, settings, state, F, adv, weight))


def optimise(settings: GaussianBanditSettings, state: GaussianBanditState, value_and_grad):
    """``settings.epochs`` optimiser steps from ``state``'s parameters:
    ``(params, opt_state, last loss)``."""
    opt = _opt(settings)

    def epoch(carry, _):
        params, opt_state = carry
        loss, grads = value_and_grad(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        lr = state.hyper["learning_rate"]
        updates = jax.tree.map(lambda u: lr.reshape((-1,) + (1,) * (u.ndim - 1)) * u, updates)
        params = project(settings, optax.apply_updates(params, updates), state.initial_mean)
        return (params, opt_state), loss

    (params, opt_state), losses = jax.lax.scan(
        epoch, (state.params, state.opt_state), None, length=settings.epochs, unroll=True)
    return params, opt_state, losses[-1]


def _write(settings: GaussianBanditSettings, state: GaussianBanditState, sample, logp, reward):
    """The step's samples written into the buffer (at its next row)."""
    pos = state.steps % settings.length if settings.rolling else state.count
    # ``pos`` is always in bounds: a plain dynamic_update_slice, without the
    # out-of-bounds handling of ``.at[pos].set``. (The rows are written in place
    # when the caller donates the state, as the Trainer does; without donation
    # XLA copied the whole buffer on every step.)
    if settings.features:   # a fresh buffer is centred on the policies' current means
        centre = jnp.where(state.count == 0, state.params["mean"], state.centre)
        put = jax.lax.dynamic_update_slice
        return state.replace(
            centre=centre,
            buf_sample=put(state.buf_sample, features_row(settings, sample, centre),
                           (0, pos, 0, 0)),
            buf_logp=put(state.buf_logp, policy_rows(settings, logp), (0, pos, 0)),
            buf_reward=put(state.buf_reward, policy_rows(settings, reward), (0, pos, 0)))
    write = jax.lax.dynamic_update_index_in_dim
    return state.replace(buf_sample=write(state.buf_sample, sample, pos, 0),
                         buf_logp=write(state.buf_logp, logp, pos, 0),
                         buf_reward=write(state.buf_reward, reward, pos, 0))


def step(settings: GaussianBanditSettings, carry, x):
    """One transition: append it to the buffer, then update when the kind says so."""
    state, loss, n_updates = carry
    length = settings.length
    do_update = partial(update_features if settings.features else update_slots, settings)
    state = _write(settings, state, *x)
    state = state.replace(count=jnp.minimum(state.count + 1, length), steps=state.steps + 1)
    if settings.rolling:
        params, opt_state, loss = do_update(state)
        state = state.replace(params=params, opt_state=opt_state, updates=state.updates + 1)
        return (state, loss, n_updates + 1), None
    full = state.count >= length
    # only the parameters go through the branch; the buffers are read-only in it
    params, opt_state, loss = jax.lax.cond(
        full, do_update, lambda s: (s.params, s.opt_state, loss), state)
    full_i = full.astype(jnp.int32)
    state = state.replace(params=params, opt_state=opt_state,
                          updates=state.updates + full_i,
                          count=jnp.where(full, 0, state.count))
    return (state, loss, n_updates + full_i), None


def update(settings: GaussianBanditSettings, state: GaussianBanditState, batch: Transition):
    aux = batch.aux
    if "sample" not in aux or "log_prob" not in aux:
        raise KeyError(f"{settings.kind}.update needs batch.aux['sample'] and "
                       "batch.aux['log_prob'] as returned by act")
    xs = (jnp.asarray(aux["sample"], jnp.float32),
          jnp.asarray(aux["log_prob"], jnp.float32),
          jnp.asarray(batch.reward, jnp.float32))
    # loss NaN until an update runs: "no update in this batch", not a loss of 0
    carry = (state, jnp.full((), jnp.nan, jnp.float32), jnp.zeros((), jnp.int32))
    one_step = partial(step, settings)
    if xs[2].shape[0] == 1:  # one step: no loop around the buffers
        (state, loss, n_updates), _ = one_step(carry, jax.tree.map(lambda v: v[0], xs))
    else:
        (state, loss, n_updates), _ = jax.lax.scan(one_step, carry, xs)
    std = jnp.exp(state.params["log_std"])
    # loss: of the last update in this batch (NaN when the batch triggered none)
    metrics = {"loss": loss, "num_updates": n_updates,
               "mean": state.params["mean"].mean(), "stddev": std.mean()}
    return state, metrics


# ------------------------------------------------------------------ settings (numpy only)

# kind -> (fields, algorithm, rolling window)
KINDS = {
    "vpg_bandit": (VPG_FIELDS, "vpg", False),
    "ppo_bandit": (PPO_FIELDS, "ppo", False),
    "rolling_ppo_bandit": (ROLLING_PPO_FIELDS, "ppo", True),
}


def _policy_bounds(spec: LearnerSpec) -> tuple[np.ndarray, np.ndarray]:
    """The action bounds ``[N, P]`` of each policy's first slot."""
    low_np, high_np = bounds(spec)
    index_np = np.asarray(spec.index())
    first_slot = np.zeros(spec.policies, dtype=np.int64)
    for slot in range(spec.num_agents - 1, -1, -1):
        first_slot[index_np[slot]] = slot
    return low_np[first_slot], high_np[first_slot]


def _mean_bounds(h, entity, where, pol_low, pol_high):
    if h["scaled"]:
        floor = 1e-6 * np.maximum(pol_high, 1.0)
        with np.errstate(divide="ignore"):
            default_mlo = np.log(np.maximum(pol_low, floor))
            default_mhi = np.log(pol_high)
    else:
        default_mlo, default_mhi = pol_low, pol_high
    mean_low = default_mlo if h["mean_low"] is None else entity("mean_low")
    mean_high = default_mhi if h["mean_high"] is None else entity("mean_high")
    if np.any(mean_low > mean_high):
        bad = np.argwhere(mean_low > mean_high)[0]
        raise ConfigError(f"{where}.mean_low", h["mean_low"],
                          f"values <= mean_high ({float(mean_high[tuple(bad)]):g} for "
                          f"policy {bad[0]}, product {bad[1]})")
    return mean_low, mean_high


def _initial_mean(h, entity, where, pol_low, pol_high, finite):
    if h["initial_mean"] is not None:
        return entity("initial_mean")
    if not finite:
        raise ConfigError(f"{where}.initial_mean", None,
                          "a value (the action bounds are infinite, so no default)")
    mid = 0.5 * (pol_low + pol_high)
    return np.log(np.maximum(mid, 1e-6 * np.maximum(pol_high, 1.0))) if h["scaled"] else mid


def _initial_stddev(h, entity, where, pol_low, pol_high, finite):
    if h["initial_stddev"] is not None:
        return entity("initial_stddev")
    if h["scaled"]:
        return np.full(pol_low.shape, 0.5, np.float32)
    if not finite:
        raise ConfigError(f"{where}.initial_stddev", None,
                          "a value (the action bounds are infinite, so no default)")
    return 0.25 * (pol_high - pol_low)


def _stddev_bounds(h, where) -> tuple[float, float, float | None]:
    std_low = h["stddev_low"]
    std_high = np.inf if h["stddev_high"] is None else h["stddev_high"]
    if std_high < std_low:
        raise ConfigError(f"{where}.stddev_high", h["stddev_high"],
                          f">= stddev_low ({std_low:g})")
    fallback = h["stddev_fallback"]
    if fallback is not None and not std_low <= fallback <= std_high:
        raise ConfigError(f"{where}.stddev_fallback", fallback,
                          "a value within [stddev_low, stddev_high] = "
                          f"[{std_low:g}, {std_high:g}]")
    return std_low, std_high, fallback


# per algorithm: the per-policy hyperparameters of ``state.hyper`` (what PBT may mutate)
PBT_HYPERPARAMS = {"vpg": ("learning_rate", "entropy_coef", "pullback_coef"),
                   "ppo": ("learning_rate", "entropy_coef", "pullback_coef", "clip_eps")}


def gaussian_bandit_settings(kind: str, hyper: Mapping[str, Any],
                             spec: LearnerSpec) -> GaussianBanditSettings:
    """Validate ``hyper`` for ``kind`` (one of :data:`KINDS`) against ``spec`` and
    resolve the defaults of the module docstring (numpy only, nothing traced)."""
    fields, algo, rolling = KINDS[kind]
    h = resolve_hyper(fields, hyper, kind)
    where = f"learners.{kind}"
    pol_low, pol_high = _policy_bounds(spec)                         # [N, P]
    finite = bool(np.all(np.isfinite(pol_low)) and np.all(np.isfinite(pol_high)))

    def entity(name):
        return entity_per_policy(fields[name], h[name], f"{where}.{name}", spec)

    mean_low, mean_high = _mean_bounds(h, entity, where, pol_low, pol_high)
    init_mean = _initial_mean(h, entity, where, pol_low, pol_high, finite)
    init_mean = np.clip(init_mean, mean_low, mean_high).astype(np.float32)
    init_std = _initial_stddev(h, entity, where, pol_low, pol_high, finite)
    std_low, std_high, fallback = _stddev_bounds(h, where)
    init_std = np.clip(init_std, std_low, std_high).astype(np.float32)

    low_np, high_np = bounds(spec)
    index_np = np.asarray(spec.index())
    slot_weight = 1.0 / jnp.asarray(np.bincount(index_np, minlength=spec.policies),
                                    jnp.float32)[spec.index()]          # [A]
    layout = SlotLayout(spec)
    names = PBT_HYPERPARAMS[algo]
    return GaussianBanditSettings(
        kind=kind, algo=algo, rolling=rolling, num_agents=spec.num_agents,
        num_products=spec.num_products, num_policies=spec.policies,
        length=h["buffer_length"], scaled=h["scaled"], optimizer=h["optimizer"],
        epochs=h.get("update_epochs", 1) if algo == "ppo" else 1,
        hyper=tuple((name, h[name]) for name in names),
        init_mean=StaticArray(init_mean),
        init_log_std=StaticArray(np.asarray(jnp.asarray(np.log(init_std), jnp.float32))),
        mean_low=StaticArray(mean_low), mean_high=StaticArray(mean_high),
        std_low=std_low, std_high=std_high, fallback=fallback,
        low=StaticArray(low_np), high=StaticArray(high_np),
        slot_weight=StaticArray(np.asarray(slot_weight)), layout=layout,
        features=not rolling and layout.one_policy_per_column)


def make_gaussian_bandit(kind: str, hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    settings = gaussian_bandit_settings(kind, hyper, spec)
    return Learner(partial(init, settings), partial(act, settings), partial(update, settings))


def make_vpg_bandit(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_gaussian_bandit("vpg_bandit", hyper, spec)


def make_ppo_bandit(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_gaussian_bandit("ppo_bandit", hyper, spec)


def make_rolling_ppo_bandit(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_gaussian_bandit("rolling_ppo_bandit", hyper, spec)


def _params(state: GaussianBanditState) -> dict:
    """What ``act`` reads of the members (a league snapshot): the policy parameters."""
    return {"params": state.params}


# PBT: a replaced member copies its parameters, optimizer state and hyper (the sample
# buffers are per slot and stay); the static equilibrium: the box of the action bounds
LEARNERS.register(LearnerDef("vpg_bandit", make_vpg_bandit, VPG_FIELDS,
                             doc="Gaussian-policy bandit, vanilla policy gradient",
                             pbt_hyperparams=PBT_HYPERPARAMS["vpg"], snapshot=_params))
LEARNERS.register(LearnerDef("ppo_bandit", make_ppo_bandit, PPO_FIELDS,
                             doc="Gaussian-policy bandit, PPO clipped surrogate",
                             pbt_hyperparams=PBT_HYPERPARAMS["ppo"], snapshot=_params))
LEARNERS.register(LearnerDef("rolling_ppo_bandit", make_rolling_ppo_bandit, ROLLING_PPO_FIELDS,
                             doc="Gaussian-policy bandit, PPO on a rolling window updated "
                                 "every step",
                             pbt_hyperparams=PBT_HYPERPARAMS["ppo"], snapshot=_params))
