"""Outside clients on the adapters and exports (docs/ecosystem.md): Stable-Baselines3's
PPO on the Gymnasium adapter, d3rlpy on a D4RL export.

These need the ``clients`` extra plus d3rlpy (``pip install -e '.[test,clients]'`` and
``pip install --no-deps d3rlpy`` and its small dependencies; docs/ecosystem.md says why
they are not in ``test``: torch's CUDA wheels and d3rlpy's gymnasium pin). Without
stable-baselines3, torch and d3rlpy this module defines no tests (nothing is skipped):
the clients are checked wherever they are installed.
"""

from __future__ import annotations

import importlib.util

import numpy as np
from conftest import CONFIGS

from jaxmarket.market.economics import logit_profits, monopoly_price

CLIENTS = ("torch", "stable_baselines3", "d3rlpy")
INSTALLED = all(importlib.util.find_spec(m) is not None for m in CLIENTS)
MONOPOLY = str(CONFIGS / "logit_monopoly.yaml")
DUOPOLY = str(CONFIGS / "logit_duopoly.yaml")
OWN_PRICE_MONOPOLY = "market.sellers[0].observation=[{kind: own_price}]"

if INSTALLED:
    import d3rlpy
    import h5py
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    from jaxmarket.adapters import make_gymnasium_env
    from jaxmarket.cli.collect import main as collect_main

    def test_sb3_ppo_on_the_gymnasium_adapter_learns_the_monopoly_price():
        torch.manual_seed(0)
        # bounds [1, 4]: the first actions (0, the midpoint) price at 2.5, far from p*
        env = make_gymnasium_env(MONOPOLY, "seller", [OWN_PRICE_MONOPOLY,
                                                      "market.episode_length=64",
                                                      "market.sellers[0].high=4.0"],
                                 normalize_actions=True)
        sb3_check_env(env)                       # SB3's own checker
        low, high = 1.0, 4.0
        # a one-shot pricing problem: gamma = 0 (the myopic best response)
        model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, n_epochs=5,
                    learning_rate=3e-3, gamma=0.0, seed=0, verbose=0)

        def price(model):
            obs, _ = env.reset(seed=1)
            a, _ = model.predict(obs, deterministic=True)
            return low + (float(np.clip(a[0], -1, 1)) + 1) / 2 * (high - low)

        def profit(p):
            return float(logit_profits([p])[0])

        before = price(model)
        model.learn(total_timesteps=1536)
        after = price(model)
        p_star = monopoly_price()                 # 1.8020 (Lambert W)
        assert abs(before - (low + high) / 2) < 0.3 and profit(before) < 0.7 * profit(p_star)
        assert abs(after - p_star) < 0.12, (before, after, p_star)
        assert profit(after) > 0.95 * profit(p_star)

    def test_d3rlpy_loads_a_d4rl_export_with_actions_in_minus_one_one(tmp_path, capsys):
        out = tmp_path / "duopoly.hdf5"
        assert collect_main(["--config", DUOPOLY, "--steps", "10", "--noise", "0.3",
                             "--out", str(out), "--format", "d4rl", "--normalize-actions",
                             "market.sellers[0].observation=[{kind: own_price}]",
                             "train.num_envs=2", "train.num_seeds=1"]) == 0
        with h5py.File(out) as f:
            arr = {k: np.asarray(f[k]) for k in ("observations", "actions", "rewards",
                                                 "terminals", "timeouts")}
        ds = d3rlpy.dataset.MDPDataset(arr["observations"], arr["actions"], arr["rewards"],
                                       arr["terminals"], timeouts=arr["timeouts"])
        # 2 markets x 2 sellers, one episode each of 10 steps
        assert len(ds.episodes) == 4 and all(len(e.rewards) == 10 for e in ds.episodes)
        assert ds.dataset_info.action_size == 1
        acts = np.concatenate([e.actions for e in ds.episodes])
        assert acts.min() >= -1 and acts.max() <= 1 and acts.std() > 0.05
        np.testing.assert_allclose(np.concatenate([e.rewards for e in ds.episodes]).ravel(),
                                   arr["rewards"], rtol=1e-6)
