"""One registry mechanism for every ``kind`` a config can name.

A :class:`Registry` is a typed table ``kind -> definition``: distributors, demand
processes, reward and observation components, learners, external models, POI fields,
population mappings and offline algorithms each have one, created in the module that
defines the definition type. A component registers itself where it is defined, either
with a call or as a decorator::

    DISTRIBUTORS = Registry("distributor")          # in the layer's base module
    DISTRIBUTORS.register(DistributorDef("logit", ...))   # a definition that has .kind

    @MAPPINGS.register("round_robin")                # a function is its own definition
    def round_robin(key, num_markets, num_agents, population_size): ...

Each component package imports its modules in its ``__init__`` (explicitly, no
discovery loop), so importing the package fills its table. An unknown kind is a
:class:`~jaxmarket.config.errors.ConfigError` that names the field and every known kind
(:meth:`Registry.lookup`). A registry is a read-only ``Mapping`` (``kind in R``,
``R[kind]``, ``sorted(R)``), so code that only reads it needs nothing else.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar, overload

from jaxmarket.config.errors import ConfigError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """A table of ``kind -> definition`` for one family of components (``what``)."""

    def __init__(self, what: str):
        self.what = what
        self._table: dict[str, T] = {}

    @overload
    def register(self, kind: str) -> Callable[[T], T]: ...

    @overload
    def register(self, kind: str, definition: T) -> T: ...

    @overload
    def register(self, kind: T) -> T: ...

    def register(self, kind: Any, definition: Any = None) -> Any:
        """Add ``definition`` under ``kind`` and return it. ``register(definition)``:
        a definition that names itself (``definition.kind``); ``register(kind)``: a
        decorator that registers what it decorates. Registering a kind twice with a
        definition from elsewhere is an error (two components would share one name);
        the same module re-run (a notebook cell, ``python -m``) replaces its own."""
        if definition is None and not isinstance(kind, str) and hasattr(kind, "kind"):
            kind, definition = kind.kind, kind
        if definition is None:
            return lambda d: self.register(kind, d)
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"{self.what} kinds are non-empty strings, got {kind!r}")
        old = self._table.get(kind)
        if old is not None and old is not definition and not _same_source(old, definition):
            raise ValueError(f"{self.what} kind {kind!r} is registered already")
        self._table[kind] = definition
        return definition

    def lookup(self, kind: Any, where: str) -> T:
        """``self[kind]``, or a ConfigError at ``where`` listing the known kinds."""
        if not isinstance(kind, str) or kind not in self._table:
            raise ConfigError(where, kind, f"one of the {self.what} kinds "
                              + ", ".join(sorted(self._table)))
        return self._table[kind]

    def __getitem__(self, kind: str) -> T:
        if not isinstance(kind, str):   # a list or a mapping as a kind: unknown, not a TypeError
            raise KeyError(kind)
        return self._table[kind]

    def __contains__(self, kind: object) -> bool:
        return isinstance(kind, str) and kind in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(sorted(self._table))})"


def _origin(definition: Any) -> tuple | None:
    """Where a definition's code lives: its own (module, qualname) if it is a function,
    else that of its first function-valued field."""
    if hasattr(definition, "__qualname__") and callable(definition):
        return definition.__module__, definition.__qualname__
    fields = getattr(definition, "__dict__", {})
    for value in fields.values():
        if callable(value) and hasattr(value, "__qualname__"):
            return value.__module__, value.__qualname__
    return None


def _same_source(old: Any, new: Any) -> bool:
    return _origin(old) is not None and _origin(old) == _origin(new)
