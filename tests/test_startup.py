"""Commands start fast (docs/configuration.md, "Start-up"): ``check``, ``--help`` and a
config error import none of jax, flax, optax, orbax or distrax; the quick checks
(:mod:`jaxmarket.config.precheck`) raise exactly the message the full validation
raises, never one for a valid config, and leave kinds registered from Python to the full
validation; the jax-free schema they read is the registries' own. Also the renamed
default config's old name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from conftest import CONFIGS, ROOT

from jaxmarket.cli import run_cli
from jaxmarket.cli import train as train_cli
from jaxmarket.config.loader import load_config

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "distrax", "rich", "pandas",
         "matplotlib", "numba")
DEFAULT = "configs/budget_monopoly.yaml"
DUOPOLY = "configs/logit_duopoly.yaml"
CALVANO = "configs/calvano.yaml"

# (command, config, overrides): each a config error the quick checks find
BAD = [
    ("check", DEFAULT, ["market.sellers[0].count=-1"]),
    ("train", DEFAULT, ["market.sellers[0].count=-1"]),
    ("check", DEFAULT, ["market.consumers[0].budget=-1"]),
    ("check", DEFAULT, ["market.consumers[0].budget=[0.5, 0.5]"]),
    ("check", DEFAULT, ["market.sellers[0].low=5"]),
    ("check", DEFAULT, ["market.sellers[0].name=a-b"]),
    ("check", DEFAULT, ["market.num_products=0"]),
    ("check", DEFAULT, ["market.colour=red"]),
    ("check", DEFAULT, ["market.distributor.kind=nope"]),
    ("check", DEFAULT, ["market.distributor.temperature=-1"]),
    ("check", DEFAULT, ["market.distributor.no_eligible=maybe"]),
    ("check", DEFAULT, ["market.consumers[0].demand={kind: nope}"]),
    ("check", DEFAULT, ["market.sellers[0].reward=[{kind: regret_ratio}]"]),
    ("check", DEFAULT, ["market.sellers[0].reward=[{kind: nope}]"]),
    ("check", DEFAULT, ["market.sellers[0].observation=[{kind: competitor_prices, summary: [median]}]"]),
    ("check", DEFAULT, ["market.consumers[0].reward=[{kind: traffic}]"]),
    ("check", DEFAULT, ["market.move_order=alternating"]),
    ("check", DEFAULT, ["learners.seller.learning_rate=-1"]),
    ("train", DEFAULT, ["learners.seller.learning_rate=-1"]),
    ("check", DEFAULT, ["learners.seller.kind=nope"]),
    ("check", DEFAULT, ["learners.seller.bogus=1"]),
    ("check", DEFAULT, ["learners.seller=ppo_bandit"]),
    ("check", DEFAULT, ["learners.other={kind: ppo_bandit}"]),
    ("check", DEFAULT, ["market.consumers[0].agent=true"]),
    ("check", DEFAULT, ["market.consumers[0].agent=true", "learners.consumer={kind: ppo_bandit}",
                        "learners.seller.bogus=1"]),
    ("check", DEFAULT, ["train.num_seeds=0"]),
    ("train", DEFAULT, ["train.num_seeds=0"]),
    ("check", DEFAULT, ["train.bogus=1"]),
    ("check", DEFAULT, ["train.engine=fast"]),
    ("check", DEFAULT, ["train.log_every=0"]),
    ("check", DEFAULT, ["train.early_stop={metric: x}"]),
    ("check", DEFAULT, ["seed=-1"]),
    ("check", DUOPOLY, ["market.sellers[0].cost=[[1], [2], [3]]"]),
    ("train", DUOPOLY, ["learners.sellers.kind=nope"]),
    ("check", CALVANO, ["train.engine=loop", "market.distributor.temperature=0"]),
    # the work budget (jaxmarket.config.fields): groups, agents per market, epochs, a chunk
    ("check", DEFAULT, ["market.sellers=[" + ", ".join(f"{{name: s{i}}}" for i in range(65))
                        + "]"]),
    ("train", DEFAULT, ["market.sellers=[" + ", ".join(f"{{name: s{i}}}" for i in range(65))
                        + "]", "train.num_seeds=0"]),
    ("check", DEFAULT, ["market.sellers[0].count=100000"]),
    ("train", DEFAULT, ["market.sellers[0].count=100000", "learners.seller.update_epochs=100000"]),
    ("check", DEFAULT, ["learners.seller.update_epochs=100000"]),
    ("check", DEFAULT, ["learners.seller.update_epochs=100000", "learners.seller.bogus=1"]),
    ("check", DEFAULT, ["train.num_envs=100000000", "train.chunk_size=100000"]),
    ("train", DEFAULT, ["train.num_envs=100000000", "train.chunk_size=100000"]),
    ("check", "configs/bench_b.yaml", ["market.sellers[0].count=5000"]),
    # YAML that never ends (a recursive alias) or explodes (an alias bomb), and top-level
    # sections of the wrong type (before: a hang, or an AttributeError traceback from
    # the engine choice): a config file each, PROBES below
    *((command, f"probe:{name}", []) for name in ("recursive_alias", "alias_bomb",
                                                 "learners_list", "learners_number",
                                                 "train_list", "market_number")
      for command in ("check", "train")),
    ("check", DEFAULT, ["train.num_iterations=&loop [*loop]"]),
    ("train", DEFAULT, ["learners=[1, 2, 3]"]),
]

_BASE = yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())
# billion laughs: 9 levels of 9 aliases each (9^9 values), in a valid config's free text
BOMB = "[" + ", ".join(["&a [" + ", ".join(["lol"] * 9) + "]"] + [
    f"&{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]) + "]"
# (file text, what its one line names: the field, or the file's line and column, and the
# value); "probe:NAME" in BAD is the file
PROBES = {
    "recursive_alias": ("market: {sellers: [{name: s}]}\ntrain:\n  num_iterations: &loop "
                        "[*loop]\n", "line 3, column 26: got 'a recursive alias *loop"),
    "alias_bomb": (yaml.safe_dump(_BASE, sort_keys=False) + f"description: {BOMB}\n",
                   "got 'YAML whose aliases expand to more than 10,000 nodes'"),
    "learners_list": (yaml.safe_dump({**_BASE, "learners": [1, 2, 3]}), "learners: got [1, 2, 3]"),
    "learners_number": (yaml.safe_dump({**_BASE, "learners": 3}), "learners: got 3"),
    "train_list": (yaml.safe_dump({**_BASE, "train": [1]}), "train: got [1]"),
    "market_number": (yaml.safe_dump({**_BASE, "market": 5}), "market: got 5"),
}

SCRIPT = r"""
import contextlib, io, json, sys
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.config.precheck import Defer, precheck, walk

