"""How much memory a run needs, estimated before anything compiles, and the refusal of a
run that cannot fit (docs/reliability.md, "Memory is checked before allocating").

The state a run keeps is read from the training program's *shapes*, never its values:
``jax.eval_shape`` of the runner's ``init`` (market state x markets x seeds, every
learner's state: Q tables, PPO parameters and buffers, the components' state) and
``jax.make_jaxpr`` of one iteration (its temporaries, the metrics one chunk stacks): the
same trace whether ``train`` or ``check`` asks, so both give one estimate. A plan too large
to build cheaply (:data:`jaxmarket.train.plan.PROBE_SLOTS`) is sized from a *probe*, the
same scenario with ``PROBE_SEEDS`` seeds of ``PROBE_ENVS x L`` markets (``L``: the
population sizes' least common multiple): every axis of the probe's shapes that is one of
its size-dependent lengths (markets, slots, policies, seeds, markets per seed) is scaled
to the run's length, so nothing the estimate does grows with the run's size.

The estimate (``total``) is::

    runner state                  market state x markets, every learner's state, the
                                  components' (a checkpoint's host copy of it is a
                                  zero-copy view on CPU, and host RAM on an accelerator)
  + one iteration's temporaries   the most bytes of its intermediate values alive at
                                  once in program order (:func:`peak_live`)
  + the metrics of one chunk      [min(chunk_size, num_iterations), ...] stacked by
                                  the scan

and a run is refused (a :class:`ConfigError` on the setting that sizes its biggest term)
when it exceeds the memory of the device: host RAM on CPU
(``SC_PHYS_PAGES x SC_PAGE_SIZE``), ``bytes_limit`` of ``memory_stats()`` on an
accelerator, or ``JAXMARKET_MEMORY_BYTES`` when set (a test, a shared machine).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import jax
from jax.extend import core as jcore
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.train.loop import Traced

MEMORY_ENV = "JAXMARKET_MEMORY_BYTES"


@dataclass(frozen=True)
class Term:
    """One part of the estimate: ``what`` needs ``bytes``; ``field`` is the setting
    that sizes it (what to lower), ``value`` that setting's value."""

    what: str
    bytes: int
    field: str
    value: Any
    lower: str = ""     # what to lower, when not the field itself


@dataclass(frozen=True)
class MemoryEstimate:
    terms: tuple[Term, ...]
    available: int | None     # bytes of the device's memory (None: unknown)
    device: str
    probed: bool = False      # sized from a probe (the plan was too large to build)

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def biggest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)

    def line(self) -> str:
        """``memory: 1.2 GiB estimated of 23.0 GiB (cpu host RAM); biggest: ...``."""
        avail = "unknown" if self.available is None else gib(self.available)
        b = self.biggest
        return (f"memory: {gib(self.total)} estimated of {avail} ({self.device}); biggest: "
                f"{b.what} {gib(b.bytes)} ({b.field}={b.value})")

    def as_dict(self) -> dict:
        return {"total_bytes": self.total, "available_bytes": self.available,
                "device": self.device, "probed": self.probed,
                "terms": [{"what": t.what, "bytes": t.bytes, "field": t.field,
                           "value": t.value} for t in self.terms]}


def gib(n: float) -> str:
    if n < 2**27:
        return f"{n / 2**20:.3g} MiB"
    return f"{n / 2**30:.3g} GiB" if n < 100 * 2**30 else f"{n / 2**30:.0f} GiB"


def available_memory() -> tuple[int | None, str]:
    """``(bytes, what)`` of the memory a run may use on the default device."""
    if os.environ.get(MEMORY_ENV):
        return int(os.environ[MEMORY_ENV]), MEMORY_ENV
    device = jax.devices()[0]
    if device.platform != "cpu":
        try:
            stats = device.memory_stats() or {}
        except Exception:   # noqa: BLE001 -- a backend without memory_stats
            stats = {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]), f"{device.platform} device memory"
        return None, f"{device.platform} (memory unknown)"
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "cpu host RAM"
    except (ValueError, OSError, AttributeError):
        return None, "cpu (memory unknown)"


