"""The one error type configuration problems raise."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid.

    The message always names the dotted field, the offending value and what is
    allowed, e.g. ``market.sellers[0].count: got -1; allowed: an integer >= 1``.
    """

    def __init__(self, field: str, value: Any, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {_short(value)}; allowed: {allowed}")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
