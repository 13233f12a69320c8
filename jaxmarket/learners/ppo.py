"""PPO: clipped-surrogate actor-critic with GAE (PureJaxRL style), for any number of
policies driving any number of agent slots.

Parameters are stacked ``[num_policies, ...]`` (``init`` vmaps the network's init over
keys) and ``policy_index [A]`` maps agent slots to policies. ``act`` gathers per-slot
parameters and vmaps the network over slots. ``update`` runs, in order:

1. **bootstrap** values ``V(next_obs)`` with the pre-update parameters;
2. **GAE** per agent slot over the time axis (``done`` cuts the recursion);
3. **flatten** the ``T x A`` samples, each tagged with the policy that acted;
4. **epochs x minibatches** (nested ``lax.scan``): every epoch shuffles the ``T x A``
   samples and splits them into ``num_minibatches`` minibatches; a minibatch step
   evaluates each sample with the parameters of *its* policy (gathered from the stacked
   parameters, so gradients flow back to the right policy through the gather), weights
   each sample by ``1 / (number of samples of its policy in the minibatch)`` so that every
   policy's loss is the mean over its own samples, and applies one Adam step per policy
   (``vmap`` over the policy axis, so gradient-norm clipping is per policy too; a policy
   with no sample in the minibatch keeps its parameters and optimiser state).

With a single policy the gather is skipped and the network runs batched (same numbers).

Action heads
------------
``gaussian``  diagonal Gaussian over the ``P`` products with a learned, state-independent
    log-std. With ``rescale_actions`` (default) the Gaussian lives in a normalised space
    ``u`` and the action is ``clip(mid + half * u, low, high)`` (``mid``/``half`` the centre
    and half-width of ``[action_low, action_high]``); without it ``clip(u, low, high)``.
    ``aux["raw_action"]`` stores the *unclipped* sample ``u`` and ``aux["log_prob"]`` is
    its log-density, ``log N(u; mu(obs), sigma)``; ``update`` re-evaluates the log-density
    of that same stored ``u`` (never of the clipped action), so the importance ratio is
    that of the distribution actually sampled from. The affine rescaling has a constant
    Jacobian, so ratios are unaffected by it.
``discrete``  for each product independently a categorical over ``num_actions`` prices
    evenly spaced on ``[action_low, action_high]`` (both ends included). ``aux`` carries
    ``action_index [A, P]`` (int32; what a gymnax discrete env with ``P = 1`` needs:
    ``aux["action_index"][:, 0]``) and the returned action is the grid price.

``update`` never reads ``batch.action``: the sample whose log-probability is re-evaluated
comes from ``aux`` (``raw_action`` or ``action_index``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.linen.initializers import constant

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.learners.base import (
    LEARNERS,
    Learner,
    LearnerDef,
    LearnerSpec,
    StaticArray,
    Transition,
)

HYPER_FIELDS: dict[str, Field] = {
    "hidden_sizes": Field("ints", (64, 64), low=1, doc="widths of the actor and critic MLPs"),
    "activation": Field("choice", "tanh", choices=("tanh", "relu")),
    "action_head": Field("choice", "gaussian", choices=("gaussian", "discrete"),
                         doc="diagonal Gaussian over products, or a categorical price grid"),
    "num_actions": Field("int", 11, low=2, doc="grid size per product (discrete head)"),
    "rescale_actions": Field("bool", True, doc="gaussian head: sample in [-1, 1]-normalised "
                             "space and map affinely onto [action_low, action_high]"),
    "log_std_init": Field("float", 0.0, doc="initial log-std (gaussian head)"),
    "learning_rate": Field("float", 3e-4, low=0.0, low_open=True),
    "anneal_lr": Field("bool", False, doc="linear decay to 0 over num_updates updates"),
    "num_updates": Field("int", None, low=1, optional=True,
                         doc="total number of update() calls (required by anneal_lr)"),
    "max_grad_norm": Field("float", 0.5, low=0.0, low_open=True,
                           doc="global-norm gradient clipping, per policy"),
    "adam_eps": Field("float", 1e-5, low=0.0, low_open=True),
    "gamma": Field("float", 0.99, low=0.0, high=1.0),
    "gae_lambda": Field("float", 0.95, low=0.0, high=1.0),
    "clip_eps": Field("float", 0.2, low=0.0, low_open=True),
    "clip_value_loss": Field("bool", True, doc="PPO2/PureJaxRL clipped value loss"),
    "ent_coef": Field("float", 0.01, low=0.0),
    "vf_coef": Field("float", 0.5, low=0.0),
    "update_epochs": Field("int", 4, low=1),
    "num_minibatches": Field("int", 4, low=1),
    "normalize_advantages": Field("bool", True, doc="per minibatch and per policy"),
    "group_by_policy": Field("choice", "auto", choices=("auto", True, False),
                             doc="evaluate each policy's slots as one batch and give every "
                             "minibatch an equal share of each policy's samples, shuffled "
                             "per policy (each policy updates as a PPO of its own would); "
                             "auto: wherever every policy drives the same number of slots; "
                             "true: required (a config error otherwise); false: per-slot "
                             "parameters and minibatches mixing the policies' samples"),
}


# ----------------------------------------------------------------------------- network


def orthogonal(scale: float = 1.0):
    """Orthogonal initialiser equal to ``flax.linen.initializers.orthogonal(scale)`` (same
    Gaussian draw, same result up to float rounding: QR with ``R``'s diagonal made positive
    *is* Gram-Schmidt), computed by classical Gram-Schmidt applied twice with plain jnp ops
    instead of LAPACK QR.

    Why: jaxlib's CPU QR kernel maps a batch (here: the vmap over policies or seeds) onto
    XLA's intra-op thread pool and waits for it from a thread of that same pool; two such
    kernels scheduled concurrently in one program then deadlock on a 2-core machine (seen
    with jax 0.10: ``init`` of a 2-policy learner never returned)."""

    def init(key, shape, dtype=jnp.float32):
        n_rows, n_cols = int(np.prod(shape[:-1])), shape[-1]
        tall = (max(n_rows, n_cols), min(n_rows, n_cols))
        a = jax.random.normal(key, tall, jnp.float32)
        k = tall[1]

        def column(j, q):
            v = a[:, j]
            earlier = (jnp.arange(k) < j).astype(v.dtype)
            for _ in range(2):  # re-orthogonalise once ("twice is enough")
                v = v - q @ (earlier * (q.T @ v))
            return q.at[:, j].set(v / jnp.sqrt(jnp.sum(v * v)))

        q = jax.lax.fori_loop(0, k, column, jnp.zeros(tall, jnp.float32))
        if n_rows < n_cols:
            q = q.T
        return (scale * q).reshape(shape).astype(dtype)

    return init


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (PureJaxRL initialisation: orthogonal sqrt(2)
    hidden layers, 0.01 policy head, 1.0 value head, zero biases).

    Returns ``(policy_out, value)``: ``policy_out`` is the logits ``[..., P, K]``
    (discrete) or ``(mean, log_std)`` each ``[..., P]`` (gaussian)."""

    hidden_sizes: tuple[int, ...]
    activation: str
    head: str
    num_products: int
    num_actions: int
    log_std_init: float = 0.0
    # (k, size): the last k features (POI observations) pass through a learned
    # Dense(size) + tanh ("poi_embed", shared by actor and critic, trained by the PPO
    # loss like every other parameter) before the torsos see them
    embed: tuple | None = None

    @nn.compact
    def __call__(self, x):
        act = nn.tanh if self.activation == "tanh" else nn.relu
        if self.embed is not None:
            k, size = self.embed
            e = nn.tanh(nn.Dense(size, name="poi_embed")(x[..., x.shape[-1] - k:]))
            x = jnp.concatenate([x[..., : x.shape[-1] - k], e], axis=-1)
        if x.shape[-1] == 0:  # observation-free (bandit) groups: a constant input
            x = jnp.ones(x.shape[:-1] + (1,), x.dtype)

        def torso(h, name):
            for i, width in enumerate(self.hidden_sizes):
                h = nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0),
                             name=f"{name}_{i}")(h)
                h = act(h)
            return h

        a = torso(x, "actor")
        P, K = self.num_products, self.num_actions
        if self.head == "discrete":
            logits = nn.Dense(P * K, kernel_init=orthogonal(0.01), bias_init=constant(0.0),
                              name="actor_out")(a)
            policy_out = logits.reshape(logits.shape[:-1] + (P, K))
        else:
            mean = nn.Dense(P, kernel_init=orthogonal(0.01), bias_init=constant(0.0),
                            name="actor_out")(a)
            log_std = self.param("log_std", constant(self.log_std_init), (P,))
            policy_out = (mean, jnp.broadcast_to(log_std, mean.shape))
        c = torso(x, "critic")
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0),
                         name="critic_out")(c)
        return policy_out, jnp.squeeze(value, -1)


