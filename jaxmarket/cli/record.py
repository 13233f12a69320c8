"""python -m jaxmarket.record (--run-dir R | --config CONFIG | --dataset D) --out FILE.gif|.mp4

Renders one market over time -- every agent's price, traffic served and reward, one line
per agent -- to an animated GIF (Pillow) or an MP4 (ffmpeg from imageio-ffmpeg), with a
progress bar. --run-dir rolls market 0 of a trained run (its last checkpoint) for --steps
steps; --config rolls a scenario with its learners' initial states (fixed policies, say);
--dataset replays the first episode of market 0 recorded by python -m jaxmarket.collect.
The file is written under a temporary name and renamed when complete."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np

from jaxmarket.cli import parser as make_parser
from jaxmarket.config.errors import ConfigError
from jaxmarket.offline.dataset import load_native, read_manifest
from jaxmarket.offline.scenario import load_scenario, make_step

FORMATS = (".gif", ".mp4")


def series_from_scenario(config=None, policy_dir=None, steps: int = 100, seed: int = 0,
                         overrides=()) -> dict[str, dict[str, np.ndarray]]:
    """``{agent label: {"price", "traffic", "reward": [T]}}`` of market 0 over ``steps``
    steps (a compiled scan of the scenario's step)."""
    sc = load_scenario(config, policy_dir, list(overrides))
    reset, step = make_step(sc)
    carry = jax.jit(reset)(jax.random.key(seed))
    keys = jax.random.split(jax.random.key(seed + 1), steps)
    _, rows = jax.jit(lambda c, k: jax.lax.scan(step, c, k))(carry, keys)
    rows = jax.device_get(rows)
    out = {}
    for g in sc.groups:
        n = sc.size(g)
        r = rows[g]
        for i in range(n):   # market 0's agents are the first n slots
            out[f"{g}[{i}]"] = _agent_series(r, i)
    return out


def _agent_series(r: dict, i) -> dict[str, np.ndarray]:
    price = np.asarray(r["info/prices"] if "info/prices" in r else r["actions"])[:, i]
    if "info/traffic" in r:
        traffic = np.asarray(r["info/traffic"])[:, i]
    else:
        traffic = np.asarray(r["info/queries"])[:, i] - np.asarray(r["info/unserved"])[:, i]
    return {"price": price.mean(-1), "traffic": traffic.sum(-1),
            "reward": np.asarray(r["rewards"])[:, i]}


def series_from_dataset(path, steps: int | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Market 0's first episode in a collected dataset (every group it recorded)."""
    manifest = read_manifest(path)
    out = {}
    for g, entry in manifest["groups"].items():
        ds = load_native(path, g)
        n = int(entry["meta"].get("agents_per_market", 1))
        for i in range(n):
            rows = np.flatnonzero((ds["stream"] == i) & (ds["episode"] == 0))
            rows = rows[np.argsort(ds["step"][rows])][:steps]
            if rows.size == 0:
                continue
            r = {k: np.asarray(v)[rows][:, None] for k, v in ds.fields.items()}
            out[f"{g}[{i}]"] = _agent_series(r, 0)
    if not out:
        raise ConfigError("--dataset", str(path), "a dataset with market 0's first episode "
                          "(stream ids below agents_per_market)")
    return out


def render(series: dict[str, dict[str, np.ndarray]], out: str | Path, fps: int = 10,
           title: str = "", progress: bool = True) -> Path:
    """Animate ``series`` into ``out`` (.gif or .mp4), atomically."""
    out = Path(out)
    if out.suffix not in FORMATS:
        raise ConfigError("--out", str(out), "a file name ending in .gif or .mp4")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import animation
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    T = min(len(s["reward"]) for s in series.values())
    fig, axes = plt.subplots(3, 1, figsize=(6, 6), sharex=True)
    lines = {}
    for ax, key, label in zip(axes, ("price", "traffic", "reward"),
                              ("price", "traffic served", "reward")):
        values = np.concatenate([s[key][:T] for s in series.values()])
        lo, hi = float(values.min()), float(values.max())
        pad = 0.05 * (hi - lo) if hi > lo else 0.5
        ax.set_xlim(0, max(T - 1, 1))
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_ylabel(label)
        for name in series:
            lines[(name, key)], = ax.plot([], [], label=name)
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title)
    t_axis = np.arange(T)

    def frame(t):
        for (name, key), line in lines.items():
            line.set_data(t_axis[:t + 1], series[name][key][:t + 1])
        return list(lines.values())

    anim = animation.FuncAnimation(fig, frame, frames=T, blit=True)
    if out.suffix == ".gif":
        writer = animation.PillowWriter(fps=fps)
    else:
        try:
            import imageio_ffmpeg
        except ModuleNotFoundError:
            plt.close(fig)
            raise ConfigError("--out", str(out), "a .gif, or imageio-ffmpeg installed for .mp4 "
                              "(pip install 'jaxmarket[video]')") from None
        matplotlib.rcParams["animation.ffmpeg_path"] = imageio_ffmpeg.get_ffmpeg_exe()
        writer = animation.FFMpegWriter(fps=fps, codec="libx264",
                                        extra_args=["-pix_fmt", "yuv420p"])
    tmp = out.with_name(f"{out.stem}.tmp-{os.getpid()}{out.suffix}")
    show = progress and (os.isatty(2) or os.environ.get("JAXMARKET_PROGRESS") == "1")
    try:
        with Progress(TextColumn("rendering"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeRemainingColumn(), disable=not show) as bar:
            task = bar.add_task("frames", total=T)
            anim.save(tmp, writer=writer,
                      progress_callback=lambda i, n: bar.update(task, completed=i + 1))
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    p = make_parser("python -m jaxmarket.record", __doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run-dir", default=None, help="a trained run directory")
    src.add_argument("--config", default=None, help="a scenario YAML")
    src.add_argument("--dataset", default=None, help="a dataset made by jaxmarket.collect")
    p.add_argument("--out", required=True, help="FILE.gif or FILE.mp4")
    p.add_argument("--steps", type=int, default=100, help="steps to render (default 100)")
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    if Path(args.out).suffix not in FORMATS:
        raise ConfigError("--out", args.out, "a file name ending in .gif or .mp4")
    if args.steps < 1:
        raise ConfigError("--steps", args.steps, "an integer >= 1")
    if args.fps < 1:
        raise ConfigError("--fps", args.fps, "an integer >= 1")
    if args.dataset:
        series = series_from_dataset(args.dataset, args.steps)
        title = f"dataset {args.dataset}"
    else:
        series = series_from_scenario(args.config, args.run_dir, args.steps, args.seed,
                                      args.overrides)
        title = f"run {args.run_dir}" if args.run_dir else Path(args.config).stem
    out = render(series, args.out, args.fps, title)
    print(f"wrote {out} ({min(len(s['reward']) for s in series.values())} frames, "
          f"{len(series)} agents)")
    return 0
