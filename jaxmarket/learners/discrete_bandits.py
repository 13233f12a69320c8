"""Discrete-price bandits over a price grid: ``epsilon_greedy``, ``ucb1``, ``ucb_tuned``,
``thompson`` and ``exp3``.

Arms. Each product ``p`` has its own ``G`` arms: the grid ``linspace(action_low,
action_high, grid_size)`` of the slot's bounds, or the explicit ``grid`` list (the same
prices for every product; they must lie within the action bounds). ``act`` picks one arm
per slot and product independently and returns ``action[a, p] = grid[a, p, arm]`` with
``aux["action_index"] = arm`` (int32 ``[A, P]``; ``exp3`` adds ``aux["prob"]``, the
probability with which the chosen arm was drawn). The joint reward ``r`` of a slot is
credited to the chosen arm of *every* product (independent per-product bandits).

Statistics are kept per policy, ``[num_policies, P, G]``: ``n`` (pulls), ``s`` (reward
sums), for ``ucb_tuned`` ``s2`` (sums of squared rewards) and, for ``exp3``, log-weights. Slots sharing a policy pool their statistics
(``update`` is a ``segment_sum`` over ``policy_index``, vectorised over the whole
``[T, A, P]`` batch). With ``N = sum_g n_g`` the pulls of the product so far and
``q_g = s_g / n_g`` the sample mean:

* ``epsilon_greedy``: with probability ``eps_N = max(epsilon_min, epsilon *
  epsilon_decay ** N)`` a uniformly random arm, else ``argmax_g q_g`` (``q_g =
  initial_value`` for an unpulled arm).
* ``ucb1``: an unpulled arm if any, else ``argmax_g q_g + c * sqrt(2 ln N / n_g)``.
* ``ucb_tuned`` (UCB-tuned, Auer, Cesa-Bianchi & Fischer 2002): an unpulled arm if any,
  else ``argmax_g q_g + sqrt((ln N / n_g) * min(variance_cap, V_g))`` with
  ``V_g = s2_g / n_g - q_g**2 + sqrt(2 ln N / n_g)`` (the empirical variance, floored at
  0 against rounding, plus its confidence bound); ``variance_cap`` is 1/4 by default, the
  largest variance of a reward in ``[0, 1]``.
* ``thompson``: Gaussian Thompson sampling with a Normal prior ``N(prior_mean,
  prior_var)`` on each arm's mean reward and Gaussian noise of known variance
  ``noise_var``; the conjugate posterior is ``N(m_g, 1 / lambda_g)`` with
  ``lambda_g = 1 / prior_var + n_g / noise_var`` and
  ``m_g = (prior_mean / prior_var + s_g / noise_var) / lambda_g``; draw
  ``theta_g`` from it and play ``argmax_g theta_g``.
* ``exp3``: ``pi_g = (1 - gamma) * w_g / sum_h w_h + gamma / G``; draw an arm from ``pi``;
  with ``x = clip((r - reward_low) / (reward_high - reward_low), 0, 1)`` the update is
  ``w_g <- w_g * exp(gamma * x / (pi_g * G))`` for the chosen arm (``pi_g`` the
  probability stored at ``act`` time), i.e. ``log w_g += gamma * x / (pi_g G)``.

Ties in an ``argmax`` are broken uniformly at random (from ``act``'s key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

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
from jaxmarket.learners.fixed import bounds, resolve_hyper
from jaxmarket.market.equilibrium import ActionSet

_GRID_FIELDS = {
    "grid_size": Field(kind="int", default=11, low=2,
                       doc="arms per product, evenly spanning action_low..action_high"),
    "grid": Field(kind="floats", default=None, optional=True,
                  doc="explicit arm prices (overrides grid_size), the same for every product"),
    "recent_window": Field(kind="int", default=0, low=0,
                           doc="keep the arms of each slot's last K pulls: the run summary's "
                               "recent_median_price (the median price of those K periods); "
                               "0: none"),
}

EPSILON_GREEDY_FIELDS = {
    **_GRID_FIELDS,
    "epsilon": Field(kind="float", default=0.1, low=0.0, high=1.0),
    "epsilon_decay": Field(kind="float", default=1.0, low=0.0, high=1.0,
                           doc="eps_N = max(epsilon_min, epsilon * epsilon_decay**N)"),
    "epsilon_min": Field(kind="float", default=0.0, low=0.0, high=1.0),
    "initial_value": Field(kind="float", default=0.0, doc="value estimate of an unpulled arm"),
}
UCB1_FIELDS = {
    **_GRID_FIELDS,
    "c": Field(kind="float", default=1.0, low=0.0, doc="exploration scale"),
}
UCB_TUNED_FIELDS = {
    **_GRID_FIELDS,
    "variance_cap": Field(kind="float", default=0.25, low=0.0, low_open=True,
                          doc="cap on an arm's variance bound V_g (1/4: rewards in [0, 1])"),
}
THOMPSON_FIELDS = {
    **_GRID_FIELDS,
    "prior_mean": Field(kind="float", default=0.0),
    "prior_var": Field(kind="float", default=1.0, low=0.0, low_open=True),
    "noise_var": Field(kind="float", default=1.0, low=0.0, low_open=True),
}
EXP3_FIELDS = {
    **_GRID_FIELDS,
    "gamma": Field(kind="float", default=0.1, low=0.0, low_open=True, high=1.0),
    "reward_low": Field(kind="float", default=0.0),
    "reward_high": Field(kind="float", default=1.0),
}
FIELDS = {"epsilon_greedy": EPSILON_GREEDY_FIELDS, "ucb1": UCB1_FIELDS,
          "ucb_tuned": UCB_TUNED_FIELDS, "thompson": THOMPSON_FIELDS, "exp3": EXP3_FIELDS}


@struct.dataclass
class DiscreteBanditState:
    counts: jax.Array       # [N, P, G] pulls per arm
    sums: jax.Array         # [N, P, G] reward sums per arm
    log_weights: jax.Array  # [N, P, G] exp3 log-weights (zeros for the others)


@struct.dataclass
class UCBTunedState(DiscreteBanditState):
    """``ucb_tuned``'s statistics: the shared ones and the sums of squared rewards."""

    sq_sums: jax.Array      # [N, P, G] sums of squared rewards per arm