def make_distribution(head: str, policy_out) -> "distrax.Distribution":  # noqa: F821
    """The policy distribution over one sample per row: event shape ``[P]``."""
    # distrax (and the TensorFlow Probability it loads) costs 0.9 s of every
    # `import jaxmarket` (-X importtime); only a traced PPO policy needs it
    import distrax

    if head == "discrete":
        return distrax.Independent(distrax.Categorical(logits=policy_out), 1)
    mean, log_std = policy_out
    return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))


# ------------------------------------------------------------------------ loss pieces


def gae_advantages(reward, value, next_value, done, gamma: float, gae_lambda: float):
    """Generalised advantage estimation over the leading time axis ``[T, ...]``.

    ``delta_t = r_t + gamma (1 - d_t) V(s'_t) - V(s_t)``,
    ``A_t = delta_t + gamma lambda (1 - d_t) A_{t+1}`` (``A_T = 0``).
    Returns ``(advantages, targets = advantages + value)``."""
    not_done = 1.0 - done.astype(jnp.float32)
    delta = reward + gamma * next_value * not_done - value

    def step(next_adv, xs):
        delta_t, not_done_t = xs
        adv = delta_t + gamma * gae_lambda * not_done_t * next_adv
        return adv, adv

    _, advantages = jax.lax.scan(step, jnp.zeros_like(delta[0]), (delta, not_done),
                                 reverse=True, unroll=16)  # as PureJaxRL: tiny loop body
    return advantages, advantages + value


