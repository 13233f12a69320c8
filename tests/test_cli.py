"""The command line as a user meets it: one consistent CLI (positional or --config, check
without arguments), errors before anything compiles or is written, Ctrl-C, resume and
extend, the end-of-run message, per-seed files, the stop-and-save paths."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from conftest import CONFIGS, ROOT

from jaxmarket.cli import run_cli
from jaxmarket.config.loader import load_config
import jaxmarket.learners  # noqa: F401  (the package registers every learner kind)
from jaxmarket.learners.base import LEARNERS
from jaxmarket.train.tracking import read_metrics

LEGACY = str(CONFIGS / "budget_monopoly.yaml")
TINY = ["train.num_iterations=40", "train.chunk_size=10", "train.checkpoint_every=1",
        "train.num_seeds=2", "train.num_envs=2"]


def run(capsys, module: str, *args):
    """A CLI in-process (the same code path as ``python -m jaxmarket.<module>``)."""
    main = {"train": "jaxmarket.cli.train", "check": "jaxmarket.cli.check",
            "plot": "jaxmarket.cli.plot"}[module]
    code = run_cli(__import__(main, fromlist=["main"]).main, list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------- one CLI

def test_train_takes_the_scenario_as_first_positional_argument(tmp_path, capsys):
    out = run(capsys, "train", LEGACY, "--run-dir", str(tmp_path / "r"), *TINY, "seed=5")
    assert out.returncode == 0, out.stderr
    # the run's config is the file with exactly these overrides (catches the positional
    # being read as an override or dropped in favour of the default)
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text()) == \
        load_config(LEGACY, TINY + ["seed=5"])
    _, data = read_metrics(tmp_path / "r" / "metrics.csv")
    assert data.shape[0] == 40


def test_train_refuses_both_a_positional_scenario_and_config(tmp_path, capsys):
    out = run(capsys, "train", LEGACY, "--config", LEGACY, "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 2 and "one scenario file" in one_line(out.stderr)
    assert not (tmp_path / "r").exists()


def test_check_without_arguments_checks_the_default_with_learner_and_train_defaults(capsys):
    out = run(capsys, "check")
    assert out.returncode == 0, out.stderr
    assert "required" not in out.stdout + out.stderr
    shipped = yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())
    # every learner setting is printed, the ones the file leaves out at their registry default
    fields = LEARNERS[shipped["learners"]["seller"]["kind"]].hyper_fields
    for name, field in fields.items():
        value = shipped["learners"]["seller"].get(name, field.default)
        assert f"\n  {name}: {value}\n" in out.stdout + "\n", name
    for name, value in shipped["train"].items():
        assert f"{name}={value}" in out.stdout


def test_check_of_a_market_only_mapping_says_it_cannot_train(tmp_path, capsys):
    cfg = yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())
    del cfg["learners"]
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = run(capsys, "check", str(path))
    assert out.returncode == 0 and "market-only" in out.stdout


@pytest.mark.parametrize("module", ["train", "check", "plot"])
def test_help_is_plain_text(module, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(capsys, module, "--help")
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert f"python -m jaxmarket.{module}" in text and "``" not in text


def test_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    # line 3 is indented deeper than its sibling: YAML reports it at line 3, column 8
    path.write_text("market:\n  num_products: 1\n  sellers: x\n       y: 2\n")
    bad_line, bad_col = 3, 10   # the ':' after "sellers: x ... y" is on line 4, col 8 (1-based)
    out = run(capsys, "check", str(path))
    line = one_line(out.stderr)
    assert out.returncode == 2
    m = re.search(rf"{re.escape(str(path))}, line (\d+), column (\d+): got ", line)
    assert m, line
    # YAML marks the ':' that cannot start a mapping inside a plain scalar: line 4, col 8
    text = path.read_text().splitlines()
    row, col = int(m.group(1)), int(m.group(2))
    assert (row, col) == (4, text[3].index(":") + 1), (row, col, bad_line, bad_col)


# ------------------------------------------------------------- validation before compiling

def test_unknown_early_stop_metric_fails_before_anything_is_written(tmp_path, capsys):
    out = run(capsys, "train", LEGACY, "--run-dir", str(tmp_path / "r"), *TINY,
              "train.early_stop={metric: reward/sellers, above: 1}")
    line = one_line(out.stderr)
    assert out.returncode == 2
    assert line.startswith("config error: train.early_stop.metric: got 'reward/sellers'")
    assert "reward/seller," in line and "price/seller/p0" in line   # the real names listed
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("learner, field, allowed", [
    # a Gaussian bandit's bound error names the group and the bound's value
    ("{kind: ppo_bandit, mean_low: 2.0, mean_high: 1.5}", "learners.seller.mean_low",
     "values <= mean_high (1.5"),
    # a discrete bandit's grid outside the group's [0, 3] bounds
    ("{kind: ucb1, grid: [0.5, 4.0]}", "learners.seller.grid", "[0, 3]"),
    # PPO's cross-field rule (a bare field name before)
    ("{kind: ppo, anneal_lr: true}", "learners.seller.num_updates", "required when anneal_lr"),
    ("{kind: schedule, timestamps: [0, 0], values: [1, 2]}", "learners.seller.timestamps",
     "strictly increasing"),
])
def test_learner_value_errors_name_the_group_field(tmp_path, capsys, learner, field, allowed):
    out = run(capsys, "train", LEGACY, "--run-dir", str(tmp_path / "r"), f"learners.seller={learner}")
    line = one_line(out.stderr)
    assert out.returncode == 2
    assert line.startswith(f"config error: {field}: got "), line
    assert allowed in line, line
    assert not (tmp_path / "r").exists()


def test_missing_learners_prints_a_block_that_makes_the_file_train(tmp_path, capsys):
    cfg = yaml.safe_load((CONFIGS / "multi_product.yaml").read_text())
    del cfg["learners"]
    path = tmp_path / "market.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = run(capsys, "train", str(path), "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    block = out.stderr[out.stderr.index("\nlearners:") + 1:]
    learners = yaml.safe_load(block)["learners"]
    assert set(learners) == {"buyers", "posted", "multiplied"}   # every agent group, no entity
    assert all(spec["kind"] in LEARNERS for spec in learners.values())
    # pasting the block in gives a file that validates
    cfg["learners"] = learners
    path.write_text(yaml.safe_dump(cfg))
    assert run(capsys, "check", str(path)).returncode == 0
    assert not (tmp_path / "r").exists()


def test_an_existing_run_directory_is_refused_and_left_alone(tmp_path, capsys):
    d = tmp_path / "r"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    out = run(capsys, "train", LEGACY, "--run-dir", str(d), *TINY)
    assert out.returncode == 2 and f"--resume {d}" in one_line(out.stderr)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


# ----------------------------------------------------------------- end of a run, seeds

def test_end_of_run_message_and_per_seed_files_agree_with_the_metrics(tmp_path, capsys):
    d = tmp_path / "r"
    out = run(capsys, "train", LEGACY, "--run-dir", str(d), *TINY)
    assert out.returncode == 0, out.stderr
    tail = math.ceil(0.1 * 40)
    assert f"finished 40 iterations; files in {d}/" in out.stdout
    assert f"mean over the last {tail} iterations" in out.stdout
    assert f"next: python -m jaxmarket.plot {d}" in out.stdout
    header, data = read_metrics(d / "metrics.csv")
    s_header, s_data = read_metrics(d / "seeds.csv")
    assert s_header[:2] == ["iteration", "seed"]
    assert s_data.shape[0] == 40 * 2
    for name in ("reward/seller", "price/seller/p0", "traffic/seller/p0"):
        per_seed = s_data[:, s_header.index(name)].reshape(40, 2)       # iteration-major
        np.testing.assert_array_equal(s_data[:, 1].reshape(40, 2), [[0, 1]] * 40)
        # the metrics.csv column is the mean of the two seeds' values
        np.testing.assert_allclose(data[:, header.index(name)], per_seed.mean(1), rtol=1e-6)
    summary = json.loads((d / "summary.json").read_text())
    rewards = s_data[:, s_header.index("reward/seller")].reshape(40, 2)[-tail:]
    np.testing.assert_allclose(summary["per_seed"]["seller"]["mean_reward"], rewards.mean(0))
    np.testing.assert_allclose(summary["final"]["seller"]["mean_reward"], rewards.mean(),
                               rtol=1e-6)


def test_bandit_loss_is_nan_exactly_when_no_update_ran(tmp_path, capsys):
    # budget_monopoly: ppo_bandit with buffer_length 4, one step per iteration, so an update
    # runs every 4th iteration and only then is there a loss
    out = run(capsys, "train", LEGACY, "--run-dir", str(tmp_path / "r"), *TINY)
    assert out.returncode == 0, out.stderr
    header, data = read_metrics(tmp_path / "r" / "metrics.csv")
    it = data[:, header.index("iteration")].astype(int)
    updates = data[:, header.index("learner/seller/num_updates")]
    loss = data[:, header.index("learner/seller/loss")]
    buffer = load_config(LEGACY)["learners"]["seller"]["buffer_length"]
    np.testing.assert_array_equal(updates, (it % buffer == 0).astype(float))
    np.testing.assert_array_equal(np.isfinite(loss), it % buffer == 0)


# ----------------------------------------------------------------- stop-and-save paths

def checkpoints(d):
    return sorted(int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("rule, stops_at", [
    ("{metric: price/seller/p0, below: 100.0}", 10),    # prices are <= 3: met at once
    ("{metric: price/seller/p0, above: 100.0}", None),  # never met: runs to the end
    ("{metric: reward/seller, above: -1.0}", 10),       # revenue >= 0 > -1: met at once
    ("{metric: reward/seller, below: -1.0}", None),
])
def test_early_stop_saves_the_state_where_it_stopped(tmp_path, capsys, rule, stops_at):
    d = tmp_path / "r"
    out = run(capsys, "train", LEGACY, "--run-dir", str(d), *TINY, f"train.early_stop={rule}")
    assert out.returncode == 0, out.stderr
    summary = json.loads((d / "summary.json").read_text())
    _, data = read_metrics(d / "metrics.csv")
    if stops_at is None:
        assert summary["stopped"] is None and summary["iterations"] == 40
        assert data.shape[0] == 40
    else:
        assert summary["stopped"].startswith("early stop: ")
        assert f"at iteration {stops_at}" in summary["stopped"]
        assert summary["iterations"] == stops_at and data.shape[0] == stops_at
        assert checkpoints(d)[-1] == stops_at
        assert f"stopped at iteration {stops_at}: early stop" in out.stdout


def test_prices_near_float32_max_saturate_and_the_run_completes(tmp_path, capsys):
    # prices drawn around 2.9e38 used to overflow float32 (max 3.4e38) in the metrics'
    # sums; quoted prices now saturate (docs/reliability.md, "Numerics"), so the run
    # trains to its end with finite metrics (the non-finite stop itself: test_train.py)
    d = tmp_path / "r"
    out = run(capsys, "train", LEGACY, "--run-dir", str(d), *TINY,
              "market.sellers[0].high=3e38", "market.consumers[0].budget=3e38",
              "learners.seller={kind: ppo_bandit, scaled: false, initial_mean: 2.9e38, "
              "initial_stddev: 1.0e36}")
    assert out.returncode == 0, out.stderr
    summary = json.loads((d / "summary.json").read_text())
    assert summary["stopped"] is None
    header, data = read_metrics(d / "metrics.csv")
    market = [i for i, h in enumerate(header) if h.split("/")[0] in ("price", "reward", "traffic")]
    assert len(market) == 3 and np.all(np.isfinite(data[:, market]))
    assert data[:, header.index("price/seller/p0")].max() > 1e36   # saturated, not clipped low
    assert summary["iterations"] == data.shape[0] > 10


def test_resume_without_a_checkpoint_starts_over_and_matches_a_fresh_run(tmp_path, capsys):
    fresh, crashed = tmp_path / "fresh", tmp_path / "crashed"
    assert run(capsys, "train", LEGACY, "--run-dir", str(fresh), *TINY).returncode == 0
    # a run killed before its first checkpoint: config.yaml and a partial metrics.csv
    crashed.mkdir()
    (crashed / "config.yaml").write_text((fresh / "config.yaml").read_text())
    (crashed / "metrics.csv").write_text("".join(
        (fresh / "metrics.csv").read_text().splitlines(keepends=True)[:4]))
    out = run(capsys, "train", "--resume", str(crashed))
    assert out.returncode == 0, out.stderr
    assert "from iteration 0" in out.stdout
    for name in ("metrics.csv", "seeds.csv"):
        assert (crashed / name).read_text() == (fresh / name).read_text()


def test_resume_extends_a_finished_run_exactly_like_a_longer_run(tmp_path, capsys):
    short, long_ = tmp_path / "short", tmp_path / "long"
    base = [o for o in TINY if not o.startswith("train.num_iterations")]
    assert run(capsys, "train", LEGACY, "--run-dir", str(short), *base,
               "train.num_iterations=20").returncode == 0
    out = run(capsys, "train", "--resume", str(short), "train.num_iterations=40")
    assert out.returncode == 0, out.stderr
    assert "from iteration 20" in out.stdout
    assert run(capsys, "train", LEGACY, "--run-dir", str(long_), *base,
               "train.num_iterations=40").returncode == 0
    for name in ("metrics.csv", "seeds.csv"):
        assert (short / name).read_text() == (long_ / name).read_text()
    assert yaml.safe_load((short / "config.yaml").read_text())["train"]["num_iterations"] == 40


@pytest.mark.parametrize("override, message", [
    ("market.num_products=2", "--resume overrides: got 'market.num_products=2'"),
    ("train.num_iterations=5", "train.num_iterations: got 5; allowed: an integer >= 40"),
])
def test_resume_refuses_changes_to_what_ran(tmp_path, capsys, override, message):
    d = tmp_path / "r"
    assert run(capsys, "train", LEGACY, "--run-dir", str(d), *TINY).returncode == 0
    before = (d / "config.yaml").read_text()
    out = run(capsys, "train", "--resume", str(d), override)
    assert out.returncode == 2 and message in one_line(out.stderr)
    assert (d / "config.yaml").read_text() == before


def test_ctrl_c_checkpoints_the_chunk_prints_one_line_and_resumes_identically(tmp_path):
    d, ref = tmp_path / "r", tmp_path / "ref"
    args = [LEGACY, "train.num_iterations=1000000", "train.chunk_size=20",
            "train.checkpoint_every=5", "train.num_seeds=1", "train.num_envs=2",
            "train.log_every=1"]   # a row per iteration (auto: 100 for 10^6 iterations)
    proc = subprocess.Popen([sys.executable, "-m", "jaxmarket.train", "--run-dir", str(d), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    deadline = time.time() + 240
    while not ((d / "metrics.csv").is_file() and (d / "metrics.csv").stat().st_size > 0):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    m = re.fullmatch(r"interrupted at iteration (\d+); resume with "
                     rf"python -m jaxmarket\.train --resume {re.escape(str(d))}", one_line(err))
    assert m, err
    n = int(m.group(1))
    # the chunk running at Ctrl-C finished and was checkpointed (not only every 5th chunk)
    assert n % 20 == 0 and n > 0 and checkpoints(d)[-1] == n
    _, data = read_metrics(d / "metrics.csv")
    assert data.shape[0] == n
    # resumed to n + 40 iterations, it equals an uninterrupted run of n + 40
    total = f"train.num_iterations={n + 40}"
    resumed = subprocess.run([sys.executable, "-m", "jaxmarket.train", "--resume", str(d), total],
                             cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    straight = subprocess.run([sys.executable, "-m", "jaxmarket.train", "--run-dir", str(ref),
                               *args[:1], *args[2:], total],
                              cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert straight.returncode == 0, straight.stderr
    assert (d / "metrics.csv").read_text() == (ref / "metrics.csv").read_text()


def test_second_train_run_loads_its_compiled_programs_from_the_cache(tmp_path, monkeypatch):
    """``--compile-cache DIR``: the first run compiles and stores, a second run of the same
    scenario (another seed: data) loads the training chunk and gets the bits it would
    have got compiling; ``none`` turns the cache off; the environment variable is the
    default."""
    import jax

    from jaxmarket.cli import run_cli
    from jaxmarket.compile_cache import resolve
    from jaxmarket.cli.train import main

    events = []

    def listen(event, **kwargs):
        events.append(event)

    cache = tmp_path / "xla"
    base = [str(CONFIGS / "budget_monopoly.yaml"), "train.num_iterations=20",
            "train.chunk_size=10", "train.num_envs=2"]
    jax.monitoring.register_event_listener(listen)
    try:
        assert run_cli(main, [*base, "--run-dir", str(tmp_path / "a"),
                              "--compile-cache", str(cache)]) == 0
        first = list(events)
        assert run_cli(main, [*base, "seed=5", "--run-dir", str(tmp_path / "b"),
                              "--compile-cache", str(cache)]) == 0
        second = events[len(first):]
        assert run_cli(main, [*base, "seed=5", "--run-dir", str(tmp_path / "c"),
                              "--compile-cache", "none"]) == 0
        third = events[len(first) + len(second):]
    finally:
        jax.monitoring.unregister_event_listener(listen)
    hits = "/jax/compilation_cache/cache_hits"
    assert first.count(hits) == 0 and any(cache.iterdir())
    assert second.count(hits) >= 1            # the chunk (and init: the seed is its data)
    assert third.count(hits) == 0
    assert (tmp_path / "b" / "metrics.csv").read_text() == \
        (tmp_path / "c" / "metrics.csv").read_text()
    monkeypatch.setenv("JAXMARKET_COMPILE_CACHE", "none")
    assert resolve(None) is None and resolve("d") == "d" and resolve("None") is None
    monkeypatch.setenv("JAXMARKET_COMPILE_CACHE", str(cache))
    assert resolve(None) == str(cache)
    monkeypatch.delenv("JAXMARKET_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve(None) == str(tmp_path / "xdg" / "jaxmarket" / "xla")


@pytest.mark.parametrize("freeze", [True, False])
def test_a_commands_exit_leaves_its_objects_to_the_operating_system(freeze):
    # Bug caught: a command's process ending with the interpreter searching every object
    # it made for reference cycles (about 0.7 s after a Calvano run): an object in a
    # cycle at exit_process is never collected (its __del__ never runs), where a plain
    # sys.exit collects it
    ending = "exit_process(3)" if freeze else "sys.exit(3)"
    script = ("import sys\n"
              "from jaxmarket.cli import exit_process\n"
              "class Cycle:\n"
              "    def __del__(self): print('collected', flush=True)\n"
              "a = Cycle(); a.self = a; del a\n"
              "import gc; gc.disable()\n" + ending + "\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3
    assert ("collected" in done.stdout) is not freeze
