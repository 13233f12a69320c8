"""The session engine (:mod:`jaxmarket.sessions`): the kernel backend against the XLA
backend, the XLA backend against the learner's own ``act``/``update`` replayed period
by period, compaction, the greedy limit cycle, the backend choice, the kernel's hash and
the tables of a three-seller game.

The games are ``configs/calvano.yaml`` on its shipped 15-price grid (and coarser ones), with faster
exploration, a short convergence window and a low discount, so that sessions converge
within a few hundred periods (some mid-run, some not at all). Expected values are the
learner's own functions replayed here, JAX's own hash, or computed by hand from the
logit formula. numba is a dependency of the package: the kernel's import below is not
skipped where it is missing, it fails.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from jaxmarket.config.loader import load_config
from jaxmarket.learners.base import Transition
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.engine import Settings
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.kernel import _draw_bits, threefry2x32
from jaxmarket.sessions.run import session_plan

A, C, A0, MU = 2.0, 1.0, 0.0, 0.25   # calvano.yaml's logit economy (quality, cost, outside)
#: a Calvano game whose sessions converge within hundreds of periods
FAST = {2: {"exploration_decay": 2.0e-2, "convergence_window": 30, "discount": 0.5,
            "learning_rate": 0.3},
        3: {"exploration_decay": 5.0e-2, "convergence_window": 30, "discount": 0.3,
            "learning_rate": 0.5}}


@functools.cache
def game_of(config: str = "calvano", firms: int | None = None, **learner):
    items = [] if firms is None else [f"market.sellers[0].count={firms}"]
    items += [f"learners.sellers.{k}={v!r}" for k, v in learner.items()]
    return make_game(session_plan(load_config(f"configs/{config}.yaml", items)))


def calvano(firms: int, **extra):
    return game_of("calvano", firms, **{**FAST[firms], **extra})


def profits(prices) -> np.ndarray:
    """Logit profits over the last axis, written out here."""
    p = np.asarray(prices, np.float64)
    weight = np.exp((A - p) / MU)
    return (p - C) * weight / (weight.sum(axis=-1, keepdims=True) + np.exp(A0 / MU))


def fields(sessions: eng.Sessions) -> dict:
    state = sessions.learner
    return {"rows": state.rows, "step": state.step, "stable_periods": state.stable_periods,
            "converged": state.converged, "index": sessions.index, "tail": sessions.tail}


def assert_same(a: dict, b: dict, names=None) -> None:
    for name in names or a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


# -- kernel == xla ----------------------------------------------------------------------

@pytest.mark.parametrize("firms, sessions, periods, chunk, m",
                         [(2, 8, 600, 140, 15), (3, 6, 400, 90, 15), (2, 8, 600, 140, 5),
                          (2, 8, 600, 140, 7), (2, 8, 600, 140, 10), (2, 8, 1500, 1500, 15)],
                         ids=["duopoly", "three", "grid5", "grid7", "grid10", "one_chunk"])
def test_kernel_backend_plays_the_xla_sessions_bit_for_bit(firms, sessions, periods, chunk, m):
    # Bugs caught: a kernel whose hash, exploration test (eps_t at the wrong step), the
    # rounding of its two multiply-adds, its greedy cache (the tie rule, the rescan when
    # the greedy entry falls), the stable count, its greedy play after convergence, the
    # tail window or the profile it hands back departs from the learner's act/update
    # (the xla backend) by one bit, for two sellers and for three (an odd number of
    # draws, m^3 states); chunks that do not divide the periods; grids where XLA would
    # have fused the update's products into multiply-adds differently (5, 7, 10 prices);
    # a greedy stretch skipped to the tail by the wrong number of periods (one_chunk: a
    # session converged early skips a thousand periods of greedy play in one go).
    game = calvano(firms) if m == 15 else calvano(firms, grid_size=m)
    key = jax.random.key(7)
    settings = {"sessions": sessions, "periods": periods, "chunk": chunk, "window": 150,
                "stop": "periods"}
    xla = eng.run(game, Settings(**settings, backend="xla"), key, compact=False)
    kernel = eng.run(game, Settings(**settings, backend="kernel"), key, compact=False)
    assert (xla.backend, kernel.backend) == ("xla", "kernel")
    assert_same(fields(xla.sessions), fields(kernel.sessions))
    assert xla.periods == kernel.periods == periods
    # the comparison covers sessions that converged mid-run (greedy play after it, in
    # the tail window too) and sessions still learning at the end
    steps, converged = np.asarray(xla.step), np.asarray(xla.converged)
    assert converged.any(), steps
    assert steps[converged].min() < periods - 150, steps   # then played greedily in the tail
    assert np.asarray(xla.sessions.tail).min() > 0   # the tail did add rewards
    if m == 15:   # and sessions still learning at the end
        assert not converged.all(), steps


@pytest.mark.parametrize("threads", [1, 3])
def test_kernel_sessions_do_not_depend_on_the_threads_that_play_them(threads, monkeypatch):
    # Bug caught: a slice of the sessions played twice, skipped, or reading another
    # slice's session (the loop's range, the slicing's bounds): one thread and three
    # threads of slices of 2 sessions play the sessions of the default threads bit for bit.
    from jaxmarket.sessions import kernel
    game = calvano(2)
    settings = Settings(sessions=7, periods=500, chunk=140, window=150, stop="periods",
                        backend="kernel")
    key = jax.random.key(3)
    default = eng.run(game, settings, key, compact=False)
    monkeypatch.setattr(kernel, "numba_threads", lambda: threads)
    monkeypatch.setattr(kernel, "SLICES_PER_THREAD", 1)
    again = eng.run(game, settings, key, compact=False)
    assert_same(fields(default.sessions), fields(again.sessions))
    assert np.asarray(default.converged).any() and not np.asarray(default.converged).all()


@pytest.mark.parametrize("firms", [2, 3])
def test_kernel_lanes_hand_over_to_the_next_session_bit_for_bit(firms, monkeypatch):
    # Bugs caught: a lane that a converged or finished session leaves and the next one
    # takes with the old session's greedy prices, step, stable count, key words, alpha or
    # eps row; a lane that goes on playing after it emptied, or two sessions in one lane;
    # bits drawn at a pass boundary of the wrong lane. One thread plays 45 sessions, more
    # than three times the 16 lanes, converging at different periods, in chunks that are
    # not a multiple of the 64 periods of a pass, the same as XLA bit for bit.
    from jaxmarket.sessions import kernel, lanes
    monkeypatch.setattr(kernel, "numba_threads", lambda: 1)
    game = calvano(firms, grid_size=7)
    sessions = 45
    assert sessions > 2 * lanes.LANES
    settings = {"sessions": sessions, "periods": 900, "chunk": 170, "window": 150,
                "stop": "periods"}
    key = jax.random.key(11)
    xla = eng.run(game, Settings(**settings, backend="xla"), key, compact=False)
    kernel_run = eng.run(game, Settings(**settings, backend="kernel"), key, compact=False)
    assert kernel_run.backend == "kernel"
    assert_same(fields(xla.sessions), fields(kernel_run.sessions))
    steps = np.asarray(xla.step)[np.asarray(xla.converged)]
    # sessions converged in different chunks, while others still learn at the end
    assert len(set(steps // 170)) >= 3, steps
    assert 0 < steps.size < sessions


@pytest.mark.parametrize("sessions, threads", [(1, 2), (7, 2), (8, 2), (1000, 2), (5, 3)])
def test_kernel_slices_cover_every_session_once(sessions, threads, monkeypatch):
    # Bug caught: slices that overlap, leave a gap or run past the last session.
    from jaxmarket.sessions import kernel
    monkeypatch.setattr(kernel, "numba_threads", lambda: threads)
    seen = []
    kernel._in_threads(lambda lo, hi, out: out.extend(range(lo, hi)), sessions, seen)
    assert sorted(seen) == list(range(sessions))


def test_kernel_slices_still_running_finish_before_a_failure_is_raised(monkeypatch):
    # Bug caught: the caller (a failing slice, or Ctrl-C) returning while another
    # thread still writes into the sessions' arrays, which a checkpoint may then save.
    import threading
    from jaxmarket.sessions import kernel
    monkeypatch.setattr(kernel, "numba_threads", lambda: 2)
    monkeypatch.setattr(kernel, "SLICES_PER_THREAD", 1)
    started, finished = threading.Event(), []

    def loop(lo, hi):
        if lo == 0:
            started.set()
            threading.Event().wait(0.3)
            finished.append(lo)
        else:
            started.wait()
            raise ValueError("slice failed")

    with pytest.raises(ValueError, match="slice failed"):
        kernel._in_threads(loop, 4)
    assert finished == [0]


def test_kernel_backend_looks_up_each_sessions_own_beta():
    # Bug caught: a kernel that takes one eps_t row for every session (or the row of the
    # wrong beta) when sessions explore at different rates (PBT, per-session hyper).
    game = calvano(2)
    key = jax.random.key(8)

    def slower(sessions):
        state = sessions.learner
        decay = state.hyper["exploration_decay"].at[:2].multiply(0.25)
        return sessions._replace(learner=state.replace(hyper={**state.hyper,
                                                              "exploration_decay": decay}))

    out = []
    for backend in ("xla", "kernel"):
        runner = eng.Runner(game, Settings(6, 280, 70, backend=backend), compact=False)
        sessions, done = slower(eng.init_sessions(game, 6, key)), 0
        while not runner.finished(sessions, done):
            sessions, done = runner.advance(sessions, done)
        out.append(fields(sessions))
    assert_same(*out)
    plain = eng.run(game, Settings(6, 280, 70, backend="kernel"), key, compact=False)
    # the slower sessions did play differently (the check above has teeth)
    assert not np.array_equal(np.asarray(plain.sessions.learner.rows[:2]),
                              np.asarray(out[1]["rows"][:2]))
    np.testing.assert_array_equal(np.asarray(plain.sessions.learner.rows[2:]),
                                  np.asarray(out[1]["rows"][2:]))


# -- xla == the learner, period by period ----------------------------------------------

def test_xla_backend_is_the_learners_act_and_update_replayed_period_by_period():
    # Bugs caught: an engine whose keys are not the documented ones (split(key, 3) into
    # init, start and run keys; session s on split(run_key, S)[s]; period t on
    # fold_in(session key, t) with t counted across chunks, not from each chunk's
    # start), whose first profile is not randint(start_key, (S, n)), whose transition
    # is not the learner's (obs of the profile in force, the reward of the new one),
    # or whose tail sums the wrong periods.
    game = calvano(2)
    sessions, periods, chunk, window, s = 3, 300, 70, 100, 1
    key = jax.random.key(11)
    result = eng.run(game, Settings(sessions, periods, chunk, window=window, backend="xla"),
                     key, compact=False)
    learner, n = game.learner, game.sellers

    @jax.jit
    def period(state, index, session_key, t):
        obs = game.obs[game.row(index)]
        _, aux = learner.act(state, obs, jax.random.fold_in(session_key, t))
        action = aux["action_index"]
        row = game.row(action)
        reward = game.reward[row]
        batch = Transition(obs=obs[None], action=game.grid.prices[action][None, :, None],
                           reward=reward[None], next_obs=game.obs[row][None],
                           done=jnp.zeros((1, n), bool), aux={"action_index": action[None]})
        state, _ = learner.update(state, batch)
        return state, action, reward

    with jax.threefry_partitionable(False):
        init_key, start_key, run_key = jax.random.split(key, 3)
        state = learner.init(init_key, game.spec)
        index = jax.random.randint(start_key, (sessions, n), 0, game.grid.size)[s]
        session_key = jax.random.split(run_key, sessions)[s]
        tail = np.zeros(n, np.float32)
        explored = 0
        for t in range(periods):
            greedy = np.asarray(state.greedy)[np.arange(n), int(game.row(index))]
            state, index, reward = period(state, index, session_key, jnp.uint32(t))
            explored += int(np.any(np.asarray(index) != greedy))
            if t >= periods - window:
                tail = tail + np.asarray(reward)
    got = jax.tree.map(lambda x: x[s], fields(result.sessions))
    want = {"rows": state.rows, "step": state.step, "stable_periods": state.stable_periods,
            "converged": state.converged, "index": index, "tail": tail}
    assert_same(got, want)
    assert explored > 20   # the key stream mattered: many periods explored
    assert not np.array_equal(np.asarray(result.sessions.learner.rows[0]),
                              np.asarray(result.sessions.learner.rows[s]))


# -- compaction ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["xla", "kernel"])
def test_compaction_changes_no_session(backend):
    # Bugs caught: compaction that writes a batch back to the wrong sessions, pads with
    # a session that still learns (and so learns twice), drops a learning session, or
    # hands a session another's key (its draws would change); on the kernel (compaction
    # asked for explicitly), a batch written back into the numpy arrays a kernel chunk
    # returns.
    game = calvano(2)
    sessions, periods, chunk = 70, 600, 100          # ladder(70) = [70, 64]
    settings = Settings(sessions, periods, chunk, backend=backend)
    key = jax.random.key(5)
    full = eng.run(game, settings, key, compact=False)
    compact = eng.run(game, settings, key, compact=True)
    # compaction did happen: fewer slot-periods than every session every period
    assert compact.session_periods < full.session_periods == sessions * periods
    assert_same(fields(full.sessions), fields(compact.sessions),
                ["rows", "step", "stable_periods", "converged"])
    converged = np.asarray(full.converged)
    assert 6 < converged.sum() < sessions   # converged mid-run, and some still learn
    learning = ~converged                    # the profile of a session still learning
    np.testing.assert_array_equal(np.asarray(full.sessions.index)[learning],
                                  np.asarray(compact.sessions.index)[learning])


def test_the_played_tail_is_reported_alike_on_both_backends_and_any_batch():
    # Bug caught: with stop: converged, a run's played profits of the last window
    # (sessions.csv's played_profit_*) reported by the kernel, which plays converged
    # sessions on greedily, and by xla at a handful of sessions, but skipped by xla once
    # its batch is compacted to the sessions still learning: one design gave different
    # columns by backend and by session count.
    game = calvano(2)
    sessions, periods, chunk = 70, 600, 100          # ladder(70) = [70, 64]
    settings = Settings(sessions, periods, chunk, stop="converged", window=150)
    key = jax.random.key(5)
    runs = {"xla compacted": eng.run(game, dataclasses.replace(settings, backend="xla"), key),
            "xla whole batch": eng.run(game, dataclasses.replace(settings, backend="xla"), key,
                                       compact=False),
            "kernel": eng.run(game, dataclasses.replace(settings, backend="kernel"), key)}
    compacted = runs["xla compacted"]
    assert compacted.session_periods < sessions * periods   # compaction did happen
    converged = np.asarray(compacted.converged)
    assert 0 < converged.sum() < sessions     # the run reached its last period
    for name, result in runs.items():
        assert result.periods == periods, name
        np.testing.assert_array_equal(np.asarray(result.converged), converged, err_msg=name)
        assert not result.tail_complete, name
    # with stop: periods every session plays the window, on both backends alike
    played = [eng.run(game, dataclasses.replace(settings, stop="periods", backend=b), key)
              for b in ("xla", "kernel")]
    assert played[0].tail_complete and played[1].tail_complete
    np.testing.assert_array_equal(played[0].tail_reward, played[1].tail_reward)


# -- the greedy limit cycle ------------------------------------------------------------

def _expected_play_per_session(game, sessions):
    """The long-run mean of random period outcomes as the chain's definition writes it:
    one session at a time (vmapped), every period of the burn-in and of the measure
    played; :func:`eng.expected_play` must give these numbers bit for bit."""
    K, J = game.num_outcomes, game.profiles
    probs = jnp.asarray(game.probs, jnp.float32)
    per_row = eng.row_figures(game)   # the rows' figures; the chain is written out here

    def one(state, index, outcome):
        greedy = state.replace(converged=jnp.ones_like(state.converged))
        obs = game.obs.reshape((K * J,) + game.obs.shape[2:])
        _, aux = jax.vmap(lambda o: game.learner.act(greedy, o, jax.random.key(0)))(obs)
        nxt = game.row(aux["action_index"])
        start = jnp.zeros((K, J), jnp.float32).at[outcome, game.row(index)].set(1.0)

        def step(dist, _):
            mass = jnp.zeros((J,), jnp.float32).at[nxt].add(dist.reshape(-1))
            dist = probs[:, None] * mass[None, :]
            return dist, jnp.einsum("kj,kjsn->sn", dist, per_row)

        dist, _ = jax.lax.scan(step, start, None, length=K * J)
        _, stats = jax.lax.scan(step, dist, None, length=16 * K * J)
        mean = stats.mean(axis=0)
        return mean[0], mean[1], mean[2], jnp.int32(0)

    return jax.jit(jax.vmap(one))(sessions.learner, sessions.index, sessions.outcome)


@pytest.mark.parametrize("config, items", [
    # stateless bidders: every chain settles (a fixed point) in the burn-in
    ("banchio2022_first", ["market.distributor.ties=random", "learners.bidders.grid_size=6"]),
    # shocked Cournot over market-price states: some sessions' chains never settle
    ("cournot", ["market.distributor.shock_values=[0.9,1.1]",
                 "market.distributor.shock_probs=[0.3,0.7]",
                 "market.sellers[0].observation=[{kind: market_price}]",
                 "learners.firms.obs_grid={low: 0.0, high: 1.1, size: 12}"])])
def test_expected_play_is_the_chains_mean_period_by_period_bit_for_bit(config, items):
    # Bugs caught: a settled distribution's repeated periods counted with other numbers
    # than the periods they stand for (or a fixed point declared where the distribution
    # still changes), the last period's numbers where the first measured one's belong.
    game = make_game(session_plan(load_config(f"configs/{config}.yaml", items)))
    assert game.num_outcomes == 2
    sessions = eng.init_sessions(game, 6, jax.random.key(3))
    q = np.asarray(sessions.learner.q)
    # random greedy strategies: chains that settle, cycle or mix, session by session
    q = jax.random.uniform(jax.random.key(4), q.shape, jnp.float32)
    sessions = sessions._replace(learner=sessions.learner.with_q(q))
    with jax.threefry_partitionable(False):
        fast = [np.asarray(x) for x in eng.expected_play(game, sessions)]
        plain = [np.asarray(x) for x in _expected_play_per_session(game, sessions)]
    for a, b in zip(fast, plain):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def _played_out_cycle(game, sessions, first_period):
    """The greedy cycle's figures with the burn-in played out: ``m^n`` turn cycles, then
    ``m^n + 1`` more, the cycle the first return to the state after the first of them,
    its sums averaged by the masked sum (what eng.greedy_cycle computes without
    playing the burn-in)."""
    seat, num_turns = eng._seats(game)
    horizon = game.grid.size ** game.sellers

    def one(state, index):
        greedy = state.replace(converged=jnp.ones_like(state.converged))

        def period(index, t):
            before = game.row(index)
            _, aux = game.learner.act(greedy, game.obs[before], jax.random.key(0))
            chosen = aux["action_index"]
            index = chosen if seat is None else jnp.where(t % num_turns == seat, chosen, index)
            pay = game.pay_row(before, game.row(index))
            return index, jnp.stack([game.reward[pay], game.fees[pay],
                                     game.grid.profile_price(index)])

        def turn_cycle(index, _):
            t = jnp.uint32(first_period) + jnp.arange(num_turns, dtype=jnp.uint32)
            index, out = jax.lax.scan(period, index, t)
            return index, (index, out.sum(axis=0))

        index, _ = jax.lax.scan(turn_cycle, index, None, length=horizon)
        _, (after, sums) = jax.lax.scan(turn_cycle, index, None, length=horizon + 1)
        cycle = jnp.argmax(jnp.all(after[1:] == after[0], axis=-1)) + 1
        on = (jnp.arange(horizon + 1) < cycle)[:, None, None]
        mean = jnp.sum(jnp.where(on, sums, 0.0), axis=0) / (cycle * num_turns)
        return mean[0], mean[1], mean[2], cycle * num_turns

    return jax.jit(jax.vmap(one))(sessions.learner, sessions.index)


@pytest.mark.parametrize("config", ["calvano", "klein2021"])
def test_greedy_cycle_is_the_played_out_burn_in_to_the_bit(config):
    # Bugs caught: the cycle measured from another of its states than the one the
    # burn-in of m^n turn cycles reaches (the same cycle summed in another order: other
    # last bits), a cycle start or length off by one turn cycle, an alternating game's
    # turns counted wrongly.
    game = game_of(config)
    sessions = eng.init_sessions(game, 24, jax.random.key(5))
    # random greedy strategies: paths into cycles of many lengths, from off the cycle
    q = jax.random.uniform(jax.random.key(6), np.asarray(sessions.learner.q).shape)
    sessions = sessions._replace(learner=sessions.learner.with_q(q))
    got = [np.asarray(x) for x in eng.greedy_cycle(game, sessions, 7)]
    want = [np.asarray(x) for x in _played_out_cycle(game, sessions, 7)]
    assert len(set(want[3].tolist())) > 3                     # cycles of several lengths
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_greedy_cycle_averages_exactly_one_limit_cycle():
    # Bugs caught: a limit cycle measured from the burn-in's start (the off-cycle first
    # profile counted), averaged over the wrong number of periods (a 2- or 3-cycle
    # counted as 1 or doubled), or the profits of the wrong profile or seller.
    game = calvano(2)
    m = game.grid.size
    prices = np.asarray(game.grid.prices, np.float64)
    base = eng.init_sessions(game, 3, jax.random.key(0))

    def state(i, j):   # the table row of the profile (i, j)
        return i * m + j

    q = np.zeros(np.asarray(base.learner.rows)[..., :m].shape, np.float32)  # [3, 2, m^2, m]
    lo, mid, hi = 2, 7, 12
    # session 0: seller 0 always plays hi, seller 1 always mid (a fixed point)
    q[0, 0, :, hi] = 1.0
    q[0, 1, :, mid] = 1.0
    # session 1: (lo, lo) -> (hi, hi) -> (lo, lo): a 2-cycle entered from anywhere
    q[1, :, :, lo] = 1.0
    q[1, :, state(lo, lo), :] = 0.0
    q[1, :, state(lo, lo), hi] = 1.0
    # session 2: (lo, hi) -> (mid, mid) -> (hi, lo) -> (lo, hi): a 3-cycle, asymmetric
    q[2, :, :, :] = 0.0
    q[2, 0, :, lo], q[2, 1, :, hi] = 1.0, 1.0           # from anywhere: (lo, hi)
    q[2, :, state(lo, hi), :] = 0.0
    q[2, :, state(lo, hi), mid] = 1.0                   # then (mid, mid)
    q[2, :, state(mid, mid), :] = 0.0
    q[2, 0, state(mid, mid), hi], q[2, 1, state(mid, mid), lo] = 1.0, 1.0   # then (hi, lo)
    # every session starts off its cycle
    sessions = base._replace(learner=base.learner.with_q(jnp.asarray(q)),
                             index=jnp.asarray([[0, 0], [5, 9], [14, 14]], jnp.int32))
    reward, _, price, length = (np.asarray(x) for x in eng.greedy_cycle(game, sessions, 0))
    np.testing.assert_array_equal(length, [1, 2, 3])
    profiles = [[(hi, mid)], [(lo, lo), (hi, hi)], [(lo, hi), (mid, mid), (hi, lo)]]
    for s, cycle in enumerate(profiles):
        p = prices[np.asarray(cycle)]                                   # [L, 2]
        np.testing.assert_allclose(reward[s], profits(p).mean(axis=0), rtol=2e-5)
        np.testing.assert_allclose(price[s], p.mean(axis=0), rtol=1e-6)
    # the 3-cycle is asymmetric per period, symmetric on average
    assert reward[2, 0] == pytest.approx(reward[2, 1], rel=2e-5)


# -- the backend choice ------------------------------------------------------------------

def test_choose_backend_refuses_a_kernel_it_cannot_run_and_auto_says_why(monkeypatch):
    # Bugs caught: the kernel accepted for sellers sharing a Q table (a game it would
    # play wrongly), a refusal that is not a ValueError, auto falling back to xla
    # without the reason (or taking xla where the kernel can run: alternating moves,
    # full feedback and an epsilon from 0 run on it).
    import dataclasses
    klein = game_of("klein2021")
    shared = dataclasses.replace(klein, settings=dataclasses.replace(
        klein.settings, exclusive_policies=False))
    with pytest.raises(ValueError, match="backend kernel: sellers sharing a Q table; use "
                                         "backend xla"):
        eng.choose_backend(shared, "kernel")
    assert eng.choose_backend(shared, "auto") == (
        "xla", "session backend xla: sellers sharing a Q table")
    assert eng.choose_backend(shared, "xla") == ("xla", None)
    with pytest.raises(ValueError, match="backend kernel: sellers sharing"):
        eng.Runner(shared, Settings(2, 10, backend="kernel"))
    assert eng.choose_backend(klein, "auto") == ("kernel", None)
    asker = game_of("asker2022_sync")   # epsilon from 0, full feedback, no state
    assert eng.choose_backend(asker, "auto") == ("kernel", None)

    game = calvano(2)
    assert eng.choose_backend(game, "auto") == ("kernel", None)   # CPU, numba installed
    assert eng.choose_backend(game, "xla") == ("xla", None)
    with monkeypatch.context() as patch:   # on an accelerator auto keeps XLA
        patch.setattr(jax, "default_backend", lambda: "gpu")
        backend, note = eng.choose_backend(game, "auto")
        assert backend == "xla" and "the platform is gpu" in note
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba" else find_spec(name, *a))
    backend, note = eng.choose_backend(game, "auto")
    assert backend == "xla" and "numba is not installed" in note
    with pytest.raises(ValueError, match="numba is not installed"):
        eng.choose_backend(game, "kernel")


# -- the kernel's hash -------------------------------------------------------------------

def test_kernel_threefry_is_jax_threefry():
    # Bug caught: a round, rotation or key-schedule slip in the kernel's hash, or draws
    # that are not jax.random.bits(fold_in(key, t), (n,)) (the counters of an odd n, the
    # two halves): the kernel's random streams would silently differ from the learner's.
    rng = np.random.default_rng(0)
    for _ in range(8):
        k0, k1, x0, x1 = (int(v) for v in rng.integers(0, 2**32, size=4, dtype=np.uint64))
        got = threefry2x32(np.uint32(k0), np.uint32(k1), np.uint32(x0), np.uint32(x1))
        want = np.asarray(threefry_2x32((jnp.uint32(k0), jnp.uint32(k1)),
                                        jnp.asarray([x0, x1], jnp.uint32)))
        assert [int(v) for v in got] == [int(v) for v in want]

    first, count = 1000, 9
    for n in (2, 3):
        half = (n + 1) // 2
        counts = np.arange(2 * half, dtype=np.uint32)
        counts[n:] = 0
        key = jax.random.key(int(rng.integers(0, 2**31)))
        k0, k1 = (np.uint32(v) for v in np.asarray(jax.random.key_data(key)))
        keys = np.zeros((2, count), np.uint32)
        out = np.zeros((2 * half, count), np.uint32)
        _draw_bits(k0, k1, counts[:half].copy(), counts[half:].copy(), np.uint32(first),
                   count, keys, out)
        with jax.threefry_partitionable(False):
            want = np.stack([np.asarray(jax.random.bits(jax.random.fold_in(key, first + k),
                                                        (n,), jnp.uint32))
                             for k in range(count)], axis=1)              # [n, count]
        np.testing.assert_array_equal(out[:n], want, err_msg=f"n = {n}")


# -- the tables and the first period of three sellers ----------------------------------

def test_three_seller_tables_initial_q_and_first_period_by_hand():
    # Bugs caught: a table row that is not the mixed-radix number of all three prices
    # (first seller most significant), profits in the wrong seller order, a state that
    # is not the profile in force, an initial Q that is not the random-rival value, and
    # a first update that is not alpha (r + delta max Q(s') - Q(s, a)) on Q(s, a) alone.
    n, m, alpha, delta = 3, 15, 0.3, 0.95
    game = game_of("calvano", 3, learning_rate=alpha, exploration_decay=1.0e-3)
    grid = np.asarray(game.grid.prices, np.float64)
    own = np.indices((m,) * n).reshape(n, -1).T                       # [m^3, 3] indices
    table = profits(grid[own])                                        # [m^3, 3]
    np.testing.assert_allclose(np.asarray(game.reward), table, rtol=1e-5, atol=1e-7)
    q0 = np.stack([[table[own[:, i] == a, i].mean() for a in range(m)] for i in range(n)])
    q0 /= 1.0 - delta                                                 # [3, m]

    sessions = 5
    start = eng.init_sessions(game, sessions, jax.random.key(1))
    rows0 = np.asarray(start.learner.rows)
    assert rows0.shape == (sessions, n, m ** n, m + 1)
    np.testing.assert_allclose(rows0[..., :m], np.broadcast_to(q0[None, :, None, :],
                                                               rows0[..., :m].shape),
                               rtol=2e-6)
    index0 = np.asarray(start.index)
    one = eng.run(game, Settings(sessions, 1, 1, backend="xla"), jax.random.key(1),
                  compact=False)
    np.testing.assert_array_equal(np.asarray(one.sessions.learner.step), 1)
    rows1, index1 = np.asarray(one.sessions.learner.rows), np.asarray(one.sessions.index)
    weights = np.array([m * m, m, 1])
    for s in range(sessions):
        s0, a = int(index0[s] @ weights), index1[s]
        for i in range(n):
            changed = np.argwhere(rows1[s, i, :, :m] != rows0[s, i, :, :m])
            assert changed.tolist() == [[s0, a[i]]]       # one entry per seller
            target = table[int(a @ weights), i] + delta * q0[i].max()
            expected = (1 - alpha) * q0[i, a[i]] + alpha * target
            assert rows1[s, i, s0, a[i]] == pytest.approx(expected, rel=2e-6)
            assert rows1[s, i, s0, m] == np.argmax(rows1[s, i, s0, :m])
