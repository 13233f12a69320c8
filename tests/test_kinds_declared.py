"""Each kind's capabilities live on its definition: no module of ``jaxmarket/train/``
and not ``jaxmarket/learners/equilibrium.py`` (the static game of a run) names a
learner, distributor or demand kind as a string (a feature that applies to some kinds reads a field or hook of
their ``LearnerDef``, ``DistributorDef`` or ``DemandDef``; docs/extending.md). The kinds
come from the registries, so a kind added later is checked too."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxmarket.config.errors import ConfigError
from jaxmarket.learners import equilibrium
from jaxmarket.learners.base import LEARNERS, Learner, LearnerDef
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.equilibrium import ActionSet
from jaxmarket.train.components import snapshot_fields
from jaxmarket.train.plan import resolve

ROOT = Path(__file__).resolve().parents[1]
TRAIN_DIR = ROOT / "jaxmarket" / "train"
STATIC_GAME = ROOT / "jaxmarket" / "learners" / "equilibrium.py"

# (module, string) where the string is another name that happens to equal a kind
NOT_KINDS = {
    ("jaxmarket/train/components/schedule.py", "schedule"): "the schedule component's name",
    ("jaxmarket/train/config.py", "schedule"): "the train.schedule field",
    ("jaxmarket/train/components/models.py", "random"): "an external model's error on "
                                                        "random points",
}


def kind_strings(source: str, kinds: set[str]) -> list[tuple[int, str]]:
    """``(line, kind)`` of every string constant of ``source`` that equals a kind."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in kinds)


def registered_kinds() -> set[str]:
    return set(LEARNERS) | set(DISTRIBUTORS) | set(DEMANDS)


def test_the_kinds_checked_include_every_shipped_family():
    kinds = registered_kinds()
    assert {"q_learning", "ppo_bandit", "ucb1", "random"} <= kinds          # learners
    assert {"first_price", "second_price", "logit", "cheapest"} <= kinds     # distributors
    assert {"constant", "cyclic", "noisy"} <= kinds                          # demands


def test_the_scan_finds_a_kind_string_and_nothing_else():
    source = ('x = "q_learning"\nif kind in ("first_price", "other"): pass\n'
              'f"{kind}_q_learning"\n"""docstring naming ``q_learning``"""\n')
    assert kind_strings(source, {"q_learning", "first_price"}) == [(1, "q_learning"),
                                                                   (2, "first_price")]


def test_no_train_module_nor_the_static_game_names_a_learner_distributor_or_demand_kind():
    kinds = registered_kinds()
    found = []
    assert STATIC_GAME.is_file(), f"{STATIC_GAME}: scan the static game where it lives"
    for path in sorted(TRAIN_DIR.rglob("*.py")) + [STATIC_GAME]:
        module = path.relative_to(ROOT).as_posix()
        for line, kind in kind_strings(path.read_text(), kinds):
            if (module, kind) not in NOT_KINDS:
                found.append(f"{module}:{line}: {kind!r}")
    assert not found, ("kind names in jaxmarket/train/ or the static game (declare the "
                       "capability on the kind's definition instead):\n" + "\n".join(found))


# ---- the shipped definitions declare what the features read --------------------------

def test_demand_and_distributor_definitions_declare_determinism_and_auctions():
    """Catches a demand process or an auction rule losing its declaration (the static
    equilibrium would sample a deterministic period, or an auction lose its metrics)."""
    assert {k for k in ("constant", "cyclic", "regime", "noisy", "shocks")
            if DEMANDS[k].deterministic} == {"constant", "cyclic", "regime"}
    shipped = ("first_price", "second_price", "mixed_price", "logit", "cheapest",
               "proportional", "cournot", "linear", "isa_2022", "isa_greedy")
    assert {k for k in shipped if DISTRIBUTORS[k].auction} == {"first_price", "second_price",
                                                               "mixed_price"}


def test_fixed_and_random_policies_are_declared_on_their_definitions():
    fixed = ("constant", "schedule", "undercut", "random")
    assert all(LEARNERS[k].fixed_policy for k in fixed)
    assert [k for k in fixed if LEARNERS[k].random_policy] == ["random"]
    assert not any(LEARNERS[k].fixed_policy for k in ("q_learning", "ppo_bandit", "ucb1", "ppo"))


