"""Every setting is played or refused: for every field of every learner, distributor and
observation kind that the generated reference (``docs/fields.md``) lists, on each engine,
a change of its value either changes what the engine plays or is a ConfigError that
names the field.

The cases are read from the reference page at collection time (a field added to a
``Field`` table is on the page, ``tests/test_fields_reference.py``, and so a case here).
"What is played" is a fingerprint of the program the engine runs, never of the settings
as read: the loop's traced training program (the jaxprs of ``init`` and of one
iteration, with their constants: the market's params, the learners' initial state and
every closed-over setting) and the session engine's game (the jaxpr of the xla
backend's chunk with the game's tables as constants, the sessions' initial state, the
fees). A setting that is read but dropped on the way (``learners.sellers.memory: 2``
played with memory 1) leaves the fingerprint as it was. Nothing is compiled or trained.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re

import jax
import numpy as np
import pytest

# 263 cases, about a minute on 2 cores: run by .ci/run with the slow tests
pytestmark = pytest.mark.slow

from conftest import ROOT

from jaxmarket.combinators.observations import OBSERVATIONS
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import REQUIRED
from jaxmarket.learners.base import LEARNERS
from jaxmarket.market.distributors import DISTRIBUTORS

PAGE = ROOT / "docs" / "fields.md"
ENGINES = ("loop", "sessions")
SECTIONS = {"## `market.distributor` by kind": "distributor",
            "## Observation components by kind": "observation",
            "## `learners.<group>` by kind": "learner"}


def reference_fields() -> list[tuple[str, str, str]]:
    """``(family, kind, field)`` of every row of the reference's distributor,
    observation and learner sections."""
    out, family, kind = [], None, None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            family = SECTIONS.get(line.strip())
        elif line.startswith("### ") and family:
            kind = line.strip("# `")
        elif family and line.startswith("| `"):
            name = line.split("`")[1].rsplit(".", 1)[-1]
            out.append((family, kind, name))
    return out


def field_of(family: str, kind: str, name: str):
    if family == "learner":
        return LEARNERS[kind].hyper_fields[name]
    if family == "distributor":
        d = DISTRIBUTORS[kind]
        return {**d.params, **d.options}[name]
    return OBSERVATIONS[kind].fields[name]


# ------------------------------------------------------------------ the base configs

GROUP = "sellers"


def market(distributor: dict, observation: list | None = None, *, sellers: int = 2,
           consumers: list | None = None, **seller) -> dict:
    """A one-product market of ``sellers`` sellers (one group, ``GROUP``)."""
    group = {"name": GROUP, "count": sellers, "action": "price", "low": 1.0, "high": 2.0,
             "cost": 0.5, "quality": 1.0, "reward": [{"kind": "profit"}],
             "observation": [{"kind": "history", "k": 1}] if observation is None
             else observation, **seller}
    return {"num_products": 1,
            "consumers": consumers or [{"name": "consumers", "count": 1, "budget": 3.0}],
            "sellers": [group], "distributor": distributor}


def config(market_: dict, learner: dict, rollout_length: int = 1) -> dict:
    return {"market": market_, "learners": {GROUP: learner},
            "train": {"num_iterations": 4, "rollout_length": rollout_length, "num_seeds": 1,
                      "num_envs": 1, "chunk_size": 1}, "seed": 0}


LOGIT = {"kind": "logit", "temperature": 0.5}
Q = {"kind": "q_learning", "grid_size": 5, "memory": 1}

# the learner bases: each kind on the logit duopoly, with the observation it reads
LEARNER_BASES = {
    "q_learning": config(market(LOGIT), Q),
    # two steps per update: two minibatches possible
    "ppo": config(market(LOGIT), {"kind": "ppo", "hidden_sizes": [4], "num_minibatches": 1,
                                  "update_epochs": 1}, rollout_length=2),
    "constant": config(market(LOGIT, []), {"kind": "constant", "value": 1.5}),
    "schedule": config(market(LOGIT, []), {"kind": "schedule", "timestamps": [0, 2],
                                           "values": [1.2, 1.8]}),
    "undercut": config(market(LOGIT, [{"kind": "competitor_prices", "summary": ["min"]}]),
                       {"kind": "undercut"}),
    "random": config(market(LOGIT, []), {"kind": "random"}),
}
for _kind in ("epsilon_greedy", "exp3", "thompson", "ucb1", "ucb_tuned"):
    LEARNER_BASES[_kind] = config(market(LOGIT, []), {"kind": _kind, "grid_size": 4})
for _kind in ("ppo_bandit", "rolling_ppo_bandit", "vpg_bandit"):
    LEARNER_BASES[_kind] = config(market(LOGIT, []), {"kind": _kind, "buffer_length": 2})

# the distributor bases: each kind in a market of q_learning sellers (what the session
# engine plays), with a setting that makes each of its fields matter
DISTRIBUTOR_SETTINGS = {
    "cheapest": {},
    "cournot": {},
    "first_price": {},
    "second_price": {},
    "mixed_price": {},
    "isa_2022": {"mode": "expected"},
    "isa_greedy": {},
    "linear": {},
    "logit": {},
    "proportional": {},
}
DISTRIBUTOR_SELLERS = {
    "cournot": {"action": "quantity", "low": 0.0, "high": 1.0},
    "isa_2022": {"latency": 0.5, "freshness": 3.0, "stake": 50.0},
    "isa_greedy": {"latency": 0.5, "freshness": 3.0, "stake": 50.0},
}
DISTRIBUTOR_BASES = {
    kind: config(market({"kind": kind, **settings}, sellers=3,
                        **DISTRIBUTOR_SELLERS.get(kind, {})), Q)
    for kind, settings in DISTRIBUTOR_SETTINGS.items()}

# the observation bases: three sellers and two consumers (so that a summary over rivals
# or consumers is not the one value it summarises); the loop's learner is a PPO (any
# feature goes into its network), the session engine's the Q-learner
OBS_COMPONENTS = {
    "budgets": {"kind": "budgets", "summary": "mean"},
    "competitor_prices": {"kind": "competitor_prices", "summary": "all"},
    "history": {"kind": "history", "k": 1},
    "time": {"kind": "time", "period": 3.0},
}
TWO_CONSUMERS = [{"name": "consumers", "count": 2, "budget": [[2.5], [3.0]]}]
PPO = {"kind": "ppo", "hidden_sizes": [4], "num_minibatches": 1, "update_epochs": 1}
OBS_BASES = {
    kind: config(market(LOGIT, [component], sellers=3, consumers=TWO_CONSUMERS), PPO)
    for kind, component in OBS_COMPONENTS.items()}
OBS_SESSION_BASES = {
    kind: config(market(LOGIT, [component], sellers=3, consumers=TWO_CONSUMERS), Q)
    for kind, component in OBS_COMPONENTS.items() if kind in ("competitor_prices", "history")}

BASES = {"learner": LEARNER_BASES, "distributor": DISTRIBUTOR_BASES, "observation": OBS_BASES}

# bases the session engine plays (the test asserts it does): the q_learning learner,
# every distributor whose period is deterministic or has finitely many outcomes, the
# observations of the profile in force
SESSION_BASES = {
    "learner": {"q_learning": LEARNER_BASES["q_learning"]},
    "distributor": DISTRIBUTOR_BASES,
    "observation": OBS_SESSION_BASES,
}

# ------------------------------------------------------------------ the changes

class Several(tuple):
    """Several changed values of one field in :data:`VALUES` (a case each)."""

    def __new__(cls, *values):
        return super().__new__(cls, values)


# the value a case sets, where the generic rule below has none or a wrong one (a
# structured "any" field, a list that must pair with another, a bound tied to the base)
VALUES = {
    # learners
    ("learner", "q_learning", "grid_low"): 1.2,
    ("learner", "q_learning", "grid_high"): 1.8,
    ("learner", "q_learning", "grid"): [1.0, 1.3, 1.6, 2.0],
    # stateless, and the issue's memory 2 on a history of k: 1
    ("learner", "q_learning", "memory"): Several(0, 2),
    ("learner", "q_learning", "epsilon"): {"start": 0.5, "decay": 1e-3},
    ("learner", "q_learning", "boltzmann"): {"temperature": 1.0, "decay": 0.999},
    ("learner", "q_learning", "q_init"): Several("zero", ["random_rival", "zero"]),
    # one value, and one per firm (the second firm's changed)
    ("learner", "q_learning", "learning_rate"): Several(0.225, [0.15, 0.3]),
    ("learner", "q_learning", "discount"): Several(0.475, [0.95, 0.5]),
    ("learner", "q_learning", "exploration_decay"): Several(6e-6, [4e-6, 1e-5]),
    ("learner", "q_learning", "obs_grid"): {"low": 1.0, "high": 2.0, "size": 7},
    ("learner", "ppo", "hidden_sizes"): [5],
    ("learner", "ppo", "num_minibatches"): 2,
    ("learner", "ppo", "num_updates"): 7,
    ("learner", "constant", "value"): 1.6,
    ("learner", "schedule", "timestamps"): [0, 3],
    ("learner", "schedule", "values"): [1.2, 1.7],
    ("learner", "undercut", "amount"): 0.05,
    ("learner", "epsilon_greedy", "grid"): [1.0, 1.4, 2.0],
    ("learner", "exp3", "grid"): [1.0, 1.4, 2.0],
    ("learner", "thompson", "grid"): [1.0, 1.4, 2.0],
    ("learner", "ucb1", "grid"): [1.0, 1.4, 2.0],
    ("learner", "ucb_tuned", "grid"): [1.0, 1.4, 2.0],
    ("learner", "exp3", "reward_low"): -1.0,
    ("learner", "exp3", "reward_high"): 2.0,
    # distributors
    ("distributor", "cournot", "shock_values"): [0.8, 1.2],
    ("distributor", "cournot", "shock_probs"): [0.25, 0.75],
    ("distributor", "logit", "shock_values"): [-1.0, 1.0],
    ("distributor", "logit", "shock_probs"): [0.25, 0.75],
    ("distributor", "isa_greedy", "max_sellers"): 2,   # 3 or more: all three sellers
    ("distributor", "isa_greedy", "min_price_ratio"): 0.5,   # above fee / budget somewhere
    ("distributor", "first_price", "reserve"): 1.5,   # within the bids
    ("distributor", "second_price", "reserve"): 1.5,
    ("distributor", "mixed_price", "reserve"): 1.5,
    ("distributor", "first_price", "tie_order"): [2, 0, 1],
    ("distributor", "second_price", "tie_order"): [2, 0, 1],
    ("distributor", "mixed_price", "tie_order"): [2, 0, 1],
    # observations
    ("observation", "competitor_prices", "summary"): ["min", "mean"],
    ("observation", "time", "period"): 5.0,
}

LOW_BUDGET = ("market", "consumers", 0, "budget")

# settings of the base that a field needs to take effect, as its own documentation says
# (keys: a setting of the field's own section, or a path from the config's top)
CONTEXT = {
    # the discrete head's grid size
    ("learner", "ppo", "num_actions"): {"action_head": "discrete"},
    # anneal_lr needs the schedule's length, num_updates is that length
    ("learner", "ppo", "anneal_lr"): {"num_updates": 4},
    ("learner", "ppo", "num_updates"): {"anneal_lr": True, "num_updates": 4},
    # full feedback needs memory 0 (a stateless learner, no observation)
    ("learner", "q_learning", "feedback"): {"memory": 0, ("market", "sellers", 0,
                                                          "observation"): []},
    # a demand shock's values and probabilities: each changed with the other in place
    **{("distributor", kind, name): {"shock_values": values, "shock_probs": [0.5, 0.5]}
       for kind, values in (("cournot", [0.9, 1.1]), ("logit", [-0.5, 0.5]))
       for name in ("shock_values", "shock_probs")},
    # a consumer with no eligible seller: a budget below some prices (and, for logit, no
    # outside option)
    ("distributor", "cheapest", "no_eligible"): {LOW_BUDGET: 1.5},
    ("distributor", "proportional", "no_eligible"): {LOW_BUDGET: 1.5},
    ("distributor", "logit", "no_eligible"): {LOW_BUDGET: 1.5, "outside_option": False},
    # the priority of ties: order
    ("distributor", "first_price", "tie_order"): {"ties": "order"},
    ("distributor", "second_price", "tie_order"): {"ties": "order"},
    ("distributor", "mixed_price", "tie_order"): {"ties": "order"},
}

ANY = object()   # in a key of EQUIVALENT or REFUSED: every engine, or every value


def entry(table: dict, engine: str, family: str, kind: str, name: str, value):
    """The reason ``table`` gives for a case, or None."""
    for (e, f, k, n, v), why in table.items():
        if (f, k, n) == (family, kind, name) and e in (ANY, engine) and (v is ANY or v == value):
            return why
    return None


# changes that play as the base does, by the field's own definition (the test asserts
# that they do, so an entry cannot outlive its reason): (engine or ANY, family, kind,
# field, value or ANY) -> why
EQUIVALENT = {
    ("loop", "learner", "ppo", "group_by_policy", True):
        "auto is true wherever every policy drives as many slots (here one each)",
    **{("sessions", "distributor", kind, "no_eligible", ANY):
       "it moves queries between sent and unserved, which only consumers' rewards and the "
       "loop's metrics read; the session engine's sellers earn and see the same"
       for kind in ("cheapest", "logit", "proportional")},
}

# fields whose value is a label only (nothing observable to play): field -> why
LABELS: dict[tuple[str, str, str], str] = {}

# changes an engine refuses (the test asserts a ConfigError that names the field): (engine
# or ANY, family, kind, field, value or ANY) -> why
REFUSED = {
    (ANY, "learner", "q_learning", "memory", 2):
        "the state is the observation: memory 2 needs a history of k: 2 (the issue's case)",
    ("sessions", "observation", "history", "k", ANY):
        "the Q-learner's memory (1) is the history's k, and the tables hold k: 1 only",
    ("sessions", "distributor", "isa_2022", "mode", "sampled"):
        "sampled draws each period at random, without a finite set of outcomes",
}

MISSING = "<no value: add one to VALUES>"


def base_value(family: str, kind: str, name: str, engine: str):
    cfg = base_config(family, kind, engine, name)
    section = _section(cfg, family, kind)
    return section.get(name, field_of(family, kind, name).default)


def values_of(family: str, kind: str, name: str) -> list:
    """The changed values of a case (every other choice of a choice field)."""
    if (family, kind, name) in VALUES:
        value = VALUES[family, kind, name]
        return list(value) if isinstance(value, Several) else [value]
    f = field_of(family, kind, name)
    current = base_value(family, kind, name, "loop")
    if f.kind == "bool":
        return [not current]
    if f.kind == "choice":
        return [c for c in f.choices if c != current]
    if f.kind in ("float", "entity", "int") and (current is None or current is REQUIRED):
        return [3 if f.kind == "int" else 1.3]   # inside the base's price range [1, 2]
    if f.kind in ("float", "entity", "int"):
        x = float(current)
        for candidate in (x * 1.5 if x else 0.5, x * 0.5, x + 1, x - 0.25):
            if f.kind == "int":
                candidate = int(round(candidate)) if candidate != x else int(x) + 1
            if candidate == current:
                continue
            if f.low is not None and (candidate < f.low or (f.low_open and candidate == f.low)):
                continue
            if f.high is not None and candidate > f.high:
                continue
            return [round(candidate, 9)]
    return [MISSING]


def _section(cfg: dict, family: str, kind: str) -> dict:
    if family == "learner":
        return cfg["learners"][GROUP]
    if family == "distributor":
        return cfg["market"]["distributor"]
    parts = cfg["market"]["sellers"][0]["observation"]
    return next(p for p in parts if p["kind"] == kind)


def base_config(family: str, kind: str, engine: str, name: str | None = None) -> dict:
    bases = SESSION_BASES[family] if engine == "sessions" else BASES[family]
    cfg = copy.deepcopy(bases[kind])
    cfg["train"]["engine"] = engine
    for key, value in CONTEXT.get((family, kind, name), {}).items():
        if isinstance(key, tuple):
            *path, last = key
            functools.reduce(lambda node, k: node[k], path, cfg)[last] = copy.deepcopy(value)
        else:
            _section(cfg, family, kind)[key] = copy.deepcopy(value)
    return cfg


def changed_config(family: str, kind: str, engine: str, name: str, value) -> dict:
    cfg = base_config(family, kind, engine, name)
    _section(cfg, family, kind)[name] = copy.deepcopy(value)
    return cfg


def field_path(family: str, name: str) -> str:
    return {"learner": f"learners.{GROUP}.{name}", "distributor": f"market.distributor.{name}",
            "observation": name}[family]


def cases():
    out = []
    for family, kind, name in reference_fields():
        if (family, kind, name) in LABELS:
            continue
        for engine in ENGINES:
            if engine == "sessions" and kind not in SESSION_BASES[family]:
                continue
            for value in values_of(family, kind, name):
                out.append(pytest.param(engine, family, kind, name, value,
                                        id=f"{engine}-{family}-{kind}-{name}={value!r}"))
    return out


# ------------------------------------------------------------------ the fingerprints

def _digest(h, closed) -> None:
    """The jaxpr's text (its literals included) and every constant, those of the inner
    jaxprs (a jitted function's, a scan body's) too, which the text does not show."""
    h.update(str(closed.jaxpr).encode())
    _consts(h, closed)


def _consts(h, jaxpr) -> None:
    for c in getattr(jaxpr, "consts", ()):
        _array(h, c)
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(inner, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    _consts(h, inner)


def _array(h, x) -> None:
    a = np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(
        getattr(x, "dtype", None), jax.dtypes.prng_key) else x)
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def loop_fingerprint(cfg: dict) -> str:
    """The loop's training program as traced: init's and one iteration's jaxprs."""
    from jaxmarket.train.plan import resolve
    plan = resolve(cfg)
    init, _ = plan.traced.functions
    h = hashlib.sha256()
    _digest(h, jax.make_jaxpr(init)(jax.random.key(0)))
    _digest(h, plan.traced.iteration[0])
    return h.hexdigest()


