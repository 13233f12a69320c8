"""The plotting library: a run's metrics over training (one figure per agent group: prices
or budgets, traffic, rewards, a line per product; the mean over seeds with a min-max or
95% bootstrap band), a session-engine run's distributions, cross-play matrices and sweep
curves. ``python -m jaxmarket.plot`` (:mod:`jaxmarket.cli.plot`) is its command line."""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.market.spec import resolve_market
from jaxmarket.train.publish import verify
from jaxmarket.train.rundir import SESSIONS_FILE
from jaxmarket.train.tracking import ParquetRows, read_metrics

PANELS = ("price", "traffic", "reward")
TOP_LABELS = {"seller": "price", "consumer": "budget", None: "price / budget"}


@dataclass
class RunData:
    """What a run directory holds for plotting (see :func:`run_data`)."""

    name: str
    header: list[str]                  # metrics.csv columns
    data: np.ndarray                   # metrics.csv rows, [iterations, columns]
    seeds_header: list[str] | None     # seeds.csv columns (iteration, seed, metrics...)
    seeds_data: np.ndarray | None      # seeds.csv rows, [iterations x seeds, columns]
    sides: dict[str, str]              # group -> "seller" | "consumer"; {} without config.yaml


def check_smooth(value: Any) -> int:
    """The --smooth value as an int >= 1 (an int, or the text of one from the command
    line); anything else is a ConfigError naming --smooth."""
    try:
        if isinstance(value, str):
            n = int(value.strip())
        elif isinstance(value, bool):
            raise TypeError
        else:
            n = operator.index(value)
    except (TypeError, ValueError):
        raise ConfigError("--smooth", value, "an integer >= 1") from None
    if n < 1:
        raise ConfigError("--smooth", value, "an integer >= 1")
    return n


def moving_average(y: np.ndarray, n: int) -> np.ndarray:
    """Trailing moving average over ``n`` rows along axis 0.

    Row ``i`` is the mean of rows ``max(0, i - n + 1) .. i``: a full window of ``n``
    once there are ``n`` rows, and the mean of the first ``i + 1`` rows before that
    (so the curve starts at the first value instead of at a zero-padded one). ``n = 1``
    returns the values unchanged. Computed as a convolution with ``n`` ones, so a NaN
    only spoils the ``n`` windows that contain it (a cumulative sum would carry it to
    the end).
    """
    n = check_smooth(n)
    y = np.asarray(y, dtype=np.float64)
    if n == 1 or y.shape[0] == 0:
        return y.copy()
    counts = np.minimum(np.arange(1, y.shape[0] + 1), n)
    flat = y.reshape(y.shape[0], -1)
    sums = np.stack([np.convolve(flat[:, j], np.ones(n))[: y.shape[0]]
                     for j in range(flat.shape[1])], axis=1)
    return (sums / counts[:, None]).reshape(y.shape)


def group_sides(run_dir: str | Path) -> dict[str, str]:
    """Group name -> "seller" or "consumer", from RUN_DIR/config.yaml; {} when the file
    is absent or no longer resolves (the plots then use generic labels)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    try:
        spec, _ = resolve_market(load_config(path)["market"])
    except ConfigError as err:
        warnings.warn(f"{path}: {err}; plotting with generic labels", stacklevel=2)
        return {}
    return {g.name: g.side for g in spec.groups}


def run_data(run_dir: str | Path) -> RunData:
    """Read metrics.csv, the per-seed rows (seeds.csv or seeds.parquet/, when present) and
    the groups' sides from config.yaml."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.csv").is_file():
        raise ConfigError("RUN_DIR", str(run_dir), "a run directory holding metrics.csv")
    verify(run_dir, growing=True)   # a live run's rows may grow; the published ones hold
    header, data = read_metrics(run_dir / "metrics.csv")
    seeds_header = seeds_data = None
    seeds = run_dir / "seeds.csv"
    parquet = ParquetRows(run_dir / "seeds.parquet")
    if not seeds.is_file() and parquet.parts():
        seeds_header, seeds_data = parquet.read()
    elif seeds.is_file() and seeds.stat().st_size > 0:
        try:
            seeds_header, seeds_data = read_metrics(seeds)
        except ValueError as err:  # e.g. a row being written while we read
            warnings.warn(f"{seeds}: unreadable ({err}); plotting without seed bands",
                          stacklevel=2)
        else:
            if "iteration" not in seeds_header or "seed" not in seeds_header:
                warnings.warn(f"{seeds}: no iteration/seed columns; plotting without seed "
                              "bands", stacklevel=2)
                seeds_header = seeds_data = None
    return RunData(run_dir.name, header, data, seeds_header, seeds_data, group_sides(run_dir))


