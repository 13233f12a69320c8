"""Stop conditions of :func:`jaxmarket.offline.fit`, checked between compiled chunks.

``Stop(steps=N, time_s=T, metric=NAME, patience=K, target=X, mode="max", nan=True)``:

* ``steps``    -- the total number of gradient updates (always set; chunks are cut so that
  training ends exactly there);
* ``time_s``   -- wall-clock budget, checked after each chunk;
* ``patience`` -- stop after ``patience`` consecutive evaluations of ``metric`` (an
  evaluator column) without an improvement of more than ``min_delta`` over the best so far
  (``mode`` "max" or "min");
* ``target``   -- stop as soon as ``metric`` reaches ``target`` (``>=`` for "max", ``<=``
  for "min");
* ``nan``      -- stop when a training metric or an evaluator value is not finite.
"""

from __future__ import annotations

import dataclasses
import math

from jaxmarket.config.errors import ConfigError


@dataclasses.dataclass
class Stop:
    steps: int = 10_000
    time_s: float | None = None
    metric: str | None = None
    patience: int | None = None
    target: float | None = None
    mode: str = "max"
    min_delta: float = 0.0
    nan: bool = True

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError("stop.steps", self.steps, "an integer >= 1")
        if self.time_s is not None and not self.time_s > 0:
            raise ConfigError("stop.time_s", self.time_s, "a number of seconds > 0")
        if self.patience is not None and (not isinstance(self.patience, int) or self.patience < 1):
            raise ConfigError("stop.patience", self.patience, "an integer >= 1")
        if self.mode not in ("max", "min"):
            raise ConfigError("stop.mode", self.mode, "'max' or 'min'")
        if (self.patience is not None or self.target is not None) and not self.metric:
            raise ConfigError("stop.metric", self.metric, "an evaluator metric name (needed by "
                              "patience and target)")


class StopTracker:
    """The running state of the stop rules (best value, evaluations since it)."""

    def __init__(self, stop: Stop):
        self.stop = stop
        self.best: float | None = None
        self.since_best = 0

    def check(self, row: dict[str, float], elapsed: float) -> str | None:
        """A reason to stop after this row (one per chunk), or None."""
        s, step = self.stop, int(row["step"])
        if s.nan:
            bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
            if bad:
                return f"non-finite {bad[0]} at step {step}"
        if s.metric is not None and s.metric in row and math.isfinite(row[s.metric]):
            value = row[s.metric]
            sign = 1.0 if s.mode == "max" else -1.0
            if s.target is not None and sign * (value - s.target) >= 0:
                return f"target reached: {s.metric}={value:.6g} at step {step}"
            if self.best is None or sign * (value - self.best) > s.min_delta:
                self.best, self.since_best = value, 0
            else:
                self.since_best += 1
            if s.patience is not None and self.since_best >= s.patience:
                return (f"no improvement of {s.metric} in {s.patience} evaluations "
                        f"(best {self.best:.6g}) at step {step}")
        if step >= s.steps:
            return None   # finished, not stopped
        if s.time_s is not None and elapsed >= s.time_s:
            return f"time budget of {s.time_s:g} s spent at step {step}"
        return None


__all__ = ["Stop", "StopTracker"]
