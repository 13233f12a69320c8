"""Outside clients on the adapters' and exports' defaults (docs/ecosystem.md):
Stable-Baselines3 on ``make_sb3_vec_env`` (the jitted vector env as an SB3 ``VecEnv``),
d3rlpy's behaviour cloning on a default Minari export, and ``minari.load_dataset`` +
``recover_environment`` on a default export of every shipped scenario.

Every test uses the defaults: actions in ``[-1, 1]`` (the adapters' and ``collect``'s
default), the adapters' default observation; no ``normalize_actions`` argument.

These need the ``clients`` extra plus d3rlpy (``pip install -e '.[test,clients]'`` and
``pip install --no-deps d3rlpy`` and its small dependencies; docs/ecosystem.md says why
they are not in ``test``: torch's CUDA wheels and d3rlpy's gymnasium pin). Without
stable-baselines3, torch, d3rlpy and minari this module defines no tests (nothing is
skipped): the clients are checked wherever they are installed (.ci/run installs them).
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import yaml
from conftest import CONFIGS
from scipy.optimize import brentq

from jaxmarket.market.economics import logit_profits, monopoly_price, nash_price

CLIENTS = ("torch", "stable_baselines3", "d3rlpy", "minari")
INSTALLED = all(importlib.util.find_spec(m) is not None for m in CLIENTS)
MONOPOLY = str(CONFIGS / "logit_monopoly.yaml")
DUOPOLY = str(CONFIGS / "logit_duopoly.yaml")
CALVANO = str(CONFIGS / "calvano.yaml")


def to_price(action, low, high):
    """A ``[-1, 1]`` action in market units (the adapters' mapping, clipped)."""
    return low + (np.clip(action, -1.0, 1.0) + 1.0) / 2.0 * (high - low)


if INSTALLED:
    import d3rlpy
    import gymnasium as gym
    import minari
    import pytest
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecMonitor

    from jaxmarket.adapters import make_gymnasium_env, make_sb3_vec_env, sb3_vec
    from jaxmarket.adapters.registration import shipped_scenarios
    from jaxmarket.cli.collect import main as collect_main
    from jaxmarket.config.errors import ConfigError

    RIVAL = {"sellers": {"kind": "constant", "value": 1.5}}
    LOW, HIGH = 1.0, 2.5                  # logit_duopoly's and logit_monopoly's bounds

    @pytest.fixture(autouse=True)
    def one_torch_thread():
        # CI's 2 cores: torch's default thread pool only adds contention at these sizes
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)

    # -- make_sb3_vec_env ----------------------------------------------------------------

    def test_sb3_vec_env_equals_dummy_vec_env_of_the_gymnasium_adapter_with_sb3_autoreset():
        n, length = 4, 3
        over = [f"market.episode_length={length}"]
        venv = make_sb3_vec_env(DUOPOLY, n, overrides=over, others=RIVAL)
        dummy = DummyVecEnv([lambda: make_gymnasium_env(DUOPOLY, "sellers", over, others=RIVAL)
                             for _ in range(n)])
        assert isinstance(venv, VecEnv) and venv.num_envs == n
        assert venv.action_space == dummy.action_space == gym.spaces.Box(-1, 1, (1,))
        assert venv.observation_space == dummy.observation_space
        calls = []
        jitted = venv.venv._step
        venv.venv._step = lambda *a: calls.append(1) or jitted(*a)
        venv.seed(0)
        dummy.seed(0)
        obs, ref = venv.reset(), dummy.reset()
        np.testing.assert_array_equal(obs, ref)
        assert obs.dtype == np.float32 and obs.flags.writeable
        actions = np.array([[-1.0], [-0.5], [0.5], [1.0]], np.float32)
        prices = to_price(actions, LOW, HIGH)
        expected = logit_profits(np.concatenate([prices, np.full((n, 1), 1.5)], 1))[:, 0]
        for t in range(length):
            obs, rewards, dones, infos = venv.step(actions)
            r_obs, r_rewards, r_dones, r_infos = dummy.step(actions)
            np.testing.assert_allclose(rewards, expected, rtol=1e-5)
            np.testing.assert_allclose(rewards, r_rewards, rtol=1e-6)
            np.testing.assert_array_equal(obs, r_obs)
            np.testing.assert_array_equal(dones, r_dones)
            assert dones.all() == (t == length - 1) and dones.any() == (t == length - 1)
            for i in range(n):
                np.testing.assert_allclose(infos[i]["prices"], prices[i], rtol=1e-6)
                assert ("terminal_observation" in infos[i]) == (t == length - 1)
            assert rewards.dtype == np.float32 and dones.dtype == bool
        # SB3's autoreset: the terminal observation (the own price just set) in the infos,
        # marked as a time limit (SB3's PPO bootstraps from it), the reset one in obs
        for i in range(n):
            np.testing.assert_allclose(infos[i]["terminal_observation"], prices[i], rtol=1e-6)
            np.testing.assert_array_equal(infos[i]["terminal_observation"],
                                          r_infos[i]["terminal_observation"])
            assert infos[i]["TimeLimit.truncated"] is True
            assert r_infos[i]["TimeLimit.truncated"] is True
        np.testing.assert_array_equal(obs, ref)            # back at the initial prices
        assert (np.asarray(venv.market_states.time) == 0).all()
        assert len(calls) == length and jitted._cache_size() == 1   # one program, one call a step
        # the SB3 side of the contract: attributes per env, no gymnasium wrappers inside
        assert venv.get_attr("action_space") == [gym.spaces.Box(-1, 1, (1,))] * n
        assert venv.get_attr("render_mode", [1, 2]) == [None, None]
        assert venv.env_is_wrapped(gym.Wrapper) == [False] * n
        with pytest.raises(ValueError, match="share one vector env"):
            venv.set_attr("params", None, indices=[0])

    def test_sb3_vec_monitor_records_the_markets_episodes():
        length, n = 4, 3
        venv = VecMonitor(make_sb3_vec_env(DUOPOLY, n, overrides=[f"market.episode_length={length}"],
                                           others=RIVAL))
        venv.reset()
        actions = np.zeros((n, 1), np.float32)            # the midpoint price
        per_step = logit_profits([(LOW + HIGH) / 2, 1.5])[0]
        for _ in range(length):
            _, rewards, dones, infos = venv.step(actions)
            np.testing.assert_allclose(rewards, per_step, rtol=1e-5)
        assert dones.all()
        for info in infos:
            assert info["episode"]["l"] == length
            assert info["episode"]["r"] == pytest.approx(length * per_step, rel=1e-5)

    def test_make_sb3_vec_env_without_stable_baselines3_names_the_extra(monkeypatch):
        sb3_vec.sb3_vec_env_class.cache_clear()
        monkeypatch.setitem(sys.modules, "stable_baselines3.common.vec_env", None)
        try:
            with pytest.raises(ImportError, match=r"pip install 'jaxmarket\[clients\]'"):
                make_sb3_vec_env(DUOPOLY, 2)
        finally:
            sb3_vec.sb3_vec_env_class.cache_clear()
        with pytest.raises(TypeError, match="autoreset_mode"):
            make_sb3_vec_env(DUOPOLY, 2, autoreset_mode="next_step")

    # -- SB3 PPO learns a best response ---------------------------------------------------

    def test_sb3_ppo_on_make_sb3_vec_env_learns_the_best_response_to_a_nash_rival():
        """Calvano's duopoly (each seller sees last period's two prices) with the rival
        fixed at the static Nash price: the best response is the Nash price itself, near
        the lower bound, while the untrained policy (action 0) plays the bounds' midpoint
        and earns a sixth less. PPO (gamma 0: a price affects only this period's profit)
        has to close most of that gap."""
        torch.manual_seed(0)
        p_n = nash_price()                             # 1.4729 (the rival's price)
        low, high = 1.427725, 1.970185                 # configs/calvano.yaml's bounds
        n_envs = 16
        venv = make_sb3_vec_env(CALVANO, n_envs,
                                others={"sellers": {"kind": "constant", "value": p_n}})

        def profit(p):
            return float(logit_profits([p, p_n])[0])

        def played(model):
            """The deterministic price and the profit the market paid for it."""
            actions, _ = model.predict(venv.reset(), deterministic=True)
            _, rewards, _, infos = venv.step(actions)
            price = float(infos[0]["prices"][0])
            assert rewards[0] == pytest.approx(profit(price), rel=1e-5)   # the closed form
            return price, float(rewards[0])

        model = PPO("MlpPolicy", venv, n_steps=64, batch_size=256, n_epochs=5,
                    learning_rate=1e-3, gamma=0.0, seed=0, verbose=0)
        before, profit_before = played(model)
        midpoint = (low + high) / 2
        # the untrained Gaussian's mean is ~0: the midpoint, far below the optimum
        assert abs(before - midpoint) < 0.05 * (high - low)
        best = profit(p_n)                      # the best response to p_N is p_N (Nash)
        gap = best - profit(midpoint)
        assert gap > 0.15 * best                # the untrained policy earns < 85 %
        model.learn(total_timesteps=4096)
        after, profit_after = played(model)
        # to pass: close 90 % of the gap, i.e. play a price in the interval around p_N
        # where profit >= best - 0.1 gap (profit is single-peaked in the own price; the
        # lower bound, where PPO's clipped Gaussian tends to settle, closes 94.7 %)
        floor = best - 0.1 * gap
        inside = (brentq(lambda p: profit(p) - floor, p_n - 1.0, p_n),
                  brentq(lambda p: profit(p) - floor, p_n, midpoint))
        assert profit_after >= floor, (before, after, p_n)
        assert inside[0] <= after <= inside[1], (after, inside)
        assert profit_before < floor

    # -- d3rlpy and Minari on the default exports -----------------------------------------

    def minari_export(tmp_path, monkeypatch, config, steps, *overrides):
        """``collect --format minari`` with its defaults into ``tmp_path``; the dataset."""
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
        name = config.rsplit("/", 1)[-1].removesuffix(".yaml")
        dataset_id = f"jaxmarket/{name}/test-v0"
        assert collect_main(["--config", config, "--steps", str(steps), "--out", dataset_id,
                             "--format", "minari", *overrides]) == 0
        return minari.load_dataset(dataset_id)

    def test_d3rlpy_bc_on_a_default_export_earns_the_logging_policys_return(tmp_path,
                                                                              monkeypatch):
        """logit_monopoly's seller logs its untrained ppo_bandit policy (prices ~ N(1.3,
        0.2), far from p* = 1.80). BC learns the mean action; in the recovered env it
        earns what that price earns, which the test derives from the logged prices."""
        T = 40
        # the seller observes its last price (the scenario's own observation is empty,
        # which d3rlpy's encoder cannot take)
        ds = minari_export(tmp_path, monkeypatch, MONOPOLY, T, "train.num_seeds=4",
                           "market.sellers[0].observation=[{kind: own_price}]")
        episodes = list(ds)
        obs = np.concatenate([e.observations[:-1] for e in episodes])   # T+1 per episode
        actions = np.concatenate([e.actions for e in episodes])
        rewards = np.concatenate([e.rewards for e in episodes])
        assert actions.min() >= -1 and actions.max() <= 1          # the default: [-1, 1]
        env = ds.recover_environment()
        assert env.action_space == gym.spaces.Box(-1, 1, (1,))
        assert env.spec.max_episode_steps == T
        prices = to_price(actions[:, 0], LOW, HIGH)
        np.testing.assert_allclose(rewards, logit_profits(prices[:, None])[:, 0], rtol=1e-5,
                                   atol=1e-6)
        logged = float(rewards.sum() / len(episodes))              # the logging policy's return
        mdp = d3rlpy.dataset.MDPDataset(
            obs, actions, rewards, np.concatenate([e.terminations for e in episodes]),
            timeouts=np.concatenate([e.truncations for e in episodes]))
        steps = 300
        d3rlpy.seed(0)
        # the learning rate annealed to 0: the fit settles instead of jittering by ~lr
        adam = d3rlpy.optimizers.AdamFactory(
            lr_scheduler_factory=d3rlpy.optimizers.CosineAnnealingLRFactory(T_max=steps))
        bc = d3rlpy.algos.BCConfig(batch_size=256, optim_factory=adam).create(device="cpu:0")
        bc.build_with_dataset(mdp)
        untrained = bc.predict(obs[:256])
        assert np.abs(untrained - actions.mean()).min() > 0.4       # BC has to learn it
        bc.fit(mdp, n_steps=steps, n_steps_per_epoch=steps, show_progress=False,
               save_interval=steps + 1, logger_adapter=d3rlpy.logging.NoopAdapterFactory())
        returned = d3rlpy.metrics.EnvironmentEvaluator(env, n_trials=1)(bc, mdp)
        # The derived tolerance. BC fits E[action | obs] = the logged mean (the logging
        # policy ignores its observation) to within the least-squares estimate's error,
        # allowed 4 standard errors: delta. Its deterministic price p_bar earns
        # profit(p_bar) a step where the logging policy earns the mean of profit(p) (Jensen's
        # gap), each of the T - 1 steps after the first may be off by the profit's slope x
        # delta, and the first (the initial observation) by at most the monopoly profit.
        delta = 4 * prices.std() / np.sqrt(len(prices))
        p_bar = float(prices.mean())
        grid = np.linspace(p_bar - delta, p_bar + delta, 101)
        span = logit_profits(grid[:, None])[:, 0]
        best = float(logit_profits([monopoly_price()])[0])
        predicted = T * float(logit_profits([p_bar])[0])
        jensen = abs(predicted - T * float(np.mean(logit_profits(prices[:, None]))))
        slack = (T - 1) * float(span.max() - span.min()) + best
        assert abs(returned - predicted) <= slack, (returned, predicted, slack)
        assert abs(returned - logged) <= jensen + slack, (returned, logged, jensen + slack)
        # the logger is far from optimal (BC imitates it; it does not find p*)
        assert logged < 0.6 * T * best

    # collect calls the learners' act alone: a league's frozen opponents are played by a
    # training-loop component, so collect refuses that scenario (a config error)
    IN_LOOP_ONLY = ("league",)
    SCENARIOS = ([n for n in shipped_scenarios() if n not in IN_LOOP_ONLY] if INSTALLED
                 else [])

    @pytest.mark.parametrize("name", IN_LOOP_ONLY)
    def test_collect_refuses_a_scenario_whose_opponents_live_in_the_training_loop(
            name, tmp_path):
        with pytest.raises(ConfigError) as err:
            collect_main(["--config", str(CONFIGS / f"{name}.yaml"), "--steps", "2",
                          "--out", str(tmp_path / "ds")])
        assert err.value.field == "learners" and err.value.value == "league"
        assert not (tmp_path / "ds").exists()

    @pytest.mark.parametrize("name", SCENARIOS)
    def test_minari_recovers_the_env_of_a_default_export_of_every_shipped_scenario(
            name, tmp_path, monkeypatch):
        steps = 2
        config = CONFIGS / f"{name}.yaml"
        ds = minari_export(tmp_path, monkeypatch, str(config), steps, "train.num_seeds=1")
        assert ds.total_steps == steps * ds.total_episodes > 0
        env = ds.recover_environment()
        # the time limit: the market's episode_length, else the dataset's episodes
        length = (yaml.safe_load(config.read_text())["market"].get("episode_length")
                  or steps)
        assert env.spec.max_episode_steps == length
        assert env.action_space == ds.action_space
        assert env.observation_space == ds.observation_space   # bounds included
        episode = next(iter(ds))
        # continuous actions in [-1, 1] by default; every logged observation is one the
        # recovered env can produce
        assert env.action_space == gym.spaces.Box(-1, 1, env.action_space.shape)
        assert episode.actions.min() >= -1 and episode.actions.max() <= 1
        assert all(env.observation_space.contains(o) for o in episode.observations)
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs), (obs, env.observation_space)
        for t in range(steps):
            obs, reward, terminated, truncated, _ = env.step(episode.actions[t])
            assert np.isfinite(reward) and not terminated
            assert env.observation_space.contains(obs), (obs, env.observation_space)
        assert truncated == (length == steps)
