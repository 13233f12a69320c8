"""Every bad config is a config error, sizes and memory are checked before anything
compiles (docs/reliability.md): each guarantee against values worked out here (the
field's rule, int32 / float32 limits, bytes counted from shapes written out by hand, the
peak memory a real run reaches)."""

from __future__ import annotations

import copy
import json
import math
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxmarket.cli import run_cli
from jaxmarket.cli.check import main as check_main
from jaxmarket.config import precheck
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import (INT32_MAX, MAX_ENTITY_VALUES, MAX_GROUPS,
                                     MAX_MARKET_AGENTS, MAX_UPDATE_EPOCHS, WORK_BUDGET, Field,
                                     check_value, resolve_entity_array)
from jaxmarket.config.loader import load_config
from jaxmarket.train import memory
from jaxmarket.train import plan as plan_module
from jaxmarket.train.config import resolve_train
from jaxmarket.train.plan import PROBE_SLOTS, resolve

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
HISTORY2 = "market.sellers[0].observation=[{kind: history, k: 2}]"
BAD_NUMBERS = [math.inf, -math.inf, math.nan, 10**100, -10**100, 10**400, 1e39, True,
               "inf", "nan", "1e400", [1.0], {"a": 1}, "abc"]


# ---------------------------------------------------------------- fields


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("kind", ["float", "int"])
def test_a_non_finite_huge_or_non_number_value_is_a_config_error_naming_it(kind, value):
    with pytest.raises(ConfigError) as err:
        check_value(Field(kind, 1), value, "x.y")
    assert err.value.field == "x.y" and "allowed: " in str(err.value)
    assert err.value.allowed.startswith("a finite number" if kind == "float" else "an integer")


def test_int_fields_fit_int32_and_float_fields_float32_the_edges_pass():
    assert check_value(Field("int", 1), INT32_MAX, "n") == INT32_MAX
    with pytest.raises(ConfigError, match=r"<= 2147483647 \(int32\)"):
        check_value(Field("int", 1), INT32_MAX + 1, "n")
    assert check_value(Field("float", 1.0), 3.0e38, "f") == 3.0e38    # float32 max 3.40e38
    with pytest.raises(ConfigError):
        check_value(Field("float", 1.0), 3.5e38, "f")
    with pytest.raises(ConfigError):                                   # a list of numbers too
        check_value(Field("floats", (1.0,)), [1.0, math.nan], "fs")


@pytest.mark.parametrize("value", [10**400, math.inf, [1.0, math.nan], [[1.0, 2.0]], "x",
                                   [10**400, 1.0]], ids=repr)
def test_an_entity_array_with_a_huge_or_non_finite_entry_is_a_config_error(value):
    with pytest.raises(ConfigError) as err:
        resolve_entity_array(Field("entity", 1.0), value, "market.sellers[0].cost", 3, 2)
    assert err.value.field == "market.sellers[0].cost"


def test_an_entity_array_too_large_is_refused_on_the_count_before_allocating():
    t = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        resolve_entity_array(Field("entity", 1.0), 1.0, "market.sellers[0].cost",
                             MAX_ENTITY_VALUES + 1, 1)
    assert err.value.field == "market.sellers[0].count"
    assert time.perf_counter() - t < 0.1
    ok = resolve_entity_array(Field("entity", 1.0, low=0.0), [0.0, 2.0], "c", 2, 2)
    assert ok.tolist() == [[0.0, 2.0], [0.0, 2.0]]


# ---------------------------------------------------------------- check, one line


def cpu_seconds() -> float:
    """This process's CPU time: the bound holds on a shared machine whose load would
    stretch the wall clock (the work is single-threaded Python and tracing)."""
    return time.process_time()


def check(capsys, *argv) -> tuple[int, str, str, float]:
    t = cpu_seconds()
    rc = run_cli(check_main, list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err, cpu_seconds() - t


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary\x00", "market: {num_products: 1}\n"
                                     "name: caf\xe9\n".encode("latin-1"), b"\x00" * 64,
                                     b"[" * 5000 + b"]" * 5000, b"market: [unclosed",
                                     b"- just\n- a list\n"], ids=range(6))
def test_a_binary_non_utf8_deep_or_broken_yaml_file_is_one_line(tmp_path, capsys, content):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    rc, out, err, _ = check(capsys, str(path))
    assert rc == 2 and out == "" and err.startswith("config error: ") and err.count("\n") == 1


