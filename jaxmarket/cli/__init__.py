"""The command-line layer: every ``python -m jaxmarket.COMMAND`` and the ``jaxmarket``
console script (:mod:`jaxmarket.cli.main`) lives in this package, one module per command
(``train``, ``check``, ``plot``, ``sweep``, ``collect``, ``offline``, ``record``); the
``jaxmarket.check`` etc. modules are the one-screen entry points that call them.

This module holds what every command shares: a configuration error is one readable
message on stderr and exit code 2, an interrupted run one line saying how to resume it
and exit code 130, a run directory that cannot be used (busy: another process
holds its lock; damaged; on storage refusing writes) or a Ray cluster that cannot be
used one line and exit code 1, never a traceback; ``--help`` texts are plain text."""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Callable, NoReturn

from jaxmarket.config.errors import ClusterError, ConfigError, Interrupted
from jaxmarket.train.rundir import RunDirError, describe_os_error, storage_cause

__all__ = ["ConfigError", "Interrupted", "exit_process", "parser", "plain", "run_cli"]


def plain(doc: str | None) -> str:
    """A module docstring as plain ``--help`` text: no reStructuredText backticks."""
    return (doc or "").replace("``", "").strip()


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose description is ``doc`` as plain text, line breaks kept."""
    return argparse.ArgumentParser(prog=prog, description=plain(doc),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """``main(argv)`` (default: the process's arguments) as an exit code: a ConfigError
    is ``config error: ...`` on stderr and 2, an interrupted run its resume line and 130,
    a :class:`~jaxmarket.train.rundir.RunDirError` (busy, damaged or failing run
    directory) or a :class:`~jaxmarket.cluster.ClusterError` its line and 1, any other storage ``OSError`` (ENOSPC, EROFS, EACCES, ...)
    ``storage error: ...`` and 1."""
    try:
        code = main(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        print(str(err), file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RunDirError, ClusterError) as err:
        print(str(err), file=sys.stderr)
        return 1
    except Exception as err:
        cause = storage_cause(err)
        if cause is None:
            raise
        print(f"storage error: {describe_os_error(cause)}", file=sys.stderr)
        return 1
    return int(code or 0)


def exit_process(code: int) -> NoReturn:
    """``sys.exit(code)`` at the end of a command's process (the ``python -m`` entry
    points and the ``jaxmarket`` script), after :func:`gc.freeze`: the interpreter's exit
    then leaves the objects the command made (JAX's and numba's traced and compiled
    programs, a run's tables) to the operating system instead of searching them for
    reference cycles, several times over (about 0.7 s after a Calvano run). ``atexit``
    handlers still run; the commands close their files and wait for their own writes."""
    gc.freeze()
    sys.exit(code)
