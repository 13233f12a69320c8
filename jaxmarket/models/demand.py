"""Shipped external models of a seller group's market: ``demand`` and ``reward`` (and
``rival``, :mod:`jaxmarket.models.rival`).

Inputs (every kind), for agent ``a`` of the group in one market, every price scaled to
``[-1, 1]`` by its seller's action bounds (``u = (p - mid) / half``)::

    x = [u_own (P), u_rivals, obs]   rivals: all -> every other seller's u ((S - 1) P)
                                              mean -> their mean per product (P)
                                     obs: the group's observation (D), with
                                          ``observation: true`` only

Targets:

* ``demand``: the agent's own traffic and/or fees, scaled by the queries ``Q_p`` all
  consumers send per step (fees also by the seller's highest price ``high_p``)::

      y = [traffic_p / Q_p (P), fees_p / (Q_p high_p) (P)]       (targets: both)

* ``reward``: the agent's reward divided by ``sum_p Q_p * max high``.

Both are MLP ensembles (:func:`jaxmarket.models.base.make_mlp_model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.models.base import MLP_FIELDS, MODELS, ModelContext, ModelDef, make_mlp_model

INPUT_FIELDS = {
    "rivals": Field("choice", "all", choices=("all", "mean"),
                    doc="every other seller's price, or their mean per product"),
    "observation": Field("bool", False,
                         doc="append the group's observation (e.g. its price history)"),
}
DEMAND_FIELDS = {**MLP_FIELDS, **INPUT_FIELDS,
                 "targets": Field("choice", "both", choices=("traffic", "fees", "both"),
                                  doc="own traffic, own fees, or both")}
REWARD_FIELDS = {**MLP_FIELDS, **INPUT_FIELDS}


def price_inputs(settings: Mapping[str, Any], ctx: ModelContext, where: str):
    """``(inputs(prices, obs) -> [E, A, I], I)``: the scaled own and rivals' prices of a
    price profile ``prices`` (every seller group's ``[E, n, P]``), then the group's
    observation ``obs [E, A, D]`` with ``observation: true``."""
    if ctx.side != "seller":
        raise ConfigError(where, ctx.group, "a seller group (the model reads its prices, "
                          "traffic and fees)")
    low, high = ctx.seller_low, ctx.seller_high
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError(where, ctx.group, "sellers with finite price bounds")
    mid = jnp.asarray(0.5 * (low + high), jnp.float32)
    half = jnp.asarray(np.maximum(0.5 * (high - low), 1e-6), jnp.float32)
    n, A, P = low.shape[0], ctx.num_agents, ctx.num_products
    own = np.arange(ctx.group_offset, ctx.group_offset + A)
    rivals = np.asarray([[s for s in range(n) if s != o] for o in own], np.int32)  # [A, R]
    if rivals.shape[1] == 0:
        raise ConfigError(where, ctx.group, "a market with at least one other seller "
                          "(the model's inputs include the rivals' prices)")
    mean = settings["rivals"] == "mean"
    names = [g for g, _ in ctx.seller_groups]

    with_obs = settings.get("observation", False)

    def inputs(prices, obs=None):
        prices = jnp.concatenate([prices[g] for g in names], axis=1)          # [E, n, P]
        u = (prices - mid) / half
        x_own = u[:, own]                                                     # [E, A, P]
        x_riv = u[:, rivals]                                                  # [E, A, R, P]
        x_riv = x_riv.mean(2) if mean else x_riv.reshape(x_riv.shape[:2] + (-1,))
        parts = [x_own, x_riv] + ([jnp.asarray(obs, jnp.float32)] if with_obs else [])
        return jnp.concatenate(parts, axis=-1)

    return inputs, P + (P if mean else rivals.shape[1] * P) + (ctx.obs_dim if with_obs else 0)


def make_demand(settings: Mapping[str, Any], ctx: ModelContext):
    where = f"learners.{ctx.group}.external_model"
    inputs, in_dim = price_inputs(settings, ctx, f"{where}.kind")
    q = jnp.asarray(np.maximum(ctx.queries, 1e-6), jnp.float32)                # [P]
    own = slice(ctx.group_offset, ctx.group_offset + ctx.num_agents)
    fee_scale = q * jnp.asarray(np.maximum(ctx.seller_high[own], 1e-6), jnp.float32)  # [A, P]
    which = settings["targets"]
    g = ctx.group

    def make_io(transition, info):
        ys = []
        if which in ("traffic", "both"):
            ys.append(info["traffic"][g] / q)
        if which in ("fees", "both"):
            ys.append(info["fees"][g] / fee_scale)
        return inputs(info["prices"], transition.obs), jnp.concatenate(ys, axis=-1)

    out_dim = ctx.num_products * (2 if which == "both" else 1)
    return make_mlp_model(settings, in_dim, out_dim, make_io, inputs, ctx.num_products)


def make_reward(settings: Mapping[str, Any], ctx: ModelContext):
    where = f"learners.{ctx.group}.external_model"
    inputs, in_dim = price_inputs(settings, ctx, f"{where}.kind")
    scale = float(max(np.sum(ctx.queries) * np.max(ctx.seller_high), 1e-6))

    def make_io(transition, info):
        return inputs(info["prices"], transition.obs), transition.reward[..., None] / scale

    return make_mlp_model(settings, in_dim, 1, make_io, inputs, ctx.num_products)


MODELS.register(ModelDef("demand", make_demand, DEMAND_FIELDS,
                         doc="own price, rivals' prices -> own traffic and fees"))
MODELS.register(ModelDef("reward", make_reward, REWARD_FIELDS,
                         doc="own price, rivals' prices -> own reward"))