@pytest.mark.parametrize("where,value", [
    ("market.distributor.kind", "[1, 2]"), ("market.distributor.kind", "3"),
    ("market.distributor.kind", "{a: 1}"), ("learners.sellers.kind", "[ppo]"),
    ("learners.sellers.kind", "{kind: ppo}"), ("learners.sellers.kind", "7"),
    ("market.sellers[0].reward", "[{kind: [profit]}]"),
    ("market.consumers[0].demand", "{kind: {a: 1}}")])
def test_a_kind_of_the_wrong_type_is_a_config_error(capsys, where, value):
    rc, _, err, _ = check(capsys, "configs/calvano.yaml", f"{where}={value}")
    assert rc == 2 and err.startswith("config error: ") and err.count("\n") == 1


@pytest.mark.parametrize("override,rc_want", [
    ("train.num_envs=1000000", 0), ("train.num_envs=3000000", 0),
    ("train.num_seeds=1000000", 2), ("train.num_envs=2147483648", 2),
    ("train.num_envs=1073741824", 2), ("market.sellers[0].count=100000000", 2),
    ("market.num_products=100000000", 2),
    # a chunk runs min(chunk_size, num_iterations) iterations: its metrics do not fit
    ("train.chunk_size=2000000000 train.num_iterations=2000000000", 2)])
def test_check_of_a_huge_size_builds_nothing_of_its_size(capsys, monkeypatch, override, rc_want):
    """Before: num_envs=1e6 took 86 s, 3e6 178 s, num_seeds=1e6 67 s (per-slot Python in
    the learners' builders). Now the learners are only ever built for a probe of at most
    PROBE_SLOTS slots, so nothing check does grows with the size (its time on a quiet
    machine: docs/reliability.md)."""
    built = []
    real = plan_module.build_controller

    def spy(env, params, config, specs=None):
        built.append(sum(s.num_agents for s in (specs or {}).values()))
        return real(env, params, config, specs=specs)

    monkeypatch.setattr(plan_module, "build_controller", spy)
    rc, out, err, _ = check(capsys, "configs/calvano.yaml", "train.engine=loop",
                            "train.num_seeds=8", "train.chunk_size=50000", *override.split())
    assert rc == rc_want, err
    assert max(built, default=0) <= PROBE_SLOTS
    assert built or rc == 2
    if rc == 2:
        assert err.count("\n") == 1
    else:
        assert out.splitlines()[-1].startswith("memory: ")
        assert out.splitlines()[-2] == "engine: loop"


def test_a_probe_keeps_the_runs_minibatches_where_it_has_fewer_samples(capsys):
    """A large run may split an update into more minibatches than its probe has samples:
    the probe traces with fewer (whole markets each), check reports the run's own."""
    over = ["train.num_envs=20000", "learners.posted.num_minibatches=3000"]
    plan = resolve("configs/multi_product.yaml", over, validate_only=True)
    assert plan.probe
    assert plan.learner_settings["posted"][1]["num_minibatches"] == 3000
    base = plan_module.group_specs(plan.env, plan.params, plan.learner_config)
    probe = plan_module.probe_minibatches(base, plan.populations, plan.learner_config,
                                          plan.train)
    # rollout_length 8 x 3 sellers per market: 24 samples per market, whose largest
    # divisor up to 3000 is 24 itself
    assert probe["posted"]["num_minibatches"] == 24
    assert probe["buyers"] == plan.learner_config["buyers"]   # not split: untouched


# ---------------------------------------------------------------- the work budget

# the sizes a fuzz of the shipped configs found taking 30 s to minutes in check (the
# learners built per agent slot for a probe of 143 markets; PPO's epochs traced one by
# one): each is now a one-line ConfigError on its biggest factor, before anything is
# built or traced
BUDGET_CASES = [
    ("budget_monopoly", ["market.sellers[0].count=100000"], "market.sellers[0].count",
     "MAX_MARKET_AGENTS"),
    ("budget_monopoly", ["market.sellers[0].count=100000", "learners.seller.update_epochs=100000"],
     "market.sellers[0].count", "MAX_MARKET_AGENTS"),
    ("budget_monopoly", ["market.sellers[0].count=100000", "train.rollout_length=100000"],
     "market.sellers[0].count", "MAX_MARKET_AGENTS"),
    ("budget_monopoly", ["market.sellers[0].count=100000", "train.chunk_size=100000"],
     "market.sellers[0].count", "MAX_MARKET_AGENTS"),
    ("multi_product", ["learners.posted.update_epochs=100000"], "learners.posted.update_epochs",
     "MAX_UPDATE_EPOCHS"),
    ("budget_monopoly", ["train.num_envs=100000000", "train.chunk_size=100000"],
     "train.num_envs", "WORK_BUDGET"),
    ("calvano", ["train.engine=loop", "train.rollout_length=1000000"], "train.rollout_length",
     "WORK_BUDGET"),
    ("bench_b", ["market.sellers[0].count=5000"], "market.sellers[0].count",
     "MAX_MARKET_AGENTS"),
]


