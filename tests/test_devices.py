"""``--devices N``: the seeds x markets sharded over N devices (jaxmarket/train/devices.py).

One subprocess with 8 forced CPU devices (``XLA_FLAGS`` must be set before JAX starts)
trains the same tiny scenario on 1 and 8 devices (2 devices, and 2 processes:
tests/test_distributed.py). What the runs must share
(docs/scaling.md): every integer and every discrete choice bit for bit (iteration and
update counters, a UCB1 bandit's pulls per arm, hence every arm it chose); the floats
to a relative 1e-5 of their scale (GSPMD reduces over the sharded axis in per-device partial sums, and
partitions the learners' per-policy update into a differently fused program)."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from jaxmarket.cli import run_cli

CONFIG = {
    "market": {
        "num_products": 2,
        "consumers": [{"name": "consumers", "count": 3, "budget": [1.0, 1.6], "queries": 10.0}],
        "sellers": [
            {"name": "sellers", "count": 3, "action": "price", "low": 0.0, "high": 3.0,
             "cost": 0.1, "reward": [{"kind": "profit"}]},
            {"name": "grid", "count": 2, "action": "price", "low": 0.0, "high": 3.0,
             "reward": [{"kind": "revenue"}]},
        ],
        "distributor": {"kind": "logit", "temperature": 0.5, "outside_option": True},
    },
    # 8 buffer rows: the 12 policies do not divide over 8 devices, the rows do
    "learners": {"sellers": {"kind": "ppo_bandit", "buffer_length": 8, "update_epochs": 2},
                 "grid": {"kind": "ucb1", "grid_size": 5}},
    # 32 markets: on 8 devices each seed's 8 markets span two devices
    "train": {"num_iterations": 12, "rollout_length": 2, "num_envs": 8, "num_seeds": 4,
              "chunk_size": 6},
    "seed": 3,
}

SCRIPT = r"""
import json, re, sys
from pathlib import Path
import jax, numpy as np
from jaxmarket.config.errors import ConfigError
from jaxmarket.train.plan import resolve
from jaxmarket.train.trainer import Trainer
from jaxmarket.train.tracking import Tracker

config, out = json.loads(sys.argv[1]), Path(sys.argv[2])
facts = {"local_devices": len(jax.local_devices()), "errors": {}}
for n in (9, 3):   # more than exist; not a divisor of the 32 markets
    try:
        Trainer(resolve(config), out / f"bad{n}", devices=n)
    except ConfigError as err:
        facts["errors"][str(n)] = str(err)
for n in (1, 8):   # 2 devices: tests/test_distributed.py
    t = Trainer(resolve(config), out / f"d{n}", devices=n)
    (out / f"d{n}").mkdir()
    t.train(Tracker(), t.initial_runner(), 0)
    runner, _ = t.restore()
    prices = runner.env_state.prices["sellers"]
    mean = runner.learners["sellers"].params["mean"]
    buf = runner.learners["sellers"].buf_sample   # the feature buffer [N, L, M, 2P]
    facts[str(n)] = {"price_devices": len(prices.sharding.device_set),
                     "price_shard_rows": prices.addressable_shards[0].data.shape[0],
                     "mean_replicated": bool(mean.sharding.is_fully_replicated),
                     "mean_devices": len(mean.sharding.device_set),
                     "buffer_shape": list(buf.shape),
                     "buffer_spec": [str(a) for a in buf.sharding.spec],
                     "buffer_shard_shape": list(buf.addressable_shards[0].data.shape),
                     "logp_buffer_size": int(runner.learners["sellers"].buf_logp.size)}
    # what the compiled chunk moves between devices: (op, elements) per collective
    hlo = t.chunk_fn(6).lower(runner).compile().as_text()
    facts[str(n)]["moved"] = [
        (m.group(2), int(np.prod([int(d) for d in m.group(1).split(",") if d] or [1])))
        for m in re.finditer(r"= [a-z0-9]+\[([0-9,]*)\]\S* (all-gather|all-to-all|"
                             r"collective-permute)(?:-start)?\(", hlo)]
    np.savez(out / f"d{n}.npz", **{jax.tree_util.keystr(p): np.asarray(x)
                                   for p, x in jax.tree_util.tree_leaves_with_path(runner)})