cases, configs = json.loads(sys.argv[1]), json.loads(sys.argv[2])

def quick(command, path, overrides):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            walk(load_config(path, overrides), command, say=print)
    except ConfigError as err:
        return ["error", str(err), out.getvalue()]
    except Defer:
        return ["defer", "", ""]
    return ["ok", "", ""]

result = {"quick": [quick(*c) for c in cases],
          "valid": {p: [quick(cmd, p, []) for cmd in ("check", "train")] for p in configs}}
# a fresh process had imported no registry: precheck itself ran (and raised)
try:
    precheck(load_config(*cases[0][1:]), cases[0][0])
    result["fresh"] = "passed"
except ConfigError as err:
    result["fresh"] = str(err)
# the full validation: the commands themselves, now that the registries are imported
# (precheck then leaves every config to it)
from jaxmarket.cli import run_cli
from jaxmarket.cli import check, describe, train, train_run  # noqa: F401  (the registries)
result["registries_loaded"] = "jaxmarket.learners.base" in sys.modules
full = []
for command, path, overrides in cases:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        argv = [path, *overrides] + (["--run-dir", "/nonexistent/run"] if command == "train" else [])
        code = run_cli((check if command == "check" else train).main, argv)
    full.append([code, err.getvalue(), out.getvalue()])
result["full"] = full
# a learner kind registered from Python: the quick checks leave it to the full validation
import dataclasses
from jaxmarket.learners.base import LEARNERS
LEARNERS.register(dataclasses.replace(LEARNERS["ppo_bandit"], kind="my_bandit"))
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    result["custom"] = run_cli(check.main, [cases[0][1], "learners.seller.kind=my_bandit"])
result["custom_out"] = out.getvalue()
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, str]:
    """Each of PROBES written to a file: ``{"probe:NAME": its path}``."""
    folder = tmp_path_factory.mktemp("probes")
    for name, (text, _) in PROBES.items():
        (folder / f"{name}.yaml").write_text(text)
    return {f"probe:{name}": str(folder / f"{name}.yaml") for name in PROBES}


@pytest.fixture(scope="module")
def compared(probes):
    """The quick checks and the full validation of every case of BAD, in a fresh process
    (tests here register kinds of their own in this one)."""
    configs = sorted(f"configs/{p.name}" for p in CONFIGS.glob("*.yaml"))
    cases = [(command, probes.get(path, path), over) for command, path, over in BAD]
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases), json.dumps(configs)],
                         cwd=ROOT, check=False, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("i", range(len(BAD)), ids=[" ".join(c[2] or [c[1]]) + f" ({c[0]})"
                                                    for c in BAD])
def test_the_quick_checks_raise_the_full_validations_message(compared, i):
    status, message, said = compared["quick"][i]
    code, stderr, stdout = compared["full"][i]
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert status == "error", (BAD[i], status)   # the quick checks found it
    assert stderr == f"config error: {message}\n"
    assert said == stdout   # train's engine line, where the full path prints it first


