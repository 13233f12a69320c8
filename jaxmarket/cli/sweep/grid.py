"""A sweep's grid: the ``--grid 'KEY=[v1, v2, ...]'`` axes parsed and cross-checked
against each other and the shared overrides (:func:`make_sweep`), and :class:`Sweep`,
what a sweep runs (written to and read back from its ``sweep.yaml``)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import yaml

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import _split_path, load_config, safe_load

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class Axis:
    key: str            # the dotted path as given, e.g. market.distributor.temperature
    values: tuple       # YAML values, numeric strings such as 1e-3 read as numbers

    @property
    def path(self) -> tuple:
        return tuple(_split_path(self.key))


def canonical(parts: Sequence) -> str:
    """Path parts -> the spelling config errors use: ``market.sellers[0].count``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out


def _number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; the config validators take it as
    the number it spells, and so does the sweep (in its CSV, summary and plot)."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value) if not value.strip().lstrip("+-").isdigit() else int(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def yaml_text(value: Any) -> str:
    """A value as the YAML text of a ``key=value`` override that reads back equal."""
    text = yaml.safe_dump([value], default_flow_style=True, width=10**9).strip()[1:-1]
    if yaml.safe_load(text) != value:   # pragma: no cover - safe_dump round-trips
        raise ConfigError("--grid", value, "a value that YAML writes and reads back")
    return text


def parse_axis(item: str) -> Axis:
    """``'KEY=[v1, v2]'`` -> :class:`Axis`; a one-line ConfigError naming ``--grid KEY``
    unless the values are a non-empty YAML list of distinct values."""
    if "=" not in item:
        raise ConfigError("--grid", item, "KEY=[v1, v2, ...] with a dotted KEY, e.g. "
                          "'market.distributor.temperature=[0.1, 0.5]'")
    key, text = (s.strip() for s in item.split("=", 1))
    where = f"--grid {key}"
    try:
        parts = _split_path(key)
    except ConfigError:
        raise ConfigError(where, key, "a dotted path like market.sellers[0].count") from None
    try:
        values = safe_load(text, where, marks=False) if text else None
    except (yaml.YAMLError, RecursionError):
        raise ConfigError(where, text, "a YAML list of values, e.g. [0.1, 0.5]") from None
    if not isinstance(values, list) or not values:
        raise ConfigError(where, values if text else text,
                          "a non-empty YAML list of values, e.g. [0.1, 0.5]")
    values = [_number(v) for v in values]
    for i, v in enumerate(values):
        if any(v == w and type(v) is type(w) for w in values[:i]):
            raise ConfigError(where, values, "distinct values (" + yaml_text(v) + " twice)")
    if canonical(parts) == "train.num_seeds":
        raise ConfigError(where, values, "not a grid axis: the seeds of every cell are "
                          "--seeds N (the rows of sweep.csv)")
    return Axis(key, tuple(values))


def describe_values(values: dict) -> str:
    """A cell's grid values as ``key=value, ...`` (the overrides' spelling)."""
    return ", ".join(f"{k}={yaml_text(v)}" for k, v in values.items())


def _prefix(a: tuple, b: tuple) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


@dataclass
class Sweep:
    """What a sweep runs: the scenario file (``config``, its path as given, and
    ``scenario``, its content read when the sweep started: every cell, and a resumed one,
    runs from that copy), the grid axes, the seeds and the shared overrides."""

    config: str
    axes: list[Axis]
    seeds: int | None = None
    overrides: list[str] = field(default_factory=list)
    scenario: dict = field(default_factory=dict)

    def cells(self) -> list[dict[str, Any]]:
        """Every combination, the first axis varying slowest (``itertools.product``)."""
        return [dict(zip([a.key for a in self.axes], combo))
                for combo in itertools.product(*(a.values for a in self.axes))]

    def cell_overrides(self, values: dict[str, Any]) -> list[str]:
        """The ``python -m jaxmarket.train`` overrides that make one cell."""
        seeds = [] if self.seeds is None else [f"train.num_seeds={self.seeds}"]
        return [*self.overrides, *(f"{k}={yaml_text(v)}" for k, v in values.items()), *seeds]

    def to_yaml(self) -> dict:
        return {"config": self.config, "grid": {a.key: list(a.values) for a in self.axes},
                "seeds": self.seeds, "overrides": list(self.overrides),
                "scenario": self.scenario}

    @classmethod
    def from_yaml(cls, raw: dict) -> "Sweep":
        return cls(raw["config"], [Axis(k, tuple(v)) for k, v in raw["grid"].items()],
                   raw["seeds"], list(raw["overrides"]), raw["scenario"])


def make_sweep(config: str, grid: Sequence[str], seeds: int | None = None,
               overrides: Sequence[str] = ()) -> Sweep:
    """Parse and cross-check the command line (not the cells: :func:`validate`)."""
    if not grid:
        raise ConfigError("--grid", None, "at least one --grid 'KEY=[v1, v2, ...]'")
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise ConfigError("--seeds", seeds, "an integer >= 1")
    axes = [parse_axis(item) for item in grid]
    for i, a in enumerate(axes):
        for b in axes[:i]:
            if a.path == b.path:
                raise ConfigError(f"--grid {a.key}", list(a.values), "each key once (a "
                                  "duplicate --grid; put every value in one list)")
            if _prefix(a.path, b.path):
                raise ConfigError(f"--grid {a.key}", list(a.values),
                                  f"a key that does not overlap --grid {b.key}")
    for item in overrides:
        if "=" not in item:
            raise ConfigError("overrides", item, "KEY=VALUE with a dotted KEY")
        path = tuple(_split_path(item.split("=", 1)[0].strip()))
        if seeds is not None and canonical(path) == "train.num_seeds":
            raise ConfigError("train.num_seeds", item, "set by --seeds in a sweep")
        for a in axes:
            if _prefix(a.path, path):
                raise ConfigError(f"--grid {a.key}", list(a.values),
                                  f"a key that no key=value override also sets ({item})")
    scenario = load_config(config)   # a missing file or bad YAML: named once, not per cell
    return Sweep(str(config), axes, seeds, list(overrides), scenario)


__all__ = ["Axis", "Sweep", "canonical", "describe_values", "make_sweep", "parse_axis", "yaml_text"]
