"""Declarative field specifications shared by every registry (distributors, demand
processes, reward and observation components, learners).

A component declares its settings as ``{name: Field(...)}``; :func:`check_mapping`
validates a user mapping against it and returns the resolved values, raising
:class:`ConfigError` that names the dotted field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from jaxmarket.config.errors import ConfigError

REQUIRED = object()

# Sane upper bounds every value obeys (docs/reliability.md, "Every bad config is a config
# error"): an "int" field without its own ``high`` fits int32 (jax's default integer),
# every number fits float32 (the arrays' dtype: a larger value would be inf there), and
# an entity array ([count, num_products] of one group) has at most MAX_ENTITY_VALUES
# entries (64 MiB of float32 per field; the market state holds a dozen such arrays).
INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_ENTITY_VALUES = 2**24

# The work budget (docs/configuration.md, "Sizes and the work budget"), checked before
# anything is built or traced (jaxmarket.config.precheck.check_groups / check_work):
# at most MAX_GROUPS groups in market.consumers and market.sellers together (each group
# is its own code in the traced step), at most MAX_MARKET_AGENTS agents per market (the
# learners' builders do Python work per agent slot, and check builds a probe of 143
# markets), at most MAX_UPDATE_EPOCHS update_epochs per learner (PPO traces its epochs'
# keys one by one, the bandits unroll their epochs), and at most WORK_BUDGET
# entity-updates per compiled chunk: min(chunk_size, num_iterations) x rollout_length x
# num_seeds x num_envs x num_products x the sum over groups of count x update_epochs (1
# without update_epochs). The shipped configs reach 5 groups, 32 agents per market, 4
# epochs and 6e7 per chunk.
MAX_GROUPS = 64
MAX_MARKET_AGENTS = 4096
MAX_UPDATE_EPOCHS = 1000
WORK_BUDGET = 10**13


@dataclass(frozen=True)
class Field:
    """One setting of a component.

    kind:
      ``"float"``  a finite number (bounds ``low``/``high``, ``low_open`` for ``> low``);
      ``"int"``    an integer with the same bounds;
      ``"bool"``;
      ``"choice"`` one of ``choices``;
      ``"floats"`` a non-empty list of finite numbers, each within the bounds;
      ``"ints"``   a list of integers, each within the bounds;
      ``"firm_float"`` a ``"float"``, or a non-empty list of them (one per firm: the
                   learner checks the length against the firms of a market);
      ``"entity"`` a number per entity and product: a scalar, a per-product list of
                   length ``num_products`` or a ``[count, num_products]`` nested list
                   (resolved to a float32 array of that shape by the group loader);
      ``"any"``    passed through unchecked (structured sub-configs).
    ``optional`` allows ``None`` (YAML ``null``).
    """

    kind: str = "float"
    default: Any = REQUIRED
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple = ()
    optional: bool = False
    doc: str = ""

    def describe(self) -> str:
        """Human-readable description of the allowed values."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            base = {
                "float": "a finite number",
                "int": "an integer",
                "floats": "a non-empty list of finite numbers",
                "ints": "a list of integers",
                "firm_float": "a finite number or a list of one per firm, each",
                "entity": "a number, a list of one number per product, or a [count, products] array",
                "any": "any value",
            }[self.kind]
            bounds = []
            if self.low is not None:
                bounds.append(f"{'>' if self.low_open else '>='} {self.low:g}")
            if self.high is not None:
                bounds.append(f"<= {self.high:g}")
            text = base + (" " + " and ".join(bounds) if bounds else "")
        if self.optional:
            text += " (or null)"
        return text


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _as_float(x: Any) -> float:
    """``float(x)``, or ``inf`` for an integer too large for a float (10**400)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf


def _in_bounds(field: Field, x: float) -> bool:
    if not math.isfinite(x) or abs(x) > FLOAT32_MAX:
        return False
    if field.low is not None and (x <= field.low if field.low_open else x < field.low):
        return False
    if field.high is not None and x > field.high:
        return False
    return True


def _numeric_string(value: Any) -> Any:
    """YAML 1.1 reads ``1e-4`` (no dot) as a string; take it as the number it spells."""
    if isinstance(value, str):
        try:
            return float(value) if not value.strip().lstrip("+-").isdigit() else int(value)
        except ValueError:
            return value
    return value


def check_value(field: Field, value: Any, where: str) -> Any:
    """Validate one value (not ``"entity"`` fields, which need shapes)."""
    if field.kind == "firm_float":
        if isinstance(value, (list, tuple)):
            return check_value(dataclasses.replace(field, kind="floats"), value, where)
        return check_value(dataclasses.replace(field, kind="float"), value, where)
    if field.kind in ("float", "int"):
        value = _numeric_string(value)
    elif field.kind in ("floats", "ints") and isinstance(value, (list, tuple)):
        value = [_numeric_string(v) for v in value]
    if value is None:
        if field.optional:
            return None
        raise ConfigError(where, value, field.describe())
    kind = field.kind
    if kind == "any":
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(where, value, field.describe())
        return value
    if kind == "choice":
        if value not in field.choices:
            raise ConfigError(where, value, field.describe())
        return value
    if kind == "float":
        if not _is_number(value) or not _in_bounds(field, _as_float(value)):
            raise ConfigError(where, value, field.describe())
        return float(value)
    if kind == "int":
        ok = (_is_number(value) and _in_bounds(field, _as_float(value))
              and float(value) == int(value))
        if not ok:
            raise ConfigError(where, value, field.describe())
        if field.high is None and abs(int(value)) > INT32_MAX:
            raise ConfigError(where, value, field.describe() + f" and <= {INT32_MAX} (int32)")
        return int(value)
    if kind in ("floats", "ints"):
        items = value if isinstance(value, (list, tuple)) else None
        if items is None or (kind == "floats" and not items):
            raise ConfigError(where, value, field.describe())
        sub = Field(kind="float" if kind == "floats" else "int", low=field.low, high=field.high,
                    low_open=field.low_open)
        out = []
        for i, item in enumerate(items):
            try:
                out.append(check_value(sub, item, f"{where}[{i}]"))
            except ConfigError as err:
                raise ConfigError(err.field, item, field.describe()) from None
        return tuple(out)
    if kind == "entity":
        return value  # resolved by resolve_entity_array
    raise AssertionError(f"unknown field kind {kind}")


def resolve_entity_array(field: Field, value: Any, where: str, count: int, num_products: int) -> np.ndarray:
    """Broadcast a scalar / per-product list / [count, P] array to float32 [count, P]."""
    if value is None and field.optional:
        value = field.default
    value = _numeric_string(value)
    if isinstance(value, (list, tuple)):
        value = [[_numeric_string(x) for x in v] if isinstance(v, (list, tuple))
                 else _numeric_string(v) for v in value]
    allowed = (f"a number, a list of {num_products} numbers (one per product) or a "
               f"[{count}, {num_products}] array (or a [{count}, 1] column)"
               + _bounds_text(field))
    if count * num_products > MAX_ENTITY_VALUES:
        raise ConfigError(where.rsplit(".", 1)[0] + ".count", count,
                          f"count x num_products <= {MAX_ENTITY_VALUES} per group (got "
                          f"{count} x {num_products}; jaxmarket.config.fields.MAX_ENTITY_VALUES)")
    if _is_number(value):
        if not _in_bounds(field, _as_float(value)):
            raise ConfigError(where, value, allowed)
        arr = np.full((count, num_products), float(value))
    elif isinstance(value, (list, tuple, np.ndarray)):
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError, RecursionError):
            raise ConfigError(where, value, allowed) from None
        if arr.dtype == object or arr.ndim not in (1, 2):
            raise ConfigError(where, value, allowed)
        if arr.ndim == 1:
            if arr.shape != (num_products,):
                raise ConfigError(where, value, allowed + f" (got shape {list(arr.shape)})")
            arr = np.broadcast_to(arr, (count, num_products))
        elif arr.shape == (count, 1):
            arr = np.broadcast_to(arr, (count, num_products))  # one value per entity
        elif arr.shape != (count, num_products):
            raise ConfigError(where, value, allowed + f" (got shape {list(arr.shape)})")
    else:
        raise ConfigError(where, value, allowed)
    if not _all_in_bounds(field, arr):
        raise ConfigError(where, value, allowed)
    return np.array(arr, dtype=np.float32)


def _all_in_bounds(field: Field, arr: np.ndarray) -> bool:
    """:func:`_in_bounds` of every entry, vectorised (an array of a million entries is
    checked in milliseconds)."""
    x = np.asarray(arr, np.float64)
    ok = np.isfinite(x) & (np.abs(x) <= FLOAT32_MAX)
    if field.low is not None:
        ok &= (x > field.low) if field.low_open else (x >= field.low)
    if field.high is not None:
        ok &= x <= field.high
    return bool(np.all(ok))


def _bounds_text(field: Field) -> str:
    parts = []
    if field.low is not None:
        parts.append(f"{'>' if field.low_open else '>='} {field.low:g}")
    if field.high is not None:
        parts.append(f"<= {field.high:g}")
    return (", each " + " and ".join(parts)) if parts else ", each finite"


def american(key: Any) -> Any:
    """The public spelling of a key: ``normalise`` -> ``normalize`` (``-ise``/``-isation``
    forms of the words the config uses)."""
    if not isinstance(key, str):
        return key
    return key.replace("normalis", "normaliz")


def check_mapping(spec: Mapping[str, Field], given: Mapping[str, Any] | None, where: str,
                  ignore: tuple[str, ...] = ("kind",)) -> dict[str, Any]:
    """Validate ``given`` against ``spec``: unknown keys, missing required keys and bad
    values all raise :class:`ConfigError`. Returns defaults filled in (entity fields
    are returned raw for the caller to resolve)."""
    given = {} if given is None else given
    if not isinstance(given, Mapping):
        raise ConfigError(where, given, "a mapping of settings")
    unknown = [k for k in given if k not in spec and k not in ignore]
    if unknown:
        spelled = american(unknown[0])
        if spelled in spec:   # one spelling for public keys: normalize..., not normalise...
            raise ConfigError(f"{where}.{unknown[0]}", given[unknown[0]],
                              f"the key {spelled} (public keys use one spelling: "
                              f"{where}.{spelled})")
        allowed = ", ".join(sorted(spec)) or "no settings"
        raise ConfigError(f"{where}.{unknown[0]}", given[unknown[0]], f"known keys are: {allowed}")
    out: dict[str, Any] = {}
    for name, field in spec.items():
        path = f"{where}.{name}"
        if name in given:
            out[name] = check_value(field, given[name], path)
        elif field.default is REQUIRED:
            raise ConfigError(path, "<missing>", field.describe() + " (this field is required)")
        else:
            out[name] = field.default
    return out


def lookup_kind(raw: Any, registry: Mapping[str, Any], where: str,
                what: str = "a mapping with a 'kind' key") -> tuple[str, Any]:
    """``raw`` must be a mapping whose ``kind`` is a key of ``registry``; returns
    ``(kind, registry[kind])`` or raises a :class:`ConfigError` naming the field."""
    if not isinstance(raw, Mapping) or "kind" not in raw:
        raise ConfigError(where, raw, what)
    kind = raw["kind"]
    if not isinstance(kind, str) or kind not in registry:
        raise ConfigError(f"{where}.kind", kind, "one of " + ", ".join(sorted(registry)))
    return kind, registry[kind]
