"""The whole training iteration as one readable function (PureJaxRL style).

``make_train(env, params, learners, specs, tcfg)`` returns ``(init, run_chunk)``:

* ``init(key) -> Runner``: reset ``num_seeds x num_envs`` markets, init every group's
  learner;
* ``run_chunk(runner, length) -> (runner, metrics)``: ``length`` iterations in one
  ``lax.scan``; an iteration collects ``rollout_length`` market steps (every agent group
  acts through its learner, the vmapped market steps, auto-resets) and then calls each
  learner's ``update`` on its group's time-major batch. ``metrics[name]`` is
  ``[length, ...]``: the market metrics ``reward/<g>`` (``[]``), ``price/<g>`` and
  ``traffic/<g>`` (``[P]``) are means over the rollout, seeds, markets and agents, and
  ``per_seed/<name>`` holds the same per seed (``[S]``, ``[S, P]``); ``learner/<g>/<m>``
  are the learners' own metrics, averaged over whatever axis they report.

Both are pure; the caller ``jit``s them. Seeds are not a ``vmap`` over the whole
program: they are folded into the agent axis. With ``S`` seeds of ``E`` markets each, a
group of ``A`` agents driven by ``K`` parameter sets is seen by its learner as
``S * E * A`` slots and ``S * K`` policies, ``policy_index[(s * E + e) * A + a] =
s * K + index[a]``: the markets of one seed share that seed's parameters, and seeds
never share anything (data, not a code path). This keeps learner-internal control flow
(``lax.cond`` on a buffer counter, say) a real branch: under a ``vmap`` over seeds its
predicate would be batched and both branches would run every step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxmarket.learners.base import Learner, LearnerSpec, Transition, materialize
from jaxmarket.learners.population import (Population, assignment_from_members,
                                           custom_members, draw_assignment,
                                           episodes_trigger_draw)
from jaxmarket.market.env import MarketEnv
from jaxmarket.market.spec import MarketParams
from jaxmarket.train import pbt as pbt_mod
from jaxmarket.train.config import TrainConfig, schedule_leaf, with_schedule_leaf


PER_SEED = "per_seed/"   # prefix of the per-seed copies of the market metrics


@struct.dataclass
class Runner:
    env_state: Any       # MarketState batched [E]
    obs: Any             # dict group -> [E, A, D]
    learners: Any        # dict group -> learner state
    key: jax.Array       # raw uint32 key data (checkpoint friendly)
    iteration: jax.Array  # int32
    # groups with a resampled population: (gather, scatter) [S * E * A] int32 each, the
    # current assignment of market slots to the learner's member-grouped slots
    assignment: Any = struct.field(default_factory=dict)
    episodes: jax.Array = struct.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    # groups under PBT: the running sum [S, K] of each member's per-iteration mean reward
    # since the last PBT period boundary (its objective)
    pbt: Any = struct.field(default_factory=dict)
    # groups with a league mapping: {"pool": snapshot fields [pool_size, S K, ...],
    # "count": snapshots taken (int32), "draw": [S E] each market's pool entry}
    league: Any = struct.field(default_factory=dict)
    # the market's parameters (MarketParams), carried as data rather than baked into the
    # compiled chunk as constants: scenarios that differ only in parameter values (a
    # sweep over a temperature, a budget) share one compiled program
    params: Any = None
    # groups with an external model (learners.<g>.external_model): its per-seed state,
    # POI statistics and last ground-truth errors (jaxmarket.models.runtime)
    models: Any = struct.field(default_factory=dict)


def snapshot_fields(state: Any) -> dict:
    """The part of a learner state a league snapshot freezes: what ``act`` reads of the
    members (Q tables, parameters, or a discrete bandit's whole per-policy statistics)."""
    if hasattr(state, "rows"):
        return {"rows": state.rows}
    if hasattr(state, "params"):
        return {"params": state.params}
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}  # all stats


