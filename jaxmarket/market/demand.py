"""Demand processes: how many queries each consumer sends this step, in-graph.

A process is a pair of pure functions over a small state pytree:

    init(params, shape) -> state
    step(key, t, state, params, base) -> (queries, state)      base, queries: [n, P]

``params`` are float32 arrays (vmappable). Registry :data:`DEMANDS`, keyed by ``kind``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from jaxmarket.combinators.saturate import QUERY_MAX
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field
from jaxmarket.config.registry import Registry


@dataclass(frozen=True)
class DemandDef:
    kind: str
    init: Callable[[Mapping[str, jax.Array], tuple[int, int]], Any]
    step: Callable[..., tuple[jax.Array, Any]]
    params: Mapping[str, Field] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any], str], None] | None = None
    doc: str = ""
    # True when ``step`` ignores its key: a period's queries are a function of ``t`` and
    # the state alone (the static equilibrium then needs one key, not a sample of them)
    deterministic: bool = False


DEMANDS: Registry[DemandDef] = Registry("demand process")


def _no_state(params, shape):
    return jnp.zeros((), jnp.float32)


def constant_step(key, t, state, params, base):
    """queries_t = base."""
    return base, state


def noisy_step(key, t, state, params, base):
    """queries_t = base * max(0, 1 + sigma * eps), eps ~ N(0, 1) i.i.d. per consumer
    and product (multiplicative Gaussian noise, floored at zero)."""
    eps = jax.random.normal(key, base.shape)
    return base * jnp.maximum(0.0, 1.0 + params["sigma"] * eps), state


def cyclic_step(key, t, state, params, base):
    """queries_t = base * levels[(t // period) mod L]: each level is held for ``period``
    steps, then the next one, cycling."""
    levels = params["levels"]
    idx = (jnp.floor_divide(t, params["period"].astype(jnp.int32)) % levels.shape[0])
    return base * levels[idx], state


def regime_step(key, t, state, params, base):
    """queries_t = base * levels[k], k = number of switch steps <= t: demand switches
    regime at the scheduled steps (``levels`` has one more entry than ``steps``)."""
    k = jnp.sum(t >= params["steps"]).astype(jnp.int32)
    return base * params["levels"][k], state


def shocks_init(params, shape):
    return jnp.ones((), jnp.float32)


def shocks_step(key, t, state, params, base):
    """Random shocks to the group's demand level m (m_0 = 1):
    m_{t+1} = 1 + persistence * (m_t - 1) + B_t * size, B_t ~ Bernoulli(rate);
    queries_t = base * max(m_{t+1}, 0). The level saturates in ``[-1e35, 1e35]``
    (QUERY_MAX), so shocks of size 1e30 that pile up never overflow the state."""
    hit = jax.random.bernoulli(key, params["rate"]).astype(jnp.float32)
    m = 1.0 + params["persistence"] * (state - 1.0) + hit * params["size"]
    m = jnp.clip(m, -QUERY_MAX, QUERY_MAX)
    return base * jnp.maximum(m, 0.0), m


def _check_regime(values: Mapping[str, Any], where: str) -> None:
    steps, levels = values["steps"], values["levels"]
    if len(levels) != len(steps) + 1:
        raise ConfigError(f"{where}.levels", list(levels),
                          f"a list of {len(steps) + 1} numbers (one more than steps)")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ConfigError(f"{where}.steps", list(steps), "strictly increasing step numbers")


#: the demand process of a consumer group that declares none
DEFAULT_DEMAND = "constant"

DEMANDS.register(DemandDef("constant", _no_state, constant_step, {}, doc=constant_step.__doc__,
                           deterministic=True))
DEMANDS.register(DemandDef("noisy", _no_state, noisy_step,
                           {"sigma": Field("float", 0.1, low=0.0, doc="noise scale")},
                           doc=noisy_step.__doc__))
DEMANDS.register(DemandDef("cyclic", _no_state, cyclic_step,
                           {"period": Field("int", 10, low=1, doc="steps per level"),
                            "levels": Field("floats", (1.0,), low=0.0, doc="demand multipliers")},
                           doc=cyclic_step.__doc__, deterministic=True))
DEMANDS.register(DemandDef("regime", _no_state, regime_step,
                           {"steps": Field("ints", (), low=0, doc="switch steps"),
                            "levels": Field("floats", (1.0,), low=0.0,
                                            doc="multiplier per regime")},
                           check=_check_regime, doc=regime_step.__doc__, deterministic=True))
DEMANDS.register(DemandDef("shocks", shocks_init, shocks_step,
                           {"rate": Field("float", 0.01, low=0.0, high=1.0,
                                          doc="shock probability"),
                            "size": Field("float", 0.5, doc="jump of the demand level"),
                            "persistence": Field("float", 0.9, low=0.0, high=1.0,
                                                 doc="decay of the level towards 1")},
                           doc=shocks_step.__doc__))
