"""The session kernel compiled in child processes while the run starts.

On a fresh machine (numba's cache empty) compiling the kernel's loop of Calvano et al.'s
learner (:func:`jaxmarket.sessions.kernel.compile_plain`) takes about 7 CPU-seconds,
most of them in numba's typing and lowering, which are Python: on a thread of the run's
own process they would hold the interpreter's lock for long stretches against the run's
own start-up (the plan, the outcome tables, XLA's compilations, all dispatched from
Python). ``python -m jaxmarket.train`` therefore forks, as soon as its config has passed
its checks and the kernel's module is imported (before any JAX backend or thread
starts), two children that compile the two halves of that work into numba's cache and
exit (:data:`~jaxmarket.sessions.kernel.COMPILE_PARTS`); the run's kernel thread
(:func:`~jaxmarket.sessions.kernel.precompile`) waits for them, then loads the loop from
the cache (about 0.3 s). The run's first chunk waits for that thread.

The fork is skipped (the thread loads or compiles, as in every other command) where it
would not be needed, not pay or not be safe: numba's cache already holding the loop
(:func:`~jaxmarket.sessions.kernel.plain_cached`), no ``os.fork`` (Windows), another
thread already running, jax already imported (a test, a notebook), a config the kernel
does not play, or an accelerator that JAX may take instead of the CPU (``JAX_PLATFORMS``
naming another platform, a ``jax_plugins`` package or ``libtpu`` installed). The
children's output goes to ``/dev/null``: a failure there leaves the cache without the
loop and the run compiles it on its thread, where its errors are reported.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import threading

#: the process ids of the forked compilations not yet waited for
_CHILDREN: list[int] = []


def learner_kinds(config: dict) -> dict[str, str]:
    """Each learner group's ``kind``."""
    learners = config.get("learners") or {}
    return {g: (v or {}).get("kind") if isinstance(v, dict) else v for g, v in learners.items()}


def kernel_candidate(config: dict) -> bool:
    """Whether a loaded config may run on the kernel by its own settings: sellers all
    ``q_learning``, ``train.engine`` not ``loop``, ``train.session_backend`` not ``xla``,
    numba installed (the platform is checked where JAX's backend starts)."""
    from jaxmarket.train.config import resolve_train   # imports jax: not before the fork's checks

    tcfg = resolve_train(config.get("train"))
    kinds = learner_kinds(config).values()
    return (bool(kinds) and all(k == "q_learning" for k in kinds) and tcfg.engine != "loop"
            and tcfg.session_backend != "xla" and importlib.util.find_spec("numba") is not None)


def _accelerator_possible() -> bool:
    """Whether JAX might run on something other than the CPU here."""
    platforms = os.environ.get("JAX_PLATFORMS", os.environ.get("JAX_PLATFORM_NAME", ""))
    if platforms.strip():
        return platforms.strip().lower() != "cpu"
    return any(importlib.util.find_spec(name) is not None for name in ("jax_plugins", "libtpu"))


def fork_compile(config: dict) -> bool:
    """Fork the children that compile the kernel into numba's cache (module docstring),
    where ``config`` may run on the kernel and forking is safe; whether it forked."""
    if (not hasattr(os, "fork") or "jax" in sys.modules or not kernel_candidate(config)
            or _accelerator_possible()):
        return False
    # imported here, where the run imports it anyway: the child starts compiling at once
    # (importing jax starts no thread and no backend)
    from jaxmarket.sessions.kernel import COMPILE_PARTS, compile_plain, plain_cached
    if plain_cached():   # an earlier run compiled it: the run's thread loads it
        return False
    # the modules imported so far out of the collector's reach, in the run and in the
    # children (Python's advice before a fork): numba's compiler and the run's tracing
    # make many short-lived objects, and every full collection would walk jax's and
    # numba's own objects again (a tenth of a child's time without it)
    gc.freeze()
    for part in range(COMPILE_PARTS):
        if threading.active_count() != 1:
            break
        pid = os.fork()
        if pid:
            _CHILDREN.append(pid)
            continue
        code = 1
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):   # the parent's pipes are not held open by the child
                os.dup2(devnull, fd)
            compile_plain(part)
            code = 0
        finally:
            os._exit(code)
    return bool(_CHILDREN)


def wait_children() -> None:
    """Wait for the forked compilations (their exit status is not needed: the caller
    loads numba's cache, or compiles where it is empty)."""
    while _CHILDREN:
        try:
            os.waitpid(_CHILDREN.pop(), 0)
        except ChildProcessError:   # already waited for
            pass
