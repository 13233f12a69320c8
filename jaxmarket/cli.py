"""Shared behaviour of every command-line entry point: a configuration error is one
readable message on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import sys
from typing import Callable

from jaxmarket.config.errors import ConfigError


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    try:
        code = main(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    return int(code or 0)