def clipped_surrogate(log_prob, old_log_prob, advantages, clip_eps: float):
    """Per-sample PPO policy loss ``-min(r A, clip(r, 1-eps, 1+eps) A)``,
    ``r = exp(log_prob - old_log_prob)``."""
    ratio = jnp.exp(log_prob - old_log_prob)
    return -jnp.minimum(ratio * advantages,
                        jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages)


def value_loss(value, old_value, target, clip_eps: float, clip: bool = True):
    """Per-sample value loss ``0.5 max((V - R)^2, (V_old + clip(V - V_old, +-eps) - R)^2)``
    (plain ``0.5 (V - R)^2`` with ``clip=False``)."""
    loss = jnp.square(value - target)
    if clip:
        clipped = old_value + jnp.clip(value - old_value, -clip_eps, clip_eps)
        loss = jnp.maximum(loss, jnp.square(clipped - target))
    return 0.5 * loss


# ----------------------------------------------------------------------------- learner


@struct.dataclass
class PPOState:
    params: Any            # network parameters, every leaf [num_policies, ...]
    opt_state: Any         # Adam state, every leaf [num_policies, ...]
    policy_index: jax.Array  # [A] int32, slot -> policy
    key: jax.Array         # minibatch shuffling
    # per-policy hyperparameters {name: [num_policies] float32} (PBT mutates them
    # in-graph without recompiling): learning_rate, ent_coef, vf_coef, clip_eps
    hyper: Any = None


# the per-policy hyperparameters of ``state.hyper`` (what PBT may mutate)
HYPERPARAMS = ("learning_rate", "ent_coef", "vf_coef", "clip_eps")


def _resolve(hyper: Mapping[str, Any]) -> dict[str, Any]:
    h = {name: f.default for name, f in HYPER_FIELDS.items()}
    h.update(hyper)
    h.pop("kind", None)
    h["hidden_sizes"] = tuple(int(x) for x in h["hidden_sizes"])
    if h["anneal_lr"] and h["num_updates"] is None:
        raise ConfigError("num_updates", None,
                          "an integer >= 1 (required when anneal_lr is true)")
    return h