class Dims(dict):
    """A probe's lengths -> the run's (:func:`probe_dims`); ``markets`` = ``(S0 E0, S E)``
    also scales an axis that *flattens* the probe's markets with other axes (its length a
    multiple of ``S0 E0``, two primes: a rollout x slots axis)."""

    markets: tuple[int, int] | None = None


def _scale(d: int, dims: Mapping[int, int]) -> int:
    if d in dims:
        return dims[d]
    markets = getattr(dims, "markets", None)
    if markets is not None and d > markets[0] and d % markets[0] == 0:
        return d // markets[0] * markets[1]
    return d


def _nbytes(leaf: Any, dims: Mapping[int, int]) -> int:
    n = _itemsize(getattr(leaf, "dtype", np.float32))
    for d in getattr(leaf, "shape", ()):
        n *= _scale(d, dims)
    return n


def _itemsize(dtype: Any) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):   # typed keys: their key data
        return 4 * int(np.prod(jax.eval_shape(jax.random.key_data,
                                              jax.ShapeDtypeStruct((), dtype)).shape))
    return np.dtype(dtype).itemsize


def _tree_bytes(tree: Any, dims: Mapping[int, int]) -> int:
    return sum(_nbytes(x, dims) for x in jax.tree_util.tree_leaves(tree))


