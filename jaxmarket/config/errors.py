"""The error types every layer raises: :class:`ConfigError` for configuration problems,
:class:`Interrupted` for a training run stopped by Ctrl-C (the command-line layer turns
both into one line and an exit code)."""

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


class Interrupted(Exception):
    """Training stopped by Ctrl-C (SIGINT); ``iteration`` is the last iteration whose
    state is in a checkpoint, ``resume`` the command that continues the run."""

    def __init__(self, iteration: int, run_dir: str):
        self.iteration, self.run_dir = iteration, run_dir
        super().__init__(f"interrupted at iteration {iteration}; resume with "
                         f"python -m jaxmarket.train --resume {run_dir}")
