"""A group's external model inside the compiled training iteration: per-seed model
states, the POI exploration bonus, the fit on the iteration's experience and the
ground-truth evaluation. Used by :func:`jaxmarket.train.loop.make_train`.

One model (``M`` members) per seed and group, trained on every agent of the group in
that seed's markets; its state is the models component's entry ``[group]`` of ``runner.components``::

    {"model": ModelState (leaves [S, M, ...]),
     "poi": {"count", "mean", "var"} [S]     running POI statistics,
     "eval": {"heldout", "random"} [S]       the last ground-truth errors,
     "obs": {...}                            poi_obs only: the sampler's points}

POI observations (``poi_obs: {k, sampler, emb_size, normalize}``). At every market step
the POI field (the model as it was at the start of the iteration) is evaluated at ``k``
model inputs per agent and the ``k`` values are appended to the group's observation
(and, at the prices just quoted, to its next observation):

* ``grid``: the agent's inputs in the state (``make_inputs`` of the prices in force,
  rivals at their current prices) with its own scaled prices set to
  ``linspace(-1, 1, k)[j]`` (every product at once): the whole own-price range;
* ``uniform``: the same with own prices ``u_j ~ U(-1, 1)^P``, drawn per seed once per
  iteration (every step and market of the iteration sees the same ``u``);
* ``replay``: ``k`` inputs (and their targets) drawn without replacement from the seed's
  previous iteration of experience (zeros before the first), the same for every agent
  of the seed.

Ground truth. Every ``eval_every`` iterations (and at the first), for the first market
of each seed: agent 0 of the group quotes each of ``eval_grid`` prices evenly spaced on
its bounds (every product at once) while every other agent holds its current price
(the rivals' last quotes: their current policy), and one market step (fixed key) gives
its true traffic and fees: exact expectations for the deterministic distributors
(``logit``, ``proportional``, ``cheapest``) under a constant demand process.
``heldout`` is the RMS error of the ensemble-mean prediction over that grid and the
outputs (in the model's target scale); ``random`` the same over ``eval_random`` fixed
draws of every seller's price uniform on its bounds (EMMA's error under a uniformly
random agent).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.learners.base import Transition
from jaxmarket.market.state import current_actions
from jaxmarket.models.config import ModelConfig, build_model
from jaxmarket.models.poi import make_poi

OBS_KEY = 20241   # folded into the iteration's key for the uniform / replay draws


def beta_at(settings: dict, iteration: jax.Array) -> jax.Array:
    """``beta`` at a 0-based iteration: 0 during ``warmup``, then with ``t`` the
    iterations since::

        constant  beta
        linear    beta + (beta_final - beta) * min(t / decay_iterations, 1)
        exp       beta_final + (beta - beta_final) * exp(-t / decay_iterations)
    """
    b0, b1 = settings["beta"], settings["beta_final"]
    t = (iteration - settings["warmup"]).astype(jnp.float32)
    d = float(settings["decay_iterations"])
    kind = settings["beta_schedule"]
    if kind == "constant":
        beta = jnp.full((), b0, jnp.float32)
    elif kind == "linear":
        beta = b0 + (b1 - b0) * jnp.minimum(jnp.maximum(t, 0.0) / d, 1.0)
    else:
        beta = b1 + (b0 - b1) * jnp.exp(-jnp.maximum(t, 0.0) / d)
    return jnp.where(t < 0, 0.0, beta).astype(jnp.float32)


def running_update(stats: dict, x: jax.Array, horizon: int | None = None) -> dict:
    """Merge a batch ``x [S, N]`` into per-seed running ``count, mean, var`` (Chan et
    al.'s parallel variance). With ``horizon`` the past counts as at most ``horizon``
    batches (``count <= horizon N``): older batches fade out, so the statistics follow
    a POI whose scale shrinks as the model learns."""
    n_b = jnp.float32(x.shape[1])
    mean_b, var_b = x.mean(1), x.var(1)
    n_a = stats["count"]
    if horizon is not None:
        n_a = jnp.minimum(n_a, horizon * n_b)
    n = n_a + n_b
    delta = mean_b - stats["mean"]
    mean = stats["mean"] + delta * n_b / n
    m2 = stats["var"] * n_a + var_b * n_b + jnp.square(delta) * n_a * n_b / n
    return {"count": n, "mean": mean, "var": m2 / n}


class GroupModel:
    def __init__(self, env, params, group: str, cfg: ModelConfig, num_seeds: int,
                 envs_per_seed: int):
        self.env, self.group, self.cfg = env, group, cfg
        self.S, self.Es, self.A = num_seeds, envs_per_seed, env.num_agents(group)
        self.model = build_model(env, params, group, cfg)
        poi = cfg.poi_settings
        self.poi_settings = poi
        self.poi = None if poi is None else make_poi(poi["kind"], self.model, poi)
        self.target = "action" if poi is None else poi["target"]
        self.obs_settings = cfg.poi_obs_settings
        g = env.spec.group(group)
        low = np.asarray(params.sellers[group].low, np.float32)[0]          # agent 0 [P]
        high = np.asarray(params.sellers[group].high, np.float32)[0]
        frac = np.linspace(0.0, 1.0, cfg.eval_grid, dtype=np.float32)[:, None]
        self.grid = jnp.asarray(low + frac * (high - low))                    # [G, P]
        self.seller_bounds = {s.name: (np.asarray(params.sellers[s.name].low, np.float32),
                                       np.asarray(params.sellers[s.name].high, np.float32))
                              for s in env.spec.sellers}
        del g

    # -- state ---------------------------------------------------------------------------
    def init(self, key: jax.Array) -> dict:
        S = self.S
        model = jax.vmap(self.model.init)(jax.random.split(key, S))
        extra = {}
        if self.obs_settings is not None:
            K, sampler = self.obs_settings["k"], self.obs_settings["sampler"]
            if sampler == "replay":
                extra["obs"] = {"x": jnp.zeros((S, K, self.model.in_dim), jnp.float32),
                                "y": jnp.zeros((S, K, self.model.out_dim), jnp.float32)}
            elif sampler == "uniform":
                extra["obs"] = {"u": jax.random.uniform(
                    jax.random.fold_in(key, OBS_KEY), (S, K, self.model.own_dims),
                    minval=-1.0, maxval=1.0)}
        return {**extra, "model": model,
                "poi": {"count": jnp.zeros((S,), jnp.float32), "mean": jnp.zeros((S,), jnp.float32),
                        "var": jnp.ones((S,), jnp.float32), "start": jnp.zeros((S,), jnp.int32),
                        "error": jnp.zeros((S,), jnp.float32)},
                "eval": {"heldout": jnp.zeros((S,), jnp.float32),
                         "random": jnp.zeros((S,), jnp.float32)}}

    # -- data ----------------------------------------------------------------------------
    def prices_in_force(self, env_state, params) -> dict:
        """Every seller group's quoted prices ``[E, n, P]`` in a (batched) state: what
        it quoted last (or its reset price)."""
        quoted = jax.vmap(self.env._quoted_prices, in_axes=(0, None))(env_state, params)
        return {s.name: quoted[:, s.offset:s.offset + s.count] for s in self.env.spec.sellers}

    def io(self, transition: Transition, info: dict, env_state=None, params=None) -> dict:
        """One step's ``{"x": [E, A, I], "y": [E, A, O]}`` in market order (``info``
        gets ``prev_prices``, the prices in force in ``env_state``, the state before the
        step); with ``poi target: state`` also ``"xs"``, the inputs of the state reached
        (``make_inputs`` of the prices just quoted and the next observation)."""
        if env_state is not None:
            info = {**info, "prev_prices": self.prices_in_force(env_state, params)}
        x, y = self.model.make_io(transition, info)
        out = {"x": x, "y": y}
        if self.target == "state":
            out["xs"] = self.model.make_inputs(info["prices"], transition.next_obs)
        return out

    def per_seed(self, x: jax.Array) -> jax.Array:
        """``[T, E, A, d]`` (markets seed-major) -> ``[S, T * Es * A, d]``."""
        T = x.shape[0]
        x = x.reshape((T, self.S, self.Es * self.A) + x.shape[3:]).swapaxes(0, 1)
        return x.reshape((self.S, -1) + x.shape[3:])

    def to_market(self, b: jax.Array, T: int) -> jax.Array:
        """Inverse of :meth:`per_seed` for ``[S, N]`` -> ``[T, E, A]``."""
        b = b.reshape(self.S, T, self.Es * self.A).swapaxes(0, 1)
        return b.reshape(T, self.S * self.Es, self.A)

    # -- exploration bonus ---------------------------------------------------------------
    def bonus(self, mstate: dict, x: jax.Array, y: jax.Array, iteration: jax.Array,
              xs: jax.Array | None = None):
        """``(beta * normalize(poi) [S, N], new poi statistics, metrics)`` with the
        model as it was before this iteration's fit: the POI at ``x`` (the inputs the
        actions produced) or, with ``poi target: state``, at ``xs`` (the inputs of the
        states reached).

        The beta schedule's clock starts at iteration 0 and, with
        ``restart_on_surprise: k``, restarts (per seed) at an iteration whose batch
        error ``mean_i ||mean_m f_m(x_i) - y_i||^2 / O`` exceeds ``k`` times its moving
        average (``0.95 a + 0.05 e``, not updated by a restarting batch), after the
        warm-up and at least ``decay_iterations`` after the last (re)start: the model
        noticed that the market changed, and exploration starts over."""
        settings = self.poi_settings
        poi = jax.vmap(self.poi)(mstate["model"], x if xs is None else xs, y)  # [S, N]
        old = mstate["poi"]
        stats = running_update(old, poi, settings["normalize_horizon"])
        if settings["normalize"] == "running":
            norm = (poi - stats["mean"][:, None]) / (jnp.sqrt(stats["var"])[:, None] + 1e-8)
        else:
            norm = poi
        start, ema = old["start"], old["error"]
        k = settings["restart_on_surprise"]
        surprised = jnp.zeros(start.shape, bool)
        if k is not None:
            pred = jax.vmap(lambda st, xs: self.model.predict(st.params, xs).mean(0))(
                mstate["model"], x)
            err = jnp.square(pred - y).mean((1, 2))                              # [S]
            # not during warm-up, nor within decay_iterations of the last restart
            surprised = ((iteration > settings["warmup"]) & (err > k * ema)
                         & (iteration - start >= settings["decay_iterations"]))
            start = jnp.where(surprised, iteration, start)
            ema = jnp.where(iteration == 0, err,
                            jnp.where(surprised, ema, 0.95 * ema + 0.05 * err))
        beta = jax.vmap(lambda s0: beta_at(settings, iteration - s0))(start)   # [S]
        bonus = beta[:, None] * norm
        stats = {**stats, "start": start, "error": ema}
        return bonus, stats, {"value": poi.mean(), "beta": beta.mean(),
                              "bonus": jnp.abs(bonus).mean(),
                              "restarts": surprised.astype(jnp.float32).mean()}

    # -- POI observations ----------------------------------------------------------------
    def obs_points(self, mstate: dict, prices: dict, obs: jax.Array) -> jax.Array:
        """The grid / uniform sampler's model inputs ``[E, A, k, I]`` in a state with
        ``prices`` in force (every seller group's ``[E, n, P]``) and the group's
        observation ``obs [E, A, D]``."""
        K, sampler = self.obs_settings["k"], self.obs_settings["sampler"]
        P = self.model.own_dims
        x = self.model.make_inputs(prices, obs)                                # [E, A, I]
        E, A, I = x.shape
        if sampler == "grid":
            own = jnp.broadcast_to(jnp.linspace(-1.0, 1.0, K, dtype=jnp.float32)[:, None],
                                   (E, A, K, P))
        else:   # uniform: the seed's draws of this iteration
            own = jnp.repeat(mstate["obs"]["u"], self.Es, axis=0)[:, None]    # [E, 1, K, P]
            own = jnp.broadcast_to(own, (E, A, K, P))
        x = jnp.broadcast_to(x[:, :, None], (E, A, K, I))
        return jnp.concatenate([own, x[..., P:]], axis=-1)

    def obs_features(self, mstate: dict, prices: dict, obs: jax.Array) -> jax.Array:
        """The ``k`` POI values ``[E, A, k]`` appended to the group's observation."""
        o = self.obs_settings
        K, E, A = o["k"], self.S * self.Es, self.A
        if o["sampler"] == "replay":
            v = jax.vmap(self.poi)(mstate["model"], mstate["obs"]["x"], mstate["obs"]["y"])
            v = jnp.broadcast_to(jnp.repeat(v, self.Es, axis=0)[:, None], (E, A, K))
        else:
            x = self.obs_points(mstate, prices, obs)
            x = x.reshape((self.S, self.Es * A * K, x.shape[-1]))
            v = jax.vmap(self.poi)(mstate["model"], x).reshape(E, A, K)
        if o["normalize"] == "running":
            stats = mstate["poi"]
            mean = jnp.repeat(stats["mean"], self.Es)[:, None, None]
            std = jnp.repeat(jnp.sqrt(stats["var"]), self.Es)[:, None, None]
            v = (v - mean) / (std + 1e-8)
        return v

    def refresh_obs(self, mstate: dict, x: jax.Array, y: jax.Array, key: jax.Array) -> dict:
        """After an iteration: ``replay`` draws its ``k`` points (without replacement
        when the iteration has ``k`` samples or more) from this iteration's ``x [S, N,
        I]``, ``y``; ``uniform`` draws fresh own prices."""
        o = self.obs_settings
        K, key = o["k"], jax.random.fold_in(key, OBS_KEY)
        if o["sampler"] == "replay":
            N = x.shape[1]
            pick = jax.vmap(lambda k: jax.random.choice(k, N, (K,), replace=N < K))(
                jax.random.split(key, self.S))                                # [S, K]
            take = jax.vmap(lambda a, i: a[i])
            return {**mstate, "obs": {"x": take(x, pick), "y": take(y, pick)}}
        if o["sampler"] == "uniform":
            u = jax.random.uniform(key, (self.S, K, self.model.own_dims), minval=-1.0,
                                   maxval=1.0)
            return {**mstate, "obs": {"u": u}}
        return mstate

    # -- fit -----------------------------------------------------------------------------
    def fit(self, mstate: dict, x: jax.Array, y: jax.Array):
        model, m = jax.vmap(self.model.fit)(mstate["model"], x, y)
        return {**mstate, "model": model}, m["loss"]                          # [S]

    # -- ground truth --------------------------------------------------------------------
    def _truth(self, state, params, actions_fn, n: int):
        """Model inputs and true targets of agent 0 for ``n`` action profiles built by
        ``actions_fn(k, held) -> actions`` from one market state."""
        env, g = self.env, self.group

        def one(k):
            acts = actions_fn(k, current_actions(env.spec, state))
            obs, _, rewards, _, info = env.step_env(jax.random.key(0), state, acts, params)
            tr = Transition(obs=obs[g], action=acts[g], reward=rewards[g], next_obs=obs[g],
                            done=jnp.zeros(rewards[g].shape, bool), aux={})
            # the profile is the one in force: a rival model's true target is the
            # rivals' (held) prices
            return tr, {**info, "prev_prices": info["prices"]}

        tr, info = jax.vmap(one)(jnp.arange(n))
        x, y = self.model.make_io(tr, info)                                   # [n, A, d]
        return x[:, 0], y[:, 0]

    def _rmse(self, params_m, x, y):
        pred = self.model.predict(params_m, x).mean(0)
        return jnp.sqrt(jnp.mean(jnp.square(pred - y)))

    def evaluate(self, mstate: dict, env_state, params) -> dict:
        g, grid = self.group, self.grid
        first = jax.tree.map(lambda v: v[:: self.Es], env_state)             # [S, ...]

        def grid_acts(k, held):
            return {**held, g: held[g].at[0].set(grid[k])}

        bounds = self.seller_bounds
        names = [s.name for s in self.env.spec.sellers]

        def random_acts(k, held):
            key = jax.random.fold_in(jax.random.key(20240), k)   # a fixed held-out set
            out = dict(held)
            for i, name in enumerate(names):   # static loop over seller groups
                lo, hi = bounds[name]
                u = jax.random.uniform(jax.random.fold_in(key, i), lo.shape)
                out[name] = jnp.asarray(lo) + u * jnp.asarray(hi - lo)
            return out

        def one_seed(model_s, state_s):
            x, y = self._truth(state_s, params, grid_acts, grid.shape[0])
            heldout = self._rmse(model_s.params, x, y)
            if self.cfg.eval_random:
                xr, yr = self._truth(state_s, params, random_acts, self.cfg.eval_random)
                random = self._rmse(model_s.params, xr, yr)
            else:
                random = jnp.zeros((), jnp.float32)
            return {"heldout": heldout, "random": random}

        return jax.vmap(one_seed)(mstate["model"], first)

    def maybe_evaluate(self, mstate: dict, env_state, params, iteration) -> dict:
        """The ground-truth errors at iterations ``0, eval_every, 2 eval_every, ...``
        (0-based, after the fit), held in between."""
        return jax.lax.cond(iteration % self.cfg.eval_every == 0,
                            lambda: self.evaluate(mstate, env_state, params),
                            lambda: mstate["eval"])
