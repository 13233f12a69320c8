"""Roofline probes: what this machine's cores can do, measured with jitted JAX programs.

Each probe is a function of its own returning ``{"value": ..., "unit": ..., "samples":
[...], ...}``; :data:`PROBES` lists them (other benchmarks import a probe or add theirs).
Every probe is compiled first, then timed ``--repeats`` times; the value is the median,
``spread`` = (max - min) / median of the samples (the noise: the machine may be shared).

* ``matmul_gflops``: ``[n, n] @ [n, n]`` float32 (``2 n^3`` flops), XLA:CPU's matmul
  (Eigen, all cores): the peak a dense kernel reaches.
* ``fma_gflops``: a chain of ``x = a * x + b`` on a float32 array that stays in L2
  (``2`` flops per element per step), one XLA loop fusion: the peak for the
  elementwise fusions that dominate a market step.
* ``copy_gbs``: ``x = x * c`` in place over a float32 array far larger than the caches
  (read + write: ``2 x`` its bytes moved).
* ``reduce_gbs``: ``sum(x)`` over the same array (its bytes read once).

    python benchmarks/roofline.py --json
    python benchmarks/roofline.py --repeats 9 --mb 512
    python benchmarks/roofline.py --market --json     # + the market step per cell

With ``--json`` the last printed line is JSON: ``{probe: {value, unit, samples,
spread, ...}, "machine": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import machine
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)


def timed(fn: Callable, args: tuple, repeats: int, thread: bool = False) -> list[float]:
    """Wall times of ``repeats`` calls of the jitted ``fn(*args)`` after one warm-up
    call (which compiles it). ``thread``: ``fn`` returns its next (single) argument (a
    donated buffer written in place: no fresh output pages to fault in per call)."""
    out_ = jax.block_until_ready(fn(*args))
    if thread:
        args = (out_,)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out_ = jax.block_until_ready(fn(*args))
        out.append(time.perf_counter() - t0)
        if thread:
            args = (out_,)
    return out


def rate(work: float, times: list[float], unit: str, **extra) -> dict:
    """``work / time`` per sample (in ``unit``'s scale: 1e9), median and spread."""
    samples = [work / t / 1e9 for t in times]
    med = statistics.median(samples)
    return {"value": round(med, 2), "unit": unit, "best": round(max(samples), 2),
            "samples": [round(s, 2) for s in samples],
            "spread": round((max(samples) - min(samples)) / med, 3), **extra}


def matmul_gflops(repeats: int = 7, n: int = 2048, **_) -> dict:
    """Dense float32 matmul: ``2 n^3`` flops per call."""
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), jnp.float32)
    b = jax.random.normal(k2, (n, n), jnp.float32)
    fn = jax.jit(lambda a, b: a @ b)
    return rate(2.0 * n**3, timed(fn, (a, b), repeats), "GFLOP/s", n=n)


def fma_gflops(repeats: int = 7, size: int = 65536, steps: int = 256, chains: int = 8,
               depth: int = 8, **_) -> dict:
    """``x = a x + b`` on ``size`` float32 elements (256 KiB: in L2), ``chains``
    independent chains of ``depth`` FMAs per element per loop step (out-of-order cores
    need independent FMAs to fill their pipelines), combined by ``chains`` adds: one
    XLA loop fusion per ``fori_loop`` step, ``size steps chains (2 depth + 1)`` flops
    per call."""
    a = jnp.full((size,), 0.999, jnp.float32)
    b = jnp.full((size,), 1e-3, jnp.float32)
    x0 = jnp.linspace(0.0, 1.0, size, dtype=jnp.float32)

    @jax.jit
    def fn(x, a, b):
        def body(_, x):
            ys = [x + (1e-3 * i) for i in range(chains)]
            for _ in range(depth):
                ys = [a * y + b for y in ys]
            return sum(ys[1:], ys[0]) * (1.0 / chains)
        return jax.lax.fori_loop(0, steps, body, x)

    flops = float(size) * steps * chains * (2 * depth + 1)
    return rate(flops, timed(fn, (x0, a, b), repeats), "GFLOP/s", size=size, steps=steps,
                chains=chains, depth=depth)