def sessions_fingerprint(cfg: dict) -> str:
    """The session engine's game as played: the xla backend's chunk (its jaxpr holds
    the tables and the learner's act and update), the sessions' initial state (the
    initial Q tables), the fees and prices of the greedy cycle."""
    from jaxmarket.sessions.engine import init_sessions, xla_chunk
    from jaxmarket.sessions.game import make_game
    from jaxmarket.sessions.run import choose_engine
    engine, reason, plan = choose_engine(cfg)
    assert engine == "sessions", reason
    game = make_game(plan)
    with jax.threefry_partitionable(False):
        sessions = init_sessions(game, 2, jax.random.key(0))
        closed = jax.make_jaxpr(xla_chunk(game, 2, 1))(sessions, np.uint32(0))
    h = hashlib.sha256()
    _digest(h, closed)
    for leaf in jax.tree.leaves(sessions):
        _array(h, leaf)
    _array(h, game.fees)
    _array(h, game.grid.prices)
    h.update(repr((game.radix, game.turns, game.probs)).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _fingerprint(engine: str, text: str) -> str:
    cfg = json.loads(text)
    return loop_fingerprint(cfg) if engine == "loop" else sessions_fingerprint(cfg)


def fingerprint(engine: str, cfg: dict) -> str:
    return _fingerprint(engine, json.dumps(cfg, sort_keys=True))


# ------------------------------------------------------------------ the tests

CASES = cases()


@pytest.mark.parametrize("engine,family,kind,name,value", CASES)
def test_a_changed_field_is_played_or_refused(engine, family, kind, name, value):
    # Bug caught: a setting read and then dropped on the way to the engine
    # (learners.sellers.memory=2 on the session engine ran with memory 1, silently): its
    # change leaves what the engine plays as it was, and nothing says so.
    assert value != MISSING, f"{family} {kind}.{name}: no value to change it to; add one to VALUES"
    base = base_config(family, kind, engine, name)
    changed = changed_config(family, kind, engine, name, value)
    assert changed != base, "the case changes nothing: pick another value in VALUES"
    before = fingerprint(engine, base)
    if entry(REFUSED, engine, family, kind, name, value) is not None:
        with pytest.raises(ConfigError) as err:
            fingerprint(engine, changed)
        assert re.search(rf"(?<!\w){re.escape(name)}(?!\w)", str(err.value)), str(err.value)
        return
    after = fingerprint(engine, changed)
    same = entry(EQUIVALENT, engine, family, kind, name, value)
    if same is not None:
        assert after == before, f"{name}: {value!r} no longer plays as the base does ({same})"
        return
    assert after != before, (f"{field_path(family, name)}: {value!r} plays as "
                             f"{base_value(family, kind, name, engine)!r} does on the {engine} "
                             f"engine (neither played nor refused)")


BASE_CASES = [pytest.param(engine, family, kind, id=f"{engine}-{family}-{kind}")
              for family in BASES for engine in ENGINES
              for kind in (SESSION_BASES if engine == "sessions" else BASES)[family]]


@pytest.mark.parametrize("engine,family,kind", BASE_CASES)
def test_each_base_runs_on_its_engine_and_its_fingerprint_is_stable(engine, family, kind):
    # Bug caught (in this test): a fingerprint that differs between two resolutions of
    # one config (an address, a fresh name) would make every field look played.
    text = json.dumps(base_config(family, kind, engine), sort_keys=True)
    assert _fingerprint.__wrapped__(engine, text) == _fingerprint(engine, text)


def test_every_kind_of_the_reference_has_a_base_and_the_tables_name_real_fields():
    # Bug caught: a new kind without a base (its fields would have no case), or an
    # allow-list entry left behind by a field that is gone.
    listed = reference_fields()
    kinds = {(family, kind) for family, kind, _ in listed}
    for family, kind in kinds:
        assert kind in BASES[family], f"{family} {kind}: add a base config"
    names = set(listed)
    for table in (VALUES, CONTEXT, LABELS, {k[1:4]: v for k, v in EQUIVALENT.items()},
                  {k[1:4]: v for k, v in REFUSED.items()}):
        for key in table:
            assert key in names, f"{key}: not a field of the reference"
    for table in (EQUIVALENT, REFUSED):
        for key in table:
            assert any(entry({key: True}, *case.values) for case in CASES), \
                f"{key}: matches no case"


def test_the_fingerprint_sees_the_memory_of_the_issue_dropped(monkeypatch):
    # Bug caught (in this test): a fingerprint blind to what the issue's bug dropped.
    # Before memory had to equal the observation's periods, learners.sellers.memory: 2
    # on a history of k: 1 was accepted and played as memory 1; with that check undone
    # here, the two must fingerprint alike (the case above would then fail), while a
    # setting that is played (the discount) still changes the fingerprint.
    import dataclasses

    from jaxmarket.learners import qlearning
    bounds = qlearning.grid_bounds
    monkeypatch.setattr(qlearning, "grid_bounds", lambda hyper, spec: bounds(
        hyper, dataclasses.replace(spec, obs_periods=None)))
    uncached = lambda cfg: _fingerprint.__wrapped__("sessions", json.dumps(cfg, sort_keys=True))
    before = uncached(base_config("learner", "q_learning", "sessions"))
    assert uncached(changed_config("learner", "q_learning", "sessions", "memory", 2)) == before
    assert uncached(changed_config("learner", "q_learning", "sessions", "discount", 0.5)) != before
