"""JAX's persistent compilation cache for the command-line tools.

``python -m jaxmarket.train`` keeps compiled programs in a cache directory, so a second
run of the same scenario (or of one that differs only in data: the seed, a market
parameter, a per-member learner hyperparameter) loads its training chunk instead of
compiling it. Where:

* ``--compile-cache DIR`` on the command line (``none``: no cache), else
* the environment variable ``JAXMARKET_COMPILE_CACHE`` (a directory, or ``none``), else
* ``$XDG_CACHE_HOME/jaxmarket/xla`` (``~/.cache/jaxmarket/xla``).

A loaded program is the executable that was compiled, so its results are the same bits.
``python -m jaxmarket.sweep`` uses the same mechanism with its own default,
``DIR/jax_cache``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

ENV = "JAXMARKET_COMPILE_CACHE"
OFF = "none"


def default_dir() -> str | None:
    """The cache directory when no flag is given (``None``: off)."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() == OFF else value
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "jaxmarket" / "xla")


def resolve(flag: str | None) -> str | None:
    """``--compile-cache`` -> a directory or ``None`` (off)."""
    if flag is None:
        return default_dir()
    return None if flag.strip().lower() == OFF else flag


@contextmanager
def compilation_cache(path: str | Path | None):
    """JAX's persistent compilation cache in ``path`` for the duration (every program,
    however quickly it compiled), then the process's previous settings. A program already
    in the cache (compiled by an earlier run, or another sweep cell) is loaded instead of
    compiled: the same executable, so the same bits. Programs are shared when runs differ
    only in values the program takes as data: the seed, the market's parameters (carried
    in the training runner), and the learner hyperparameters held per member in its
    state (the ``pbt_hyperparams`` a learner's ``LearnerDef`` declares: learning rates,
    entropy and clip coefficients, Q-learning's alpha and beta). Structural values (counts, kinds, action
    bounds, buffer lengths) compile once per distinct value."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    if path is None:   # off, even where JAX_COMPILATION_CACHE_DIR names one
        if jax.config.jax_compilation_cache_dir is None:
            yield
            return
        settings = {"jax_compilation_cache_dir": None}
    else:
        Path(path).mkdir(parents=True, exist_ok=True)
        settings = {"jax_compilation_cache_dir": str(Path(path).absolute()),
                    "jax_persistent_cache_min_compile_time_secs": 0.0}
    previous = {name: getattr(jax.config, name) for name in settings}
    cc.reset_cache()
    for name, value in settings.items():
        jax.config.update(name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)
        cc.reset_cache()
