"""python -m jaxmarket.plot: the numbers each figure draws, checked against the CSV files
they come from (hand-written run directories with known values), the axis labels per
side, --smooth validation through the CLI, and one real tiny training run."""

import csv

import numpy as np
import pytest
from conftest import CONFIGS

from jaxmarket import ConfigError
from jaxmarket.cli import run_cli
from jaxmarket.analysis.plots import make_figure, moving_average, plot_run, plot_series
from jaxmarket.cli.plot import main

CONFIG_YAML = """\
market:
  num_products: 2
  consumers:
    - {name: buy, count: 2, agent: true, budget: 1.0, budget_low: 0.1, budget_high: 2.0,
       queries: 1.0}
  sellers:
    - {name: sel, count: 2, action: price, low: 0.0, high: 3.0}
  distributor: {kind: logit}
"""
GROUPS = ("buy", "sel")
MARKET_COLUMNS = [f"{what}/{g}" + (f"/p{j}" if what != "reward" else "")
                  for g in GROUPS for what in ("reward", "traffic", "price")
                  for j in (range(2) if what != "reward" else [None])]
NUM_ITER, NUM_SEEDS = 12, 3


def trailing_mean(y, n):
    """The documented smoothing, by hand: mean of rows max(0, i-n+1)..i."""
    y = np.asarray(y, dtype=np.float64)
    return np.array([y[max(0, i - n + 1): i + 1].mean(axis=0) for i in range(len(y))])


