"""A learner whose states are numbered on ``obs_grid`` (observations off the action
grid's scale, e.g. the market price of a Cournot duopoly, configs/calvano2021.yaml) acts
from the state its update writes: both number an observation on ``obs_grid``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.loader import load_config
from jaxmarket.learners.qlearning import grid_of, obs_grid_of
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.run import session_plan


def test_greedy_play_reads_the_obs_grid_state_the_update_writes():
    game = make_game(session_plan(load_config("configs/calvano2021.yaml",
                                              ["train.num_seeds=1"])))
    learner, settings = game.learner, game.settings
    m = settings.grid_size
    state = learner.init(jax.random.key(0), game.spec)
    states = state.rows.shape[1]
    greedy = jnp.arange(states, dtype=jnp.float32) % m            # state s -> price s mod m
    rows = state.rows.at[:, :, m].set(greedy[None, :])
    state = state.replace(rows=rows, converged=jnp.ones_like(state.converged))   # eps 0
    obs = game.obs.reshape(-1, *game.obs.shape[-2:])               # every profile, outcome
    act = jax.vmap(lambda o: learner.act(state, o, jax.random.key(1))[1]["action_index"])
    got = np.asarray(act(obs))                                     # [rows, n]
    by_obs_grid = np.asarray(obs_grid_of(settings).state_index(obs)) % m
    by_action_grid = np.asarray(grid_of(settings).state_index(obs)) % m
    assert np.any(by_obs_grid != by_action_grid)   # the two numberings differ here
    np.testing.assert_array_equal(got, by_obs_grid)
