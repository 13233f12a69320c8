"""POI fields ("points of interest": where the external model has most to learn), one
registry of pure functions ``poi(model, state, x [B, I], y [B, O]) -> [B]`` (``y``, the
targets, is read only by the kinds that need them). :func:`make_poi` binds the model:
``poi(state, x, y) -> [B]``.

With ``f_m`` the ``M`` members' predictions (``[O]`` each), ``O`` output dims:

``zero``          ``poi(x) = 0`` (the model trains, nothing steers exploration).
``disagreement``  the ensemble's spread, averaged over output dims::

                      poi(x) = (1/O) sum_o std_m f_m(x)_o      (population std over m)

                  With one member and ``dropout > 0``: MC-dropout, the same std over
                  ``mc_passes`` stochastic passes (EMMA: 30 passes, p = 0.5).
``gradient``      the norm of the per-example parameter gradient of the loss::

                      poi(x, y) = || grad_theta l(theta; x, y) ||_2,
                      l = (1/M) sum_m ||f_m(x) - y||^2 / O

                  (``signed: true``: EMMA's signed mean, the mean of the gradient's
                  components instead of its norm).
``error``         the ensemble-mean prediction's squared error where the target is
                  known::

                      poi(x, y) = || mean_m f_m(x) - y ||^2 / O
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from jaxmarket.config.fields import Field
from jaxmarket.config.registry import Registry


@dataclass(frozen=True)
class PoiDef:
    kind: str
    fn: Callable            # fn(model, state, x, y, settings) -> [B]
    needs_spread: bool = False   # an ensemble (M > 1) or MC-dropout
    needs_target: bool = False   # reads y: only where the target is known
    fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""


POI_FIELDS: Registry[PoiDef] = Registry("POI field")




def zero(model, state, x, y, settings):
    return jnp.zeros(x.shape[:1], jnp.float32)


def disagreement(model, state, x, y, settings):
    if model.num_members > 1:
        preds = model.predict(state.params, x)                                # [M, B, O]
    else:   # MC-dropout: passes x members
        keys = jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(state.key), 7),
                                settings["mc_passes"])
        preds = jax.vmap(lambda k: model.predict(state.params, x, k)[0])(keys)  # [K, B, O]
    return preds.std(0).mean(-1)


def gradient(model, state, x, y, settings):
    M = model.num_members

    def one(xi, yi):
        w = jnp.ones((M, 1), jnp.float32)
        g = jax.grad(model.loss)(state.params, xi[None], yi[None], w)
        leaves = jax.tree.leaves(g)
        if settings["signed"]:
            return sum(v.sum() for v in leaves) / sum(v.size for v in leaves)
        return jnp.sqrt(sum(jnp.sum(jnp.square(v)) for v in leaves))

    # the loss sums the members' losses: divide by M for the mean member loss
    return jax.vmap(one)(x, y) / M


def error(model, state, x, y, settings):
    pred = model.predict(state.params, x).mean(0)
    return jnp.square(pred - y).mean(-1)


POI_FIELDS.register(PoiDef("zero", zero, doc="no exploration signal (the baseline)"))
POI_FIELDS.register(PoiDef("disagreement", disagreement, needs_spread=True,
                           fields={"mc_passes": Field("int", 30, low=2,
                                                      doc="MC-dropout passes (one member)")},
                           doc="ensemble std (or MC-dropout std), mean over outputs"))
POI_FIELDS.register(PoiDef("gradient", gradient, needs_target=True,
                           fields={"signed": Field("bool", False,
                                                   doc="EMMA's signed mean instead of the norm")},
                           doc="per-example parameter-gradient norm of the loss"))
POI_FIELDS.register(PoiDef("error", error, needs_target=True,
                           doc="squared error of the ensemble mean"))


def make_poi(kind: str, model, settings: Mapping[str, Any] | None = None) -> Callable:
    """``poi(state, x [B, I], y [B, O]) -> [B]`` of a registered kind for ``model``."""
    d = POI_FIELDS[kind]
    opts = {name: f.default for name, f in d.fields.items()}
    opts.update({k: v for k, v in (settings or {}).items() if k in d.fields})

    def poi(state: Any, x, y=None):
        if y is None:
            y = jnp.zeros(x.shape[:1] + (model.out_dim,), jnp.float32)
        return d.fn(model, state, x, y, opts).astype(jnp.float32)

    return poi