def write_csv(path, header, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory written by hand: config.yaml (consumer agents "buy", sellers
    "sel"), seeds.csv with 3 seeds of random values (rows of one iteration together, the
    seeds in a different order each iteration), metrics.csv holding their mean (plus a learner column, which is not drawn)."""
    rng = np.random.default_rng(0)
    per_seed = rng.normal(size=(NUM_SEEDS, NUM_ITER, len(MARKET_COLUMNS)))
    per_seed *= np.linspace(0.5, 3.0, len(MARKET_COLUMNS))  # columns on different scales
    its = np.arange(1, NUM_ITER + 1)
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(CONFIG_YAML)
    mean = per_seed.mean(axis=0)
    write_csv(d / "metrics.csv", ["iteration", *MARKET_COLUMNS, "learner/sel/loss"],
              [[int(i), *(repr(float(v)) for v in row), "nan"] for i, row in zip(its, mean)])
    write_csv(d / "seeds.csv", ["iteration", "seed", *MARKET_COLUMNS],
              [[int(its[t]), s, *(repr(float(v)) for v in per_seed[s, t])]
               for t in range(NUM_ITER) for s in rng.permutation(NUM_SEEDS)])
    return d, its, mean, per_seed


def column(name):
    return MARKET_COLUMNS.index(name)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 40])
def test_moving_average_matches_a_hand_window_loop(n):
    # catches: a window off by one, zero-padding the first n-1 rows (divide by n instead
    # of by the rows available), a centred instead of trailing window
    y = np.random.default_rng(1).normal(size=(17, 3))
    np.testing.assert_allclose(moving_average(y, n), trailing_mean(y, n), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(moving_average(y[:, 0], n), trailing_mean(y[:, 0], n), rtol=1e-12)


def test_moving_average_keeps_a_nan_inside_its_windows():
    # catches: a cumulative-sum implementation that spreads one NaN to every later row
    y = np.arange(10.0)
    y[3] = np.nan
    out = moving_average(y, 3)
    assert np.isnan(out[3:6]).all()
    np.testing.assert_allclose(out[6:], trailing_mean(y, 3)[6:])
    np.testing.assert_allclose(out[:3], [0.0, 0.5, 1.0])


@pytest.mark.parametrize("smooth", [1, 4])
def test_mean_lines_are_the_metrics_columns_smoothed(run_dir, smooth):
    # catches: lines from the wrong column/group, smoothing skipped or applied twice,
    # x not the iteration column, learner columns drawn
    d, its, mean, _ = run_dir
    for g in GROUPS:
        s = plot_series(d, g, smooth)
        np.testing.assert_array_equal(s["x"], its)
        for what in ("price", "traffic", "reward"):
            lines = s["panels"][what]["lines"]
            expected_names = [c for c in MARKET_COLUMNS if c.startswith(f"{what}/{g}")]
            assert list(lines) == expected_names
            for name, y in lines.items():
                want = mean[:, column(name)] if smooth == 1 else trailing_mean(mean[:, column(name)], smooth)
                np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
        assert not any(name.startswith("learner/") for p in s["panels"].values() for name in p["lines"])


@pytest.mark.parametrize("smooth", [1, 3])
def test_band_is_min_max_over_seeds_of_the_smoothed_seed_series(run_dir, smooth):
    # catches: a band from min/max of the raw values then smoothed (differs for smooth > 1),
    # rows grouped by position instead of by the seed column, a band around the wrong line
    d, its, mean, per_seed = run_dir
    s = plot_series(d, "sel", smooth)
    assert s["num_seeds"] == NUM_SEEDS
    np.testing.assert_array_equal(s["band_x"], its)
    for what in ("price", "traffic", "reward"):
        for name, (low, high) in s["panels"][what]["bands"].items():
            smoothed = np.stack([trailing_mean(per_seed[k, :, column(name)], smooth)
                                 for k in range(NUM_SEEDS)])
            np.testing.assert_allclose(low, smoothed.min(axis=0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(high, smoothed.max(axis=0), rtol=1e-12, atol=1e-12)
            line = s["panels"][what]["lines"][name]
            assert np.all(low <= line + 1e-12) and np.all(line <= high + 1e-12)
            if smooth > 1:  # the fixture tells the two orders apart
                assert not np.allclose(low, trailing_mean(per_seed[:, :, column(name)].min(axis=0), smooth))
        assert list(s["panels"][what]["bands"]) == list(s["panels"][what]["lines"])


def test_figure_labels_and_drawn_data_match_the_csv(run_dir):
    # catches: the consumer group's top panel labelled "price" (or the seller's "budget"),
    # lines not the CSV columns, bands not drawn at the computed low/high
    d, its, mean, _ = run_dir
    for g, top in (("sel", "price"), ("buy", "budget")):
        s = plot_series(d, g)
        fig = make_figure(s, "run")
        assert [ax.get_ylabel() for ax in fig.axes[:3]] == [top, "traffic", "reward"]
        for ax, what in zip(fig.axes, ("price", "traffic", "reward")):
            names = [c for c in MARKET_COLUMNS if c.startswith(f"{what}/{g}")]
            assert len(ax.lines) == len(names) and len(ax.collections) == len(names)
            for line, band, name in zip(ax.lines, ax.collections, names):
                np.testing.assert_array_equal(line.get_xdata(), its)
                np.testing.assert_array_equal(line.get_ydata(), mean[:, column(name)])
                low, high = s["panels"][what]["bands"][name]
                vertices = {tuple(v) for v in band.get_paths()[0].vertices}
                assert vertices == set(zip(its, low)) | set(zip(its, high))


def test_no_band_without_seeds_csv_or_with_one_seed_and_generic_label_without_config(run_dir):
    # catches: a band drawn from a single seed (zero width, or crash), a crash without
    # seeds.csv or config.yaml, a side-specific label guessed without the config
    d, its, mean, per_seed = run_dir
    write_csv(d / "seeds.csv", ["iteration", "seed", *MARKET_COLUMNS],
              [[int(its[t]), 0, *(repr(float(v)) for v in per_seed[0, t])] for t in range(NUM_ITER)])
    s = plot_series(d, "sel")
    assert s["num_seeds"] == 0 and all(not p["bands"] for p in s["panels"].values())
    (d / "seeds.csv").unlink()
    (d / "config.yaml").unlink()
    s = plot_series(d, "buy", 2)
    assert all(not p["bands"] for p in s["panels"].values())
    np.testing.assert_allclose(s["panels"]["reward"]["lines"]["reward/buy"],
                               trailing_mean(mean[:, column("reward/buy")], 2), rtol=1e-12)
    fig = make_figure(s, "run")
    assert fig.axes[0].get_ylabel() not in ("price", "budget")
    assert all(len(ax.collections) == 0 for ax in fig.axes)


def test_band_covers_only_iterations_every_seed_has(run_dir):
    # catches: a crash or misaligned band when seeds.csv lags metrics.csv (a run killed
    # between the two appends) or one seed misses a row
    d, its, mean, per_seed = run_dir
    rows = [[int(its[t]), k, *(repr(float(v)) for v in per_seed[k, t])]
            for t in range(8) for k in range(NUM_SEEDS) if (t, k) != (7, 1)]
    write_csv(d / "seeds.csv", ["iteration", "seed", *MARKET_COLUMNS], rows)
    s = plot_series(d, "buy", 2)
    np.testing.assert_array_equal(s["x"], its)
    np.testing.assert_array_equal(s["band_x"], its[:7])
    low, high = s["panels"]["price"]["bands"]["price/buy/p1"]
    smoothed = np.stack([trailing_mean(per_seed[k, :7, column("price/buy/p1")], 2)
                         for k in range(NUM_SEEDS)])
    np.testing.assert_allclose(low, smoothed.min(axis=0), rtol=1e-12)
    np.testing.assert_allclose(high, smoothed.max(axis=0), rtol=1e-12)
    make_figure(s, "run")


@pytest.mark.parametrize("bad", ["0", "-2", "1.5", "abc"])
def test_cli_rejects_a_bad_smooth_with_exit_code_2(run_dir, capsys, bad):
    # catches: --smooth 0 accepted (division by zero / empty window), an argparse usage
    # dump or a traceback instead of one config error naming --smooth
    d = run_dir[0]
    assert run_cli(main, [str(d), "--smooth", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: --smooth") and "an integer >= 1" in err
    assert not (d / "plots").exists()
    with pytest.raises(ConfigError, match="--smooth"):
        plot_run(d, smooth=0)


def test_cli_writes_one_png_per_group_and_help_is_plain_text(run_dir, capsys):
    # catches: a group missing from the output, the smoothing option not wired to the
    # CLI, RST markup in --help
    d = run_dir[0]
    assert run_cli(main, [str(d), "--smooth", "3"]) == 0
    assert capsys.readouterr().out.split() == [str(d / "plots" / f"{g}.png") for g in GROUPS]
    import matplotlib.image
    img = matplotlib.image.imread(d / "plots" / "sel.png")
    assert img[..., :3].std() > 0.05
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "--smooth N" in out and "min" in out
    assert run_cli(main, [str(d.parent / "missing")]) == 2


def test_real_run_mean_line_is_the_metrics_column(tmp_path):
    # catches: plotting broken on the training loop's own files (column names, its
    # config.yaml, the seller label)
    from jaxmarket.train.run import start_run
    from jaxmarket.train.tracking import read_metrics
    d = tmp_path / "run"
    start_run(str(CONFIGS / "budget_monopoly.yaml"),
              ["train.num_iterations=40", "train.chunk_size=20", "train.num_seeds=2"], str(d))
    header, data = read_metrics(d / "metrics.csv")
    s = plot_series(d, "seller")
    assert s["side"] == "seller"
    np.testing.assert_array_equal(s["x"], data[:, header.index("iteration")])
    for what in ("price", "reward"):
        name = f"{what}/seller/p0" if what == "price" else "reward/seller"
        np.testing.assert_array_equal(s["panels"][what]["lines"][name], data[:, header.index(name)])
    fig = make_figure(s, d.name)
    assert fig.axes[0].get_ylabel() == "price"
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_ydata(),
                                  data[:, header.index("price/seller/p0")])
    assert plot_run(d) == [d / "plots" / "seller.png"]
