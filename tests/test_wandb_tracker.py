"""--tracker wandb: an offline W&B run in RUN_DIR/wandb holding the mean series, every
population member's series and every seed's series (from seeds.csv), with the run's
summary.json and metrics.csv saved; without wandb, a one-line configuration error."""

import csv
import sys

import pytest
from conftest import CONFIGS

from jaxmarket.config.errors import ConfigError
from jaxmarket.train.run import start_run
from jaxmarket.train.tracking import SeedRowsTail, with_tracker


def test_wandb_tracker_logs_means_members_and_every_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    start_run(str(CONFIGS / "budget_monopoly.yaml"),
              ["train.num_iterations=40", "train.chunk_size=20", "train.num_seeds=2",
               "learners.seller.population=2"], str(run_dir), tracker="wandb")
    import wandb
    wandb.teardown()     # the service process writes the log: wait until it has finished
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = log.read_bytes()
    # metric names: means, members m0/m1, and seed/<s>/... for both seeds
    for key in ("reward/seller", "reward/seller/m1", "price/seller/m0/p0",
                "seed/0/price/seller/p0", "seed/1/reward/seller", "seed/1/traffic/seller/p0"):
        assert key.encode() in data, key
    # the per-seed values of the chunks' last iterations (20 and 40), as seeds.csv has them
    with (run_dir / "seeds.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["iteration"] in ("20", "40")]
    assert len(rows) == 4
    for row in rows:
        value = row["price/seller/p0"]
        assert float(value) not in (0.0, 1.0) and value.encode() in data, row
    saved = log.parent / "files"
    assert (saved / "summary.json").read_text() == (run_dir / "summary.json").read_text()
    assert (saved / "metrics.csv").read_text() == (run_dir / "metrics.csv").read_text()


def test_seed_rows_tail_reads_each_appended_row_once(tmp_path):
    path = tmp_path / "seeds.csv"
    tail = SeedRowsTail(path)
    assert tail.rows() == []
    path.write_text("iteration,seed,reward/g\n1,0,0.5\n1,1,0.25\n2,0,0.7")   # last line open
    assert tail.rows() == [{"iteration": 1.0, "seed": 0.0, "reward/g": 0.5},
                           {"iteration": 1.0, "seed": 1.0, "reward/g": 0.25}]
    with path.open("a") as f:
        f.write("5\n2,1,0.125\n")
    assert tail.rows() == [{"iteration": 2.0, "seed": 0.0, "reward/g": 0.75},
                           {"iteration": 2.0, "seed": 1.0, "reward/g": 0.125}]
    assert tail.rows() == []


def test_wandb_tracker_without_wandb_is_a_one_line_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)      # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'jaxmarket\[wandb\]'"):
        with_tracker("wandb", tmp_path, {}, lambda tracker: None)


def test_wandb_online_without_a_login_is_a_one_line_config_error(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))          # no ~/.netrc, no saved login
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.raises(ConfigError, match=r"--tracker wandb: .*WANDB_MODE=offline"):
        with_tracker("wandb", tmp_path / "run", {}, lambda tracker: None)
