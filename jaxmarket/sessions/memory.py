"""The memory a sessions run needs, from the game's tables and the learner state's
shapes (nothing of the run's size is built), in the terms of
:class:`jaxmarket.train.memory.MemoryEstimate` (``train`` and ``check`` print and
enforce the same estimate)::

    tables              reward, observation and fee tables of every profile (x outcomes)
  + sessions            every session's learner state, profile (memory k: the last k),
                        tail sums and key
  + working copies      the kernel's host copy of the sessions and its result (the
                        xla backend: the compacted batch); before the run, the kernel
                        asks XLA's program for its rounding on as many fresh sessions
                        (:func:`jaxmarket.sessions.kernel.calibrate`): a peak of
                        about the same size, before the run's sessions exist
  + the result          the greedy cycle's per-session trace (m^n turn cycles) and the
                        strategies written at the end

A chunk stores no per-period rows, so ``train.chunk_size`` does not enter it.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxmarket.sessions.game import SessionGame
from jaxmarket.train.memory import MemoryEstimate, Term, available_memory


def _nbytes(tree) -> int:
    return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))


def estimate(game: SessionGame, sessions: int) -> MemoryEstimate:
    """The estimate of ``sessions`` sessions of ``game`` (module docstring)."""
    one = jax.eval_shape(lambda k: game.learner.init(k, game.spec), jax.random.key(0))
    n = game.sellers
    per_session = _nbytes(one) + n * 8 + 8 + 4 + (game.memory - 1) * n * 4   # + past
    state = sessions * per_session
    tables = _nbytes((game.reward, game.obs, game.fees))
    J, K = game.profiles, game.num_outcomes
    if game.probs is None:
        trace = sessions * (J + 1) * 16 * n    # per turn cycle: the profile and 3 sums
    else:
        trace = sessions * (16 * K * J * 12 * n + K * J * (n * 4 + 8))
    field = ("train.num_seeds", sessions)
    terms = (Term("the outcome tables", tables, "learners.grid_size", game.grid.size,
                  lower="learners.<group>.grid_size"),
             Term(f"{sessions} sessions' learner state", state, *field),
             Term("working copies of the sessions", 2 * state, *field),
             Term("the greedy play's trace and the strategies", trace + state, *field))
    available, device = available_memory()
    return MemoryEstimate(terms, available, device)


__all__ = ["estimate"]
