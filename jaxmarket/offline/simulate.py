"""Ground truth: the value of a policy in the simulator that produced the data.

``policy_value(scenario, group, policy, steps, gamma)`` resets all the scenario's markets
and rolls them ``steps`` steps in one jitted ``lax.scan`` with ``group`` acting by
``policy(obs [E*A, D]) -> action [E*A, P]`` (environment units) and every other agent
group by its scenario learner (the same behaviour as in ``collect``, without noise). It
returns, averaged over the group's agents and all markets,

    mean_reward        (1 / H) sum_t r_t
    discounted_return  sum_{t < H} gamma^t r_t          (H = steps; gamma^H is the bias)

Markets are vmapped; a policy that is a function of a learner state is jitted once and
the state passed as an argument, so evaluating it between training chunks recompiles
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.dataset import Dataset
from jaxmarket.offline.scenario import Scenario, load_scenario, make_step


def rollout_fn(sc: Scenario, group: str, steps: int, gamma: float, stochastic: bool = False):
    """``run(policy_fn, key) -> {"mean_reward", "discounted_return"}`` (pure; jit it
    with ``policy_fn`` closed over a state argument). ``stochastic``: the policy is
    ``policy_fn(obs, key)``."""
    if group not in sc.groups:
        raise ConfigError("group", group, "one of the agent groups " + ", ".join(sc.groups))

    def run(policy: Callable, key: jax.Array) -> dict:
        def act(obs, k, base, aux):
            del base, aux
            return (policy(obs, k) if stochastic else policy(obs)), {}

        reset, step = make_step(sc, {group: act})
        k_reset, k_run = jax.random.split(key)
        carry = reset(k_reset)

        def body(c, inp):
            k, t = inp
            c, rows = step(c, k)
            return c, rows[group]["rewards"].mean() * jnp.stack([1.0, gamma ** t])

        ts = jnp.arange(steps, dtype=jnp.float32)
        _, out = jax.lax.scan(body, carry, (jax.random.split(k_run, steps), ts))
        return {"mean_reward": out[:, 0].mean(), "discounted_return": out[:, 1].sum()}

    return run


def policy_value(scenario: Scenario | dict | str, group: str, policy: Callable,
                 steps: int = 200, gamma: float = 0.9, seed: int = 0,
                 stochastic: bool = False) -> dict[str, float]:
    """The simulated value of ``policy`` for ``group`` (see the module docstring);
    ``stochastic``: ``policy(obs, key)``."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    run = rollout_fn(sc, group, steps, gamma, stochastic)
    out = jax.jit(lambda k: run(policy, k))(jax.random.key(seed))
    return {k: float(v) for k, v in out.items()}


class SimulatorValue:
    """Evaluator: the learned policy's value in the dataset's scenario (ground truth)."""

    def __init__(self, dataset_or_scenario: Any, group: str | None = None, steps: int = 200,
                 gamma: float = 0.9, seed: int = 0, num_markets: int | None = None):
        ds = None
        if isinstance(dataset_or_scenario, Dataset):
            ds = dataset_or_scenario
            config = ds.meta.get("config")
            if config is None:
                raise ConfigError("evaluator sim", "a dataset without a scenario",
                                  "a dataset made by jaxmarket.collect (its manifest holds the "
                                  "scenario)")
            group = group or ds.meta["group"]
            dataset_or_scenario = config
        if isinstance(dataset_or_scenario, Scenario):
            sc = dataset_or_scenario
        else:
            overrides = [] if num_markets is None else [f"train.num_envs={num_markets}",
                                                        "train.num_seeds=1"]
            sc = load_scenario(dataset_or_scenario, overrides=overrides)
        self.group = group or sc.groups[0]
        if self.group not in sc.groups:
            raise ConfigError("evaluator sim group", self.group,
                              "one of the scenario's agent groups " + ", ".join(sc.groups))
        if ds is not None:
            want = (int(sc.specs[self.group].obs_dim), sc.env.spec.num_products)
            if (ds.obs_dim, ds.action_dim) != want:
                raise ConfigError("evaluator sim", f"a dataset with obs_dim {ds.obs_dim} and "
                                  f"action_dim {ds.action_dim}", f"the spaces of group "
                                  f"{self.group} of its scenario: obs_dim {want[0]}, "
                                  f"action_dim {want[1]}")
        self.key = jax.random.key(seed)
        self._run = rollout_fn(sc, self.group, steps, gamma)
        self._cache: dict[int, Callable] = {}

    def graph(self, algo, state) -> dict:
        """The same value as a pure function (for ``fit(graph_evaluators=...)``)."""
        return self._run(lambda obs: algo.policy(state, obs), self.key)

    def __call__(self, algo, state) -> dict[str, float]:
        fn = self._cache.get(id(algo))
        if fn is None:
            fn = jax.jit(lambda s, k: self._run(lambda obs: algo.policy(s, obs), k))
            self._cache[id(algo)] = fn
        return {k: float(v) for k, v in fn(state, self.key).items()}


__all__ = ["SimulatorValue", "policy_value", "rollout_fn"]