def probe_dims(probe, num_envs: int, num_seeds: int) -> dict[int, int]:
    """Each size-dependent length of the probe plan's shapes -> the run's length."""
    S0, E0 = probe.train.num_seeds, probe.train.num_envs
    dims = {}
    for g, spec in probe.specs.items():
        per_market = spec.num_agents // (S0 * E0)
        dims.setdefault(spec.num_agents, num_seeds * num_envs * per_market)   # slots
        dims.setdefault(spec.policies, num_seeds * (spec.policies // S0))     # policies
        dims.setdefault(E0 * per_market, num_envs * per_market)               # a seed's slots
    for a in {probe.env.num_agents(g) for g in probe.groups}:
        dims.setdefault(S0 * E0 * a, num_seeds * num_envs * a)
    dims.setdefault(S0 * E0, num_seeds * num_envs)                            # markets
    dims.setdefault(E0, num_envs)
    dims.setdefault(S0, num_seeds)
    out = Dims({k: v for k, v in dims.items() if k != v})
    out.markets = (S0 * E0, num_seeds * num_envs)
    return out


def estimate(plan, train=None, dims: Mapping[int, int] | None = None,
             traced: Traced | None = None) -> MemoryEstimate:
    """The memory ``plan`` needs; with ``dims`` (:func:`probe_dims`) ``plan`` is a probe
    and ``train`` the run's :class:`~jaxmarket.train.config.TrainConfig`. ``traced``:
    the plan's :class:`~jaxmarket.train.loop.Traced` program (the trace it holds is
    reused: the run reads its metric columns from the same trace). ``train`` and
    ``check`` both call it the same way, so they print and enforce one estimate."""
    dims = Dims() if dims is None else dims
    train = plan.train if train is None else train
    S, E = train.num_seeds, train.num_envs
    traced = Traced(plan) if traced is None else traced
    runner = traced.runner
    market = _tree_bytes((runner.env_state, runner.obs), dims)
    terms = [Term("market state", market, "train.num_envs", E)]
    for g in plan.groups:
        state = _tree_bytes(runner.learners[g], dims)
        # what to lower: the markets when the state grows with the slots, else the
        # learner's own size settings (a Q table's grid and memory, a network's width)
        if _grows_with(runner.learners[g], plan, dims, train):
            terms.append(Term(f"learner state {g}", state, "train.num_envs", E))
        else:
            kind = plan.learner_settings.get(g, ("?",))[0]
            terms.append(Term(f"learner state {g} ({kind}, per policy x {S} seeds)",
                              state, f"learners.{g}", kind,
                              "settings with a smaller state per policy, or train.num_seeds"))
    rest = (runner.key, runner.iteration, runner.episodes, runner.params, runner.components)
    terms.append(Term("components' state", _tree_bytes(rest, dims), "train.num_envs", E))
    # one iteration, traced: its temporaries' peak and the metrics it stacks
    jaxpr, (_, metrics) = traced.iteration
    terms.append(Term("one iteration's temporaries", peak_live(jaxpr.jaxpr, dims),
                      "train.num_envs", E))
    # a chunk runs min(chunk_size, iterations left) iterations (jaxmarket.train.trainer)
    length = min(train.chunk_size, train.num_iterations)
    terms.append(Term("metrics of one chunk", length * _tree_bytes(metrics, dims),
                      "train.chunk_size", train.chunk_size))
    avail, device = available_memory()
    return MemoryEstimate(tuple(terms), avail, device, probed=bool(dims))


def _grows_with(tree: Any, plan, dims: Mapping[int, int], train) -> bool:
    """Whether most of ``tree``'s bytes grow with the markets per seed: its size at the
    run's markets against one market per seed (the plan's lengths scaled as a probe's)."""
    one = probe_dims(plan, 1, train.num_seeds)
    return _tree_bytes(tree, dims) > 2 * _tree_bytes(tree, one)


def peak_live(jaxpr: Any, dims: Mapping[int, int]) -> int:
    """The most bytes of ``jaxpr``'s intermediate values alive at once, in program order
    (a value lives from the equation that makes it to the last one that reads it; a
    sub-program (scan body, branch, call) adds its own peak at its equation; the
    program's inputs are not counted: they are the runner state; an output the size of
    an input that nothing reads afterwards reuses its buffer). Without XLA's fusion
    this bounds the buffers XLA keeps; measured against peak RSS it is within a factor
    of 2 (tests/test_reliability_memory.py)."""
    last: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, jcore.Var):
                last[v] = i
    for v in jaxpr.outvars:
        if isinstance(v, jcore.Var):
            last[v] = len(jaxpr.eqns)
    inputs = set(jaxpr.invars) | set(jaxpr.constvars)
    live = peak = 0
    for i, eqn in enumerate(jaxpr.eqns):
        inner = max((peak_live(j, dims) for j in _sub_jaxprs(eqn)), default=0)
        dying = {v: _nbytes(v.aval, dims) for v in eqn.invars
                 if isinstance(v, jcore.Var) and last.get(v) == i}
        new = 0
        for v in _outs(eqn):
            b = _nbytes(v.aval, dims)
            # an output the size of an input read nowhere after is written into that
            # input's buffer (XLA's in-place updates: a Q table's row, an elementwise op)
            same = next((u for u, ub in dying.items() if ub == b), None)
            if same is not None:
                del dying[same]
                if same in inputs:          # the program's own (donated) buffer
                    inputs.add(v)
                elif v not in last:
                    live -= b
                continue
            new += b
            if v in last:
                live += b
        peak = max(peak, live + inner + new)
        for v, b in dying.items():
            if v not in inputs:
                live -= b
    return peak


def _outs(eqn: Any) -> list:
    return [v for v in eqn.outvars if isinstance(v, jcore.Var) and not isinstance(v, jcore.DropVar)]


def _sub_jaxprs(eqn: Any):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jcore.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jcore.Jaxpr):
                yield item


def check_memory(est: MemoryEstimate) -> None:
    """A :class:`ConfigError` on the biggest term's setting when the run cannot fit."""
    if est.available is None or est.total <= est.available:
        return
    b = est.biggest
    raise ConfigError(b.field, b.value, f"a run that fits in memory: it needs about "
                      f"{gib(est.total)}, the device has {gib(est.available)} ({est.device}); "
                      f"the biggest part is {b.what} ({gib(b.bytes)}): lower {b.lower or b.field}")


def lcm(values) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


__all__ = ["MemoryEstimate", "Term", "available_memory", "check_memory", "estimate",
           "probe_dims", "MEMORY_ENV"]