# 8 seeds of 4 markets on 8 devices: the feature buffer split by policy (24 policies,
# whole seeds per device, as the markets' state); its shardings, not compiled
seeds = Trainer(resolve({**config, "train": {**config["train"], "num_seeds": 8, "num_envs": 4}}),
                out / "seeds8", devices=8)
facts["seeds8_buffer_spec"] = [str(a) for a in
                               seeds.placement.runner.learners["sellers"].buf_sample.spec]
# 4 buffer rows: neither the 12 policies nor the rows divide over 8 devices
rows4 = Trainer(resolve({**config, "learners": {**config["learners"], "sellers": {
    **config["learners"]["sellers"], "buffer_length": 4}}}), out / "rows4", devices=8)
facts["rows4_buffer_spec"] = [str(a) for a in
                              rows4.placement.runner.learners["sellers"].buf_sample.spec]
from jaxmarket.train.run import _placement_note
facts["notes"] = {"rows4": _placement_note(rows4), "seeds8": _placement_note(seeds),
                  "rows8": _placement_note(t)}
print(json.dumps(facts))
"""


def split_axis(spec):
    """The one axis a PartitionSpec (as strings; trailing Nones dropped) splits."""
    axes = [i for i, a in enumerate(spec) if a != "None"]
    assert len(axes) == 1 and spec[axes[0]] == "markets", spec
    return axes[0]


def close(actual, desired, what):
    """Within 1e-5 relative, or 1e-5 of the array's largest magnitude (a profit near 0
    is a difference of two larger numbers)."""
    desired = np.asarray(desired)
    scale = float(np.abs(desired).max()) if desired.size else 0.0
    np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-5 * scale + 1e-12,
                               err_msg=what)


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("devices")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CONFIG), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


def test_markets_are_split_over_the_devices_and_policies_replicated(runs):
    _, facts = runs
    assert facts["local_devices"] == 8
    for n in (1, 8):
        f = facts[str(n)]
        assert f["price_devices"] == n and f["price_shard_rows"] == 32 // n
        assert f["mean_replicated"] and f["mean_devices"] == n


def test_feature_buffer_is_split_by_policy_else_rows_else_markets(runs):
    """The ppo_bandit's buffer is stored per policy ([3 sellers x seeds, rows, markets per
    seed, 2 P]). 4 seeds x 3 sellers = 12 policies do not divide over 8 devices, its 8
    rows do: each device holds one row of every policy and market. 8 seeds (24 policies)
    split the policy axis, whole seeds per device. With 4 rows and 12 policies, the
    markets axis is split."""
    _, facts = runs
    assert facts["1"]["buffer_shape"] == [3 * 4, 8, 8, 2 * 2]
    assert facts["1"]["buffer_shard_shape"] == [3 * 4, 8, 8, 2 * 2]
    assert split_axis(facts["8"]["buffer_spec"]) == 1                  # rows
    assert facts["8"]["buffer_shard_shape"] == [3 * 4, 1, 8, 2 * 2]
    assert split_axis(facts["seeds8_buffer_spec"]) == 0                # policies
    assert split_axis(facts["rows4_buffer_spec"]) == 2                 # markets


def test_the_cli_names_a_buffer_it_must_gather_and_the_fix(runs):
    """Only the 4-row buffer (neither its 12 policies nor its rows divide over 8 devices)
    takes the slow split; the run's first line says which group and what avoids it."""
    _, facts = runs
    first, *notes = facts["notes"]["rows4"].split("\n")
    assert first == " (markets sharded over 8 device(s))"
    assert notes == ["note: learners.sellers: its 12 policies and 4 buffer rows do not "
                     "divide over 8 devices, so its buffer is split by markets, which its "
                     "update gathers whole every time (slower); a buffer_length divisible "
                     "by 8 avoids it"]
    assert facts["notes"]["rows8"] == facts["notes"]["seeds8"] == first