def _big(mb: int) -> jax.Array:
    return jnp.linspace(0.0, 1.0, mb * 2**20 // 4, dtype=jnp.float32)


def copy_gbs(repeats: int = 7, mb: int = 256, **_) -> dict:
    """``x * c`` over ``mb`` MiB of float32, in place (the input donated): ``2 mb`` MiB
    moved (read + write)."""
    x = _big(mb)
    nbytes = x.nbytes
    fn = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
    return rate(2.0 * nbytes, timed(fn, (x,), repeats, thread=True), "GB/s", mb=mb)


def reduce_gbs(repeats: int = 7, mb: int = 256, **_) -> dict:
    """``sum(x)`` over ``mb`` MiB of float32: ``mb`` MiB read."""
    x = _big(mb)
    fn = jax.jit(jnp.sum)
    return rate(float(x.nbytes), timed(fn, (x,), repeats), "GB/s", mb=mb)


def market_step_cost(repeats: int = 3, config: str | None = None, num_envs: int = 1024,
                     steps: int = 20, **_) -> dict:
    """The market step's measured time per consumer x seller x product cell
    (``benchmarks/throughput.py``'s rollout of ``config``, default bench_b) and XLA's
    own count of one vmapped step's flops and bytes accessed
    (``compiled.cost_analysis()``), per cell: with the probes above, the roofline time
    per cell is ``max(flops / peak, bytes / bandwidth)``."""
    from throughput import measure

    import jaxmarket
    from jaxmarket.config.loader import load_config
    cfg = load_config(config or str(ROOT / "configs" / "bench_b.yaml"), [])
    env, params = jaxmarket.make({"market": cfg["market"]})
    m = cfg["market"]
    C = sum(int(c["count"]) for c in m["consumers"])
    S = sum(int(x["count"]) for x in m["sellers"])
    cells = C * S * int(m["num_products"])
    r = measure(env, params, num_envs, steps, repeats)
    # one vmapped step (random actions drawn outside): XLA's cost model of the program
    from throughput import random_actions
    reset = jax.vmap(env.reset, in_axes=(0, None))
    _, states = reset(jax.random.split(jax.random.key(0), num_envs), params)
    actions = random_actions(env, params, jax.random.key(1), num_envs)
    step = jax.jit(lambda k, s, a: jax.vmap(env.step, in_axes=(0, 0, 0, None))(
        jax.random.split(k, num_envs), s, a, params))
    cost = step.lower(jax.random.key(2), states, actions).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    per = num_envs * cells
    return {"value": round(1e3 * r["us_per_env_step"] / cells, 4), "unit": "ns/cell",
            "cells_per_market": cells, "consumers": C, "sellers": S,
            "products": int(m["num_products"]), "num_envs": num_envs, "steps": steps,
            "us_per_env_step": r["us_per_env_step"], "cores_used": r["cores_used"],
            "flops_per_cell": round(float(cost.get("flops", 0.0)) / per, 2),
            "transcendentals_per_cell": round(float(cost.get("transcendentals", 0.0)) / per, 3),
            "bytes_per_cell": round(float(cost.get("bytes accessed", 0.0)) / per, 2),
            "samples": [], "spread": None}


def memory_bandwidth(repeats: int = 7, kib: tuple[int, ...] = (256, 4096, 24576, 262144),
                     passes: int = 0, **_) -> dict:
    """Read bandwidth (GB/s) of ``sum(x + acc)`` over float32 arrays of ``kib`` KiB each
    (default: one that fits L2, one L3, one that fills most of L3, one far beyond it),
    each read ``passes`` times per call in a ``fori_loop`` (default: about 256 MiB per
    call); the loop carries the sum, so no pass can be skipped. One value per size:
    ``{"value": GB/s of the first size, "by_kib": {kib: GB/s}, ...}``."""
    by_kib, samples = {}, {}
    for size in kib:
        x = jnp.linspace(0.0, 1.0, size * 1024 // 4, dtype=jnp.float32)
        k = passes or max(1, (256 * 1024) // size)
        fn = jax.jit(lambda x, k=k: jax.lax.fori_loop(
            0, k, lambda i, acc: acc + jnp.sum(x + acc) * 1e-9, jnp.float32(0.0)))
        r = rate(float(x.nbytes) * k, timed(fn, (x,), repeats), "GB/s")
        by_kib[size], samples[size] = r["value"], r["samples"]
    first = kib[0]
    return {"value": by_kib[first], "unit": "GB/s", "by_kib": by_kib,
            "samples": samples[first], "spread": None, "samples_by_kib": samples}


def row_gather(repeats: int = 7, table_kib: tuple[int, ...] = (256, 4096, 24576, 262144),
               rows: int = 1 << 16, width: int = 16, **_) -> dict:
    """Random 64-byte rows (``width`` float32) gathered from a table of ``table_kib``
    KiB, ``rows`` per call, summed: the access pattern of tabular Q-learning (one row
    per seller and state per period). ns per row and GB/s per table size."""
    by_kib = {}
    key = jax.random.key(0)
    for size in table_kib:
        n_rows = max(1, size * 1024 // (4 * width))
        table = jnp.linspace(0.0, 1.0, n_rows * width, dtype=jnp.float32).reshape(n_rows, width)
        index = jax.random.randint(key, (rows,), 0, n_rows)
        fn = jax.jit(lambda t, i: jnp.sum(t[i], axis=0))
        times = timed(fn, (table, index), repeats)
        best = statistics.median(times)
        by_kib[size] = {"ns_per_row": round(1e9 * best / rows, 3),
                        "gbs": round(rows * width * 4 / best / 1e9, 2)}
    return {"value": by_kib[table_kib[0]]["ns_per_row"], "unit": "ns/row", "by_kib": by_kib,
            "samples": [], "spread": None}


def calvano_cost(repeats: int = 5, sessions: int = 512, length: int = 2000,
                 bandwidth: dict | None = None, backend: str = "auto", **_) -> dict:
    """A chunk of the session engine (``configs/calvano.yaml``: two sellers, the published
    settings; ``jaxmarket.sessions.engine.Runner``, its default backend) per
    session-period, beside its roofline: the bytes a session-period must move (per
    seller: its row of the current state read, its row of the next state read, one cache
    line of the current row written back; 64-byte rows) at the measured read bandwidth
    of a working set of the batch's tables' size."""
    from jaxmarket.config.loader import load_config
    from jaxmarket.sessions import engine
    from jaxmarket.sessions.game import make_game
    from jaxmarket.sessions.run import session_plan

    game = make_game(session_plan(load_config(str(ROOT / "configs" / "calvano.yaml"))))
    settings = engine.Settings(sessions=sessions, periods=length * (repeats + 1), chunk=length,
                               stop="periods", backend=backend)
    runner = engine.Runner(game, settings)
    carry, done = engine.init_sessions(game, sessions, jax.random.key(0)), 0
    carry, done = runner.advance(carry, done)          # compiles
    jax.block_until_ready(carry)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        carry, done = runner.advance(carry, done)
        jax.block_until_ready(carry)
        times.append(time.perf_counter() - t0)
    per = [1e9 * t / (sessions * length) for t in times]
    n, m, line = game.sellers, game.grid.size, 64
    nbytes = n * 3 * line
    table_kib = sessions * n * m ** n * (m + 1) * 4 // 1024
    bw = bandwidth or memory_bandwidth(repeats=3, kib=(table_kib,))
    gbs = bw["by_kib"].get(table_kib, bw["value"])
    roof = nbytes / gbs
    return {"value": round(statistics.median(per), 2), "unit": "ns/session-period",
            "best": round(min(per), 2), "samples": [round(x, 2) for x in per],
            "spread": round((max(per) - min(per)) / statistics.median(per), 3),
            "sessions": sessions, "backend": runner.backend, "length": length,
            "bytes_per_session_period": nbytes, "tables_kib": table_kib,
            "read_gbs": gbs, "roofline_ns": round(roof, 3),
            "distance": round(statistics.median(per) / roof, 1)}


def roofline_ns(flops: float, nbytes: float, gflops: float, gbs: float) -> dict:
    """Roofline time (ns) of ``flops`` and ``nbytes`` at ``gflops`` GFLOP/s and
    ``gbs`` GB/s: the larger of the two bounds, and which one it is."""
    compute, memory = flops / gflops, nbytes / gbs
    return {"ns": round(max(compute, memory), 4), "compute_ns": round(compute, 4),
            "memory_ns": round(memory, 4), "bound": "compute" if compute >= memory else "memory"}


#: name -> probe(repeats=..., mb=...) -> result dict
PROBES: dict[str, Callable[..., dict]] = {
    "matmul_gflops": matmul_gflops,
    "fma_gflops": fma_gflops,
    "copy_gbs": copy_gbs,
    "reduce_gbs": reduce_gbs,
}


def run(names=None, repeats: int = 7, mb: int = 256, rounds: int = 1) -> dict:
    """Every probe (or ``names``), ``rounds`` times in turn in this process; with
    several rounds a probe's samples are pooled."""
    names = list(PROBES) if names is None else list(names)
    out: dict = {}
    for _ in range(rounds):
        for name in names:
            r = PROBES[name](repeats=repeats, mb=mb)
            if name in out:
                samples = out[name]["samples"] + r["samples"]
                med = statistics.median(samples)
                r.update(samples=samples, value=round(med, 2), best=round(max(samples), 2),
                         spread=round((max(samples) - min(samples)) / med, 3))
            out[name] = r
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per probe and round")
    ap.add_argument("--rounds", type=int, default=2, help="all probes in turn, this often")
    ap.add_argument("--mb", type=int, default=256, help="array size of the bandwidth probes")
    ap.add_argument("--probe", action="append", choices=sorted(PROBES), default=None)
    ap.add_argument("--market", action="store_true",
                    help="also time the bench_b market step per cell (market_step_cost) "
                         "and put it beside the roofline of the probes just measured")
    ap.add_argument("--calvano", action="store_true",
                    help="also the cache-level read bandwidths (memory_bandwidth), random "
                         "64-byte row gathers (row_gather) and a session-engine chunk per "
                         "session-period beside its roofline (calvano_cost)")
    ap.add_argument("--json", action="store_true", help="last line: JSON result")
    record.add_arguments(ap, "roofline")
    args = ap.parse_args(argv)
    if args.calvano and "xla_force_host_platform_device_count" not in os.environ.get(
            "XLA_FLAGS", ""):   # one XLA CPU device per core, as calvano.py (JAX not started)
        os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_"
                                   f"platform_device_count={os.cpu_count() or 1}").strip()
    info = machine()
    out = run(args.probe, args.repeats, args.mb, args.rounds)
    if args.market:   # measured beside the probes, same process
        mk = market_step_cost(max(3, args.repeats // 2))
        fl = out.get("fma_gflops", out.get("matmul_gflops"))
        bw = out.get("copy_gbs", out.get("reduce_gbs"))
        if fl and bw:
            mk["roofline"] = roofline_ns(mk["flops_per_cell"], mk["bytes_per_cell"],
                                         fl["value"], bw["value"])
            mk["distance"] = round(mk["value"] / max(mk["roofline"]["ns"], 1e-9), 1)
        out["market_step"] = mk
    if args.calvano:
        out["memory_bandwidth"] = memory_bandwidth(max(3, args.repeats // 2))
        out["row_gather"] = row_gather(max(3, args.repeats // 2))
        out["calvano"] = calvano_cost(max(3, args.repeats // 2))
    print(f"machine: {info['cpu']}, {info['nproc']} cores, load {info['load_avg']}, "
          f"jax {info['jax']} ({info['backend']})")
    for name, r in out.items():
        if name in ("memory_bandwidth", "row_gather", "calvano"):
            print(f"  {name:<14} {json.dumps({k: v for k, v in r.items() if 'samples' not in k})}")
            continue
        if name == "market_step":
            rf = r.get("roofline", {})
            print(f"  market step    {r['value']:>9.4f} ns/cell ({r['cells_per_market']} cells, "
                  f"{r['us_per_env_step']:.2f} us/step, {r['cores_used']:.2f} cores); XLA: "
                  f"{r['flops_per_cell']} flops, {r['bytes_per_cell']} bytes per cell; "
                  f"roofline {rf.get('ns', float('nan')):.4f} ns/cell "
                  f"({rf.get('bound')}), x{r.get('distance')} away")
            continue
        print(f"  {name:<14} {r['value']:>9.2f} {r['unit']:<8} (best {r['best']:.2f}, "
              f"spread {r['spread']:.0%} over {len(r['samples'])} calls)")
    result = {**out, "machine": {**info, "load_after": machine()["load_avg"]}}
    if args.json:
        print(json.dumps(result))
    record.write(args, result, __file__, argv, "roofline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
