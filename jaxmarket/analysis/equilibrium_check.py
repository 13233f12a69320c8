"""The equilibrium check of an existing session-engine run: its ``strategies.npz``
(validated and checked against the run's published result) on its config's game,
through the same :func:`jaxmarket.sessions.run.diagnostics` the run wrote
``summary.json``'s ``equilibrium_check`` with (``python -m jaxmarket.impulse RUN
--check``; docs/analysis.md)."""

from __future__ import annotations

from pathlib import Path

from jaxmarket.analysis.strategies import read_strategies
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.run import check_summary, diagnostics, session_plan


def equilibrium_check(run_dir: str | Path) -> dict:
    """``summary.json``'s ``equilibrium_check`` of the session-engine run in ``run_dir``,
    recomputed from its strategies; a ConfigError where the check does not apply."""
    run_dir = Path(run_dir)
    arrays = read_strategies(run_dir)
    game = make_game(session_plan(load_config(run_dir / "config.yaml")))
    last = arrays.get("last")   # memory k > 1: the last k profiles, the most recent first
    found = diagnostics(game, arrays["greedy"], arrays.get("q"), last, last)
    if isinstance(found, str):
        raise ConfigError("--check", str(run_dir), f"a design the check applies to ({found})")
    return check_summary(found, game.memory)


__all__ = ["equilibrium_check"]