@struct.dataclass
class RecentArms:
    """A bandit's statistics (``stats``) with the arms of each slot's last ``K`` pulls
    (``recent_window: K``): ``arms [K, A, P]`` a ring buffer (-1 where not yet written),
    ``pulls`` the pulls each slot has recorded (every slot pulls every period)."""

    stats: DiscreteBanditState
    arms: jax.Array         # [K, A, P] int32
    pulls: jax.Array        # [] int32


def argmax_random(values: jax.Array, key: jax.Array) -> jax.Array:
    """``argmax`` over the last axis with ties broken uniformly at random."""
    best = values >= values.max(-1, keepdims=True)
    noise = jax.random.uniform(key, values.shape)
    return jnp.argmax(jnp.where(best, noise, -1.0), axis=-1).astype(jnp.int32)


def make_grid(h: Mapping[str, Any], spec: LearnerSpec, kind: str) -> np.ndarray:
    """The arms ``[A, P, G]``."""
    low, high = bounds(spec)
    if h["grid"] is not None:
        grid = np.asarray(h["grid"], dtype=np.float32)
        if np.any(grid < low[..., None]) or np.any(grid > high[..., None]):
            raise ConfigError(f"learners.{kind}.grid", list(h["grid"]),
                              "prices within every slot's action bounds "
                              f"[{float(low.max()):g}, {float(high.min()):g}]")
        return np.broadcast_to(grid, low.shape + grid.shape).astype(np.float32)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError(f"learners.{kind}.grid", None,
                          "an explicit grid (the action bounds are infinite)")
    frac = np.linspace(0.0, 1.0, h["grid_size"], dtype=np.float32)
    return (low[..., None] + (high - low)[..., None] * frac).astype(np.float32)


@dataclass(frozen=True)
class DiscreteBanditSettings:
    """A discrete bandit's resolved settings (static)."""

    kind: str                       # epsilon_greedy | ucb1 | ucb_tuned | thompson | exp3
    grid: StaticArray               # [A, P, G] float32 arm prices
    num_policies: int
    num_products: int
    policy_index: tuple[int, ...]   # [A] slot -> policy
    hyper: tuple[tuple[str, Any], ...]   # the kind's resolved hyper-parameters
    recent_window: int = 0          # K: the arms of each slot's last K pulls kept

    @property
    def num_arms(self) -> int:
        return self.grid.shape[-1]

    def h(self, name: str) -> Any:
        return dict(self.hyper)[name]