@pytest.mark.parametrize("name", PROBES)
def test_a_never_ending_yaml_or_a_section_of_the_wrong_type_is_one_line_at_once(
        probes, name, tmp_path):
    """The commands themselves on each probe file, in a fresh process: one line naming the
    field (or the file, line and column) and the value, exit code 2, within 10 s.
    Before: a recursive alias spun at full CPU until killed (check and
    train), ``learners: [1, 2, 3]`` or ``learners: 3`` printed a 22-line AttributeError
    traceback from the engine choice, ``market: 5`` printed train's engine line first."""
    path = probes[f"probe:{name}"]
    for argv in (["-m", "jaxmarket.check", path],
                 ["-m", "jaxmarket.train", path, "--run-dir", str(tmp_path / "run")]):
        out = subprocess.run([sys.executable, *argv], cwd=ROOT, check=False,
                             capture_output=True, text=True, timeout=10)
        assert out.returncode == 2, (argv, out.stderr[-2000:])
        assert out.stdout == "" and out.stderr.count("\n") == 1, (argv, out.stdout, out.stderr)
        assert out.stderr.startswith("config error: ") and PROBES[name][1] in out.stderr, \
            out.stderr
        if name in ("recursive_alias", "alias_bomb"):
            assert out.stderr.startswith(f"config error: {path}, line "), out.stderr
    assert not (tmp_path / "run").exists()