@pytest.mark.parametrize("name,overrides,field,bound", BUDGET_CASES,
                         ids=[" ".join(c[1]) for c in BUDGET_CASES])
def test_sizes_over_the_work_budget_are_refused_before_anything_is_built(
        capsys, monkeypatch, name, overrides, field, bound):
    touched = []
    for fn in ("group_specs", "build_controller", "Traced"):   # what builds or traces
        real = getattr(plan_module, fn)
        monkeypatch.setattr(plan_module, fn, lambda *a, _r=real, _n=fn, **k:
                            touched.append(_n) or _r(*a, **k))
    with pytest.raises(ConfigError) as err:
        resolve(f"configs/{name}.yaml", overrides, validate_only=True)
    assert err.value.field == field and f"jaxmarket.config.fields.{bound}" in err.value.allowed
    assert not touched
    rc, out, stderr, _ = check(capsys, f"configs/{name}.yaml", *overrides)
    assert rc == 2 and out == "" and stderr == f"config error: {err.value}\n"


def test_a_file_listing_12000_groups_is_refused_before_reading_them(tmp_path, capsys):
    """12,000 seller groups of one seller each (a fuzz of the probe: minutes in check,
    each group traced on its own): refused on the list, before any group is read."""
    base = load_config(ROOT / "configs/budget_monopoly.yaml")
    base["market"]["sellers"] = [{"name": f"s{i}"} for i in range(12000)]
    base["learners"] = {f"s{i}": {"kind": "ppo_bandit"} for i in range(12000)}
    path = tmp_path / "many.yaml"
    path.write_text(json.dumps(base))   # JSON is YAML: one line, well under 1 MiB
    rc, out, err, _ = check(capsys, str(path))
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("config error: market.sellers: got '12000 groups'; allowed: at most "
                          f"{MAX_GROUPS} groups")


