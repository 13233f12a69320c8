"""Compile time of whatever JAX compiles inside a ``with CompileTimer() as t:`` block,
from JAX's own monitoring events (tracing, lowering to MLIR, XLA compilation): the
``compile_s`` every benchmark reports. Programs loaded from a persistent compilation
cache cost only their tracing and lowering."""

from __future__ import annotations

import jax

EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
          "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "/jax/core/compile/backend_compile_duration")


class CompileTimer:
    """``seconds``: the summed durations of the compile events seen inside the block."""

    def __init__(self):
        self.seconds = 0.0

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event in EVENTS:
            self.seconds += duration

    def __enter__(self) -> "CompileTimer":
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listen)