def test_the_same_section_in_a_run_directory_is_one_line_on_resume(probes, tmp_path):
    """``--resume`` reads the run's own config.yaml through the same loader and checks."""
    for name in ("recursive_alias", "learners_list"):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(PROBES[name][0])
        out = subprocess.run([sys.executable, "-m", "jaxmarket.train", "--resume", str(run)],
                             cwd=ROOT, check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
        assert PROBES[name][1] in out.stderr


def test_anchors_aliases_and_merge_keys_load_as_before(tmp_path):
    """The bounded loader reads what ``yaml.safe_load`` reads: anchors, aliases (to
    scalars, lists, mappings, nested), merge keys, and aliases repeating nearly as many
    values as the bound allows (9,133 of 10,000)."""
    from jaxmarket.config.loader import MAX_EXPANDED_NODES, safe_load
    text = (CONFIGS / "logit_duopoly.yaml").read_text() + """
description: &text a duopoly
name: *text
pbt: {}
"""
    shared = """
x: &seller {name: s, count: 2, cost: &cost [0.1, 0.2]}
y: [*seller, {<<: *seller, name: t, cost: *cost}, *cost]
deep: [&l1 [1, 2, 3, 4, 5, 6, 7, 8, 9], &l2 [*l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1],
       &l3 [*l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2],
       [*l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3], *l3]
"""
    assert MAX_EXPANDED_NODES == 10_000
    for body in (text, shared):
        assert safe_load(body, "x") == yaml.safe_load(body)
    path = tmp_path / "anchored.yaml"
    path.write_text(text)
    loaded = load_config(path)
    assert loaded == yaml.safe_load(text)
    assert loaded["name"] == loaded["description"] == "a duopoly"
    assert {k: v for k, v in loaded.items() if k not in ("name", "description", "pbt")} == \
        load_config(CONFIGS / "logit_duopoly.yaml")
    # a shipped config whose repeated seller group YAML writes as an anchor and aliases
    base = load_config(CONFIGS / "multi_product.yaml")
    group = base["market"]["sellers"][0]
    three = {**base, "market": {**base["market"], "sellers": [group, group, group]}}
    path.write_text(yaml.safe_dump(three, sort_keys=False))
    assert "&id001" in path.read_text() and "*id001" in path.read_text()
    assert load_config(path) == yaml.safe_load(path.read_text()) == three


def test_the_quick_checks_never_refuse_a_shipped_config(compared):
    refused = {p: r for p, rs in compared["valid"].items() for r in rs if r[0] == "error"}
    assert not refused
    # and they are not idle: most shipped configs get past the market and learners
    assert sum(r[0] == "ok" for rs in compared["valid"].values() for r in rs) >= 10


def test_a_fresh_process_runs_the_quick_checks_and_a_loaded_one_defers(compared):
    assert compared["fresh"] == compared["full"][0][1].removeprefix("config error: ").strip()
    assert compared["registries_loaded"]
    # a kind registered from Python is unknown to the schema: the full validation took it
    assert compared["custom"] == 0, compared["custom_out"]
    assert "learners.seller: my_bandit" in compared["custom_out"]


def test_the_schema_is_the_registries_own():
    """jaxmarket/config/schema.py is what ``python -m jaxmarket.cli.schema`` writes from
    the registries (a fresh process: only the shipped kinds)."""
    out = subprocess.run([sys.executable, "-m", "jaxmarket.cli.schema", "--check"], cwd=ROOT,
                         check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr


def imported(*args: str, cwd=ROOT) -> tuple[subprocess.CompletedProcess, set[str]]:
    """A command under ``-X importtime``: its result and the top-level packages it imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd,
                         check=False, capture_output=True, text=True, timeout=600)
    modules = {line.rsplit("|", 1)[1].strip().split(".")[0]
               for line in out.stderr.splitlines() if line.startswith("import time:")
               and "|" in line}
    return out, modules


@pytest.mark.parametrize("args", [
    ["-m", "jaxmarket.check", DEFAULT, "learners.seller.learning_rate=-1"],
    ["-m", "jaxmarket.train", DEFAULT, "market.sellers[0].count=0"],
    ["-m", "jaxmarket.cli.main", "check", DEFAULT, "train.num_seeds=0"],
    ["-m", "jaxmarket.check", DEFAULT, "market.sellers[0.count]=1"],
    ["-m", "jaxmarket.check", "tests/../README.md"],
    ["-m", "jaxmarket.check", "--help"],
    ["-m", "jaxmarket.train", "--help"],
    ["-m", "jaxmarket.cli.main", "--help"],
], ids=lambda a: " ".join(a[1:]))
def test_help_and_config_errors_import_no_heavy_library(args):
    out, modules = imported(*args)
    assert out.returncode in (0, 2), out.stderr[-2000:]
    assert "jaxmarket" in modules   # the timing lines were read
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    if out.returncode == 2:
        assert [ln for ln in out.stderr.splitlines() if not ln.startswith("import time:")] \
            [-1].startswith("config error: ")


def test_a_yaml_syntax_error_imports_no_heavy_library(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("market:\n  num_products: 1\n  sellers: [\n")
    out, modules = imported("-m", "jaxmarket.check", str(bad))
    assert out.returncode == 2 and "valid YAML" in out.stderr
    assert not modules & set(HEAVY)


def test_a_valid_check_imports_jax():
    """The structural test above is not vacuous: the full check does import jax."""
    out, modules = imported("-m", "jaxmarket.check", DEFAULT)
    assert out.returncode == 0 and "jax" in modules


#: what a session-engine run never needs: gymnax's environments (which import matplotlib
#: and seaborn), the loop's plotting and distributions, the cluster
NOT_FOR_SESSIONS = ("gymnax", "matplotlib", "seaborn", "distrax", "ray")


def test_a_session_engine_run_imports_no_gymnax_plotting_or_ray(tmp_path):
    """A Calvano run on the session engine (docs/sessions.md) reads the action bounds
    and observation shapes without gymnax's spaces (``MarketEnv.action_bounds``), and
    imports nothing of the loop's plotting, distributions or cluster."""
    out, modules = imported("-m", "jaxmarket.train", CALVANO, "train.num_seeds=2",
                            "train.num_iterations=40", "train.chunk_size=20",
                            "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"jax", "numba", "orbax"} <= modules   # the engine ran and checkpointed
    assert (tmp_path / "run" / "summary.json").is_file()
    assert not modules & set(NOT_FOR_SESSIONS), sorted(modules & set(NOT_FOR_SESSIONS))


# ----------------------------------------------------------------- the renamed default

OLD = "configs/legacy_default.yaml"


def test_the_default_is_budget_monopoly_and_no_second_copy_exists():
    assert train_cli.DEFAULT_CONFIG.name == "budget_monopoly.yaml"
    assert not (CONFIGS / "legacy_default.yaml").exists()


def test_the_old_name_loads_the_new_file_with_one_deprecation_line(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for old in (OLD, "jaxmarket/configs/legacy_default.yaml", str(ROOT / OLD)):
        assert load_config(old) == yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("DeprecationWarning") \
            and "budget_monopoly.yaml" in err[0], err


def test_the_old_name_outside_a_checkout_is_the_shipped_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(OLD) == load_config(CONFIGS / "budget_monopoly.yaml")
    assert "budget_monopoly.yaml" in capsys.readouterr().err


def test_the_old_name_trains_byte_identical_results(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    tiny = ["train.num_iterations=20", "train.chunk_size=10", "train.num_seeds=2",
            "train.num_envs=2"]
    for name, path in (("old", OLD), ("new", DEFAULT)):
        code = run_cli(train_cli.main, [path, "--run-dir", str(tmp_path / name), *tiny])
        assert code == 0, capsys.readouterr().err
    assert "budget_monopoly.yaml" in capsys.readouterr().err
    for f in ("metrics.csv", "seeds.csv", "summary.json"):
        assert (tmp_path / "old" / f).read_bytes() == (tmp_path / "new" / f).read_bytes(), f