def test_every_shipped_config_is_far_inside_the_work_budget(monkeypatch):
    """The shipped configs at their shipped sizes (calvano.yaml: 1000 sessions of 20,000-
    period chunks) pass every bound of the work budget tightened 10x (groups), 100x
    (agents per market, epochs) and 10^5 x (the work of one chunk)."""
    monkeypatch.setattr(precheck, "MAX_GROUPS", MAX_GROUPS // 10)
    monkeypatch.setattr(precheck, "MAX_MARKET_AGENTS", MAX_MARKET_AGENTS // 100)
    monkeypatch.setattr(precheck, "MAX_UPDATE_EPOCHS", MAX_UPDATE_EPOCHS // 100)
    monkeypatch.setattr(precheck, "WORK_BUDGET", WORK_BUDGET // 10**5)
    for path in CONFIGS:
        budget_checks(load_config(path))
    monkeypatch.setattr(precheck, "WORK_BUDGET", 10**7)   # not vacuous: bench_b's 3.5e7
    with pytest.raises(ConfigError, match="is 3.53e7; lower train.chunk_size"):
        budget_checks(BASES["bench_b"])


def budget_checks(config: dict) -> None:
    """The work budget's checks on a loaded config (jax-free, as the quick checks run them)."""
    market = config["market"]
    precheck.check_groups(market)
    groups = [{"name": g["name"], "side": side, "count": g.get("count", 1),
               "agent": side == "seller" or g.get("agent", False)}
              for side in ("consumer", "seller") for g in market[side + "s"]]
    precheck.check_work(vars(resolve_train(config.get("train"))), market.get("num_products", 1),
                        groups, config["learners"], precheck.schema_epochs)


def test_slots_must_fit_int32():
    with pytest.raises(ConfigError) as err:   # 2 sellers x 8 seeds x 2**27 markets = 2**31
        resolve("configs/calvano.yaml", ["train.num_envs=134217728", "train.num_seeds=8",
                                         "train.chunk_size=1"], validate_only=True)
    assert err.value.field == "train.num_envs" and "int32" in err.value.allowed


# ---------------------------------------------------------------- memory

# calvano.yaml as a loop run of 8 seeds (the shipped file runs 1000 sessions on the
# session engine)
CALVANO8 = ["train.num_seeds=8", "train.chunk_size=50000", "train.num_iterations=2500000"]


def test_a_run_over_the_device_memory_is_refused_naming_the_biggest_term(monkeypatch):
    monkeypatch.setenv(memory.MEMORY_ENV, str(2**40))
    fits = resolve("configs/bench_b.yaml", ["train.num_envs=20000"], validate_only=True).memory
    monkeypatch.setenv(memory.MEMORY_ENV, str(fits.total - 1))   # one byte short
    with pytest.raises(ConfigError) as err:
        resolve("configs/bench_b.yaml", ["train.num_envs=20000"], validate_only=True)
    assert err.value.field == "train.num_envs" and err.value.value == 20000
    assert f"the biggest part is {fits.biggest.what}" in err.value.allowed
    monkeypatch.setenv(memory.MEMORY_ENV, str(2**30))
    q60 = ["learners.sellers.grid_size=60", "learners.sellers.memory=2", HISTORY2, *CALVANO8]
    with pytest.raises(ConfigError) as err:   # 16 Q tables of 60**4 states: per policy
        resolve("configs/calvano.yaml", q60, validate_only=True)
    assert err.value.field == "learners.sellers" and err.value.value == "q_learning"
    monkeypatch.setenv(memory.MEMORY_ENV, str(2**40))
    resolve("configs/calvano.yaml", q60, validate_only=True)


def test_the_q_table_term_is_the_bytes_counted_by_hand():
    """calvano: 2 sellers x 8 seeds = 16 Q tables of (15**2 states) x (15 actions + the
    greedy column) float32, plus a few numbers per policy and slot."""
    plan = resolve("configs/calvano.yaml", CALVANO8)
    term = next(t for t in plan.memory.terms if t.what.startswith("learner state"))
    table = 16 * 15**2 * 16 * 4
    assert table <= term.bytes <= table + 16 * 64   # + per-policy counters, hypers


@pytest.mark.parametrize("name,overrides", [
    ("bench_b", ["train.num_envs=200"]), ("calvano", ["train.num_envs=300", *CALVANO8]),
    ("population_sync", ["train.num_envs=2048"])])
def test_the_probe_estimate_equals_the_exact_one(name, overrides):
    """Above PROBE_SLOTS the estimate is scaled from a probe's shapes; the built plan's
    exact shapes give the same bytes, term by term."""
    plan = resolve(f"configs/{name}.yaml", overrides)
    slots = sum(s.num_agents for s in plan.specs.values())
    assert slots > PROBE_SLOTS and plan.memory.probed
    terms = lambda est: [(t.what, t.bytes, t.field) for t in est.terms]  # noqa: E731
    checked = resolve(f"configs/{name}.yaml", overrides, validate_only=True)  # check's
    assert terms(plan.memory) == terms(checked.memory)   # train's is check's
    exact = memory.estimate(plan)
    assert checked.probe and [t[0] for t in terms(checked.memory)] == [t[0] for t in terms(exact)]
    for probed, built in zip(checked.memory.terms, exact.terms):
        if probed.what == "one iteration's temporaries":
            # liveness over the program: a population's few unscaled index axes differ
            assert abs(probed.bytes - built.bytes) <= 0.1 * built.bytes, (probed, built)
        else:
            assert probed.bytes == built.bytes, (probed, built)


def test_check_json_prints_the_estimate(capsys):
    rc, out, _, _ = check(capsys, "configs/bench_b.yaml", "--json")
    est = json.loads(out)
    assert rc == 0 and est["total_bytes"] == sum(t["bytes"] for t in est["terms"])
    assert {t["field"] for t in est["terms"]} >= {"train.num_envs", "train.chunk_size"}


MEASURE = """
import json, os, resource, sys, tempfile
from jaxmarket.cli import run_cli
from jaxmarket.cli.train import main
from jaxmarket.train.plan import resolve
cfg, runs = sys.argv[1], json.loads(sys.argv[2])
short = ["train.num_iterations=1", "train.chunk_size=1"]
out = []
with tempfile.TemporaryDirectory() as d:
    for i, ov in enumerate(runs):
        est = resolve(cfg, ov + short, validate_only=True).memory.total
        assert run_cli(main, [cfg, "--run-dir", os.path.join(d, str(i)), "--compile-cache",
                              "none", *ov, *short]) == 0
        out.append((est, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
print(json.dumps(out))
"""


# ---------------------------------------------------------------- fuzz

MUTANTS = [None, True, False, 0, -1, 1, 2**31, 10**100, -10**100, math.inf, -math.inf,
           math.nan, 1e308, -1e-300, "", "abc", "inf", "1e400", [], [1, 2], [[1.0]], {},
           {"kind": [1]}, {"kind": "nope"}, [{"kind": 3}]]


def leaves(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))


BASES = {p.stem: load_config(p) for p in CONFIGS}
PATHS = {k: [p for p in leaves(c) if p] for k, c in BASES.items()}
OUTCOMES: Counter = Counter()


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(sorted(BASES)))
    config = copy.deepcopy(BASES[name])
    path = draw(st.sampled_from(PATHS[name]))
    node = config
    for part in path[:-1]:
        node = node[part]
    old = node[path[-1]]
    how = draw(st.sampled_from(["delete", "value", "swap"]))
    if how == "delete":
        del node[path[-1]]
    elif how == "value":
        node[path[-1]] = draw(st.sampled_from(MUTANTS))
    else:
        node[path[-1]] = draw(st.sampled_from([str(old), [old], {"kind": old}, -old
                                               if isinstance(old, (int, float)) else 0]))
    for _ in range(draw(st.integers(0, 1))):   # sometimes a second mutation: a size
        if not isinstance(config.get("train"), dict):
            config["train"] = {}
        config["train"]["num_envs"] = draw(st.sampled_from(
            [10**6, 2**31, 10**100, 0, 1.5]))
    for _ in range(draw(st.integers(0, 1))):   # or a size a probe found slow: 10^5 of one
        size_mutation(config, draw(st.sampled_from(SIZES)))
    return name, path, how, config


SIZES = ["count", "update_epochs", "rollout_length", "chunk_size", "num_envs"]


def size_mutation(config: dict, key: str, value: int = 10**5) -> None:
    """10^5 agents in the first seller group, epochs of the first learner or a train size
    (the fuzz of the probe that found them: 30 s to minutes in check before the budget)."""
    market, learners = config.get("market"), config.get("learners")
    if key == "count":
        sellers = market.get("sellers") if isinstance(market, dict) else None
        if isinstance(sellers, list) and sellers and isinstance(sellers[0], dict):
            sellers[0]["count"] = value
    elif key == "update_epochs":
        first = next((c for c in learners.values() if isinstance(c, dict)), None) \
            if isinstance(learners, dict) else None
        if first is not None:
            first["update_epochs"] = value
    else:
        if not isinstance(config.get("train"), dict):
            config["train"] = {}
        config["train"][key] = value


@settings(max_examples=100, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(mutated())
def fuzz_one(case):
    name, path, how, config = case
    t = cpu_seconds()
    try:
        resolve(config, validate_only=True)
        OUTCOMES["clean"] += 1
    except ConfigError as err:
        # one line (the missing-learners error appends a ready-to-paste template)
        assert "\n" not in str(err) or err.field == "learners", str(err)
        OUTCOMES["config error"] += 1
    seconds = cpu_seconds() - t
    assert seconds < 60.0, (name, path, how, seconds)   # a hang guard, not a speed target


def test_fuzz_any_mutation_of_a_shipped_config_resolves_or_is_a_config_error():
    """Hypothesis mutates the shipped configs (type swaps, extremes, inf/nan, huge
    integers, strings, lists, deletions, absurd sizes): every outcome is a plan or a
    ConfigError (any other exception fails the test); none hangs (60 s of CPU each)."""
    OUTCOMES.clear()
    t = time.perf_counter()
    fuzz_one()
    print(f"fuzz outcomes: {dict(OUTCOMES)} in {time.perf_counter() - t:.0f} s")
    assert OUTCOMES["clean"] > 0 and OUTCOMES["config error"] > 0


def test_train_and_check_give_one_estimate_where_a_bound_would_refuse():
    """100 loop sessions of calvano.yaml, 100,000-iteration chunks: the untraced bound
    of one chunk's metrics (16 KiB per seed and iteration: 153 GiB) refused the run in
    train while check, which traces the iteration, estimated 120 MiB. Both trace now:
    the same terms, the metrics term the traced bytes x the chunk."""
    over = ["train.engine=loop", "train.num_seeds=100", "train.chunk_size=100000",
            "train.num_iterations=3200000"]
    checked = resolve("configs/calvano.yaml", over, validate_only=True).memory
    trained = resolve("configs/calvano.yaml", over).memory
    assert [(t.what, t.bytes) for t in trained.terms] == [(t.what, t.bytes) for t in checked.terms]
    metrics = next(t for t in trained.terms if t.what == "metrics of one chunk")
    assert metrics.bytes % 100_000 == 0 and metrics.bytes < 16 * 2**10 * 100 * 100_000 / 100


QUICK = ("logit_duopoly", "multi_product")   # the rest: -m slow (40 resolves)


@pytest.mark.parametrize("name", [pytest.param(p.stem, marks=() if p.stem in QUICK
                                               else pytest.mark.slow) for p in CONFIGS])
def test_train_and_check_give_one_estimate_on_every_shipped_config(name):
    """Every shipped config (on the loop: the session engine's estimate is one function
    both call), at its size and at a 10x chunk: train's estimate is check's, term by
    term. Before: train skipped the iteration's trace far from the memory and bounded
    the metrics at 16 KiB per seed and iteration (logit_duopoly at a 10x chunk: 3.05 GiB
    in train, 3.8 MiB in check)."""
    chunk = BASES[name].get("train", {}).get("chunk_size", 100)
    for over in (["train.engine=loop"], ["train.engine=loop", f"train.chunk_size={10 * chunk}"]):
        checked = resolve(f"configs/{name}.yaml", over, validate_only=True).memory
        trained = resolve(f"configs/{name}.yaml", over).memory
        assert [(t.what, t.bytes) for t in trained.terms] == \
            [(t.what, t.bytes) for t in checked.terms], over


BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")) \
    + "market: *i\n"


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(capsys, tmp_path):
    # Bug caught: a config whose aliases nest to 9^9 values loaded (or printed in an
    # error) by expanding them: memory and minutes, not a line.
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    rc, _, err, _ = check(capsys, str(path))
    assert rc == 2 and err.count("\n") == 1 and "aliases expand to more than" in err
    # the same aliases, few enough, load as before
    small = tmp_path / "small.yaml"
    small.write_text("a: &a [1, 2]\nb: [*a, *a]\n")
    assert load_config_text(small) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def load_config_text(path):
    from jaxmarket.config.loader import read_yaml
    return read_yaml(path)


def test_integers_past_pythons_string_limit_are_config_errors(capsys, tmp_path):
    # Bug caught: a 5000-digit integer in an override or a file ending in a ValueError
    # traceback from YAML's int constructor, or an error message that prints it whole.
    digits = "1" + "0" * 5000
    rc, _, err, _ = check(capsys, "configs/calvano.yaml", f"train.num_seeds={digits}")
    assert rc == 2 and err.count("\n") == 1 and "train.num_seeds" in err
    path = tmp_path / "big.yaml"
    path.write_text(f"seed: {digits}\n")
    rc, _, err, _ = check(capsys, str(path))
    assert rc == 2 and err.count("\n") == 1 and str(path) in err
    err = ConfigError("train.num_seeds", 10 ** 400, "an integer <= 2147483647")
    assert "about 400 digits" in str(err) and len(str(err)) < 200
    nested = ConfigError("x", [list(range(100))] * 10 ** 6, "anything")
    assert len(str(nested)) < 200


def test_a_sessions_run_is_held_to_the_work_budget_at_its_own_size():
    """The session engine resolves one session's plan; the budget still reads the run's
    own sizes (sessions x chunk periods x products x sellers). Catches: the check made
    on the one-session plan (a chunk of 10^9 periods over 10^5 sessions accepted)."""
    from jaxmarket.sessions.run import session_plan
    sizes = {"train.chunk_size": 10**9, "train.num_iterations": 2 * 10**9,
             "train.num_seeds": 10**5}
    config = load_config("configs/calvano.yaml", [f"{k}={v}" for k, v in sizes.items()])
    sellers = sum(g["count"] for g in config["market"]["sellers"])
    assert sizes["train.chunk_size"] * sizes["train.num_seeds"] * sellers > WORK_BUDGET
    with pytest.raises(ConfigError) as err:
        session_plan(config)
    assert err.value.field == "train.chunk_size" and "WORK_BUDGET" in str(err.value)
    shipped = session_plan(load_config("configs/calvano.yaml"))   # the published design fits
    assert shipped.train.num_seeds == 1000
