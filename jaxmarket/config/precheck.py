"""The commands' quick checks: a loaded config's first configuration error, found
before jax and the training stack are imported, so ``train`` and ``check`` answer a
bad value in about a second (docs/configuration.md, "Start-up").

:func:`precheck` walks the config in the order the full validation does
(:func:`jaxmarket.train.plan.resolve`, and ``check``'s market-only description) with
the registries' ``Field`` tables as :mod:`jaxmarket.config.schema` holds them, and
raises the :class:`ConfigError` the full validation raises first, with the same
message. It covers the ``train:`` section and ``seed``, the ``market:`` section (its
groups, entity arrays, reward and observation components, demand process and
distributor) and, where every agent group observes nothing, the ``learners:`` names
and every group's kind and settings. Wherever the next check is one it does not
hold (a component's own ``check``, a reward's builder, the session engine's choice,
populations, PBT, external models, train.schedule, a learner's ``make``), it stops
and leaves the config to the full validation, which always runs next; so does a
process that has imported the registries already (kinds registered from Python are
only in those)."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxmarket.config import schema
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import INT32_MAX, check_mapping, lookup_kind, resolve_entity_array

# the modules that hold the registries: once one is imported, kinds may have been
# registered from Python, which the schema does not know
REGISTRY_MODULES = ("jaxmarket.learners.base", "jaxmarket.learners.population",
                    "jaxmarket.market.demand", "jaxmarket.market.distributors.base",
                    "jaxmarket.combinators.rewards", "jaxmarket.combinators.observations")
CONSUMER_ARRAYS = ("budget", "budget_low", "budget_high", "base_price", "queries")
SELLER_ARRAYS = ("low", "high", "initial", "cost", "quality", "reliability", "latency",
                 "freshness", "stake", "value")
LEARNER_KEYS = ("population", "mapping", "external_model")   # the loop's, not the learner's
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Defer(Exception):
    """The next check is not one the quick checks hold: the full validation decides."""


def precheck(config: Mapping[str, Any], command: str,
             say: Callable[[str], Any] | None = None) -> None:
    """Raise the first :class:`ConfigError` of ``config`` (as :func:`load_config` gave
    it) that ``command`` (``"train"`` or ``"check"``) would raise, where the quick
    checks can tell; return otherwise. ``say``: where ``train`` prints the line it
    prints before that error (``engine: loop (why not sessions)``)."""
    if any(m in sys.modules for m in REGISTRY_MODULES):
        return
    try:
        walk(config, command, say)
    except Defer:
        return


def walk(config: Mapping[str, Any], command: str,
         say: Callable[[str], Any] | None = None) -> None:
    """The checks in the full validation's order; :class:`Defer` where they stop."""
    learners = "learners" in config
    if not learners and command == "check":   # check's market-only description
        market(config["market"])
        train_section(config)
        return
    if learners and not isinstance(config["learners"], dict):
        raise Defer   # the engine choice reads it as a mapping
    reason = engine(train(config.get("train")), config.get("learners") or {})
    try:
        train_section(config)
        groups = market(config["market"])
        if not learners or config["market"].get("move_order") == "alternating":
            raise Defer   # the missing section's message shows the market; turns per group
        learner_section(config["learners"], groups)
    except ConfigError:
        if command == "train" and reason is not None and say is not None:
            say(f"engine: loop ({reason})")
        raise


# ------------------------------------------------------------------ train:

def train(raw: Any, where: str = "train") -> dict:
    """:func:`jaxmarket.train.config.resolve_train` up to ``train.schedule``."""
    vals = check_mapping(schema.TRAIN, raw or {}, where, ignore=())
    stop = vals["early_stop"]
    if stop is not None:
        ok = (isinstance(stop, dict) and isinstance(stop.get("metric"), str)
              and len(set(stop) & {"above", "below"}) == 1
              and set(stop) <= {"metric", "above", "below"})
        if not ok:
            raise ConfigError(f"{where}.early_stop", stop,
                              "{metric: NAME, above: NUMBER} or {metric: NAME, below: NUMBER}")
    if vals["schedule"] is not None:
        raise Defer
    value = vals["log_every"]
    if value != "auto" and not (isinstance(value, int) and not isinstance(value, bool)
                                and 1 <= value <= INT32_MAX):
        raise ConfigError(f"{where}.log_every", value, "'auto' or an integer >= 1 (iterations "
                          "between rows of metrics.csv and the per-seed file)")
    if vals["seeds_format"] == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError(f"{where}.seeds_format", "parquet", "csv, or parquet with pyarrow "
                          "installed (pip install 'jaxmarket[parquet]')")
    return vals