@pytest.mark.parametrize("config, overrides, frozen", [
    ("calvano.yaml", ["learners.sellers.grid_size=3"], {"rows"}),
    ("logit_monopoly.yaml", [], {"params"}),
    ("logit_monopoly.yaml", ["learners.seller={kind: ucb1, grid_size: 3}"],
     {"counts", "sums", "log_weights"}),
])
def test_a_league_snapshot_freezes_what_the_definition_declares(config, overrides, frozen):
    """Q-learning's Q tables, a Gaussian bandit's parameters (not its sample buffers or
    optimizer state), a discrete bandit's every statistic."""
    plan = resolve(str(ROOT / "configs" / config), overrides, validate_only=True)
    g = plan.groups[0]
    state = plan.learners[g].init(jax.random.key(0), plan.specs[g])
    kind = plan.learner_settings[g][0]
    assert set(snapshot_fields(state, kind)) == frozen


# ---- a learner registered outside the package gets the features from its definition --

@struct.dataclass
class _State:
    x: jax.Array
    hyper: dict


def _make(hyper, spec):
    def init(key, spec_=None):
        return _State(jnp.zeros((spec.policies, spec.num_products)),
                      {"rate": jnp.ones((spec.policies,))})

    def act(state, obs, key):
        return state.x[spec.index()], {}

    def update(state, batch):
        return state, {}

    return Learner(init, act, update)


def _register(kind, **declared):
    if kind not in LEARNERS:
        LEARNERS.register(LearnerDef(kind, _make, {}, doc="tests/test_kinds_declared.py",
                                     **declared))
    return kind


def _market(kind, **learner):
    return {"market": {"num_products": 1,
                       "consumers": [{"name": "c", "count": 1, "budget": 1.0, "queries": 1.0}],
                       "sellers": [{"name": "s", "count": 2, "low": 0.0, "high": 1.0}],
                       "distributor": {"kind": "cheapest"}},
            "learners": {"s": {"kind": kind, **learner}},
            "train": {"num_envs": 2}}


def test_pbt_lists_the_learners_that_declare_hyperparameters():
    """The error for a learner without PBT hyperparameters lists the kinds whose
    definition declares them, one registered here included."""
    tunable = _register("test_declares_rate", pbt_hyperparams=("rate",), member_fields=("x",
                                                                                        "hyper"))
    plain = _register("test_declares_nothing")
    pbt = {"hyperparams": {"rate": [0.1, 1.0]}}
    with pytest.raises(ConfigError) as err:
        resolve(_market(plain, population=2, pbt=pbt), validate_only=True)
    assert err.value.field == "learners.s.kind"
    listed = str(err.value).split("one of ")[1].split(" (")[0].split(", ")
    assert tunable in listed and {"q_learning", "ppo_bandit", "ppo"} <= set(listed)
    assert plain not in listed and "ucb1" not in listed
    plan = resolve(_market(tunable, population=2, pbt=pbt), validate_only=True)
    assert plan.pbt["s"].hyperparams == (("rate", 0.1, 1.0),)
    with pytest.raises(ConfigError) as err:
        resolve(_market(tunable, population=2, pbt={"hyperparams": {"lr": [0.1, 1.0]}}),
                validate_only=True)
    assert err.value.field == "learners.s.pbt.hyperparams.lr" and "rate" in str(err.value)


def test_the_static_game_reads_fixed_random_and_action_set_declarations():
    grid = np.array([[[0.2, 0.4]], [[0.3, 0.6]]], np.float32)      # [n, P, G]
    gridded = _register("test_declares_grid",
                        action_set=lambda hyper, spec, n: ActionSet.from_grid(grid[:n]))
    rival = _register("test_declares_random_rival", fixed_policy=True, random_policy=True)
    plan = resolve(_market(gridded), validate_only=True)
    assert equilibrium.learning_groups(plan) == ("s",)
    np.testing.assert_array_equal(equilibrium.action_set(plan, "s").grid, grid)
    assert equilibrium.deterministic(plan)
    plan = resolve(_market(rival), validate_only=True)
    assert equilibrium.learning_groups(plan) == ()
    assert not equilibrium.deterministic(plan) and not equilibrium.exact(plan)
    box = equilibrium.action_set(resolve(_market(_register("test_declares_nothing")),
                                         validate_only=True), "s")
    assert box.grid is None and box.low.tolist() == [[0.0], [0.0]] \
        and box.high.tolist() == [[1.0], [1.0]]
