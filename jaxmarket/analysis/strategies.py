"""Reading a session-engine run's ``strategies.npz`` without trusting it.

:func:`read_strategies` is the one reader of the file (``write_strategies`` in
:mod:`jaxmarket.sessions.run` writes it; :func:`jaxmarket.analysis.impulse.load_strategies`
and everything built on it read it through here). Before an array is used it checks, in
this order:

1. the checksum of a published run (``published.json``, :mod:`jaxmarket.train.publish`);
2. that the file opens: a truncated, empty or garbled file, a pickled object, any error of
   ``numpy.load`` or ``zipfile`` is one line, not a traceback;
3. every key the replay needs is present (``greedy``, ``last``, ``grid``, ``memory``,
   ``profit_table``), and every key of the file (those and ``q``, ``converged``,
   ``p_nash``, ``p_monopoly``, ``pi_nash``, ``pi_monopoly``, ``lagged``) has its dtype
   kind and rank;
4. that the shapes agree with each other (``N`` sessions, ``n`` sellers, ``Z`` states,
   ``m`` prices)::

       q [N, n, Z, m] float (finite)        greedy [N, n, Z] int in [0, m)
       last [N, memory n] int in [0, m)     converged [N] bool
       grid [m] float, finite, increasing   memory [] int >= 0
         (per-firm grids: [n, m], each row)
       profit_table [m^n, n] float (finite; [K, m^n, n] with K outcomes of a period;
         [(m^n)^2, n], row p m^n + j, where ``lagged``: a rule on last period's prices)
       lagged [] bool (absent: False)

5. in a run directory (``config.yaml`` beside the file), that it is the run's: ``N`` is
   ``train.num_seeds``, and ``n``, ``Z``, ``memory``, the profit table's shape and the grid
   (``np.allclose``) are those of the game the run's config gives
   (:func:`jaxmarket.sessions.game.make_game` of
   :func:`jaxmarket.sessions.run.session_plan`, the engine's own code).

Every failure is a :class:`~jaxmarket.train.rundir.RunDirError`: one line naming the file,
the key and what is wrong, and what to do (``python -m jaxmarket.train --resume RUN``
writes the file again from the run's last checkpoint); exit code 1 from the command line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.run import session_plan
from jaxmarket.train.publish import verify
from jaxmarket.train.rundir import STRATEGIES_FILE, RunDirError, read_run_config

#: key -> (dtype kinds, ranks): what the replay needs
REQUIRED = {"greedy": ("iu", (3,)), "last": ("iu", (2,)), "grid": ("f", (1, 2)),
            "memory": ("iu", (0,)), "profit_table": ("f", (2, 3))}
#: key -> (dtype kinds, ranks): the rest of what ``write_strategies`` writes, checked
#: where present (files written by hand or by older tools may lack them)
OPTIONAL = {"q": ("f", (4,)), "converged": ("b", (1,)), "p_nash": ("f", (0,)),
            "p_monopoly": ("f", (0,)), "pi_nash": ("f", (0,)), "pi_monopoly": ("f", (0,)),
            "lagged": ("b", (0,))}
KINDS = {"i": "integer", "u": "integer", "f": "float", "b": "bool"}


def strategies_path(path: str | Path) -> Path:
    """The file itself: ``DIR/strategies.npz`` of a directory, else ``path``."""
    path = Path(path)
    return path / STRATEGIES_FILE if path.is_dir() else path


def _run_of(file: Path) -> Path | None:
    """The run directory the file is the result of (``config.yaml`` beside it), or None
    for a file on its own (a ``--save-strategies`` copy, a file written by hand)."""
    run = file.parent
    return run if file.name == STRATEGIES_FILE and (run / "config.yaml").is_file() else None


def _remedy(run: Path | None) -> str:
    if run is None:
        return ("copy it again from the run that wrote it (python -m jaxmarket.train "
                "--resume RUN writes it again there)")
    return (f"write it again from the run's last checkpoint (or start the run again): "
            f"python -m jaxmarket.train --resume {run}")


class _Fail:
    """``fail(key, what)``: the one-line RunDirError of this file (to raise)."""

    def __init__(self, file: Path, run: Path | None):
        self.file, self.run = file, run

    def __call__(self, key: str | None, what: str) -> RunDirError:
        where = f"{self.file}: {key} " if key else f"{self.file} "
        text = " ".join(f"run directory error: {where}{what}; {_remedy(self.run)}".split())
        return RunDirError(text)


def _sessions_run(directory: Path) -> bool:
    """Whether ``run.json`` says a session-engine run (which writes the file when it
    finishes)."""
    try:
        return json.loads((directory / "run.json").read_text()).get("engine") == "sessions"
    except (OSError, ValueError, AttributeError):
        return False


def expects_strategies(path: str | Path) -> bool:
    """Whether ``path`` names strategies (a ``.npz`` file, a directory holding
    ``strategies.npz``, or a session-engine run directory that should hold one)."""
    path = Path(path)
    if str(path).endswith(".npz"):
        return True
    return path.is_dir() and ((path / STRATEGIES_FILE).is_file() or _sessions_run(path))


def _verify_checksum(run: Path | None) -> None:
    """The published checksum of the file (:func:`jaxmarket.train.publish.verify`): a
    RunDirError when the file changed since its run published it, or is missing from a
    published result."""
    if run is None:
        return
    verify(run)   # every file of the result: strategies.npz alone may be the new one


def _open(file: Path, fail: _Fail) -> dict[str, np.ndarray]:
    if not file.exists():
        raise fail(None, "is missing (a session-engine run writes it when it finishes)")
    if not file.is_file():
        raise fail(None, "is not a file")
    try:
        data = np.load(file, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise fail(None, "is a single array, not an .npz archive of arrays")
        with data:
            return {key: np.asarray(data[key]) for key in data.files}
    except RunDirError:
        raise
    except Exception as err:   # whatever numpy, zipfile or zlib raise on a bad archive
        detail = " ".join(str(err).split())[:120]
        raise fail(None, f"cannot be read ({type(err).__name__}"
                         + (f": {detail}" if detail else "") + ")") from None


def _check_kinds(arrays: dict, fail: _Fail) -> None:
    for key, (kinds, ranks) in {**REQUIRED, **OPTIONAL}.items():
        if key not in arrays:
            if key in REQUIRED:
                raise fail(key, "is missing")
            continue
        a = arrays[key]
        if a.dtype.kind not in kinds:
            raise fail(key, f"has dtype {a.dtype}, not {KINDS[kinds[0]]}")
        if a.ndim not in ranks:
            raise fail(key, f"has shape {a.shape}: rank {a.ndim}, not "
                            + " or ".join(map(str, ranks)))


def _in_range(a: np.ndarray, m: int) -> bool:
    return a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < m)


def _check_shapes(a: dict, fail: _Fail) -> None:
    greedy, last, grid = a["greedy"], a["last"], a["grid"]
    N, n, Z = greedy.shape
    if min(N, n, Z) < 1:
        raise fail("greedy", f"has shape {greedy.shape}: no sessions, sellers or states")
    m = grid.shape[-1]
    if m < 1 or not np.all(np.isfinite(grid)):
        raise fail("grid", f"is not a finite price grid ({m} prices)")
    if m > 1 and not np.all(np.diff(grid, axis=-1) > 0):
        raise fail("grid", "is not increasing")
    if grid.ndim == 2 and grid.shape[0] != n:
        raise fail("grid", f"has shape {grid.shape}: {grid.shape[0]} per-firm grids, not one "
                           f"per seller ({n})")
    memory = int(a["memory"])
    if memory < 0:
        raise fail("memory", f"is {memory}, not >= 0")
    if last.shape != (N, memory * n):
        raise fail("last", f"has shape {last.shape}, not (sessions, memory x sellers) = "
                           f"{(N, memory * n)}")
    if not _in_range(greedy, m):
        raise fail("greedy", f"holds indices outside the grid's 0 .. {m - 1} "
                             f"(min {greedy.min()}, max {greedy.max()})")
    if not _in_range(last, m):
        raise fail("last", f"holds indices outside the grid's 0 .. {m - 1} "
                           f"(min {last.min()}, max {last.max()})")
    if "q" in a:
        if a["q"].shape != (N, n, Z, m):
            raise fail("q", f"has shape {a['q'].shape}, not (sessions, sellers, states, "
                            f"prices) = {(N, n, Z, m)}")
        if not np.all(np.isfinite(a["q"])):
            raise fail("q", f"holds {int(np.sum(~np.isfinite(a['q'])))} NaN or infinite "
                            "values")
    if "converged" in a and a["converged"].shape != (N,):
        raise fail("converged", f"has shape {a['converged'].shape}, not (sessions,) = {(N,)}")
    table = a["profit_table"]
    lagged = bool(a.get("lagged", False))   # one row per pair of profiles
    rows = (m ** n) ** 2 if lagged else m ** n
    if table.shape[-2:] != (rows, n):
        what = "(prices^sellers)^2" if lagged else "prices^sellers"
        raise fail("profit_table", f"has shape {table.shape}, not ({what}, sellers) "
                                   f"= {(rows, n)}")
    if not np.all(np.isfinite(table)):
        raise fail("profit_table", "holds NaN or infinite values")


def _check_run(a: dict, run: Path, fail: _Fail) -> None:
    """The file against the game the run's own ``config.yaml`` gives."""
    config = read_run_config(run)   # a ConfigError naming config.yaml where unreadable
    try:
        plan = session_plan(config)
        game = make_game(plan)
    except ConfigError:
        raise
    except ValueError as err:   # check_game: not a design the session engine plays
        raise fail(None, f"is not the result of its run: {run / 'config.yaml'} is not a "
                         f"session-engine design ({' '.join(str(err).split())[:120]})") from None
    N, n, Z = a["greedy"].shape
    grid = np.asarray(game.grid.prices, np.float64)                  # [m] or [n, m]
    memory = game.settings.num_digits // game.sellers if game.sellers else 0
    table = a["profit_table"].shape
    expected = [("greedy", f"has {N} sessions", N, plan.train.num_seeds, "train.num_seeds"),
                ("greedy", f"has {n} sellers", n, game.sellers, "the market's sellers"),
                ("greedy", f"has {Z} states", Z, game.settings.num_states,
                 "the learner's states"),
                ("memory", f"is {int(a['memory'])}", int(a["memory"]), memory,
                 "price profiles in the learner's state"),
                ("grid", f"has shape {a['grid'].shape}", a["grid"].shape,
                 grid.shape, "the learner's grid"),
                ("profit_table", f"has shape {table}", table, tuple(game.reward.shape),
                 "the market's outcome tables")]
    for key, what, got, want, source in expected:
        if got != want:
            raise fail(key, f"{what}, but the run's config.yaml gives {want} ({source}): "
                            "not this run's result")
    if not np.allclose(a["grid"], grid):
        worst = np.unravel_index(int(np.argmax(np.abs(a["grid"] - grid))), grid.shape)
        where = worst[0] if grid.ndim == 1 else worst
        raise fail("grid", f"is not the run's grid (price {where}: {a['grid'][worst]:.6g} "
                           f"in the file, {grid[worst]:.6g} from config.yaml)")


def read_strategies(path: str | Path, check_run: bool = True) -> dict[str, np.ndarray]:
    """Every array of ``strategies.npz`` (``path``: the file or its directory), checked
    (module docstring); ``check_run``: also against the run's ``config.yaml`` where the
    file lies in a run directory. A RunDirError (one line) on anything wrong."""
    file = strategies_path(path)
    run = _run_of(file)
    fail = _Fail(file, run)
    _verify_checksum(run)
    arrays = _open(file, fail)
    _check_kinds(arrays, fail)
    _check_shapes(arrays, fail)
    if run is not None and check_run:
        _check_run(arrays, run, fail)
    return arrays


__all__ = ["OPTIONAL", "REQUIRED", "expects_strategies", "read_strategies",
           "strategies_path"]