def train_section(config: Mapping[str, Any]) -> None:
    """``train:`` and ``seed`` (:func:`jaxmarket.train.plan.resolve_train_section`)."""
    train(config.get("train"))
    seed = config.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")


def engine(tcfg: dict, learners: Mapping[str, Any]) -> str | None:
    """``train.engine`` (:func:`jaxmarket.sessions.run.choose_engine`): None for the
    loop as asked, or why the loop runs (auto); the session engine's own choice (every
    learner a q_learning one) is not held here."""
    if tcfg["engine"] == "loop":
        return None
    kinds = {g: (v or {}).get("kind") if isinstance(v, dict) else v for g, v in learners.items()}
    if tcfg["engine"] == "sessions" or (kinds and all(k == "q_learning" for k in kinds.values())):
        raise Defer
    return ("the session engine plays q_learning sellers; learners: " +
            ", ".join(f"{g} {k}" for g, k in kinds.items()))


# ------------------------------------------------------------------ market:

def market(raw: Any, where: str = "market") -> list[dict]:
    """:func:`jaxmarket.market.spec.resolve_market`'s checks; the groups as
    ``{name, side, agent, observation}``, consumers first."""
    if not isinstance(raw, Mapping):
        raise ConfigError(where, raw, "a mapping with num_products, consumers, sellers, distributor")
    vals = check_mapping(schema.MARKET, raw, where, ignore=())
    P = vals["num_products"]
    taken: set = set()
    consumers, base = _groups(_as_list(vals["consumers"], f"{where}.consumers", "consumer"),
                              "consumer", P, f"{where}.consumers", taken)
    sellers, _ = _groups(_as_list(vals["sellers"], f"{where}.sellers", "seller"),
                         "seller", P, f"{where}.sellers", taken)
    kind, d = lookup_kind(vals["distributor"], schema.DISTRIBUTORS, f"{where}.distributor")
    check_mapping(d["fields"], vals["distributor"], f"{where}.distributor")
    if d["checked"]:
        raise Defer
    for i, g in enumerate(sellers):
        if g["action"] not in d["actions"]:
            raise ConfigError(f"{where}.sellers[{i}].action", g["action"],
                              f"one of {', '.join(d['actions'])} (the seller actions distributor "
                              f"{kind!r} accepts)")
    if not d["dense"] and any(g["action"] == "multiplier" for g in sellers):
        prices = np.concatenate(base)
        if np.any(prices != prices[0:1]):
            raise ConfigError(f"{where}.consumers[*].base_price", prices.tolist(),
                              f"the same base price for every consumer of a product with "
                              f"distributor {kind!r} and multiplier sellers (dense kinds: "
                              + ", ".join(k for k, x in schema.DISTRIBUTORS.items()
                                          if x["dense"]) + ")")
    _move_order(vals["move_order"], sum(g["count"] for g in sellers), vals["episode_length"],
                f"{where}.move_order")
    return consumers + sellers


def _as_list(value: Any, where: str, what: str) -> list:
    if not isinstance(value, list) or not value:
        raise ConfigError(where, value, f"a non-empty list of {what} groups")
    return value


def _groups(items: list, side: str, P: int, where: str, taken: set) -> tuple[list, list]:
    table = schema.CONSUMER if side == "consumer" else schema.SELLER
    groups, base = [], []
    for i, raw in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(at, raw, f"a mapping describing a {side} group")
        vals = check_mapping(table, raw, at, ignore=())
        name = vals["name"]
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"{at}.name", name, "an identifier (letters, digits, _)")
        if name in taken:
            raise ConfigError(f"{at}.name", name, "a group name not used by another group")
        taken.add(name)
        n = vals["count"]
        arrays = {key: resolve_entity_array(table[key], vals[key], f"{at}.{key}", n, P)
                  for key in (CONSUMER_ARRAYS if side == "consumer" else SELLER_ARRAYS)
                  if vals[key] is not None}
        agent = vals["agent"] if side == "consumer" else True
        if side == "seller" and np.any(arrays["low"] > arrays["high"]):
            raise ConfigError(f"{at}.low", raw.get("low", 0.0),
                              f"values <= high ({raw.get('high', 10.0)})")
        if side == "consumer":
            if agent and np.any(arrays["budget_low"] > arrays["budget_high"]):
                raise ConfigError(f"{at}.budget_low", raw.get("budget_low", 0.0),
                                  f"values <= budget_high ({raw.get('budget_high', 1.0)})")
            _demand(vals["demand"], f"{at}.demand")
            base.append(arrays["base_price"])
        reward, observation = vals["reward"], vals["observation"]
        if agent:
            if reward is None:
                reward = [{"kind": "profit"}] if side == "seller" else [{"kind": "regret_ratio"}]
            _rewards(reward, f"{at}.reward", side)
            _observations([] if observation is None else observation, f"{at}.observation")
        else:
            for key in ("reward", "observation"):
                if vals[key] is not None:
                    raise ConfigError(f"{at}.{key}", vals[key], "nothing: only agent groups "
                                      "(agent: true) have rewards and observations")
        groups.append({"name": name, "side": side, "agent": agent, "count": n,
                       "action": vals["action"] if side == "seller" else None,
                       "observation": observation})
    return groups, base


