"""PPO on gymnax CartPole-v1 with PureJaxRL's default settings, driven by jaxmarket's
PPO learner (``jaxmarket.learners.ppo``): the ``NUM_ENVS`` environments are agent slots
of one learner group sharing a single policy (``num_policies=1``, ``policy_index`` all 0),
observation dim 4, discrete head with 2 "prices" on [0, 1] whose index is the env action.

The whole training is one jitted ``lax.scan`` over updates (PureJaxRL's ``make_train``),
vmapped over seeds.

    python benchmarks/ppo_cartpole.py                 # 1 seed, 5e5 env steps
    python benchmarks/ppo_cartpole.py --seeds 8 --json

Reported:
  env_steps_per_s  seeds x total_timesteps / wall time of the compiled run (no compile);
  final_return     mean return of the episodes *completed* during the last 5% of the
                   updates (gymnax LogWrapper's returned_episode_returns), over all seeds;
  compile_s        lowering + XLA compilation time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from gymnax.wrappers.purerl import LogWrapper

from jaxmarket.config.fields import check_mapping
from jaxmarket.learners.base import LearnerSpec, Transition
from jaxmarket.learners.ppo import PPO

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)

CONFIG = {  # PureJaxRL purejaxrl/ppo.py defaults for CartPole-v1
    "NUM_ENVS": 4,
    "NUM_STEPS": 128,
    "TOTAL_TIMESTEPS": 500_000,
    "LR": 2.5e-4,
    "ANNEAL_LR": True,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
}
FINAL_FRACTION = 0.05  # final_return averages episodes completed in the last 5% of updates


def make_train(config: dict):
    """Returns ``train(key) -> per-update metrics`` (jittable, vmappable over keys)."""
    num_envs, num_steps = config["NUM_ENVS"], config["NUM_STEPS"]
    num_updates = int(config["TOTAL_TIMESTEPS"]) // num_steps // num_envs
    env, env_params = gymnax.make(config["ENV_NAME"])
    env = LogWrapper(env)
    num_actions = env.action_space(env_params).n

    spec = LearnerSpec(
        num_agents=num_envs,
        obs_dim=int(np.prod(env.observation_space(env_params).shape)),
        num_products=1,
        action_low=np.zeros((num_envs, 1), np.float32),
        action_high=np.full((num_envs, 1), num_actions - 1, np.float32),
        num_policies=1,
        policy_index=(0,) * num_envs,
    )
    hyper = check_mapping(PPO.hyper_fields, {
        "hidden_sizes": [64, 64],
        "activation": config["ACTIVATION"],
        "action_head": "discrete",
        "num_actions": num_actions,
        "learning_rate": config["LR"],
        "anneal_lr": config["ANNEAL_LR"],
        "num_updates": num_updates,
        "max_grad_norm": config["MAX_GRAD_NORM"],
        "gamma": config["GAMMA"],
        "gae_lambda": config["GAE_LAMBDA"],
        "clip_eps": config["CLIP_EPS"],
        "ent_coef": config["ENT_COEF"],
        "vf_coef": config["VF_COEF"],
        "update_epochs": config["UPDATE_EPOCHS"],
        "num_minibatches": config["NUM_MINIBATCHES"],
        "normalize_advantages": True,
    }, "learners.cartpole")
    learner = PPO.make(hyper, spec)

    def train(key):
        key, init_key, reset_key = jax.random.split(key, 3)
        learner_state = learner.init(init_key, spec)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), env_params)

        def update_step(runner, _):
            def env_step(runner, _):
                learner_state, env_state, obs, key = runner
                key, act_key, step_key = jax.random.split(key, 3)
                action, aux = learner.act(learner_state, obs, act_key)
                next_obs, env_state, reward, terminated, truncated, info = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None))(
                    jax.random.split(step_key, num_envs), env_state,
                    aux["action_index"][:, 0], env_params)
                done = jnp.logical_or(terminated, truncated)  # PureJaxRL: no bootstrap on truncation
                transition = Transition(obs=obs, action=action, reward=reward,
                                        next_obs=next_obs, done=done, aux=aux)
                episode = (info["returned_episode_returns"] * done, done)
                return (learner_state, env_state, next_obs, key), (transition, episode)

            runner, (batch, (returns, done)) = jax.lax.scan(env_step, runner, None, num_steps)
            learner_state, env_state, obs, key = runner
            learner_state, metrics = learner.update(learner_state, batch)
            metrics = {**metrics, "return_sum": returns.sum(),
                       "episodes": done.sum().astype(jnp.float32)}
            return (learner_state, env_state, obs, key), metrics

        runner = (learner_state, env_state, obs, key)
        _, metrics = jax.lax.scan(update_step, runner, None, num_updates)
        return metrics

    return train


def final_return(metrics, fraction: float = FINAL_FRACTION) -> np.ndarray:
    """Mean return of the episodes completed in the last ``fraction`` of the updates,
    per seed (``metrics`` leaves ``[seeds, num_updates]``)."""
    num_updates = metrics["episodes"].shape[-1]
    k = max(1, math.ceil(fraction * num_updates))
    returns = np.asarray(metrics["return_sum"])[..., -k:].sum(-1)
    episodes = np.asarray(metrics["episodes"])[..., -k:].sum(-1)
    return returns / np.maximum(episodes, 1)


def run(seeds: int = 1, total_timesteps: int | None = None, seed: int = 0, repeats: int = 1):
    config = dict(CONFIG)
    if total_timesteps is not None:
        config["TOTAL_TIMESTEPS"] = total_timesteps
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    train = jax.jit(jax.vmap(make_train(config)))
    t0 = time.perf_counter()
    compiled = train.lower(keys).compile()
    compile_s = time.perf_counter() - t0
    run_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        metrics = jax.block_until_ready(compiled(keys))
        run_times.append(time.perf_counter() - t0)
    num_updates = metrics["episodes"].shape[-1]
    steps = seeds * num_updates * config["NUM_STEPS"] * config["NUM_ENVS"]
    per_seed = final_return(metrics)
    return {
        "env_steps_per_s": steps / min(run_times),
        "final_return": float(per_seed.mean()),
        "final_return_per_seed": [float(x) for x in per_seed],
        "compile_s": compile_s,
        "run_s": run_times,
        "seeds": seeds,
        "env_steps_per_seed": num_updates * config["NUM_STEPS"] * config["NUM_ENVS"],
        "final_window": f"episodes completed in the last {FINAL_FRACTION:.0%} of updates",
        "metrics": metrics,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="seeds trained in parallel (vmap)")
    parser.add_argument("--seed", type=int, default=0, help="base PRNG seed")
    parser.add_argument("--total-timesteps", type=int, default=None,
                        help=f"env steps per seed (default {CONFIG['TOTAL_TIMESTEPS']})")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed runs of the compiled program; steps/s uses the fastest")
    parser.add_argument("--json", action="store_true", help="print a last line of JSON")
    record.add_arguments(parser, "ppo_cartpole")
    args = parser.parse_args(argv)

    out = run(args.seeds, args.total_timesteps, args.seed, args.repeats)
    m = out.pop("metrics")
    print(f"backend: {jax.default_backend()} ({jax.device_count()} device), "
          f"seeds: {out['seeds']}, env steps per seed: {out['env_steps_per_seed']}")
    print(f"compile: {out['compile_s']:.2f} s; run: "
          + ", ".join(f"{t:.2f} s" for t in out["run_s"]))
    print(f"env steps/s (excluding compile): {out['env_steps_per_s']:,.0f}")
    print(f"final mean episodic return ({out['final_window']}): {out['final_return']:.1f}"
          + (f"  per seed: {np.round(out['final_return_per_seed'], 1).tolist()}"
             if args.seeds > 1 else ""))
    print(f"last update: policy_loss {float(np.mean(m['policy_loss'][..., -1])):.4f}, "
          f"value_loss {float(np.mean(m['value_loss'][..., -1])):.4f}, "
          f"entropy {float(np.mean(m['entropy'][..., -1])):.4f}, "
          f"approx_kl {float(np.mean(m['approx_kl'][..., -1])):.5f}")
    result = {k: out[k] for k in ("env_steps_per_s", "final_return", "compile_s",
                                  "final_return_per_seed", "run_s", "seeds",
                                  "env_steps_per_seed")}
    if args.json:
        print(json.dumps(result))
    record.write(args, result, __file__, argv, "ppo_cartpole")


if __name__ == "__main__":
    main()