def test_a_buffer_split_by_rows_is_never_gathered(runs):
    """Split along its rows, the buffer stays where it is: each step's samples move to
    the device of their row, and the update's sums over rows and markets are per-device
    partial sums and an all-reduce of the [policies, 2P] gradient. (Split along its
    markets instead, the update's merge of rows and markets made GSPMD gather all of it,
    and its rewards and log-probabilities, at every update: 31 sellers on 2 devices then
    trained at 0.56x one device, docs/scaling.md.) Nothing as large as the [12, 8, 8]
    row buffers moves between devices."""
    _, facts = runs
    assert facts["1"]["moved"] == []
    moved = facts["8"]["moved"]
    assert moved and all(op in ("all-gather", "all-to-all", "collective-permute")
                         for op, _ in moved)
    assert max(size for _, size in moved) < facts["8"]["logp_buffer_size"], moved


def test_bad_device_counts_are_one_line_errors_naming_both_numbers(runs):
    out, facts = runs
    too_many, uneven = facts["errors"]["9"], facts["errors"]["3"]
    assert too_many.startswith("--devices: got 9;") and "8 local device" in too_many
    assert uneven.startswith("--devices: got 3;") and "32 markets" in uneven
    assert "\n" not in too_many + uneven
    assert not (out / "bad9").exists() and not (out / "bad3").exists()


def test_integers_and_discrete_choices_are_identical_on_1_and_8_devices(runs):
    out, _ = runs
    one = np.load(out / "d1.npz")
    ints = [k for k in one.files if one[k].dtype.kind in "iub"]
    assert any("iteration" in k for k in ints) and any("updates" in k for k in ints)
    counts = next(k for k in one.files if "grid" in k and "counts" in k)   # UCB1 pulls per arm
    assert one[counts].sum() == 12 * 2 * 32 * 2 * 2   # iterations x steps x markets x agents x P
    for n in (8,):
        other = np.load(out / f"d{n}.npz")
        assert sorted(other.files) == sorted(one.files)
        # the UCB1 group's prices are grid points: its choices, not sums of floats
        for k in ints + [counts, ".env_state.prices['grid']"]:
            assert np.array_equal(one[k], other[k]), (n, k)
        for k in one.files:   # floats: the tolerance docs/scaling.md states
            close(other[k], one[k], k)
        m1, mn = _rows(out / "d1" / "metrics.csv"), _rows(out / f"d{n}" / "metrics.csv")
        assert [r["iteration"] for r in m1] == [r["iteration"] for r in mn]
        for a, b in zip(m1, mn):
            assert a["learner/sellers/num_updates"] == b["learner/sellers/num_updates"]
            for k in a:
                close(float(b[k]), float(a[k]), k)
        s1 = json.loads((out / "d1" / "summary.json").read_text())
        sn = json.loads((out / f"d{n}" / "summary.json").read_text())
        np.testing.assert_allclose(sn["final"]["sellers"]["mean_price"],
                                   s1["final"]["sellers"]["mean_price"], rtol=1e-5)
        assert sn["final"]["grid"]["mean_price"] == s1["final"]["grid"]["mean_price"]


def test_devices_beyond_this_process_exit_2_before_anything_is_written(tmp_path, capsys):
    from jaxmarket.train.__main__ import main
    d = tmp_path / "run"
    code = run_cli(main, ["--devices", "2", "--run-dir", str(d), "train.num_iterations=2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not d.exists()
    assert err.startswith("config error: --devices: got 2;") and "1 local device" in err
    assert len(err.splitlines()) == 1
