"""``python -m jaxmarket.plot RUN_DIR``: PNGs of prices, traffic and rewards over
training, one figure per agent group (a line per product), written to RUN_DIR/plots/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxmarket.cli import run_cli
from jaxmarket.config.errors import ConfigError
from jaxmarket.train.tracking import read_metrics


def plot_run(run_dir: str | Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    if not (run_dir / "metrics.csv").is_file():
        raise ConfigError("RUN_DIR", str(run_dir), "a run directory holding metrics.csv")
    header, data = read_metrics(run_dir / "metrics.csv")
    it = data[:, header.index("iteration")]
    groups = sorted({h.split("/")[1] for h in header if h.startswith("reward/")})
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for g in groups:
        fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
        for ax, what, label in zip(axes, ("price", "traffic", "reward"),
                                   ("price (budget for consumers)", "traffic", "reward")):
            cols = [i for i, h in enumerate(header)
                    if h == f"{what}/{g}" or h.startswith(f"{what}/{g}/")]
            for i in cols:
                name = header[i].split("/")[-1]
                ax.plot(it, data[:, i], label=name if name != g else label, lw=1)
            ax.set_ylabel(label)
            if len(cols) > 1:
                ax.legend(fontsize="small", ncol=4)
            ax.grid(alpha=0.3)
        axes[-1].set_xlabel("iteration")
        fig.suptitle(f"{run_dir.name}: group {g}")
        fig.tight_layout()
        path = out_dir / f"{g}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.plot", description=__doc__)
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    for path in plot_run(args.run_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
