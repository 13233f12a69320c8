"""Training over several devices: the folded seed x market axis sharded over a 1-D mesh.

``python -m jaxmarket.train --devices N`` (default: every local device) lays the
runner out over a 1-D :class:`jax.sharding.Mesh` of ``N`` devices (axis ``"markets"``)
with :class:`~jax.sharding.NamedSharding`, and ``jax.jit`` compiles the chunk with those
in/out shardings (GSPMD): every array with a market axis -- the markets' state and
observations, a learner's per-slot buffers -- is split along it, ``S x E / N`` markets
per device; what is per policy (parameters, optimiser state), per seed or global (the
key, the iteration, a population's assignment) is replicated. The program is the
single-device one, partitioned by XLA, so every learner and feature works unchanged.

Equality across device counts (``docs/scaling.md``): from 4,096 input elements XLA:CPU
hands a reduction to YNNPACK, which sums in another order than the loop XLA emits for a
smaller one, so the *per-device shape* can decide the last bits of a ``sum`` (a profit
summed over 8 products differs between 64 and 8 markets per device). With
``JAXMARKET_NO_YNN=1`` the training programs compile with :func:`compiler_options` (no
YNNPACK fusions on CPU; about 7x slower), which makes everything computed per market --
the market step, the learners' actions and buffers -- bitwise the same on any device
count. What still differs is the learners' update and the means over seeds: GSPMD turns
a reduction over the sharded axis into per-device partial sums and an all-reduce, and
partitions the per-policy update into a different HLO graph (other fusions, so other
rounding); ``benchmarks/device_equality.py`` shows both.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxmarket.config.errors import ConfigError

AXIS = "markets"
#: XLA:CPU compile option that takes reductions away from YNNPACK (whose summation order
#: changes at 4,096 input elements, so with the per-device shape): reductions then stay
#: in XLA's own loops, whose order does not depend on the shape -- but bench_b training
#: runs 7x slower with it, so it is opt-in (``JAXMARKET_NO_YNN=1``); docs/scaling.md
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options() -> dict | None:
    """The compile options of the training programs: :data:`NO_YNN` on CPU when
    ``JAXMARKET_NO_YNN=1``, else none."""
    import jax
    if os.environ.get("JAXMARKET_NO_YNN") == "1" and jax.default_backend() == "cpu":
        return dict(NO_YNN)
    return None


def resolve_devices(requested: int | None, num_markets: int, where: str = "--devices") -> int:
    """The local device count to shard ``num_markets`` (seeds x markets per seed) over:
    every local device when ``requested`` is None (as many as divide the markets), checked
    against what exists and against the market count, before anything compiles. In a
    distributed run each process contributes that many devices."""
    import jax
    available, procs = len(jax.local_devices()), jax.process_count()
    platform = jax.local_devices()[0].platform
    if requested is None:
        fits = [n for n in range(1, available + 1) if num_markets % (n * procs) == 0]
        if not fits:
            raise ConfigError("train.num_seeds x train.num_envs", num_markets,
                              f"a multiple of the {procs} processes, which split the markets "
                              "evenly")
        return max(fits)
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ConfigError(where, requested, f"a positive integer (this process has {available} "
                          f"local device(s): {platform})")
    if requested > available:
        raise ConfigError(where, requested, f"at most the {available} local device(s) of this "
                          f"process ({platform}; more CPU devices: XLA_FLAGS="
                          "--xla_force_host_platform_device_count=N before JAX starts)")
    if num_markets % (requested * procs):
        total = f"{requested * procs} devices ({procs} processes)" if procs > 1 else \
            f"{requested} devices"
        raise ConfigError(where, requested, f"a count that divides the {num_markets} markets "
                          f"(train.num_seeds x train.num_envs) evenly over {total}")
    return requested


def make_mesh(num_local: int):
    """A 1-D mesh over the first ``num_local`` local devices of every process (all
    processes in a distributed run: process-major, so each holds a contiguous block)."""
    import jax
    from jax.sharding import Mesh
    if jax.process_count() == 1:
        devices = jax.local_devices()[:num_local]
    else:
        by_process: dict[int, list] = {}
        for d in jax.devices():
            by_process.setdefault(d.process_index, []).append(d)
        devices = [d for p in sorted(by_process) for d in sorted(by_process[p],
                                                                  key=lambda d: d.id)[:num_local]]
    return Mesh(np.asarray(devices), (AXIS,))


def _market_axis(shape: tuple[int, ...], size: int) -> int | None:
    for axis, n in enumerate(shape):
        if n == size:
            return axis
    return None


def runner_shardings(runner: Any, mesh, num_markets: int, slots: dict[str, tuple[int, int]],
                     notes: list[str] | None = None):
    """A ``NamedSharding`` per leaf of the (abstract) runner: the markets' state and
    observations split along axis 0; a learner leaf along its first axis of the group's
    slot count (``slots[g] = (slots, policies)``) when that count differs from the
    policy count and divides over the mesh; everything else replicated.

    A learner state may name arrays stored per policy rather than per slot in a static
    ``market_axes`` attribute, ``((field, policy_axis, market_axis, row_axis), ...)``: an
    axis of policies (grouped by seed), an axis of a seed's markets and an axis of buffer
    rows (a Gaussian bandit's feature buffer ``[policies, rows, markets, 2P]``). Such an
    array is split along its policies when they divide over the mesh: each device then
    updates its own policies from its own rows, and when the seeds divide too it holds
    whole seeds, as the markets' state does; otherwise each step's samples move to their
    policies' device (one step's worth). Else along its rows when they divide (each
    step's samples move to the device of their row; the update's sums over rows and
    markets are per-device partial sums and an all-reduce), else along its markets (the
    update merges rows and markets, rows major, so GSPMD gathers such a buffer whole).
    ``notes`` (a list) receives a line per group whose buffer takes that slow split, or
    none."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    n = mesh.size
    replicated = NamedSharding(mesh, P())

    def split(axis: int | None, ndim: int):
        if axis is None:
            return replicated
        return NamedSharding(mesh, P(*([None] * axis + [AXIS])))

    def markets(x):
        ok = x.ndim >= 1 and x.shape[0] == num_markets and num_markets % n == 0
        return split(0 if ok else None, x.ndim)

    def learner(g):
        count, policies = slots[g]

        def leaf(x):
            if count == policies or count % n:
                return replicated
            return split(_market_axis(x.shape, count), x.ndim)
        return leaf

    def learner_state(g, state):
        out = jax.tree.map(learner(g), state)
        for field, policy_axis, market_axis, row_axis in getattr(state, "market_axes",
                                                                  None) or ():
            x = getattr(state, field)
            axis = next((a for a in (policy_axis, row_axis, market_axis)
                         if x.shape[a] % n == 0), None)
            if notes is not None and axis not in (policy_axis, row_axis) and field == \
                    state.market_axes[0][0]:
                how = ("split by markets, which its update gathers whole every time"
                       if axis is not None else "kept whole on every device")
                notes.append(
                    f"learners.{g}: its {x.shape[policy_axis]} policies and "
                    f"{x.shape[row_axis]} buffer rows do not divide over {n} devices, so its "
                    f"buffer is {how} (slower); a buffer_length divisible by {n} avoids it")
            out = out.replace(**{field: split(axis, x.ndim)})
        return out

    out = runner.replace(
        env_state=jax.tree.map(markets, runner.env_state),
        obs=jax.tree.map(markets, runner.obs),
        learners={g: learner_state(g, s) for g, s in runner.learners.items()},
    )
    other = ("key", "iteration", "episodes", "params", "components")
    return out.replace(**{f: jax.tree.map(lambda _: replicated, getattr(runner, f))
                          for f in other})


