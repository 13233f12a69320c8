"""Memory ``k = 2`` (and ``k = 3``) on the session engine (the observation
``[{kind: history, k: 2}]``): the state numbering against the general loop's own
observation, the xla backend against the learner's ``act``/``update`` replayed period
by period on a history built here, the kernel against xla bit for bit (Calvano's plain
loop and the general one), the greedy limit cycle and the equilibrium check on a
hand-built strategy that only a memory of two profiles can play, a run's files with the
impulse responses replayed from them, and the refusals.

The games are ``configs/calvano.yaml`` on coarse grids (3 or 4 prices: 81 or 256
histories), with fast exploration and a low discount, so that a few thousand periods
hold exploration, greedy changes and convergence mid-run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmarket.config.loader import load_config
from jaxmarket.learners.base import Transition
from jaxmarket.learners.qlearning import obs_grid_of
from jaxmarket.market.state import current_actions
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.diagnostics import diagnose
from jaxmarket.sessions.engine import Settings
from jaxmarket.sessions.game import check_game, kernel_reason, make_game
from jaxmarket.sessions.kernel import history_in, plain
from jaxmarket.sessions.reproduce import find_design
from jaxmarket.sessions.run import session_plan

A, C, A0, MU = 2.0, 1.0, 0.0, 0.25   # calvano.yaml's logit economy
MEMORY2 = ["market.sellers[0].observation=[{kind: history, k: 2}]",
           "learners.sellers.memory=2"]
FAST = {"exploration_decay": 2.0e-3, "convergence_window": 300, "discount": 0.5,
        "learning_rate": 0.3}


def plan_of(m: int, *extra: str, **learner):
    items = MEMORY2 + [f"learners.sellers.grid_size={m}"]
    items += [f"learners.sellers.{k}={v!r}" for k, v in learner.items()] + list(extra)
    return session_plan(load_config("configs/calvano.yaml", items))


@functools.cache
def game_of(m: int = 4, fast: bool = True, *extra: str):
    return make_game(plan_of(m, *extra, **(FAST if fast else {})))


def profits(prices) -> np.ndarray:
    """Logit profits over the last axis, written out here."""
    p = np.asarray(prices, np.float64)
    weight = np.exp((A - p) / MU)
    return (p - C) * weight / (weight.sum(axis=-1, keepdims=True) + np.exp(A0 / MU))


def leaves(sessions: eng.Sessions) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves((sessions.learner, sessions.index,
                                                    sessions.past, sessions.tail,
                                                    sessions.outcome))]


# -- the state numbering -----------------------------------------------------------------

def test_state_of_a_two_period_history_is_the_loops_and_the_formula():
    # Bugs caught: a history observation in the wrong order (oldest first), a state
    # number whose digits are not (p_{t-1}, p_{t-2}) seller by seller, or an engine
    # observation that is not what the general loop's market shows its learner after
    # the same two periods.
    plan = plan_of(5)
    game = make_game(plan)
    m, n = 5, 2
    assert game.memory == 2 and game.histories == m ** 4 == game.settings.num_states
    older, newer = np.array([1, 4]), np.array([3, 0])     # grid indices, p_{t-2} and p_{t-1}
    env, params = plan.env, plan.params
    _, state = env.reset_env(jax.random.key(0), params)
    for profile in (older, newer):   # the general loop's market, two periods
        actions = current_actions(env.spec, state)
        actions[game.group] = game.grid.profile_price(jnp.asarray(profile))[:, None]
        obs, state, *_ = env.step_env(jax.random.key(0), state, actions, params)
    loop_obs = np.asarray(obs[game.group])                      # [n, 2n]
    rows = jnp.asarray([newer @ [m, 1], older @ [m, 1]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(game.history_obs(rows)), loop_obs)
    prices = np.asarray(game.grid.prices)
    np.testing.assert_array_equal(loop_obs[0], prices[[3, 0, 1, 4]])
    state_number = np.asarray(obs_grid_of(game.settings).state_index(jnp.asarray(loop_obs)))
    # s = d_0 m^3 + d_1 m^2 + d_2 m + d_3, digits (p_{t-1}: 3, 0; p_{t-2}: 1, 4)
    want = 3 * m ** 3 + 0 * m ** 2 + 1 * m + 4
    np.testing.assert_array_equal(state_number, [want] * n)
    # the engine's history number of that state is the same
    sessions = eng.init_sessions(game, 1, jax.random.key(0))._replace(
        index=jnp.asarray([newer], jnp.int32), past=jnp.asarray([[older]], jnp.int32))
    assert int(history_in(game, sessions)[0]) == want
    np.testing.assert_array_equal(game.history_rows()[want], [3 * m + 0, 1 * m + 4])


def test_first_history_is_k_profiles_from_the_start_key():
    # Bugs caught: a first history not drawn at random (the loop's reset repeats one
    # profile), or drawn from another key than memory 1's first profile.
    game = game_of(4)
    sessions = eng.init_sessions(game, 50, jax.random.key(3))
    with jax.threefry_partitionable(False):
        _, start_key, _ = jax.random.split(jax.random.key(3), 3)
        want = np.asarray(jax.random.randint(start_key, (50, 2, 2), 0, 4))
    np.testing.assert_array_equal(np.asarray(sessions.index), want[:, 0])
    np.testing.assert_array_equal(np.asarray(sessions.past), want[:, 1:])
    assert np.any(want[:, 0] != want[:, 1])


# -- xla == the learner, period by period --------------------------------------------------

def test_xla_backend_is_the_learners_act_and_update_on_the_history():
    # Bugs caught: an engine that shows the learner the profile in force only, shifts
    # the history in the wrong order, learns towards the wrong next state, or reads the
    # reward of the history's older profile.
    game = game_of(4)
    sessions, periods, chunk, s = 3, 900, 250, 2
    key = jax.random.key(11)
    result = eng.run(game, Settings(sessions, periods, chunk, window=100, backend="xla",
                                    stop="periods"), key, compact=False)
    learner, n, m = game.learner, game.sellers, game.grid.size
    prices = np.asarray(game.grid.prices)

    def observe(newer, older):   # what the history observation holds, written out
        return jnp.asarray(np.broadcast_to(np.concatenate([prices[newer], prices[older]]),
                                           (n, 2 * n)))

    @jax.jit
    def period(state, obs, next_obs, action, reward):
        batch = Transition(obs=obs[None], action=game.grid.prices[action][None, :, None],
                           reward=reward[None], next_obs=next_obs[None],
                           done=jnp.zeros((1, n), bool), aux={"action_index": action[None]})
        return learner.update(state, batch)[0]

    act = jax.jit(lambda state, obs, key: learner.act(state, obs, key)[1]["action_index"])
    with jax.threefry_partitionable(False):
        init_key, start_key, run_key = jax.random.split(key, 3)
        state = learner.init(init_key, game.spec)
        first = np.asarray(jax.random.randint(start_key, (sessions, 2, n), 0, m))[s]
        newer, older = first[0], first[1]
        session_key = jax.random.split(run_key, sessions)[s]
        for t in range(periods):
            obs = observe(newer, older)
            action = np.asarray(act(state, obs, jax.random.fold_in(session_key, t)))
            reward = game.reward[int(action @ [m, 1])]
            state = period(state, obs, observe(action, newer), jnp.asarray(action), reward)
            newer, older = action, newer
    got = result.sessions
    np.testing.assert_array_equal(np.asarray(got.learner.rows[s]), np.asarray(state.rows))
    np.testing.assert_array_equal(np.asarray(got.learner.step[s]), np.asarray(state.step))
    np.testing.assert_array_equal(np.asarray(got.index[s]), newer)
    np.testing.assert_array_equal(np.asarray(got.past[s, 0]), older)
    np.testing.assert_allclose(np.asarray(game.reward)[:, 0],
                               profits(prices[np.indices((m, m)).reshape(2, -1).T])[:, 0],
                               rtol=2e-6)


# -- kernel == xla -------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [(), ("learners.sellers.epsilon={start: 0.8, decay: 0.002}",)],
                         ids=["plain", "general"])
def test_kernel_plays_memory_two_as_xla_bit_for_bit(extra):
    # Bugs caught: a kernel whose next state is the profile only (not p J + h // J), that
    # reads the reward of the history number, hands back index and past swapped, or
    # plays greedily after convergence from the wrong state; in Calvano's plain loop and
    # in the general one (an epsilon schedule from 0.8); a calibration too short to tell
    # the update's roundings apart on 256 states.
    game = game_of(4, True, *extra)
    assert plain(game) == (not extra) and kernel_reason(game) is None
    settings = {"sessions": 8, "periods": 3000, "chunk": 700, "window": 300,
                "stop": "periods"}
    key = jax.random.key(3)
    xla = eng.run(game, Settings(**settings, backend="xla"), key, compact=False)
    kernel = eng.run(game, Settings(**settings, backend="kernel"), key, compact=False)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")
    for a, b in zip(leaves(xla.sessions), leaves(kernel.sessions)):
        np.testing.assert_array_equal(a, b)
    converged = np.asarray(xla.converged)
    assert converged.any() and np.asarray(xla.step)[converged].min() < 3000 - 300
    np.testing.assert_array_equal(xla.cycle_length, kernel.cycle_length)


@pytest.mark.slow
def test_kernel_plays_memory_three_as_xla_bit_for_bit():
    # Bugs caught: a history of two profiles hard-wired anywhere (the shift, the history
    # number, index and past handed back, the greedy cycle over histories).
    items = ["market.sellers[0].observation=[{kind: history, k: 3}]",
             "learners.sellers.memory=3", "learners.sellers.grid_size=3"]
    items += [f"learners.sellers.{k}={v!r}" for k, v in FAST.items()]
    game = make_game(session_plan(load_config("configs/calvano.yaml", items)))
    assert game.memory == 3 and game.histories == 9 ** 3 == game.settings.num_states
    settings = {"sessions": 8, "periods": 3000, "chunk": 700, "window": 300,
                "stop": "periods"}
    key = jax.random.key(3)
    xla = eng.run(game, Settings(**settings, backend="xla"), key, compact=False)
    kernel = eng.run(game, Settings(**settings, backend="kernel"), key, compact=False)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")
    assert np.asarray(xla.sessions.past).shape == (8, 2, 2)
    for a, b in zip(leaves(xla.sessions), leaves(kernel.sessions)):
        np.testing.assert_array_equal(a, b)
    assert np.asarray(xla.converged).any()
    np.testing.assert_array_equal(xla.cycle_length, kernel.cycle_length)


# -- the greedy limit cycle ----------------------------------------------------------------

def two_step_strategy(game, base):
    """Both sellers play ``hi`` after two equal profiles, else ``lo``: from a history
    ``(x, x)`` the play goes ``(hi, hi)``; from any other, onto the 3-cycle ``(lo, lo),
    (lo, lo), (hi, hi)``, which a memory of one profile cannot play ((lo, lo) is followed
    once by (lo, lo), once by (hi, hi))."""
    m = game.grid.size
    lo, hi = 0, m - 1
    rows = game.history_rows()
    q = np.zeros(np.asarray(base.learner.rows)[..., :m].shape, np.float32)
    same = rows[:, 0] == rows[:, 1]
    q[:, :, same, hi] = 1.0
    q[:, :, ~same, lo] = 1.0
    return q, lo, hi


def test_greedy_cycle_of_a_strategy_that_needs_two_profiles():
    # Bugs caught: a cycle over the profile in force only (it would see (lo, lo) twice
    # and stop at length 1 or 2), a cycle averaged from off the cycle, or a history not
    # shifted between periods.
    game = game_of(3, fast=False)
    base = eng.init_sessions(game, 3, jax.random.key(0))
    q, lo, hi = two_step_strategy(game, base)
    index = jnp.asarray([[hi, hi], [0, 2], [1, 1]], jnp.int32)
    past = jnp.asarray([[[hi, hi]], [[1, 1]], [[1, 1]]], jnp.int32)
    sessions = base._replace(learner=base.learner.with_q(jnp.asarray(q)), index=index,
                             past=past)
    reward, _, price, length = (np.asarray(x) for x in eng.greedy_cycle(game, sessions, 0))
    np.testing.assert_array_equal(length, [1, 3, 3])
    prices = np.asarray(game.grid.prices, np.float64)
    fixed = prices[[hi, hi]]
    cycle = prices[np.asarray([[lo, lo], [lo, lo], [hi, hi]])]
    np.testing.assert_allclose(price[0], fixed, rtol=1e-6)
    np.testing.assert_allclose(reward[0], profits(fixed), rtol=2e-5)
    for s in (1, 2):
        np.testing.assert_allclose(price[s], cycle.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(reward[s], profits(cycle).mean(axis=0), rtol=2e-5)


def test_equilibrium_check_over_histories_is_the_simulated_value():
    # Bugs caught: values over profiles instead of histories (the next state of a
    # history not p J + h // J), the reward of a state read from its older profile, or
    # the limit cycle followed over profiles.
    game = game_of(3, fast=False)
    base = eng.init_sessions(game, 1, jax.random.key(0))
    q, lo, hi = two_step_strategy(game, base)
    greedy = np.argmax(q, axis=-1).astype(np.int64)          # [1, n, Z]
    rows = game.history_rows()
    state = np.asarray(obs_grid_of(game.settings).state_index(
        game.history_obs(jnp.asarray(rows))), np.int64)      # [Z, n]
    Z, J, m, n, delta = game.histories, game.profiles, game.grid.size, 2, 0.95
    np.testing.assert_array_equal(state, np.arange(Z)[:, None].repeat(n, 1))
    reward = np.asarray(game.reward, np.float64)
    d = diagnose(reward, state, greedy, m, delta, np.zeros(1, np.int64), memory=2)
    # Q_i(h, a) simulated: seller i plays a once in history h, then both follow the
    # strategy (800 periods: delta^800 < 1e-17)
    sigma = greedy[0]                                        # [n, Z]
    h = np.arange(Z)[:, None]
    Q = np.zeros((Z, n, m))
    for i in range(n):
        for a in range(m):
            first = np.stack([sigma[0, h[:, 0]], sigma[1, h[:, 0]]], axis=-1)
            first[:, i] = a
            p = first @ [m, 1]
            total, weight, hist = reward[p, i], delta, p * J + h[:, 0] // J
            for _ in range(800):   # periods of the path (time)
                p = sigma[0, hist] * m + sigma[1, hist]
                total = total + weight * reward[p, i]
                weight *= delta
                hist = p * J + hist // J
            Q[:, i, a] = total
    played = np.take_along_axis(Q, sigma.T[..., None], -1)[..., 0]       # [Z, n]
    best = Q.max(-1)
    np.testing.assert_allclose(d.gap_all[0], ((best - played) / np.abs(best)).mean(0),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(d.br_all[0], (played >= best - 1e-9 * best).mean(0))
    assert 0 < d.br_all[0, 0] < 1   # some histories best-reply, some do not
    # the 3-cycle from history 0 = ((lo, lo), (lo, lo)): its three histories
    on = np.flatnonzero(d.on_path[0])
    want = sorted([(lo * m + lo) * J + hi * m + hi, (lo * m + lo) * J + lo * m + lo,
                   (hi * m + hi) * J + lo * m + lo])
    np.testing.assert_array_equal(on, want)


# -- refusals ----------------------------------------------------------------------------

def test_memory_two_refuses_what_it_cannot_play_exactly():
    # Bugs caught: a history mixed with another observation, or with random period
    # outcomes (the state would need past outcomes), played as if exact.
    mixed = session_plan(load_config("configs/calvano.yaml", [
        "market.sellers[0].observation=[{kind: history, k: 2}, {kind: own_price}]",
        "learners.sellers.memory=0"]))
    with pytest.raises(ValueError, match="history of k=2 profiles with other components"):
        check_game(mixed)
    design = find_design("calvano2020_demand015")
    shocked = session_plan(load_config(design.config, list(design.overrides) + MEMORY2))
    with pytest.raises(ValueError, match="history k=2 with random period outcomes"):
        check_game(shocked)


# -- a run's files and the impulse responses ---------------------------------------------

@pytest.mark.slow
def test_a_memory_two_run_writes_its_history_and_the_impulse_replays_it(tmp_path):
    # Bugs caught: strategies.npz without the history (last of the profile in force only,
    # memory 1) or over the wrong state count, an equilibrium check labelled as over the
    # last profile, or impulse responses whose replayed cycles are not the engine's.
    from jaxmarket.analysis.impulse import _Game, limit_cycles, strategies_from_npz
    from jaxmarket.sessions.run import start
    items = MEMORY2 + ["learners.sellers.grid_size=3", "learners.sellers.exploration_decay=0.003",
                       "learners.sellers.convergence_window=300", "train.num_iterations=4000",
                       "train.chunk_size=1000", "train.num_seeds=6",
                       "train.session_backend=xla"]
    config = load_config("configs/calvano.yaml", items)
    summary = start(config, session_plan(config), tmp_path)
    assert "last 2 price profiles" in summary["equilibrium_check"]["method"]
    npz = np.load(tmp_path / "strategies.npz")
    assert int(npz["memory"]) == 2 and npz["greedy"].shape == (6, 2, 81)
    assert npz["last"].shape == (6, 4)
    from jaxmarket.analysis.equilibrium_check import equilibrium_check
    assert equilibrium_check(tmp_path) == summary["equilibrium_check"]
    s = strategies_from_npz(tmp_path)
    length, _ = limit_cycles(_Game(s))
    rows = (tmp_path / "sessions.csv").read_text().splitlines()
    column = rows[0].split(",").index("cycle_length")
    np.testing.assert_array_equal(length, [int(float(r.split(",")[column])) for r in rows[1:]])