def tile_spec(spec: LearnerSpec, num_envs: int, num_seeds: int = 1,
              population: Population | None = None) -> LearnerSpec:
    """A group's spec seen across ``num_seeds x num_envs`` markets: slots
    ``S * E * A``, policies ``S * K``, seed ``s`` owning policies ``s*K .. s*K + K - 1``.
    With a ``population``, ``K`` is its size and slot ``j`` of a seed (in the learner's
    member-grouped order) is driven by member ``population.layout(E, A)[j]``."""
    if population is not None and population.live_seats_only:   # the live seats
        spec = dataclasses.replace(spec, num_agents=1, action_low=spec.action_low[:1],
                                   action_high=spec.action_high[:1], payoff=None)
    if population is not None:
        layout = population.layout(num_envs, spec.num_agents)              # [E * A]
        spec = dataclasses.replace(spec, num_policies=population.size, policy_index=None)
        per_seed = layout
    elif num_envs == 1 and num_seeds == 1:
        return spec
    else:
        per_seed = np.tile(np.asarray(spec.index()), num_envs)           # [E * A]
    index = (np.arange(num_seeds)[:, None] * spec.policies + per_seed[None]).ravel()
    markets = num_envs * num_seeds
    return dataclasses.replace(
        spec, num_agents=spec.num_agents * markets, num_policies=spec.policies * num_seeds,
        policy_index=tuple(int(i) for i in index), num_markets=markets, num_sessions=num_seeds,
        action_low=np.tile(spec.action_low, (markets, 1)),
        action_high=np.tile(spec.action_high, (markets, 1)))


