"""Training progress on the host: the rich progress bar on a terminal, plain lines
otherwise (a log file): ``iteration 2500/10000 (25%), 1,234 it/s, 5,678 env-steps/s, ETA
0:01:02, reward sellers=0.2345``."""

from __future__ import annotations

import math
import os
import time

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# plain progress lines (stdout not a terminal): seconds between lines
PROGRESS_EVERY = 30.0


def show_bar() -> bool:
    """The rich progress bar on a terminal (or with ``JAXMARKET_PROGRESS=1``); plain
    lines otherwise."""
    return os.isatty(2) or os.environ.get("JAXMARKET_PROGRESS") == "1"


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PlainProgress:
    """Progress as plain lines on stdout, for logs (stdout not a terminal): one when a
    chunk program is compiled, then at most one every ``every`` seconds (and at the
    end): ``iteration 2500/10000 (25%), 1,234 it/s, 5,678 env-steps/s, ETA 0:01:02,
    reward sellers=0.2345``. ``every``: ``--progress-every`` (default 30 s)."""

    def __init__(self, total: int, done: int, every: float, enabled: bool):
        self.total, self.every, self.enabled = total, every, enabled
        self.last = time.monotonic()

    def say(self, line: str) -> None:
        if self.enabled:
            print(line, flush=True)

    def update(self, done: int, its: float, steps: float, reward: str) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.every and done < self.total):
            return
        self.last = now
        eta = (self.total - done) / its if its > 0 else float("inf")
        self.say(f"iteration {done}/{self.total} ({100 * done / self.total:.0f}%), "
                 f"{its:,.0f} it/s, {steps:,.0f} env-steps/s, ETA "
                 f"{_clock(eta) if math.isfinite(eta) else '?'}"
                 + (f", reward {reward}" if reward else ""))


def progress_bar() -> Progress:
    """The rich bar of a training run (disabled off a terminal, :func:`show_bar`): its
    task takes ``speed`` and ``reward`` fields."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total} it"),
                    TextColumn("{task.fields[speed]}"), TextColumn("{task.fields[reward]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not show_bar())


__all__ = ["PROGRESS_EVERY", "PlainProgress", "progress_bar", "show_bar"]
