"""Stable-Baselines3 PPO on ``make_sb3_vec_env`` against SB3's ``DummyVecEnv`` of the
single-agent Gymnasium adapter: env steps per second, same run, same hyperparameters.

    python benchmarks/sb3_vec.py --json          # needs stable-baselines3 (the clients extra)

Both sides are what a user writes (``--config``, default ``configs/calvano.yaml``, group
``sellers``, the adapters' defaults)::

    PPO("MlpPolicy", make_sb3_vec_env(config, n_envs=64), ...)                  # jitted
    PPO("MlpPolicy", DummyVecEnv([lambda: make_gymnasium_env(config, "sellers")] * 64), ...)

(each lambda makes its own env). ``make_sb3_vec_env`` steps the ``--n-envs`` markets in
one jitted, vmapped call; ``DummyVecEnv`` steps ``--n-envs`` Gymnasium envs one after the
other, one jitted call each. PPO's settings are the same on both sides (``--n-steps``
per env per rollout, ``--batch-size``, ``--epochs``; SB3's defaults otherwise, seed 0).

Measured, per side: ``setup_s`` (building the envs and PPO, the first ``reset`` and one
``learn`` rollout + update, so every compile is in it: the Dummy side compiles one step
per env), then ``--rounds`` rounds in which each side runs ``learn(--timesteps)`` in turn
(alternating which goes first, so a change of load on a shared machine moves both sides
of a round). Reported: the median over the rounds of ``env_steps_per_s = timesteps /
seconds`` per side and ``ratio`` = the median of the rounds' ratios (jitted / Dummy);
and the same without learning (``--step-calls`` calls of ``venv.step`` with random
actions): ``step_env_steps_per_s`` and ``step_ratio``. With ``--json`` the last printed
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import record  # benchmarks/record.py: --write, --json-out


def build(side: str, config: str, group: str, n_envs: int, ppo_kwargs: dict):
    """The vec env and PPO model of one side, timed through one warm-up ``learn``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from jaxmarket.adapters import make_gymnasium_env, make_sb3_vec_env
    t0 = time.perf_counter()
    if side == "jitted":
        venv = make_sb3_vec_env(config, n_envs, group)
    else:
        venv = DummyVecEnv([lambda: make_gymnasium_env(config, group)
                            for _ in range(n_envs)])
    model = PPO("MlpPolicy", venv, seed=0, verbose=0, **ppo_kwargs)
    model.learn(n_envs * ppo_kwargs["n_steps"])
    return venv, model, time.perf_counter() - t0


def learn_rate(model, timesteps: int) -> float:
    """Env steps per second of ``model.learn`` (SB3 rounds up to whole rollouts)."""
    before, t0 = model.num_timesteps, time.perf_counter()
    model.learn(timesteps, reset_num_timesteps=False)
    return (model.num_timesteps - before) / (time.perf_counter() - t0)


def step_rate(venv, calls: int, rng: np.random.Generator) -> float:
    n = venv.num_envs
    actions = rng.uniform(-1, 1, (calls, n) + venv.action_space.shape).astype(np.float32)
    venv.reset()
    t0 = time.perf_counter()
    for a in actions:
        venv.step(a)
    return calls * n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python benchmarks/sb3_vec.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/calvano.yaml", help="scenario YAML")
    p.add_argument("--group", default="sellers", help="the agent group that acts")
    p.add_argument("--n-envs", type=int, default=64, help="markets (envs) per side")
    p.add_argument("--n-steps", type=int, default=32, help="PPO steps per env per rollout")
    p.add_argument("--batch-size", type=int, default=256, help="PPO minibatch size")
    p.add_argument("--epochs", type=int, default=4, help="PPO epochs per rollout")
    p.add_argument("--timesteps", type=int, default=None,
                   help="env steps per timed learn (default: 4 rollouts)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per side")
    p.add_argument("--step-calls", type=int, default=100, help="venv.step calls timed")
    p.add_argument("--json", action="store_true", help="print a last line of JSON")
    record.add_arguments(p, "sb3_vec")
    args = p.parse_args(argv)
    try:
        import stable_baselines3
        import torch
    except ImportError as err:
        raise SystemExit(f"sb3_vec.py: error: {err}; pip install 'jaxmarket[clients]'")
    timesteps = args.timesteps or 4 * args.n_envs * args.n_steps
    ppo_kwargs = {"n_steps": args.n_steps, "batch_size": args.batch_size,
                  "n_epochs": args.epochs}
    sides = ("jitted", "dummy")
    built = {s: build(s, args.config, args.group, args.n_envs, ppo_kwargs) for s in sides}
    rates = {s: [] for s in sides}
    for r in range(args.rounds):
        for s in (sides if r % 2 == 0 else sides[::-1]):
            rates[s].append(learn_rate(built[s][1], timesteps))
        print(f"round {r}: PPO env steps/s jitted {rates['jitted'][-1]:,.0f}, "
              f"Dummy {rates['dummy'][-1]:,.0f}", flush=True)
    rng = np.random.default_rng(0)
    steps = {s: step_rate(built[s][0], args.step_calls, rng) for s in sides}
    ratios = [a / b for a, b in zip(rates["jitted"], rates["dummy"])]
    out = {"config": args.config, "group": args.group, "n_envs": args.n_envs,
           "ppo": {**ppo_kwargs, "timesteps_per_round": timesteps, "rounds": args.rounds},
           "jitted": {"setup_s": round(built["jitted"][2], 2),
                      "env_steps_per_s": round(statistics.median(rates["jitted"]), 1),
                      "rounds": [round(x, 1) for x in rates["jitted"]],
                      "step_env_steps_per_s": round(steps["jitted"], 1)},
           "dummy": {"setup_s": round(built["dummy"][2], 2),
                     "env_steps_per_s": round(statistics.median(rates["dummy"]), 1),
                     "rounds": [round(x, 1) for x in rates["dummy"]],
                     "step_env_steps_per_s": round(steps["dummy"], 1)},
           "ratio": round(statistics.median(ratios), 3),
           "ratios": [round(x, 3) for x in ratios],
           "step_ratio": round(steps["jitted"] / steps["dummy"], 3),
           "versions": {"stable_baselines3": stable_baselines3.__version__,
                        "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
           "machine": {**record.machine_info(), "nproc": os.cpu_count()}}
    j, d = out["jitted"], out["dummy"]
    print(f"SB3 PPO, {args.n_envs} envs of {args.config} ({args.group}): env steps/s "
          f"make_sb3_vec_env {j['env_steps_per_s']:,.0f}, DummyVecEnv {d['env_steps_per_s']:,.0f}"
          f": ratio {out['ratio']:.2f} (rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"venv.step alone: {j['step_env_steps_per_s']:,.0f} vs {d['step_env_steps_per_s']:,.0f}"
          f" env steps/s: ratio {out['step_ratio']:.1f}; setup (compiles included) "
          f"{j['setup_s']:.1f} s vs {d['setup_s']:.1f} s")
    if args.json:
        print(json.dumps(out))
    record.write(args, out, __file__, argv, "sb3_vec")
    return out


if __name__ == "__main__":
    main()