@dataclass(frozen=True)
class PPOSettings:
    """PPO's resolved settings (static)."""

    network: ActorCritic
    policy_index: tuple[int, ...]   # [A] slot -> policy
    num_policies: int
    obs_dim: int
    low: StaticArray                # [A, P] float32 action bounds
    high: StaticArray
    rescale_actions: bool
    gamma: float
    gae_lambda: float
    update_epochs: int
    num_minibatches: int
    anneal_lr: bool
    num_updates: int | None
    max_grad_norm: float
    adam_eps: float
    clip_value_loss: bool
    normalize_advantages: bool
    hyper: tuple[tuple[str, float], ...]   # initial per-policy HYPERPARAMS
    # group_by_policy: the slots of each policy, [num_policies][slots per policy]
    # (None: the default, per-slot parameter gathers and mixed minibatches)
    groups: tuple[tuple[int, ...], ...] | None = None

    @property
    def head(self) -> str:
        return self.network.head

    @property
    def single(self) -> bool:
        """Every slot uses policy 0: plain batched apply, no gather."""
        return self.num_policies == 1


def step_size(settings: PPOSettings, lr, count):
    """The Adam step size of a policy with learning rate ``lr`` after ``count``
    optimizer steps: ``lr``, or PureJaxRL's linear schedule
    ``lr (1 - floor(count / (epochs * minibatches)) / num_updates)``."""
    if settings.anneal_lr:
        steps_per_update = settings.update_epochs * settings.num_minibatches
        return lr * (1.0 - (count // steps_per_update) / settings.num_updates)
    return lr


def optimizer(settings: PPOSettings) -> optax.GradientTransformation:
    """Gradient clipping and Adam's direction at unit step size: the policy's own
    learning rate (state.hyper) scales it, ``u * -step_size``, as ``optax.adam(lr)``
    computes it."""
    return optax.chain(optax.clip_by_global_norm(settings.max_grad_norm),
                       optax.scale_by_adam(eps=settings.adam_eps))


def tx_update(settings: PPOSettings, grads, opt_state, params, lr):
    """One policy's optimizer step (vmapped over policies)."""
    count = opt_state[1].count            # Adam's step count before this step
    direction, opt_state = optimizer(settings).update(grads, opt_state, params)
    step = -step_size(settings, lr, count)
    return jax.tree.map(lambda u: u * step.astype(u.dtype), direction), opt_state


def apply(settings: PPOSettings, params, index, x):
    """Network outputs for rows ``x[i]`` (any trailing batch dims) with the parameters
    of policy ``index[i]``."""
    if settings.single:
        return settings.network.apply(jax.tree.map(lambda p: p[0], params), x)
    if settings.groups is not None:   # rows = the slots; one batch per policy
        order = np.asarray(settings.groups)                    # [K, c]
        inverse = np.argsort(order.ravel())
        out = jax.vmap(settings.network.apply)(params, x[order])
        return jax.tree.map(lambda y: y.reshape((-1,) + y.shape[2:])[inverse], out)
    rows = jax.tree.map(lambda p: p[index], params)
    return jax.vmap(settings.network.apply)(rows, x)


def per_policy_sum(settings: PPOSettings, x, pol):
    if settings.single:
        return jnp.sum(x, keepdims=True)
    return jax.ops.segment_sum(x, pol, num_segments=settings.num_policies)


@partial(jax.jit, static_argnums=0)  # one compiled call instead of many small eager ones
def init_from_key(settings: PPOSettings, key: jax.Array) -> PPOState:
    key, shuffle_key = jax.random.split(key)
    dummy = jnp.zeros((max(settings.obs_dim, 0),), jnp.float32)
    params = jax.vmap(lambda k: settings.network.init(k, dummy))(
        jax.random.split(key, settings.num_policies))
    hyper = {name: jnp.full((settings.num_policies,), value, jnp.float32)
             for name, value in settings.hyper}
    return PPOState(params=params, opt_state=jax.vmap(optimizer(settings).init)(params),
                    policy_index=jnp.asarray(settings.policy_index, dtype=jnp.int32),
                    key=shuffle_key, hyper=hyper)


def init(settings: PPOSettings, key: jax.Array, spec: LearnerSpec | None = None) -> PPOState:
    del spec  # the learner was built for its spec
    return init_from_key(settings, key)


def act(settings: PPOSettings, state: PPOState, obs: jax.Array, key: jax.Array):
    head = settings.head
    low, high = jnp.asarray(settings.low.array), jnp.asarray(settings.high.array)
    policy_out, value = apply(settings, state.params, state.policy_index, obs)
    sample, log_prob = make_distribution(head, policy_out).sample_and_log_prob(seed=key)
    if head == "discrete":
        index = sample.astype(jnp.int32)
        K = settings.network.num_actions
        action = low + (high - low) * (index.astype(jnp.float32) / (K - 1))
        return action, {"log_prob": log_prob, "value": value, "action_index": index}
    if settings.rescale_actions:
        action = 0.5 * (low + high) + 0.5 * (high - low) * sample
    else:
        action = sample
    action = jnp.clip(action, low, high)
    return action, {"log_prob": log_prob, "value": value, "raw_action": sample}


def minibatch_loss(settings: PPOSettings, params, hyper, mb):
    policy_out, value = apply(settings, params, mb["policy"], mb["obs"])
    dist = make_distribution(settings.head, policy_out)
    log_prob = dist.log_prob(mb["sample"])
    entropy = dist.entropy()

    # weights: each policy's loss is the mean over its own samples in the minibatch
    pol = mb["policy"]
    counts = per_policy_sum(settings, jnp.ones_like(value), pol)
    weight = 1.0 / jnp.maximum(counts, 1.0)[pol]
    active = jnp.sum(counts > 0)

    adv = mb["advantage"]
    if settings.normalize_advantages:
        mean = (per_policy_sum(settings, adv, pol) * (1.0 / jnp.maximum(counts, 1.0)))[pol]
        var = (per_policy_sum(settings, jnp.square(adv - mean), pol)
               * (1.0 / jnp.maximum(counts, 1.0)))[pol]
        adv = (adv - mean) / (jnp.sqrt(var) + 1e-8)

    eps = hyper["clip_eps"][pol]                    # each sample's policy's values
    pg = clipped_surrogate(log_prob, mb["log_prob"], adv, eps)
    vl = value_loss(value, mb["value"], mb["target"], eps, settings.clip_value_loss)
    per_sample = pg + hyper["vf_coef"][pol] * vl - hyper["ent_coef"][pol] * entropy
    total = jnp.sum(weight * per_sample)

    log_ratio = log_prob - mb["log_prob"]
    ratio = jnp.exp(log_ratio)

    def avg(x):  # mean over policies of each policy's sample mean
        return jnp.sum(weight * x) / jnp.maximum(active, 1)

    metrics = {
        "total_loss": avg(per_sample),
        "policy_loss": avg(pg),
        "value_loss": avg(vl),
        "entropy": avg(entropy),
        "approx_kl": avg((ratio - 1.0) - log_ratio),
        "clip_frac": avg((jnp.abs(ratio - 1.0) > eps).astype(jnp.float32)),
    }
    return total, metrics


def minibatch_step(settings: PPOSettings, hyper, carry, mb):
    """One gradient step of every policy on one minibatch."""
    params, opt_state = carry
    grads, metrics = jax.grad(partial(minibatch_loss, settings), has_aux=True)(params, hyper, mb)
    updates, new_opt_state = jax.vmap(partial(tx_update, settings))(
        grads, opt_state, params, hyper["learning_rate"])
    new_params = optax.apply_updates(params, updates)
    if not settings.single:  # a policy without samples in this minibatch takes no step
        present = jax.ops.segment_sum(jnp.ones_like(mb["policy"]), mb["policy"],
                                      num_segments=settings.num_policies) > 0

        def keep(new, old):
            return jnp.where(present.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

        new_params = jax.tree.map(keep, new_params, params)
        new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    return (new_params, new_opt_state), metrics


def samples(settings: PPOSettings, state: PPOState, batch: Transition) -> dict:
    """Steps 1-3 of ``update``: the ``T x A`` samples, flattened, with their advantages,
    value targets and policies."""
    T, A_ = batch.reward.shape
    reward = batch.reward.astype(jnp.float32)
    value = batch.aux["value"]

    # 1. bootstrap values V(next_obs), slot-major so each slot's T rows share params
    _, next_value = apply(settings, state.params, state.policy_index,
                          jnp.swapaxes(batch.next_obs, 0, 1))
    next_value = jnp.swapaxes(next_value, 0, 1)  # [T, A]

    # 2. GAE per agent slot over time
    advantages, targets = gae_advantages(reward, value, next_value, batch.done,
                                         settings.gamma, settings.gae_lambda)

    # 3. flatten T x A samples; each remembers the policy of its slot
    aux = batch.aux
    sample = aux["action_index"] if settings.head == "discrete" else aux["raw_action"]
    flat = {
        "obs": batch.obs,
        "sample": sample,
        "log_prob": aux["log_prob"],
        "value": value,
        "advantage": advantages,
        "target": targets,
        "policy": jnp.broadcast_to(state.policy_index, (T, A_)),
    }
    return jax.tree.map(lambda x: x.reshape((T * A_,) + x.shape[2:]), flat)


def grouped_step(settings: PPOSettings, hyper, carry, mb):
    """``minibatch_step`` of ``group_by_policy``: ``mb`` leaves ``[K, m, ...]``, each
    policy's loss on its own ``m`` samples (its own single-policy loss, vmapped)."""
    params, opt_state = carry
    one = dataclasses.replace(settings, num_policies=1, groups=None)

    def loss(p, h, mb):
        return minibatch_loss(one, jax.tree.map(lambda x: x[None], p),
                              jax.tree.map(lambda x: x[None], h), mb)

    grads, metrics = jax.vmap(jax.grad(loss, has_aux=True))(params, hyper, mb)
    updates, opt_state = jax.vmap(partial(tx_update, settings))(
        grads, opt_state, params, hyper["learning_rate"])
    return (optax.apply_updates(params, updates), opt_state), jax.tree.map(jnp.mean, metrics)


def grouped_epochs(settings: PPOSettings, state: PPOState, flat: dict, keys):
    """Epochs of ``group_by_policy``: each epoch shuffles every policy's own samples
    (a key per policy) into ``num_minibatches`` equal minibatches."""
    order = np.asarray(settings.groups)                             # [K, c]
    K, c = order.shape
    T = flat["policy"].shape[0] // (K * c)
    # sample t * A + a of policy k's j-th slot a = order[k, j] -> [K, T * c]
    rows = (np.arange(T)[None, :, None] * (K * c) + order[:, None, :]).reshape(K, T * c)
    per_policy = {k: v[rows] for k, v in flat.items() if k != "policy"}
    per_policy["policy"] = jnp.zeros((K, T * c), jnp.int32)
    num_mb = settings.num_minibatches
    mb_size = (T * c) // num_mb
    if mb_size == 0:   # found when the update is traced: the rollout's length sets T
        raise ConfigError("num_minibatches", num_mb,
                          f"at most the {T * c} samples per policy of an update "
                          f"(group_by_policy: train.rollout_length {T} x the {c} agent "
                          "slots each policy drives); lower it, raise train.rollout_length "
                          "or train.num_envs, or set group_by_policy: false")

    def epoch(carry, key):
        perm = jax.vmap(lambda k: jax.random.permutation(k, T * c)[: num_mb * mb_size])(
            jax.random.split(key, K))                               # [K, num_mb * m]
        mbs = jax.tree.map(lambda x: jax.vmap(lambda x, p: x[p])(x, perm).reshape(
            (K, num_mb, mb_size) + x.shape[2:]).swapaxes(0, 1), per_policy)
        return jax.lax.scan(partial(grouped_step, settings, state.hyper), carry, mbs)

    return jax.lax.scan(epoch, (state.params, state.opt_state), keys)


def update(settings: PPOSettings, state: PPOState, batch: Transition):
    T, A_ = batch.reward.shape
    N = T * A_
    epochs, num_mb = settings.update_epochs, settings.num_minibatches
    mb_size = N // num_mb
    if mb_size == 0:   # found when the update is traced (plan.check_minibatches first)
        raise ConfigError("num_minibatches", num_mb,
                          f"at most the {N} samples of an update (train.rollout_length x "
                          "the group's agent slots)")
    flat = samples(settings, state, batch)
    if settings.groups is not None:
        key, *epoch_keys = jax.random.split(state.key, epochs + 1)
        (params, opt_state), metrics = grouped_epochs(settings, state, flat,
                                                      jnp.stack(epoch_keys))
        metrics = jax.tree.map(jnp.mean, metrics)
        return state.replace(params=params, opt_state=opt_state, key=key), metrics

    # 4. epochs x minibatches
    def epoch(carry, key):
        perm = jax.random.permutation(key, N)[: num_mb * mb_size]  # drops N % num_mb
        mbs = jax.tree.map(lambda x: x[perm].reshape((num_mb, mb_size) + x.shape[1:]), flat)
        return jax.lax.scan(partial(minibatch_step, settings, state.hyper), carry, mbs)

    key, *epoch_keys = jax.random.split(state.key, epochs + 1)
    (params, opt_state), metrics = jax.lax.scan(
        epoch, (state.params, state.opt_state), jnp.stack(epoch_keys))
    metrics = jax.tree.map(jnp.mean, metrics)
    return state.replace(params=params, opt_state=opt_state, key=key), metrics


def ppo_settings(hyper: Mapping[str, Any], spec: LearnerSpec) -> PPOSettings:
    """Resolve ``hyper`` (validated against HYPER_FIELDS by the caller) for ``spec``."""
    h = _resolve(hyper)
    A, P = spec.num_agents, spec.num_products
    index = np.asarray(spec.index())
    network = network_for(hyper, spec)
    return PPOSettings(
        network=network, policy_index=tuple(int(i) for i in index),
        num_policies=spec.policies, obs_dim=spec.obs_dim,
        low=StaticArray(np.broadcast_to(spec.action_low, (A, P)), np.float32),
        high=StaticArray(np.broadcast_to(spec.action_high, (A, P)), np.float32),
        rescale_actions=h["rescale_actions"], gamma=h["gamma"], gae_lambda=h["gae_lambda"],
        update_epochs=h["update_epochs"], num_minibatches=h["num_minibatches"],
        anneal_lr=h["anneal_lr"], num_updates=h["num_updates"],
        max_grad_norm=h["max_grad_norm"], adam_eps=h["adam_eps"],
        clip_value_loss=h["clip_value_loss"], normalize_advantages=h["normalize_advantages"],
        hyper=tuple((name, h[name]) for name in HYPERPARAMS),
        groups=policy_groups(index, spec.policies, h["group_by_policy"]))


def network_for(hyper: Mapping[str, Any], spec: LearnerSpec) -> ActorCritic:
    """The actor-critic of a ``ppo`` group with settings ``hyper`` and learner ``spec``
    (what ``network.apply(params_of_one_policy, obs)`` evaluates)."""
    h = _resolve(hyper)
    return ActorCritic(hidden_sizes=h["hidden_sizes"], activation=h["activation"],
                       head=h["action_head"], num_products=spec.num_products,
                       num_actions=h["num_actions"], log_std_init=h["log_std_init"],
                       embed=spec.obs_embed)


def greedy_index(network: ActorCritic, params, obs: jax.Array) -> jax.Array:
    """``[..., P]`` int32: a discrete head's most likely grid index per product (the
    first on ties) for observations ``obs [..., D]`` under one policy's ``params``."""
    logits, _ = network.apply(params, obs)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def policy_groups(index: np.ndarray, num_policies: int, mode="auto") -> tuple | None:
    """``group_by_policy``'s slots of each policy (in slot order), or None: the per-slot
    layout (``mode`` false; ``auto`` where the policies drive unequal numbers of slots)
    or one policy (already one batch). ``mode`` true requires equal slot counts."""
    if num_policies == 1 or mode is False:
        return None
    counts = np.bincount(index, minlength=num_policies)
    if not np.all(counts == counts[0]):
        if mode == "auto":
            return None
        raise ConfigError("group_by_policy", True,
                          "false, or a layout where every policy drives the same number "
                          f"of agent slots (here: {sorted(set(counts.tolist()))})")
    return tuple(tuple(int(i) for i in np.flatnonzero(index == k)) for k in range(num_policies))


def make_ppo(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    settings = ppo_settings(hyper, spec)
    return Learner(init=partial(init, settings), act=partial(act, settings),
                   update=partial(update, settings))


PPO = LEARNERS.register(LearnerDef(
    kind="ppo",
    make=make_ppo,
    hyper_fields=HYPER_FIELDS,
    doc="PPO actor-critic (clipped surrogate, GAE, Adam); gaussian or discrete price head",
    # PBT: a replaced member copies params, opt_state and hyper; a league snapshot
    # freezes the network parameters; the static equilibrium: the box of the bounds
    pbt_hyperparams=HYPERPARAMS,
    snapshot=lambda state: {"params": state.params},
))