def run_groups(header: list[str]) -> list[str]:
    """The agent groups of a metrics header (those with a reward column), in column order."""
    # reward/<group> only: a population's reward/<group>/m<k> columns are its members
    return [h.split("/", 1)[1] for h in header if h.startswith("reward/") and h.count("/") == 1]


def _panel_columns(header: list[str], what: str, group: str) -> list[str]:
    return [h for h in header if h == f"{what}/{group}" or h.startswith(f"{what}/{group}/")]


def _per_seed(run: RunData) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """(iterations every seed has, [seed][iteration, column] rows at those iterations);
    None without seeds.csv or with fewer than two seeds."""
    if run.seeds_data is None:
        return None
    it_col, seed_col = run.seeds_header.index("iteration"), run.seeds_header.index("seed")
    seeds = np.unique(run.seeds_data[:, seed_col])
    if len(seeds) < 2:
        return None
    rows = [run.seeds_data[run.seeds_data[:, seed_col] == s] for s in seeds]
    common = rows[0][:, it_col]
    for r in rows[1:]:
        common = np.intersect1d(common, r[:, it_col])
    common = np.unique(common)
    if len(common) == 0:
        return None
    per_seed = []
    for r in rows:
        order = np.argsort(r[:, it_col], kind="stable")
        r = r[order]
        # the last row of each iteration (a duplicate would be a rewritten row)
        its = r[:, it_col]
        last = np.searchsorted(its, common, side="right") - 1
        per_seed.append(r[last])
    return common, per_seed


# the --seeds band: resamples of the seeds (percentile bootstrap of the mean)
BAND_RESAMPLES = 1000