def _index(settings: DiscreteBanditSettings) -> jax.Array:
    return jnp.asarray(settings.policy_index, dtype=jnp.int32)


def init(settings: DiscreteBanditSettings, key, spec=None):
    del key, spec
    zeros = jnp.zeros((settings.num_policies, settings.num_products, settings.num_arms),
                      jnp.float32)
    if settings.kind == "ucb_tuned":
        stats = UCBTunedState(counts=zeros, sums=zeros, log_weights=zeros, sq_sums=zeros)
    else:
        stats = DiscreteBanditState(counts=zeros, sums=zeros, log_weights=zeros)
    if not settings.recent_window:
        return stats
    shape = (settings.recent_window, len(settings.policy_index), settings.num_products)
    return RecentArms(stats=stats, arms=jnp.full(shape, -1, jnp.int32),
                      pulls=jnp.zeros((), jnp.int32))


def _stats(state) -> DiscreteBanditState:
    return state.stats if isinstance(state, RecentArms) else state


def record_recent(state: RecentArms, arm: jax.Array) -> RecentArms:
    """The ring buffer after the pulls ``arm [T, A, P]`` (in period order): pull ``i``
    (counting from 0) is stored at row ``i mod K``; of more than ``K`` new pulls only the
    last ``K`` are written (each row once)."""
    K, T = state.arms.shape[0], arm.shape[0]
    first = max(T - K, 0)
    rows = (state.pulls + first + jnp.arange(T - first, dtype=jnp.int32)) % K
    return state.replace(arms=state.arms.at[rows].set(arm[first:].astype(jnp.int32)),
                         pulls=state.pulls + T)