class Placement:
    """Where a training run's arrays live and how its programs compile: the mesh of
    ``devices`` devices (None: every local device that divides the markets), the
    runner's shardings and the compile options. ``init`` is ``make_train``'s."""

    def __init__(self, init, specs: dict, tcfg, devices: int | None = None,
                 where: str = "--devices"):
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        markets = tcfg.num_seeds * tcfg.num_envs
        self.num_devices = resolve_devices(devices, markets, where)
        self.mesh = make_mesh(self.num_devices)
        abstract = jax.eval_shape(init, jax.random.key(0))
        #: one line per learner group whose buffer takes a slow split (shown by the CLI)
        self.notes: list[str] = []
        self.runner = runner_shardings(abstract, self.mesh, markets,
                                       {g: (s.num_agents, s.policies) for g, s in specs.items()},
                                       self.notes)
        self.replicated = NamedSharding(self.mesh, P())
        #: the runner as ShapeDtypeStructs carrying their shardings (an orbax restore target)
        self.abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                       sharding=s),
                                     abstract, self.runner)
        self.options = compiler_options()

    def jit_init(self, init):
        import jax
        return jax.jit(init, out_shardings=self.runner, compiler_options=self.options)

    def jit_chunk(self, chunk):
        """``chunk(runner) -> (runner, metrics)`` compiled with the runner donated (XLA
        updates the learners' buffers in place) and the metrics replicated."""
        import jax
        return jax.jit(chunk, donate_argnums=0, in_shardings=(self.runner,),
                       out_shardings=(self.runner, self.replicated),
                       compiler_options=self.options)

    def put(self, runner):
        import jax
        return jax.device_put(runner, self.runner)


def shard_markets(tree: Any, num_markets: int, devices: int | None = None):
    """``(tree, n)``: a pytree of ``[num_markets, ...]`` arrays split along axis 0 over
    ``n`` local devices (the benchmarks' market states)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    n = resolve_devices(devices, num_markets)
    if n == 1 and devices is None:
        return tree, 1
    return jax.device_put(tree, NamedSharding(make_mesh(n), P(AXIS))), n


def to_host(x: Any) -> np.ndarray:
    """A (possibly multi-process) array as a NumPy array on this host."""
    import jax
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


__all__ = [
    "AXIS",
    "NO_YNN",
    "Placement",
    "compiler_options",
    "make_mesh",
    "resolve_devices",
    "runner_shardings",
    "shard_markets",
    "to_host",
]
