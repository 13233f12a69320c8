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
import math
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxmarket.config import schema
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import (INT32_MAX, MAX_GROUPS, MAX_MARKET_AGENTS,
                                     MAX_UPDATE_EPOCHS, WORK_BUDGET, check_mapping,
                                     lookup_kind, resolve_entity_array)

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
    tcfg = train(config.get("train"))
    reason = engine(tcfg, config.get("learners") or {})
    try:
        train_section(config)
        check_groups(config["market"])
        groups = market(config["market"])
        if not learners:
            raise Defer   # the missing section's message shows the market
        check_work(tcfg, config["market"].get("num_products", 1), groups, config["learners"],
                   schema_epochs)
        if config["market"].get("move_order") == "alternating":
            raise Defer   # turns per group
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


# ------------------------------------------------------------------ sizes

def check_groups(market: Any) -> None:
    """At most :data:`~jaxmarket.config.fields.MAX_GROUPS` groups in ``market.consumers``
    and ``market.sellers`` together, counted before any group is read (a file listing
    12,000 groups is refused at once). Also :func:`jaxmarket.train.plan.resolve`'s."""
    if not isinstance(market, Mapping):
        return
    lists = {side: market.get(side) for side in ("consumers", "sellers")}
    sizes = {side: len(v) if isinstance(v, list) else 0 for side, v in lists.items()}
    if sum(sizes.values()) > MAX_GROUPS:
        side = max(sizes, key=lambda s: sizes[s])
        raise ConfigError(f"market.{side}", f"{sizes[side]} groups",
                          f"at most {MAX_GROUPS} groups in market.consumers and market.sellers "
                          f"together (jaxmarket.config.fields.MAX_GROUPS; the market lists "
                          f"{sum(sizes.values())}): each group is its own code in the traced "
                          f"step; give one group a count instead of listing its entities")


def schema_epochs(kind: str) -> Any:
    """The ``update_epochs`` Field of a learner kind in the jax-free schema (or None)."""
    entry = schema.LEARNERS.get(kind)
    return None if entry is None else entry["fields"].get("update_epochs")


def _epochs(config: Any, epochs_field: Callable[[str], Any]) -> int:
    """A group's learner's ``update_epochs`` (the default of its kind), read without
    validating it: 1 for a kind without it, or a value its own check will refuse."""
    kind = config.get("kind") if isinstance(config, Mapping) else None
    field = epochs_field(kind) if isinstance(kind, str) else None
    if field is None:
        return 1
    value = config.get("update_epochs", field.default)
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT32_MAX
    return value if ok else 1


def check_work(train: Mapping[str, Any], num_products: int, groups: list[Mapping],
               learners: Any, epochs_field: Callable[[str], Any]) -> None:
    """The run's sizes against the work budget (docs/configuration.md, "Sizes and the
    work budget"), before anything is built or traced: at most
    :data:`~jaxmarket.config.fields.MAX_MARKET_AGENTS` agents per market,
    :data:`~jaxmarket.config.fields.MAX_UPDATE_EPOCHS` epochs per update, and at most
    :data:`~jaxmarket.config.fields.WORK_BUDGET` entity-updates per compiled chunk.
    ``groups``: ``{name, side, count, agent}`` per group, consumers first; ``train``:
    the resolved ``train:`` values; ``epochs_field(kind)``: the kind's ``update_epochs``
    Field or None. The same function for the quick checks and
    :func:`jaxmarket.train.plan.resolve`, so both raise the same message."""
    index = {"consumer": 0, "seller": 0}
    rows = []   # (where, count, agent, epochs, group name)
    for g in groups:
        where = f"market.{g['side']}s[{index[g['side']]}]"
        index[g["side"]] += 1
        conf = learners.get(g["name"]) if isinstance(learners, Mapping) and g["agent"] else None
        rows.append((where, g["count"], g["agent"], _epochs(conf, epochs_field), g["name"]))
    agents = [r for r in rows if r[2]]
    total = sum(r[1] for r in agents)
    if total > MAX_MARKET_AGENTS:
        where, count = max(agents, key=lambda r: r[1])[:2]
        raise ConfigError(f"{where}.count", count,
                          f"at most {MAX_MARKET_AGENTS} agents per market in all (jaxmarket."
                          f"config.fields.MAX_MARKET_AGENTS; the market has {total}): the "
                          f"learners are built with Python work per agent slot")
    for where, _, _, epochs, name in agents:
        if epochs > MAX_UPDATE_EPOCHS:
            raise ConfigError(f"learners.{name}.update_epochs", epochs,
                              f"at most {MAX_UPDATE_EPOCHS} (jaxmarket.config.fields."
                              f"MAX_UPDATE_EPOCHS): an update's epochs are traced one by one")
    chunk = min(train["chunk_size"], train["num_iterations"])
    sizes = [("train.chunk_size", train["chunk_size"], chunk),
             ("train.rollout_length", train["rollout_length"], train["rollout_length"]),
             ("train.num_seeds", train["num_seeds"], train["num_seeds"]),
             ("train.num_envs", train["num_envs"], train["num_envs"]),
             ("market.num_products", num_products, num_products)]
    per_market = sum(r[1] * r[3] for r in rows)
    work = math.prod(s[2] for s in sizes) * per_market
    if work <= WORK_BUDGET:
        return
    where, count, _, epochs, name = max(rows, key=lambda r: r[1] * r[3])
    sizes += [(f"{where}.count", count, count),
              (f"learners.{name}.update_epochs", epochs, epochs)]
    field, value, _ = max(sizes, key=lambda s: s[2])
    raise ConfigError(field, value,
                      f"a compiled chunk of at most {_sci(WORK_BUDGET)} entity-updates (jaxmarket."
                      f"config.fields.WORK_BUDGET): min(train.chunk_size, num_iterations) x "
                      f"rollout_length x num_seeds x num_envs x market.num_products x the "
                      f"groups' count x update_epochs is {_sci(work)}; lower {field}, its "
                      f"biggest factor")


