"""The external-model protocol: a model of the market that a group's learner trains on
its own experience, inside the compiled training chunk.

    init(key) -> ModelState
    predict(params, x [B, I], key=None) -> y [M, B, O]        (M ensemble members)
    loss(params, x [B, I], y [B, O], weight [M, B]) -> scalar
    fit(state, x [N, I], y [N, O], key) -> (state, metrics)   (epochs x minibatches of SGD)
    make_io(transition, info) -> (x [E, A, I], y [E, A, O])
    make_inputs(prices, obs) -> x [E, A, I]                   (optional)

``make_io`` (EMMA's ``rollout_to_model_input`` / ``rollout_to_model_output``) turns one
market step of the group -- its :class:`~jaxmarket.learners.base.Transition` row in
market order (``[E, A, ...]``) and the environment's ``info`` dict (every seller group's
quoted ``prices``, ``traffic``, ``fees``, and ``prev_prices``: the prices in force before
the step) -- into model inputs and targets. ``make_inputs`` builds the inputs alone from
a price profile (every seller group's ``[E, n, P]`` prices in force) and the group's
observation ``[E, A, D]``: the model input *of a state*, which ``poi target: state`` and
POI observations need; its first ``own_dims`` features are the agent's own scaled
prices (what the grid and uniform samplers replace). All six are
pure and jittable; ``fit`` has no Python loop over samples or members (``vmap`` over the
ensemble, ``lax.scan`` over epochs and minibatches).

A model kind is a :class:`ModelDef` in :data:`MODELS`:
``make(settings, ctx: ModelContext) -> ExternalModel``, its settings declared as
``Field`` s, registered with ``MODELS.register(ModelDef(kind, make, fields))``.
:mod:`jaxmarket.models.demand` is the neighbouring file to read; importing
:mod:`jaxmarket.models` registers every shipped kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxmarket.config.fields import Field
from jaxmarket.config.registry import Registry


@dataclass(frozen=True)
class ModelContext:
    """What a model kind may know of the market when it is built (static)."""

    group: str                      # the agent group whose experience trains it
    side: str                       # "seller" | "consumer"
    num_agents: int                 # agents of the group per market (A)
    num_products: int               # P
    group_offset: int               # first index of the group on the seller axis
    seller_groups: tuple            # ((name, count), ...) in market order
    seller_low: np.ndarray          # [num_sellers, P] action bounds of every seller
    seller_high: np.ndarray
    queries: np.ndarray             # [P] queries sent per step by all consumers (scale)
    obs_dim: int = 0                # D: the group's observation size (the env's)


@struct.dataclass
class ModelState:
    params: Any        # every leaf [M, ...]: one parameter set per ensemble member
    opt_state: Any
    key: jax.Array     # bootstrap masks, minibatch order, MC-dropout passes
    steps: jax.Array   # () int32: fit calls so far


class ExternalModel(NamedTuple):
    init: Callable
    predict: Callable
    loss: Callable
    fit: Callable
    make_io: Callable
    num_members: int
    in_dim: int
    out_dim: int
    dropout: float
    # inputs of a state: make_inputs(prices {group: [E, n, P]}, obs [E, A, D]) -> [E, A, I]
    # (None: the model cannot say; poi target: state and poi_obs are refused)
    make_inputs: Callable | None = None
    own_dims: int = 0   # x[..., :own_dims]: the agent's own prices scaled to [-1, 1]


@dataclass(frozen=True)
class ModelDef:
    kind: str
    make: Callable[[Mapping[str, Any], ModelContext], ExternalModel]
    fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""


MODELS: Registry[ModelDef] = Registry("external model")




# the settings every MLP model shares
MLP_FIELDS: dict[str, Field] = {
    "hidden_sizes": Field("ints", (32, 32), low=1, doc="widths of the MLP's hidden layers"),
    "activation": Field("choice", "tanh", choices=("tanh", "relu")),
    "ensemble": Field("int", 1, low=1, doc="members M (independent inits, bootstrap masks)"),
    "bootstrap": Field("float", 1.0, low=0.0, low_open=True, high=1.0,
                       doc="probability that a sample enters a member's loss (1: all)"),
    "dropout": Field("float", 0.0, low=0.0, high=0.95,
                     doc="dropout rate after each hidden layer (MC-dropout POI)"),
    "learning_rate": Field("float", 3e-3, low=0.0, low_open=True, doc="Adam step size"),
    "epochs": Field("int", 1, low=1, doc="passes over the iteration's samples"),
    "minibatch_size": Field("int", 64, low=1, doc="samples per SGD step"),
}


class MLP(nn.Module):
    hidden_sizes: tuple
    out_dim: int
    activation: str = "tanh"
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        act = nn.tanh if self.activation == "tanh" else nn.relu
        for width in self.hidden_sizes:
            x = act(nn.Dense(width)(x))
            if self.dropout > 0:
                x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
        return nn.Dense(self.out_dim)(x)


def make_mlp_model(settings: Mapping[str, Any], in_dim: int, out_dim: int,
                   make_io: Callable, make_inputs: Callable | None = None,
                   own_dims: int = 0) -> ExternalModel:
    """An MLP regression model (an ensemble of ``settings["ensemble"]`` members) with
    squared-error loss, trained by Adam on minibatches.

    Loss of member ``m`` on a minibatch with bootstrap weights ``w_mi`` (Bernoulli with
    probability ``bootstrap``, drawn once per ``fit`` call)::

        L_m = sum_i w_mi ||f_m(x_i) - y_i||^2 / (O * max(sum_i w_mi, 1))

    and ``loss = sum_m L_m`` (the members share no parameter, so each gets its own
    gradient)."""
    M = settings["ensemble"]
    hidden = tuple(int(w) for w in settings["hidden_sizes"])
    net = MLP(hidden, out_dim, settings["activation"], settings["dropout"])
    tx = optax.adam(settings["learning_rate"])
    epochs, mb_size, p_keep = settings["epochs"], settings["minibatch_size"], settings["bootstrap"]
    dropout = settings["dropout"]

    def init(key):
        k_params, k_state = jax.random.split(key)
        dummy = jnp.zeros((in_dim,), jnp.float32)
        params = jax.vmap(lambda k: net.init(k, dummy))(jax.random.split(k_params, M))
        return ModelState(params, tx.init(params), jax.random.key_data(k_state),
                          jnp.zeros((), jnp.int32))

    def predict(params, x, key=None):
        """``[M, B, O]``; with a ``key`` (and dropout) one stochastic pass per member."""
        if key is None or dropout == 0:
            return jax.vmap(lambda p: net.apply(p, x))(params)
        keys = jax.random.split(key, M)
        return jax.vmap(lambda p, k: net.apply(p, x, deterministic=False,
                                               rngs={"dropout": k}))(params, keys)

    def loss(params, x, y, weight, key=None):
        err = jnp.square(predict(params, x, key) - y[None]).mean(-1)          # [M, B]
        return jnp.sum((weight * err).sum(-1) / jnp.maximum(weight.sum(-1), 1.0))

    def fit(state, x, y, key=None):
        """``epochs`` passes over ``x [N, I]``, ``y [N, O]`` in ``N // minibatch_size``
        shuffled minibatches (one minibatch of all ``N`` when ``N < minibatch_size``)."""
        N = x.shape[0]
        size = min(mb_size, N)
        num_mb = N // size
        key = jax.random.wrap_key_data(state.key) if key is None else key
        key, k_mask, k_perm, k_drop = jax.random.split(key, 4)
        if p_keep < 1.0:
            weight = jax.random.bernoulli(k_mask, p_keep, (M, N)).astype(jnp.float32)
        else:
            weight = jnp.ones((M, N), jnp.float32)

        def step(carry, mb):
            params, opt_state = carry
            xb, yb, wb, kb = mb
            value, grads = jax.value_and_grad(loss)(params, xb, yb, wb,
                                                    kb if dropout > 0 else None)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), value

        def epoch(carry, k):
            k_p, k_d = jax.random.split(k)
            perm = jax.random.permutation(k_p, N)[: num_mb * size].reshape(num_mb, size)
            mbs = (x[perm], y[perm], jnp.swapaxes(weight[:, perm], 0, 1),
                   jax.random.split(k_d, num_mb))
            return jax.lax.scan(step, carry, mbs)

        del k_drop
        (params, opt_state), losses = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(k_perm, epochs))
        state = ModelState(params, opt_state, jax.random.key_data(key), state.steps + 1)
        # the loss of the last minibatch step, per member (sum over members / M)
        return state, {"loss": losses[-1, -1] / M}

    return ExternalModel(init, predict, loss, fit, make_io, M, in_dim, out_dim, dropout,
                         make_inputs, own_dims)
