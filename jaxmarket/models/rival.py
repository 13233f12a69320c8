"""The shipped ``rival`` model: market history -> the rivals' next prices.

Inputs, for agent ``a`` of the group in one market: the price profile *in force before
the step* (``info["prev_prices"]``: what every seller quoted at the previous step, or
its reset price), scaled exactly as the demand model's (:func:`price_inputs`)::

    x = [u_own (P), u_rivals, obs]        (obs with ``observation: true``: the group's
                                           observation before the step, e.g. its
                                           price history)

Targets: the rivals' prices quoted *at* the step (their reaction to ``x``), each scaled
to ``[-1, 1]`` by that rival's bounds::

    y = u_rivals(step)                    rivals: all -> ((S - 1) P); mean -> (P)

So the model learns ``prices_t -> rivals' prices_{t+1}``: a deterministic rival (a
``constant``, a ``schedule`` that has settled, an ``undercut`` rule) is learned to
arbitrary precision, a stochastic one to its conditional mean. ``make_inputs`` of a
state is ``x`` of the prices in force in it, so ``poi target: state`` evaluates the POI
at the inputs of the *next* step (the prices just quoted). The ground-truth evaluator
(:mod:`jaxmarket.models.runtime`) holds every rival at its current price: the true
target of a profile is then the rivals' current prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmarket.models.base import MLP_FIELDS, MODELS, ModelContext, ModelDef, make_mlp_model
from jaxmarket.models.demand import INPUT_FIELDS, price_inputs

RIVAL_FIELDS = {**MLP_FIELDS, **INPUT_FIELDS}


def make_rival(settings: Mapping[str, Any], ctx: ModelContext):
    where = f"learners.{ctx.group}.external_model"
    inputs, in_dim = price_inputs(settings, ctx, f"{where}.kind")
    low, high = ctx.seller_low, ctx.seller_high
    mid = jnp.asarray(0.5 * (low + high), jnp.float32)
    half = jnp.asarray(np.maximum(0.5 * (high - low), 1e-6), jnp.float32)
    n, A, P = low.shape[0], ctx.num_agents, ctx.num_products
    own = np.arange(ctx.group_offset, ctx.group_offset + A)
    rivals = np.asarray([[s for s in range(n) if s != o] for o in own], np.int32)  # [A, R]
    mean = settings["rivals"] == "mean"
    names = [g for g, _ in ctx.seller_groups]

    def make_io(transition, info):
        prices = jnp.concatenate([info["prices"][g] for g in names], axis=1)  # [E, n, P]
        u = ((prices - mid) / half)[:, rivals]                               # [E, A, R, P]
        y = u.mean(2) if mean else u.reshape(u.shape[:2] + (-1,))
        return inputs(info["prev_prices"], transition.obs), y

    out_dim = P if mean else rivals.shape[1] * P
    return make_mlp_model(settings, in_dim, out_dim, make_io, inputs, P)


MODELS.register(ModelDef("rival", make_rival, RIVAL_FIELDS,
                         doc="prices in force (own, rivals') -> the rivals' next prices"))