def _sci(n: int) -> str:
    return f"{n:.3g}".replace("e+0", "e").replace("e+", "e")


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
    checked = d["checked"]   # True, or the options that give the check something to check
    if checked is True or (checked and any(vals["distributor"].get(k) is not None
                                           for k in checked)):
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
    check_move_order(vals["move_order"], sum(g["count"] for g in sellers), vals["episode_length"],
                f"{where}.move_order")
    return consumers + sellers


def _as_list(value: Any, where: str, what: str) -> list:
    if not isinstance(value, list) or not value:
        raise ConfigError(where, value, f"a non-empty list of {what} groups")
    return value


def group_values(raw: Any, table: Mapping, at: str, side: str, taken: set) -> dict:
    """One ``market.<side>s[i]`` entry checked against its Field ``table``: a mapping, a
    ``name`` that is an identifier not used by another group (added to ``taken``); its
    values with defaults filled in. Shared by :func:`jaxmarket.market.spec.resolve_market`
    and the quick checks."""
    if not isinstance(raw, Mapping):
        raise ConfigError(at, raw, f"a mapping describing a {side} group")
    vals = check_mapping(table, raw, at, ignore=())
    name = vals["name"]
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"{at}.name", name, "an identifier (letters, digits, _)")
    if name in taken:
        raise ConfigError(f"{at}.name", name, "a group name not used by another group")
    taken.add(name)
    return vals


def _groups(items: list, side: str, P: int, where: str, taken: set) -> tuple[list, list]:
    table = schema.CONSUMER if side == "consumer" else schema.SELLER
    groups, base = [], []
    for i, raw in enumerate(items):
        at = f"{where}[{i}]"
        vals = group_values(raw, table, at, side, taken)
        name, n = vals["name"], vals["count"]
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
            check_summary(settings["summary"], f"{at}.summary")


def check_summary(summary: Any, where: str) -> None:
    """``competitor_prices``'s ``summary``: ``all`` or a non-empty list from min, mean,
    max. Shared by the observation's builder and the quick checks."""
    ok = summary == "all" or (isinstance(summary, list) and summary and
                              all(x in ("min", "mean", "max") for x in summary))
    if not ok:
        raise ConfigError(where, summary, "'all' or a non-empty list from min, mean, max")


def check_move_order(order: str, num_sellers: int, episode_length: int | None,
                     where: str) -> str:
    """``alternating`` needs two sellers or more, and an episode length (if any) that is a
    multiple of the number of sellers, so the turn order survives the reset. Shared by
    :func:`jaxmarket.market.spec.resolve_market` and the quick checks."""
    if order != "alternating":
        return order
    if num_sellers < 2:
        raise ConfigError(where, order, f"simultaneous (alternating moves need >= 2 sellers; "
                                        f"the market has {num_sellers})")
    if episode_length is not None and episode_length % num_sellers:
        raise ConfigError(where, order, f"simultaneous, or an episode_length that is a multiple "
                                        f"of the {num_sellers} sellers (got {episode_length})")
    return order


# ------------------------------------------------------------------ learners:

def check_learner_names(learners: Mapping, groups: list[str], where: str) -> None:
    """A learner config for every agent group and for no other name. Shared by
    :func:`jaxmarket.learners.controller.check_controller` and the quick checks."""
    for name in learners:
        if name not in groups:
            raise ConfigError(f"{where}.{name}", learners[name],
                              "a learner for one of the agent groups " + ", ".join(groups))
    for name in groups:
        if name not in learners:
            raise ConfigError(f"{where}.{name}", "<missing>",
                              f"a learner config (every agent group needs one: {', '.join(groups)})")


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
    check_learner_names(learners, names, where)
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