def _demand(raw: Any, where: str) -> None:
    raw = {"kind": "constant"} if raw is None else raw
    _, d = lookup_kind(raw, schema.DEMANDS, where)
    check_mapping(d["fields"], raw, where)
    if d["checked"]:
        raise Defer


def _rewards(config: Any, where: str, side: str) -> None:
    """:func:`jaxmarket.combinators.rewards.build_reward`'s checks, up to a component
    whose builder checks more."""
    if not isinstance(config, (list, tuple)):
        raise ConfigError(where, config, "a list of reward components like [{kind: profit}]")
    for i, item in enumerate(config):
        at = f"{where}[{i}]"
        kind, d = lookup_kind(item, schema.REWARDS, at)
        if side not in d["sides"]:
            allowed = sorted(k for k, x in schema.REWARDS.items() if side in x["sides"])
            raise ConfigError(f"{at}.kind", kind, f"for a {side} group one of " + ", ".join(allowed))
        check_mapping(d["fields"], item, at)
        if d["checked"]:
            raise Defer


def _observations(config: Any, where: str) -> None:
    """:func:`jaxmarket.combinators.observations.build_observation`'s checks."""
    if not isinstance(config, (list, tuple)):
        raise ConfigError(where, config, "a list of observation components like [{kind: own_price}]")
    for i, item in enumerate(config):
        at = f"{where}[{i}]"
        _, d = lookup_kind(item, schema.OBSERVATIONS, at)
        settings = check_mapping(d["fields"], item, at)
        if item["kind"] == "competitor_prices":
            summ = settings["summary"]
            ok = summ == "all" or (isinstance(summ, list) and summ and
                                   all(x in ("min", "mean", "max") for x in summ))
            if not ok:
                raise ConfigError(f"{at}.summary", summ, "'all' or a non-empty list from min, mean, max")


def _move_order(order: str, num_sellers: int, episode_length: int | None, where: str) -> None:
    if order != "alternating":
        return
    if num_sellers < 2:
        raise ConfigError(where, order, f"simultaneous (alternating moves need >= 2 sellers; "
                                        f"the market has {num_sellers})")
    if episode_length is not None and episode_length % num_sellers:
        raise ConfigError(where, order, f"simultaneous, or an episode_length that is a multiple "
                                        f"of the {num_sellers} sellers (got {episode_length})")


# ------------------------------------------------------------------ learners:

def learner_section(learners: dict, groups: list[dict], where: str = "learners") -> None:
    """:func:`jaxmarket.learners.controller.check_controller`'s checks: the names, then
    each agent group's kind, settings and move order. Only where no agent group
    observes anything and no group uses the loop's own keys (populations, external
    models): their checks come first."""
    learners = {g: ({k: v for k, v in c.items() if k != "pbt"} if isinstance(c, Mapping)
                    else c) for g, c in learners.items()}   # strip_pbt
    agents = [g for g in groups if g["agent"]]
    if any(g["observation"] for g in agents) or not agents:
        raise Defer
    if any(isinstance(c, Mapping) and any(k in c for k in LEARNER_KEYS)
           for c in learners.values()):
        raise Defer
    names = [g["name"] for g in agents]
    for name in learners:
        if name not in names:
            raise ConfigError(f"{where}.{name}", learners[name],
                              "a learner for one of the agent groups " + ", ".join(names))
    for name in names:
        if name not in learners:
            raise ConfigError(f"{where}.{name}", "<missing>",
                              f"a learner config (every agent group needs one: {', '.join(names)})")
    for name in names:   # check_controller: each group's kind, settings and move order
        at = f"{where}.{name}"
        kind, d = lookup_kind(learners[name], schema.LEARNERS, at,
                              "a mapping with a 'kind' key, e.g. {kind: ppo_bandit}")
        check_mapping(d["fields"], learners[name], at)
        if "simultaneous" not in d["move_orders"]:
            able = [k for k, x in schema.LEARNERS.items() if "simultaneous" in x["move_orders"]]
            raise ConfigError(f"{at}.kind", kind, "a learner that handles market.move_order "
                              "'simultaneous' (its action takes effect only in its turn): "
                              + ", ".join(able))