def per_seed(x: jax.Array, num_seeds: int) -> jax.Array:
    """Policy-stacked leaf ``[S * K, ...]`` -> ``[S, K, ...]``."""
    x = jnp.asarray(x)
    return x.reshape((num_seeds, x.shape[0] // num_seeds) + x.shape[1:])


def make_train(env: MarketEnv, params: MarketParams, learners: dict[str, Learner],
               specs: dict[str, LearnerSpec], tcfg: TrainConfig):
    E, T = tcfg.num_envs * tcfg.num_seeds, tcfg.rollout_length   # E: all markets
    S = tcfg.num_seeds
    pops = {g: p for g, p in (tcfg.populations or {}).items() if p is not None}
    dynamic = [g for g in env.agent_groups if g in pops and pops[g].dynamic]
    episodic = env.spec is not None and int(params.episode_length) < 2**31 - 1
    # per-member means: [E * A, K] weights, column k averaging member k's slots of a seed
    # and the member of each learner slot of every seed [S * E * A] (cross-play)
    member_weights, slot_member = {}, {}
    for g, pop in pops.items():
        layout = pop.layout(tcfg.num_envs, env.num_agents(g))
        onehot = (layout[:, None] == np.arange(pop.size)[None]).astype(np.float32)
        member_weights[g] = jnp.asarray(onehot / np.maximum(onehot.sum(0, keepdims=True), 1))
        slot_member[g] = jnp.asarray(np.tile(layout, S))
    groups = env.agent_groups
    leagues = {g: p for g, p in pops.items() if p.league}
    pbts = {g: c for g, c in (tcfg.pbt or {}).items() if c is not None}
    sizes = {g: env.num_agents(g) for g in groups}
    seller_groups = {g.name for g in env.spec.sellers}
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    schedule = tuple(tcfg.market_schedule or ())
    models = {}
    if tcfg.models:
        from jaxmarket.models.runtime import GroupModel
        models = {g: GroupModel(env, params, g, cfg, S, tcfg.num_envs)
                  for g, cfg in tcfg.models.items()}
    obs_models = {g: m for g, m in models.items() if m.obs_settings is not None}

    def scheduled(params, iteration):
        """``train.schedule``: the changes due at this (0-based) iteration, applied to the
        params the runner carries (so they persist, and a checkpoint holds them)."""
        for entry in schedule:   # static: the config's list
            leaf = schedule_leaf(params, entry.path)
            value = jnp.asarray(np.asarray(entry.value, np.float32))
            params = with_schedule_leaf(params, entry.path,
                                        jnp.where(iteration == entry.at, value, leaf))
        return params

    def draw(key: jax.Array, episode: jax.Array) -> tuple[dict, dict]:
        """A fresh assignment of every dynamic group, and the slots a custom mapping's
        draw had to repair (``mapping/<g>/repaired``)."""
        out, repaired = {}, {}
        for i, g in enumerate(dynamic):
            k = jax.random.fold_in(key, i)
            if pops[g].custom:
                members = custom_members(k, pops[g], episode, S, tcfg.num_envs, sizes[g])
                *out[g], repaired[g] = assignment_from_members(members, pops[g].size)
                out[g] = tuple(out[g])
            else:
                out[g] = draw_assignment(k, pops[g], S, tcfg.num_envs, sizes[g])
        return out, repaired

    def init(key: jax.Array) -> Runner:
        k_env, k_learn, k_run = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, E), params)
        lkeys = jax.random.split(k_learn, len(groups))
        lstates = {g: learners[g].init(lkeys[i], specs[g]) for i, g in enumerate(groups)}
        # the first assignment is drawn from a key of its own (fold_in): scenarios without
        # a resampled population keep exactly the random streams they had
        assignment = draw(jax.random.fold_in(k_run, 1), jnp.zeros((), jnp.int32))[0] \
            if dynamic else {}
        for i, g in enumerate(pbts):   # per-member initial hyperparameters (pbt.init)
            lstates[g] = pbt_mod.initial_hyper(jax.random.fold_in(jax.random.fold_in(k_run, 4), i),
                                               pbts[g], lstates[g], S)
        objective = {g: jnp.zeros((S, pbts[g].size), jnp.float32) for g in pbts}
        league = {g: {"pool": jax.tree.map(lambda x: jnp.repeat(x[None], leagues[g].pool_size, 0),
                                           snapshot_fields(lstates[g])),
                      "count": jnp.ones((), jnp.int32), "draw": jnp.zeros((E,), jnp.int32)}
                  for g in leagues}
        # model states from a key of their own (fold_in): other streams unchanged
        mstates = {g: m.init(jax.random.fold_in(jax.random.fold_in(k_run, 6), i))
                   for i, (g, m) in enumerate(models.items())}
        return Runner(env_state, obs, lstates, jax.random.key_data(k_run),
                      jnp.zeros((), jnp.int32), assignment, jnp.zeros((), jnp.int32), objective,
                      league, params, models=mstates)

    def to_learner(x, g, assignment):   # market slot order -> the learner's slot order
        return x[assignment[g][0]] if g in assignment else x

    def to_market(x, g, assignment):    # the learner's slot order -> market slot order
        return x[assignment[g][1]] if g in assignment else x

    live_only = {g for g, p in leagues.items() if p.live_seats_only}
    opponent_of = {p.opponents: g for g, p in leagues.items() if not p.live_seats_only}

    def flat(x, g):   # [E, A, ...] -> [E * A, ...] (a league: the live seats [E, ...])
        if g in live_only:
            return x[:, 0]
        return x.reshape((E * sizes[g],) + x.shape[2:])

    def league_act(g, state, league, seats, key):
        """The actions ``[E, n, P]`` of ``n`` snapshot-driven seats ``seats [E, n, D]``
        of every market (group ``g``'s agents ``1 ..``, or another group's agents),
        taken ``L`` at a time (``L``: the live seats per market the learner acts for, so
        seat ``(e, c L + l)`` plays the snapshot of the member of live slot ``(e, l)``):
        computed under each pool entry (``vmap``) and each block, and each market's
        drawn entry kept."""
        n, L = seats.shape[1], (1 if g in live_only else sizes[g])
        blocks = seats.reshape((E, n // L, L) + seats.shape[2:]).swapaxes(0, 1)
        blocks = blocks.reshape((n // L, E * L) + seats.shape[2:])          # [n/L, E L, D]

        def one_entry(entry):
            snap = state.replace(**entry)
            keys = jax.random.split(key, n // L)
            return jax.vmap(lambda o, k: materialize(learners[g].act(snap, o, k)[0]))(
                blocks, keys)                                               # [n/L, E L, P]
        every = jax.vmap(one_entry)(league[g]["pool"])                     # [pool, n/L, E L, P]
        draw = jnp.repeat(league[g]["draw"], L)                            # [E L]
        chosen = jnp.take_along_axis(every, draw[None, None, :, None], axis=0)[0]
        chosen = chosen.reshape((n // L, E, L, chosen.shape[-1])).swapaxes(0, 1)
        return chosen.reshape((E, n, chosen.shape[-1]))

    def market_step(lstates, assignment, league, params, carry, _, mstates=None):
        # ``lstates`` is read, never written, during a rollout (``act`` is pure): it is
        # closed over rather than carried, so the scan does not copy learner buffers.
        # ``assignment`` is fixed within a rollout: a learner slot's trajectory stays one
        # market slot's. ``mstates``: the external models' states (read only, as lstates).
        env_state, obs, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        akeys = jax.random.split(k_act, len(groups))
        actions, learner_actions, aux = {}, {}, {}
        env_obs, obs = obs, dict(obs)
        for g, m in obs_models.items():   # POI observations: k values appended
            feats = m.obs_features(mstates[g], m.prices_in_force(env_state, params), obs[g])
            obs[g] = jnp.concatenate([obs[g], feats], axis=-1)
        for i, g in enumerate(groups):  # static loop over groups (config), not agents
            a, aux[g] = learners[g].act(lstates[g], to_learner(flat(obs[g], g), g, assignment),
                                        akeys[i])
            learner_actions[g] = a = materialize(a)  # once, not inside the market's fusions
            if g in live_only:   # live seat 0, then the snapshots' seats
                opponents = league_act(g, lstates[g], league, obs[g][:, 1:],
                                       jax.random.fold_in(akeys[i], 1))
                actions[g] = jnp.concatenate([a[:, None], opponents], axis=1)
                continue
            a = to_market(a, g, assignment)
            actions[g] = a.reshape((E, sizes[g]) + a.shape[1:])
        for h, g in opponent_of.items():   # another group plays g's league snapshots
            actions[h] = league_act(g, lstates[g], league, obs[h],
                                    jax.random.fold_in(akeys[groups.index(g)], 1))
        before = env_state
        next_obs, env_state, rewards, term, trunc, info = vstep(
            jax.random.split(k_step, E), env_state, actions, params)
        done = jnp.logical_or(term, trunc)
        final_obs = info["final_observation"]
        if obs_models:
            final_obs = dict(final_obs)
            for g, m in obs_models.items():   # at the prices just quoted
                final_obs[g] = jnp.concatenate(
                    [final_obs[g], m.obs_features(mstates[g], info["prices"], final_obs[g])], -1)

        def learner_view(x, g):
            return to_learner(flat(x, g), g, assignment)

        batch = {g: Transition(obs=learner_view(obs[g], g), action=learner_actions[g],
                               reward=learner_view(rewards[g], g),
                               next_obs=learner_view(final_obs[g], g),
                               done=done if g in live_only else to_learner(
                                   jnp.repeat(done, sizes[g]), g, assignment),
                               aux=aux[g]) for g in groups}
        io = {}
        for g, m in models.items():   # the external models' inputs and targets
            io[g] = m.io(Transition(obs=env_obs[g], action=actions[g], reward=rewards[g],
                                    next_obs=info["final_observation"][g],
                                    done=jnp.broadcast_to(done[:, None], rewards[g].shape),
                                    aux={}), info, before, params)
        metrics = {"episodes": done[0].astype(jnp.float32)}   # markets step in lockstep
        for g, m in obs_models.items():   # poi/<g>/obs [k]: the appended values' means
            metrics[f"poi/{g}/obs"] = obs[g][..., -m.obs_settings["k"]:].mean((0, 1))
        for g in groups:
            served = (info["traffic"][g] if g in seller_groups
                      else info["queries"][g] - info["unserved"][g])
            price = info["prices"][g] if g in seller_groups else info["budgets"][g]
            for name, value in (("reward", rewards[g]), ("traffic", served), ("price", price)):
                # markets are seed-major (market = seed * num_envs + env): one mean per seed
                by_seed = value.reshape((S, -1) + value.shape[2:]).mean(1)   # [S] or [S, P]
                metrics[f"{name}/{g}"] = by_seed.mean(0)
                metrics[f"{PER_SEED}{name}/{g}"] = by_seed
            if g in member_weights:   # per member k: reward/<g>/m<k>, price/<g>/m<k> [P]
                w = member_weights[g]
                r = batch[g].reward.reshape(S, -1) @ w                           # [S, K]
                pr = jnp.einsum("sjp,jk->kp", learner_view(price, g).reshape(
                    (S, -1, price.shape[-1])), w) / S                            # [K, P]
                if g in pbts:   # PBT's objective signal, per seed and member
                    metrics[f"{pbt_mod.OBJECTIVE}{g}"] = r
                for k in range(w.shape[1]):   # static: one metric column per member
                    metrics[f"reward/{g}/m{k}"] = r[:, k].mean()
                    metrics[f"price/{g}/m{k}"] = pr[k]
                if sizes[g] > 1 and g not in leagues:
                    metrics.update(cross_play(g, rewards[g], assignment))
        return (env_state, next_obs, key), (batch, metrics, io)

    def cross_play(g, reward, assignment):
        """``crossplay/<g>/m<i>/m<j>``: the mean reward of member ``i``'s slots in the
        markets where another agent of the group is member ``j`` (NaN where they never
        met this step)::

            C[i, j] = sum_{x, a} r[x, a] [m(x, a) = i] [j among the others of market x]
                      / sum_{x, a} [m(x, a) = i] [j among the others of market x]
        """
        K = pops[g].size
        member = to_market(slot_member[g], g, assignment).reshape(E, sizes[g])  # market order
        onehot = jax.nn.one_hot(member, K, dtype=jnp.float32)                   # [E, A, K]
        others = (onehot.sum(1, keepdims=True) - onehot) > 0                    # [E, A, K]
        total = jnp.einsum("xa,xai,xaj->ij", reward, onehot, others)
        count = jnp.einsum("xai,xaj->ij", onehot, others)
        mean = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
        return {f"crossplay/{g}/m{i}/m{j}": mean[i, j] for i in range(K) for j in range(K)}

    def iteration(runner: Runner, _):
        key = jax.random.wrap_key_data(runner.key)
        lstates = runner.learners
        carry = (runner.env_state, runner.obs, key)
        assignment = runner.assignment
        params = scheduled(runner.params, runner.iteration) if schedule else runner.params
        if T == 1:  # one step: no loop (the learners see a [1, ...] time axis all the same)
            (env_state, obs, key), out = market_step(lstates, assignment, runner.league,
                                                     params, carry, None, runner.models)
            traj, metrics, io = jax.tree.map(lambda x: x[None], out)
        else:
            (env_state, obs, key), (traj, metrics, io) = jax.lax.scan(
                functools.partial(market_step, lstates, assignment, runner.league,
                                  params, mstates=runner.models), carry, length=T)
        # an episode ends at each truncation; a market that never truncates counts each
        # iteration as one
        truncations = metrics.pop("episodes").sum().astype(jnp.int32)
        finished = truncations if episodic else jnp.ones((), jnp.int32)
        episodes = runner.episodes + finished
        if dynamic:
            redraw = {g: episodes_trigger_draw(pops[g], runner.episodes, episodes)
                      for g in dynamic}
            # not a split: other streams unchanged
            fresh, repaired = draw(jax.random.fold_in(key, 2), episodes)
            assignment = {g: jax.tree.map(lambda new, old: jnp.where(redraw[g], new, old),
                                          fresh[g], assignment[g]) for g in dynamic}
        metrics = jax.tree.map(lambda x: x.mean(0), metrics)
        if dynamic:
            for g, count in repaired.items():
                metrics[f"mapping/{g}/repaired"] = jnp.where(redraw[g], count, 0).astype(
                    jnp.float32)
        mstates = dict(runner.models)
        for g, m in models.items():
            x, y = m.per_seed(io[g]["x"]), m.per_seed(io[g]["y"])       # [S, N, d]
            if m.poi is not None:   # r + beta * normalise(poi), before any advantage
                xs = m.per_seed(io[g]["xs"]) if "xs" in io[g] else None   # poi target: state
                bonus, stats, pm = m.bonus(mstates[g], x, y, runner.iteration, xs)
                bonus = jax.vmap(lambda b: to_learner(flat(b, g), g, runner.assignment))(
                    m.to_market(bonus, T))                               # [T, slots]
                traj = {**traj, g: traj[g].replace(reward=traj[g].reward + bonus)}
                mstates[g] = {**mstates[g], "poi": stats}
                metrics.update({f"poi/{g}/{k}": v for k, v in pm.items()})
            mstates[g], loss = m.fit(mstates[g], x, y)
            if g in obs_models:   # the next iteration's replay / uniform points
                mstates[g] = m.refresh_obs(mstates[g], x, y, key)
            errors = m.maybe_evaluate(mstates[g], env_state, params, runner.iteration)
            mstates[g] = {**mstates[g], "eval": errors}
            for name, v in (("loss", loss), ("heldout_error", errors["heldout"]),
                            ("random_error", errors["random"])):
                metrics[f"model/{g}/{name}"] = v.mean()
                metrics[f"{PER_SEED}model/{g}/{name}"] = v
        new_states = {}
        for g in groups:
            new_states[g], lm = learners[g].update(lstates[g], traj[g])
            for name, value in lm.items():
                metrics[f"learner/{g}/{name}"] = jnp.mean(value)
        objective = {}
        for i, g in enumerate(pbts):
            new_states[g], objective[g], events = pbt_iteration(
                jax.random.fold_in(jax.random.fold_in(key, 3), i), g, new_states[g],
                runner.pbt[g] + metrics.pop(f"{pbt_mod.OBJECTIVE}{g}"), runner.iteration + 1)
            metrics.update({f"{pbt_mod.PREFIX}{g}/{k}": v for k, v in events.items()})
        league = {}
        for i, g in enumerate(leagues):
            league[g] = league_iteration(jax.random.fold_in(jax.random.fold_in(key, 5), i), g,
                                         new_states[g], runner.league[g], runner.iteration + 1)
            metrics[f"league/{g}/pool"] = jnp.minimum(league[g]["count"],
                                                      leagues[g].pool_size).astype(jnp.float32)
        runner = Runner(env_state, obs, new_states, jax.random.key_data(key),
                        runner.iteration + 1, assignment, episodes, objective, league,
                        params, models=mstates)
        return runner, metrics

    def league_iteration(key, g, state, league, iteration):
        """After the update of iteration ``iteration`` (1-based): every ``snapshot_every``
        iterations the members enter the pool (ring position ``count mod pool_size``);
        then each market draws its opponents' entry for the next iteration: the newest
        with probability ``latest_prob``, else uniform over the filled entries."""
        pop = leagues[g]
        take = iteration % pop.snapshot_every == 0
        pos = league["count"] % pop.pool_size
        pool = jax.tree.map(lambda p, x: p.at[pos].set(jnp.where(take, x, p[pos])),
                            league["pool"], snapshot_fields(state))
        count = league["count"] + take.astype(jnp.int32)
        k_latest, k_any = jax.random.split(key)
        newest = (count - 1) % pop.pool_size
        filled = jnp.minimum(count, pop.pool_size)
        latest = jax.random.uniform(k_latest, (E,)) < pop.latest_prob
        draw = jnp.where(latest, newest, jax.random.randint(k_any, (E,), 0, filled))
        return {"pool": pool, "count": count, "draw": draw.astype(jnp.int32)}

    def pbt_iteration(key, g, state, total, iteration):
        """After the learners' update of iteration ``iteration`` (1-based): a PBT step
        when a period ends at or after ``start``; the objective sum restarts at every
        period boundary."""
        cfg = pbts[g]
        boundary = iteration % cfg.period == 0
        act = boundary & (iteration >= cfg.start)
        tree = pbt_mod.members(state, cfg.kind)
        objective = total / cfg.period

        def step(tree):
            return pbt_mod.pbt_step(key, tree, objective, cfg)

        def skip(tree):
            return tree, pbt_mod.no_events(tree, objective, cfg)

        # only the member leaves go through the branch (not the sample buffers)
        tree, events = jax.lax.cond(act, step, skip, tree)
        total = jnp.where(boundary, jnp.zeros_like(total), total)
        return pbt_mod.with_members(state, tree), total, events

    def run_chunk(runner: Runner, length: int):
        return jax.lax.scan(iteration, runner, length=length)

    return init, run_chunk
