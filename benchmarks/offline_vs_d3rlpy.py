"""CQL update throughput: jaxmarket.offline against d3rlpy on the same data and sizes.

    python benchmarks/offline_vs_d3rlpy.py --json                 # jaxmarket only
    D3RLPY_PYTHON=/path/to/venv/bin/python python benchmarks/offline_vs_d3rlpy.py --json

Both learn continuous CQL from the same synthetic transitions (``--rows`` rows, ``--obs-dim``
observations, ``--action-dim`` actions in [-1, 1], written once to an ``.npz``) at
d3rlpy's default sizes: batch 256, 256 x 256 actor and twin critics, 10 sampled actions.
jaxmarket runs ``--updates`` updates in one compiled chunk (``jaxmarket.offline.fit``'s
``make_chunk``) after a warm-up chunk; d3rlpy (PyTorch, CPU) runs ``algo.update`` on
sampled minibatches after a warm-up, in a separate Python (``D3RLPY_PYTHON``, a venv with
``pip install torch d3rlpy``: its pins are not the simulator's), in the same run, one
after the other. With ``--json`` the last line has ``jaxmarket_updates_per_s``,
``d3rlpy_updates_per_s`` (``None`` without ``D3RLPY_PYTHON``) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

D3RLPY_SCRIPT = """
import sys, time, numpy as np, d3rlpy, torch
torch.set_num_threads({threads})
d = np.load(sys.argv[1]); n = int(sys.argv[2])
ds = d3rlpy.dataset.MDPDataset(d["obs"], d["act"], d["rew"], d["term"], timeouts=d["tout"])
cql = d3rlpy.algos.CQLConfig(batch_size=256).create(device="cpu:0")
cql.build_with_dataset(ds)
rb = ds  # ReplayBuffer
def step():
    cql.update(rb.sample_transition_batch(256))
for _ in range(5):
    step()
t0 = time.perf_counter()
for _ in range(n):
    step()
print(n / (time.perf_counter() - t0))
"""


def data(rows: int, obs_dim: int, action_dim: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(rows, obs_dim)).astype(np.float32)
    act = rng.uniform(-1, 1, size=(rows, action_dim)).astype(np.float32)
    rew = rng.normal(size=rows).astype(np.float32)
    tout = np.zeros(rows, bool)
    tout[199::200] = True            # episodes of 200 steps
    return {"obs": obs, "act": act, "rew": rew, "term": np.zeros(rows, bool), "tout": tout}


def jaxmarket_rate(d: dict, updates: int) -> float:
    import jax

    from jaxmarket.offline import make_algo
    from jaxmarket.offline.algos import device_data
    from jaxmarket.offline.dataset import make_dataset
    from jaxmarket.offline.fit import make_chunk
    next_obs = np.roll(d["obs"], -1, axis=0)
    ds = make_dataset(d["obs"], d["act"], d["rew"], next_observations=next_obs,
                      terminals=d["term"], timeouts=d["tout"])
    algo = make_algo("cql", ds)
    run = make_chunk(algo, 256)
    arrays = device_data(ds, algo.norm)
    state = jax.jit(algo.init)(jax.random.key(0))
    state, _ = run(state, arrays, jax.random.key(1), updates)     # compile + warm-up
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, m = run(state, arrays, jax.random.key(2), updates)
    jax.block_until_ready(m)
    return updates / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--obs-dim", type=int, default=4)
    ap.add_argument("--action-dim", type=int, default=1)
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    record.add_arguments(ap, "offline_vs_d3rlpy")
    args = ap.parse_args(argv)
    d = data(args.rows, args.obs_dim, args.action_dim)
    out = {"rows": args.rows, "obs_dim": args.obs_dim, "action_dim": args.action_dim,
           "updates": args.updates, "nproc": os.cpu_count(),
           "load_avg": os.getloadavg()}
    out["jaxmarket_updates_per_s"] = round(jaxmarket_rate(d, args.updates), 2)
    python = os.environ.get("D3RLPY_PYTHON")
    out["d3rlpy_updates_per_s"] = None
    if python:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "data.npz"
            np.savez(path, **d)
            script = Path(tmp) / "d3.py"
            script.write_text(D3RLPY_SCRIPT.format(threads=os.cpu_count() or 1))
            res = subprocess.run([python, str(script), str(path), str(args.updates)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit("offline_vs_d3rlpy.py: error: d3rlpy run failed: "
                                 + res.stderr.strip().splitlines()[-1])
            out["d3rlpy_updates_per_s"] = round(float(res.stdout.strip().splitlines()[-1]), 2)
            out["ratio"] = round(out["jaxmarket_updates_per_s"] / out["d3rlpy_updates_per_s"], 3)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"CQL updates/s, batch 256, 256x256: jaxmarket {out['jaxmarket_updates_per_s']}, "
              f"d3rlpy {out['d3rlpy_updates_per_s']}")
    record.write(args, out, __file__, argv, "offline_vs_d3rlpy")
    return out


if __name__ == "__main__":
    main()