def recent_median(settings: DiscreteBanditSettings, state: RecentArms) -> jax.Array:
    """``[A, P]`` each slot's median price over its last ``min(pulls, K)`` pulls
    (``numpy.median``: the mean of the two middle prices of an even count; NaN before
    the first pull)."""
    K = state.arms.shape[0]
    grid = jnp.asarray(settings.grid.array)                          # [A, P, G]
    arms = jnp.moveaxis(state.arms, 0, -1)                           # [A, P, K]
    prices = jnp.take_along_axis(grid, jnp.maximum(arms, 0), -1)
    n = jnp.minimum(state.pulls, K)
    ordered = jnp.sort(jnp.where(arms >= 0, prices, jnp.inf), axis=-1)
    lo = jnp.take(ordered, jnp.maximum((n - 1) // 2, 0), axis=-1)
    hi = jnp.take(ordered, jnp.minimum(n // 2, K - 1), axis=-1)
    return jnp.where(n > 0, 0.5 * (lo + hi), jnp.nan)


def readout(kind: str, hyper: Mapping[str, Any], spec: LearnerSpec,
            state: Any) -> dict[str, jax.Array]:
    """What the run summary reports of a trained bandit: with ``recent_window``,
    ``{"recent_median": [A, P]}`` (:func:`recent_median`); else nothing."""
    if not isinstance(state, RecentArms):
        return {}
    return {"recent_median": recent_median(discrete_bandit_settings(kind, hyper, spec), state)}


def choose(settings: DiscreteBanditSettings, state: DiscreteBanditState, key):
    """``(arm [A, P] int32, aux)`` for every slot and product."""
    state = _stats(state)
    kind, h, num_arms = settings.kind, settings.h, settings.num_arms
    index = _index(settings)
    n = state.counts[index]                            # [A, P, G]
    s = state.sums[index]
    pulls = n.sum(-1)                                  # [A, P]
    k_tie, k_draw, k_explore = jax.random.split(key, 3)
    aux = {}
    if kind == "epsilon_greedy":
        q = jnp.where(n > 0, s / jnp.maximum(n, 1.0), h("initial_value"))
        greedy = argmax_random(q, k_tie)
        eps = jnp.maximum(h("epsilon_min"), h("epsilon") * h("epsilon_decay") ** pulls)
        explore = jax.random.randint(k_explore, pulls.shape, 0, num_arms, jnp.int32)
        arm = jnp.where(jax.random.uniform(k_draw, pulls.shape) < eps, explore, greedy)
    elif kind == "ucb1":
        q = s / jnp.maximum(n, 1.0)
        bonus = h("c") * jnp.sqrt(2.0 * jnp.log(jnp.maximum(pulls, 1.0))[..., None]
                                  / jnp.maximum(n, 1.0))
        arm = argmax_random(jnp.where(n > 0, q + bonus, jnp.inf), k_tie)
    elif kind == "ucb_tuned":
        index_g = ucb_tuned_index(n, s, state.sq_sums[index], h("variance_cap"))
        arm = argmax_random(jnp.where(n > 0, index_g, jnp.inf), k_tie)
    elif kind == "thompson":
        mean, var = thompson_posterior(n, s, h("prior_mean"), h("prior_var"), h("noise_var"))
        theta = mean + jax.random.normal(k_draw, mean.shape) * jnp.sqrt(var)
        arm = argmax_random(theta, k_tie)
    else:  # exp3
        probs = exp3_probs(state.log_weights[index], h("gamma"))
        arm = jax.random.categorical(k_draw, jnp.log(probs), axis=-1).astype(jnp.int32)
        aux["prob"] = jnp.take_along_axis(probs, arm[..., None], -1)[..., 0]
    aux["action_index"] = arm
    return arm, aux


def act(settings: DiscreteBanditSettings, state: DiscreteBanditState, obs, key):
    del obs
    arm, aux = choose(settings, state, key)
    grid = jnp.asarray(settings.grid.array)
    action = jnp.take_along_axis(grid, arm[..., None], -1)[..., 0]
    return action, aux


def update(settings: DiscreteBanditSettings, state: Any, batch: Transition):
    if isinstance(state, RecentArms):
        stats, metrics = update(settings, state.stats, batch)
        arm = jnp.asarray(batch.aux["action_index"], jnp.int32)      # [T, A, P]
        return record_recent(state.replace(stats=stats), arm), metrics
    num_policies, num_products, num_arms = (settings.num_policies, settings.num_products,
                                            settings.num_arms)
    arm = jnp.asarray(batch.aux["action_index"], jnp.int32)      # [T, A, P]
    reward = jnp.broadcast_to(jnp.asarray(batch.reward, jnp.float32)[..., None], arm.shape)
    policy = jnp.broadcast_to(_index(settings)[None, :, None], arm.shape)
    product = jnp.broadcast_to(jnp.arange(num_products)[None, None, :], arm.shape)
    segment = ((policy * num_products + product) * num_arms + arm).reshape(-1)
    size = num_policies * num_products * num_arms
    shape = (num_policies, num_products, num_arms)

    def scatter(x):
        return jax.ops.segment_sum(x.reshape(-1), segment, num_segments=size).reshape(shape)

    counts = state.counts + scatter(jnp.ones_like(reward))
    sums = state.sums + scatter(reward)
    log_w = state.log_weights
    if settings.kind == "exp3":
        low, high, gamma = settings.h("reward_low"), settings.h("reward_high"), settings.h("gamma")
        x = jnp.clip((reward - low) / (high - low), 0.0, 1.0)
        prob = jnp.asarray(batch.aux["prob"], jnp.float32)
        log_w = log_w + scatter(gamma * x / (prob * num_arms))
        log_w = log_w - log_w.max(-1, keepdims=True)
    metrics = {"reward": jnp.mean(batch.reward)}
    if settings.kind == "ucb_tuned":
        return state.replace(counts=counts, sums=sums, log_weights=log_w,
                             sq_sums=state.sq_sums + scatter(reward * reward)), metrics
    return DiscreteBanditState(counts=counts, sums=sums, log_weights=log_w), metrics


def discrete_bandit_settings(kind: str, hyper: Mapping[str, Any],
                             spec: LearnerSpec) -> DiscreteBanditSettings:
    """Validate ``hyper`` for ``kind`` against ``spec`` (numpy only, nothing traced)."""
    h = resolve_hyper(FIELDS[kind], hyper, kind)
    grid = make_grid(h, spec, kind)                    # [A, P, G]
    if kind == "exp3" and not h["reward_high"] > h["reward_low"]:
        raise ConfigError("learners.exp3.reward_high", h["reward_high"],
                          f"a number > reward_low ({h['reward_low']:g})")
    hyper_items = tuple((name, h[name]) for name in FIELDS[kind] if name not in _GRID_FIELDS)
    return DiscreteBanditSettings(
        kind=kind, grid=StaticArray(grid), num_policies=spec.policies,
        num_products=spec.num_products,
        policy_index=tuple(int(i) for i in np.asarray(spec.index())), hyper=hyper_items,
        recent_window=int(h["recent_window"]))


def make_discrete_bandit(kind: str, hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    settings = discrete_bandit_settings(kind, hyper, spec)
    return Learner(partial(init, settings), partial(act, settings), partial(update, settings))


def make_epsilon_greedy(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_discrete_bandit("epsilon_greedy", hyper, spec)


def make_ucb1(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_discrete_bandit("ucb1", hyper, spec)


def make_ucb_tuned(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_discrete_bandit("ucb_tuned", hyper, spec)


def make_thompson(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_discrete_bandit("thompson", hyper, spec)


def make_exp3(hyper: Mapping[str, Any], spec: LearnerSpec) -> Learner:
    return make_discrete_bandit("exp3", hyper, spec)


def ucb_tuned_index(counts, sums, sq_sums, variance_cap):
    """UCB-tuned's index of each arm (over the last axis, ``N`` its sum of ``counts``):
    ``q + sqrt((ln N / n) * min(variance_cap, V))``, ``V = s2 / n - q**2 + sqrt(2 ln N /
    n)``, ``q = s / n``. Meaningful for pulled arms only (``n > 0``)."""
    n = jnp.maximum(counts, 1.0)
    log_pulls = jnp.log(jnp.maximum(counts.sum(-1, keepdims=True), 1.0))
    q = sums / n
    var = jnp.maximum(sq_sums / n - q * q, 0.0) + jnp.sqrt(2.0 * log_pulls / n)
    return q + jnp.sqrt(log_pulls / n * jnp.minimum(variance_cap, var))


def thompson_posterior(counts, sums, prior_mean, prior_var, noise_var):
    """Normal-Normal conjugate posterior ``(mean, var)`` of each arm's mean reward after
    ``counts`` observations summing to ``sums``: ``var = 1 / (1 / prior_var + n /
    noise_var)``, ``mean = var * (prior_mean / prior_var + s / noise_var)``."""
    precision = 1.0 / prior_var + counts / noise_var
    return (prior_mean / prior_var + sums / noise_var) / precision, 1.0 / precision


def exp3_probs(log_weights: jax.Array, gamma: float) -> jax.Array:
    """``(1 - gamma) * softmax(log_w) + gamma / G`` over the last axis."""
    return (1.0 - gamma) * jax.nn.softmax(log_weights, axis=-1) + gamma / log_weights.shape[-1]


def arms(kind: str, hyper: Mapping[str, Any], spec: LearnerSpec, n: int) -> ActionSet:
    """The static game's actions of one market's ``n`` agents: their arms per agent and
    product."""
    return ActionSet.from_grid(np.asarray(discrete_bandit_settings(kind, hyper, spec).grid)[:n])


# the equilibrium solver plays their arms; a league snapshot freezes every statistic
# (the default); no hyperparameter is worth mutating per member (no PBT); with
# recent_window the summary reports each slot's recent median price (readout)
LEARNERS.register(LearnerDef("epsilon_greedy", make_epsilon_greedy, EPSILON_GREEDY_FIELDS,
                             doc="epsilon-greedy over a price grid per product",
                             action_set=partial(arms, "epsilon_greedy"),
                             readout=partial(readout, "epsilon_greedy")))
LEARNERS.register(LearnerDef("ucb1", make_ucb1, UCB1_FIELDS,
                             doc="UCB1 over a price grid per product",
                             action_set=partial(arms, "ucb1"),
                             readout=partial(readout, "ucb1")))
LEARNERS.register(LearnerDef("ucb_tuned", make_ucb_tuned, UCB_TUNED_FIELDS,
                             doc="UCB-tuned over a price grid per product",
                             action_set=partial(arms, "ucb_tuned"),
                             readout=partial(readout, "ucb_tuned")))
LEARNERS.register(LearnerDef("thompson", make_thompson, THOMPSON_FIELDS,
                             doc="Gaussian Thompson sampling over a price grid per product",
                             action_set=partial(arms, "thompson"),
                             readout=partial(readout, "thompson")))
LEARNERS.register(LearnerDef("exp3", make_exp3, EXP3_FIELDS,
                             doc="EXP3 over a price grid per product",
                             action_set=partial(arms, "exp3"),
                             readout=partial(readout, "exp3")))