def mean_interval(stack: np.ndarray, resamples: int = BAND_RESAMPLES, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile-bootstrap interval of the mean over seeds, at every iteration:
    ``stack [S, T]`` -> ``(low [T], high [T])``. Each resample draws ``S`` seeds with
    replacement (as multinomial counts, so a resample's mean is one matrix product)."""
    S = stack.shape[0]
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(S, np.full(S, 1.0 / S), size=resamples) / S   # [B, S]
    means = weights @ stack                                                  # [B, T]
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    return low, high


def series(run: RunData, group: str, smooth: int = 1, seeds: bool = False) -> dict:
    """What the figure of one group draws, as numbers.

    Returns ``{"group", "side" ("seller", "consumer" or None if unknown), "smooth",
    "num_seeds" (0 without a band), "x" (metrics.csv iterations), "band_x" (iterations
    every seed has in seeds.csv, or None), "panels"}``; ``panels`` maps "price",
    "traffic", "reward" to ``{"ylabel", "lines": {column: mean over seeds, smoothed},
    "bands": {column: (low, high)}}``. A band is the minimum and maximum over seeds of
    each seed's smoothed series (one seed's column in seeds.csv, restricted to
    ``band_x``); ``bands`` is empty without seeds.csv or with fewer than two seeds.
    ``seeds=True``: each panel also has ``"seed_lines": {column: [S, len(band_x)]}``
    (every seed's smoothed series) and the bands are :func:`mean_interval` of them (the
    95% bootstrap interval of the mean over seeds; ``"band"``: ``"ci95"``, else
    ``"minmax"``).
    """
    smooth = check_smooth(smooth)
    if group not in run_groups(run.header):
        raise ConfigError("group", group, "one of the run's agent groups: "
                          + ", ".join(run_groups(run.header)))
    col = {h: i for i, h in enumerate(run.header)}
    x = run.data[:, col["iteration"]]
    order = np.argsort(x, kind="stable")
    x, data = x[order], run.data[order]
    side = run.sides.get(group)
    per_seed = _per_seed(run)
    scol = {h: i for i, h in enumerate(run.seeds_header)} if per_seed is not None else {}
    panels = {}
    for what in PANELS:
        lines, bands, seed_lines = {}, {}, {}
        for name in _panel_columns(run.header, what, group):
            lines[name] = moving_average(data[:, col[name]], smooth)
            if per_seed is not None and name in scol:
                stack = np.stack([moving_average(s[:, scol[name]], smooth)
                                  for s in per_seed[1]])
                if seeds:
                    seed_lines[name] = stack
                    bands[name] = mean_interval(stack)
                else:
                    bands[name] = (stack.min(axis=0), stack.max(axis=0))
        panels[what] = {"ylabel": TOP_LABELS[side] if what == "price" else what,
                        "lines": lines, "bands": bands}
        if seeds:
            panels[what]["seed_lines"] = seed_lines
    return {"group": group, "side": side, "smooth": smooth,
            "num_seeds": 0 if per_seed is None else len(per_seed[1]), "x": x,
            "band_x": None if per_seed is None else per_seed[0], "panels": panels,
            "band": "ci95" if seeds else "minmax"}


def plot_series(run_dir: str | Path, group: str, smooth: int = 1, seeds: bool = False) -> dict:
    """:func:`series` of one group of the run in ``run_dir``."""
    return series(run_data(run_dir), group, smooth, seeds)


def make_figure(s: dict, title: str = ""):
    """The matplotlib Figure for one :func:`series` result: three panels (price or
    budget, traffic, reward), a line per column and its band (same colour, shaded)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 9))
    axes = fig.subplots(3, 1, sharex=True)
    for ax, what in zip(axes, PANELS):
        panel = s["panels"][what]
        for name, y in panel["lines"].items():
            # p<j>, or a population member's m<k> / m<k>/p<j>
            label = name.split("/", 2)[2] if name.count("/") >= 2 else "mean"
            (line,) = ax.plot(s["x"], y, label=label, lw=1)
            for seed_line in panel.get("seed_lines", {}).get(name, ()):
                ax.plot(s["band_x"], seed_line, color=line.get_color(), lw=0.5, alpha=0.45)
            if name in panel["bands"]:
                low, high = panel["bands"][name]
                ax.fill_between(s["band_x"], low, high, color=line.get_color(), alpha=0.2,
                                lw=0)
        ax.set_ylabel(panel["ylabel"])
        if len(panel["lines"]) > 1:
            ax.legend(fontsize="small", ncol=4)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("iteration")
    notes = []
    if s["smooth"] > 1:
        notes.append(f"moving average over {s['smooth']} iterations")
    if s["num_seeds"] and s.get("band") == "ci95":
        notes.append(f"each of {s['num_seeds']} seeds, their mean and its 95% bootstrap "
                     "interval")
    elif s["num_seeds"]:
        notes.append(f"mean and min-max over {s['num_seeds']} seeds")
    side = {"seller": " (sellers)", "consumer": " (consumer agents)"}.get(s["side"], "")
    fig.suptitle(f"{title}: group {s['group']}{side}" + (f"\n{'; '.join(notes)}" if notes else ""))
    fig.tight_layout()
    return fig


def plot_run(run_dir: str | Path, smooth: int = 1, seeds: bool = False) -> list[Path]:
    """Write RUN_DIR/plots/<group>.png for every agent group (``seeds``: a line per
    seed and the interval band); returns the paths."""
    smooth = check_smooth(smooth)
    if (Path(run_dir) / SESSIONS_FILE).is_file():   # a session-engine run
        return [plot_sessions(run_dir)]
    run = run_data(run_dir)
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for g in run_groups(run.header):
        fig = make_figure(series(run, g, smooth, seeds), run.name)
        path = out_dir / f"{g}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
        matrix = cross_play(run, g)
        if matrix is not None:
            path = out_dir / f"{g}_crossplay.png"
            cross_play_figure(matrix, f"{run.name}: group {g}").savefig(path, dpi=100)
            written.append(path)
    return written


def plot_sessions(run_dir: str | Path) -> Path:
    """RUN_DIR/plots/sessions.png of a session-engine run: the histogram of the sessions'
    profit gain (Delta of the greedy cycle) and of their convergence periods."""
    import matplotlib.pyplot as plt
    import pandas as pd
    verify(run_dir)   # every file of the published result, not only sessions.csv
    rows = pd.read_csv(Path(run_dir) / SESSIONS_FILE)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    if rows["profit_gain"].notna().any():
        left.hist(rows["profit_gain"].dropna(), bins=30)
        left.axvline(rows["profit_gain"].mean(), color="k", ls="--", label="mean")
        left.set_xlabel("profit gain Delta (greedy cycle)")
        left.legend(fontsize="small")
    converged = rows[rows["converged"] == 1]["convergence_period"]
    right.hist(converged, bins=30)
    right.set_xlabel(f"convergence period ({len(converged)} of {len(rows)} converged)")
    for ax in (left, right):
        ax.set_ylabel("sessions")
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    out = Path(run_dir) / "plots"
    out.mkdir(exist_ok=True)
    fig.savefig(out / "sessions.png", dpi=100)
    plt.close(fig)
    return out / "sessions.png"


def cross_play(run: RunData, group: str) -> np.ndarray | None:
    """``[K, K]`` mean over the last 10% of iterations of ``crossplay/<group>/m<i>/m<j>``
    (member i's reward against member j; NaN where they never met), as in summary.json;
    ``None`` for a group without a population of several agents per market."""
    col = {h: i for i, h in enumerate(run.header)}
    K = sum(1 for h in run.header if h.startswith(f"reward/{group}/m"))
    if not K or f"crossplay/{group}/m0/m0" not in col:
        return None
    tail = run.data[-max(1, int(np.ceil(0.1 * len(run.data)))):]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # an all-NaN column: never met
        return np.array([[np.nanmean(tail[:, col[f"crossplay/{group}/m{i}/m{j}"]])
                          for j in range(K)] for i in range(K)])


def cross_play_figure(matrix: np.ndarray, title: str):
    """A heatmap of the cross-play matrix, each cell labelled with its value."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis")
    K = matrix.shape[0]
    for i in range(K):
        for j in range(K):
            ax.text(j, i, "-" if np.isnan(matrix[i, j]) else f"{matrix[i, j]:.3g}",
                    ha="center", va="center", color="w", fontsize="small")
    ax.set_xticks(range(K), [f"m{j}" for j in range(K)])
    ax.set_yticks(range(K), [f"m{i}" for i in range(K)])
    ax.set_xlabel("against member")
    ax.set_ylabel("member (its mean reward)")
    fig.colorbar(image, ax=ax)
    ax.set_title(f"{title}\ncross-play, last 10% of iterations", fontsize="small")
    fig.tight_layout()
    return fig


def sweep_figure(data: dict, title: str = ""):
    """The matplotlib Figure of a sweep's ``sweep.png`` from its
    :func:`jaxmarket.cli.sweep.results.plot_data`: a heatmap of the mean over seeds (two
    or more axes, each cell labelled with its value), or a line with the min-max band
    over seeds (one axis)."""
    from matplotlib.figure import Figure

    if data["kind"] == "heatmap":
        a = data["array"]
        fig = Figure(figsize=(1.4 * a.shape[1] + 3, 0.8 * a.shape[0] + 2.2))
        ax = fig.add_subplot()
        im = ax.imshow(a, cmap="viridis", aspect="auto", origin="upper")
        fig.colorbar(im, ax=ax, label=data["metric"])
        ax.set_xticks(range(a.shape[1]), data["col_labels"])
        ax.set_yticks(range(a.shape[0]), data["row_labels"])
        ax.set_xlabel(data["cols"])
        ax.set_ylabel(data["rows"])
        mid = np.nanmean(a) if np.isfinite(a).any() else 0.0
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                ax.text(j, i, f"{a[i, j]:.4g}", ha="center", va="center",
                        color="black" if a[i, j] > mid else "white", fontsize=9)
    else:
        fig = Figure(figsize=(6.5, 4))
        ax = fig.add_subplot()
        ax.plot(data["x"], data["mean"], marker="o", label="mean over seeds")
        ax.fill_between(data["x"], data["low"], data["high"], alpha=0.25,
                        label="min-max over seeds")
        ax.set_xticks(data["x"], data["labels"])
        ax.set_xlabel(data["key"])
        ax.set_ylabel(data["metric"])
        ax.legend()
    ax.set_title(title or data["metric"], fontsize=10)
    fig.tight_layout()
    return fig
