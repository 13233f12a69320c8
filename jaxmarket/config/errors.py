"""The error types every layer raises: :class:`ConfigError` for configuration problems,
:class:`Interrupted` for a training run stopped by Ctrl-C (the command-line layer turns
both into one line and an exit code)."""

from __future__ import annotations

import reprlib
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


class _Repr(reprlib.Repr):
    """A bounded ``repr``: a few items of each container, a few levels deep, and an
    integer past Python's int-to-string limit by its size, so that printing an error
    never expands a YAML alias bomb or a 5000-digit number."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxlist, self.maxdict, self.maxtuple = 3, 8, 8, 8
        self.maxstring, self.maxother, self.maxlong = 100, 100, 60

    def repr_int(self, x: int, level: int) -> str:
        if abs(x).bit_length() > 1000:   # more than ~300 digits: its size, not its digits
            return f"<an integer of about {int(abs(x).bit_length() * 0.30103)} digits>"
        return super().repr_int(x, level)


_REPR = _Repr()


def _short(value: Any, limit: int = 120) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Interrupted(Exception):
    """Training stopped by Ctrl-C (SIGINT); ``iteration`` is the last iteration whose
    state is in a checkpoint, ``resume`` the command that continues the run."""

    def __init__(self, iteration: int, run_dir: str):
        self.iteration, self.run_dir = iteration, run_dir
        super().__init__(f"interrupted at iteration {iteration}; resume with "
                         f"python -m jaxmarket.train --resume {run_dir}")


class ClusterError(Exception):
    """A cluster cannot be used (a Ray head that does not answer, a node that cannot see
    the run directory, peers of a distributed run that never come): one line saying what
    and what to do; exit code 1."""
