"""Accelerator benchmark, sized to finish in under 8 minutes on one GPU: env-only
throughput of bench_b from 1k to 1M markets and of a 1,000 x 1,000 x 16 market, training
throughput (bench_b, 32 PPO bandits), the Calvano 1000-session baseline, and the peak
device memory.

    pip install -e '.[cuda]'            # or '.[tpu]' on a TPU VM
    python benchmarks/device_throughput.py --json
    python benchmarks/device_throughput.py --quick --json    # CPU-sized (a smoke run)

Every stage reports ``compile_s``. A stage that would start after ``--budget-s`` seconds
(default 420) is skipped and listed under ``skipped``; a size that does not fit in device
memory is recorded with its error and ends its sweep. With ``--json`` the last line is
JSON: ``device``, ``env_only`` (bench_b, one entry per market count), ``large_market``
(1000 consumers x 1000 sellers x 16 products), ``training``, ``calvano`` (the
``benchmarks/calvano.py`` summary), ``peak_device_memory_bytes`` (``None`` where the
backend does not report it, e.g. the CPU), ``best_agent_steps_per_s`` (bench_b
env-only; the goal on a GPU is 1e9), ``skipped``, ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402

import calvano  # noqa: E402  (benchmarks/calvano.py)

import jaxmarket  # noqa: E402
from jaxmarket.config.loader import load_config  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

FULL = {"env_markets": [1 << k for k in (10, 12, 14, 16, 18, 20)],
        "large_markets": [1, 8, 64], "train_markets": [1024, 16384],
        "steps": 50, "calvano_sessions": 1000, "calvano_max_periods": 10_000_000}
QUICK = {"env_markets": [64, 256], "large_markets": [1], "train_markets": [64],
         "steps": 5, "calvano_sessions": 8, "calvano_max_periods": 20_000}


def device_info() -> dict:
    d = jax.devices()[0]
    return {"platform": d.platform, "kind": getattr(d, "device_kind", ""),
            "count": jax.device_count(), "jax": jax.__version__}


def peak_memory() -> int | None:
    """Peak bytes in use on device 0, where the backend reports it."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:   # noqa: BLE001 - backends without memory statistics
        return None
    return None if not stats else stats.get("peak_bytes_in_use")


def env_sweep(config: dict, counts: list[int], steps: int) -> list[dict]:
    """Env-only throughput (``throughput.measure``) per market count; stops at the first
    count that fails (out of memory), recording its error."""
    from throughput import measure
    env, params = jaxmarket.make({"market": config["market"]})
    out = []
    for n in counts:
        try:
            out.append(measure(env, params, n, steps, repeats=2))
        except Exception as exc:   # noqa: BLE001 - e.g. RESOURCE_EXHAUSTED on the device
            out.append({"num_envs": n, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            break
    return out


def training(config: dict, counts: list[int]) -> list[dict]:
    """bench_b with a ``ppo_bandit`` per seller (``train_throughput.time_chunk``)."""
    from train_throughput import time_chunk, with_learners
    config = with_learners(config, {"kind": "ppo_bandit"}, force=False)
    out = []
    for n in counts:
        try:
            out.append(time_chunk(config, n, 1, iterations=10, rollout=8, repeats=2))
        except Exception as exc:   # noqa: BLE001
            out.append({"num_envs": n, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            break
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU-sized runs (a smoke test)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip the stages that would start after this many seconds")
    ap.add_argument("--json", action="store_true")
    record.add_arguments(ap, "device_throughput or device_throughput_quick (--quick)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    start = time.perf_counter()
    bench_b = load_config(ROOT / "configs" / "bench_b.yaml")
    from throughput import sweep_config
    large = sweep_config(1000, 1000, 16, "logit")

    stages = {
        "env_only": lambda: env_sweep(bench_b, sizes["env_markets"], sizes["steps"]),
        "large_market": lambda: env_sweep(large, sizes["large_markets"], max(2, sizes["steps"] // 10)),
        "training": lambda: training(bench_b, sizes["train_markets"]),
        "calvano": lambda: calvano.run(
            sessions=sizes["calvano_sessions"], max_periods=sizes["calvano_max_periods"],
            progress=not args.json),
    }
    out: dict = {"device": device_info(), "quick": args.quick, "skipped": []}
    for name, stage in stages.items():
        if time.perf_counter() - start > args.budget_s:
            out["skipped"].append(name)
            out[name] = None
            continue
        out[name] = stage()
        if not args.json:
            print(f"{name}: done at {time.perf_counter() - start:.1f} s", flush=True)
    ok = [r for r in out["env_only"] or [] if "agent_steps_per_s" in r]
    out["best_agent_steps_per_s"] = max((r["agent_steps_per_s"] for r in ok), default=None)
    out["peak_device_memory_bytes"] = peak_memory()
    out["wall_s"] = round(time.perf_counter() - start, 1)
    if args.json:
        print(json.dumps(out))
    else:
        for r in out["env_only"] or []:
            print(f"bench_b env-only {r['num_envs']:>8} markets: "
                  + (f"{r['agent_steps_per_s']:.3g} agent-steps/s (compile {r['compile_s']} s)"
                     if "error" not in r else r["error"]))
        print(f"best {out['best_agent_steps_per_s']} agent-steps/s (goal on a GPU: 1e9); "
              f"peak device memory {out['peak_device_memory_bytes']}; {out['wall_s']} s")
    record.write(args, out, __file__, argv,
                 "device_throughput_quick" if args.quick else "device_throughput")
    return out


if __name__ == "__main__":
    main()
