"""Populations (``learners.<group>.population`` / ``mapping``): which member drives which
slot after real steps, that experience reaches only the member that produced it, the
resample schedule, resume, per-member metrics, every learner kind under every mapping,
and bad input.

A "member spy" learner prices every slot at ``1 + policy`` (its policy index in the
learner's member-grouped order, seeds included), so a market's prices say which member
drove each agent; its ``update`` records the last batch."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from conftest import CONFIGS

from jaxmarket.cli import run_cli
from jaxmarket.learners.base import LEARNERS, Learner, LearnerDef, Transition
from jaxmarket.learners.population import Population, episodes_trigger_draw
from jaxmarket.train.plan import resolve
from jaxmarket.train.run import start_run
from jaxmarket.train.trainer import Trainer
from jaxmarket.train.tracking import Tracker, read_metrics

S, E, A, K, Q = 2, 4, 2, 2, 10.0    # seeds, markets per seed, sellers, members, queries


def make_member_spy(hyper, spec) -> Learner:
    index = spec.index()
    num_slots, P = spec.num_agents, spec.num_products

    def init(key, spec_=None):
        z = jnp.zeros((1, num_slots))
        return {"batch": Transition(obs=jnp.zeros((1, num_slots, 0)),
                                    action=jnp.zeros((1, num_slots, P)), reward=z,
                                    next_obs=jnp.zeros((1, num_slots, 0)),
                                    done=z.astype(bool), aux={})}

    def act(state, obs, key):
        return jnp.broadcast_to((1.0 + index)[:, None], (num_slots, P)).astype(jnp.float32), {}

    def update(state, batch):
        return {"batch": batch}, {}

    return Learner(init, act, update)


if "test_member_spy" not in LEARNERS:
    LEARNERS.register(LearnerDef("test_member_spy", make_member_spy, {}, doc="tests/test_population.py"))


def market(mapping, learner=None) -> dict:
    """``E`` markets per seed of ``A`` sellers quoting in [0, 100] to one consumer sending
    ``Q`` queries to the cheapest seller (ties split evenly); revenue reward."""
    return {
        "market": {
            "num_products": 1,   # no episode_length: an iteration counts as an episode
            "consumers": [{"name": "consumer", "count": 1, "budget": 1000.0, "queries": Q}],
            "sellers": [{"name": "sellers", "count": A, "action": "price", "low": 0.0,
                         "high": 100.0, "initial": 1.0, "reward": [{"kind": "revenue"}]}],
            "distributor": {"kind": "cheapest"},
        },
        "learners": {"sellers": {**(learner or {"kind": "test_member_spy"}),
                                 "population": K, "mapping": mapping}},
        "train": {"num_iterations": 7, "num_envs": E, "num_seeds": S, "chunk_size": 7},
        "seed": 3,
    }


def train(config, run_dir):
    run_dir.mkdir(parents=True)
    trainer = Trainer(resolve(copy.deepcopy(config)), run_dir)
    trainer.train(Tracker(), trainer.initial_runner(), 0)
    runner, _ = trainer.restore()
    header, data = read_metrics(run_dir / "metrics.csv")
    return runner, {h: data[:, i] for i, h in enumerate(header)}


def hand_revenue(prices: np.ndarray) -> np.ndarray:
    """[markets, A] prices -> [markets, A] revenue under cheapest-first with even ties."""
    low = prices.min(1, keepdims=True)
    winners = prices == low
    return np.where(winners, prices * Q / winners.sum(1, keepdims=True), 0.0)


def member_of_price(prices: np.ndarray) -> np.ndarray:
    """The spy quotes 1 + s K + k: back to the member k (and check the seed)."""
    policy = np.rint(prices - 1.0).astype(int)                       # [S * E, A]
    seed = np.repeat(np.arange(S), E)[:, None]
    assert np.all(policy // K == seed), "a seed's markets driven by another seed's member"
    return policy % K


def test_sync_drives_market_e_with_member_e_mod_k(tmp_path):
    runner, _ = train(market("sync"), tmp_path / "r")
    prices = np.asarray(runner.env_state.prices["sellers"])[..., 0]   # [S * E, A]
    members = member_of_price(prices)
    e = np.tile(np.arange(E), S)
    np.testing.assert_array_equal(members, np.repeat((e % K)[:, None], A, 1))


def test_table_drives_each_slot_with_its_entry(tmp_path):
    table = [[1, 0], [0, 0], [1, 1], [0, 1]]
    runner, _ = train(market({"kind": "table", "table": table}), tmp_path / "r")
    members = member_of_price(np.asarray(runner.env_state.prices["sellers"])[..., 0])
    np.testing.assert_array_equal(members, np.tile(np.asarray(table), (S, 1)))


@pytest.mark.parametrize("mix", [False, True])
def test_resample_is_balanced_and_each_member_sees_only_its_own_experience(tmp_path, mix):
    runner, cols = train(market({"kind": "resample", "every": 2, "first": 1,
                                 "mix_in_env": mix}), tmp_path / "r")
    prices = np.asarray(runner.env_state.prices["sellers"])[..., 0]   # [S * E, A]
    members = member_of_price(prices)
    for s in range(S):   # balanced: every member drives E * A / K slots of each seed
        counts = np.bincount(members[s * E:(s + 1) * E].ravel(), minlength=K)
        np.testing.assert_array_equal(counts, [E * A // K] * K)
        if not mix:      # a market's agents share one member
            assert np.all(members[s * E:(s + 1) * E] == members[s * E:(s + 1) * E, :1])
    # the last step's batch in the learner's order: learner slot j belongs to member
    # layout[j] and must carry that member's price and the revenue of the market slot it
    # was dealt, computed here by hand from the market's prices
    batch = runner.learners["sellers"]["batch"]
    gather = np.asarray(runner.components["population"]["sellers"][0])
    layout = Population(K, "resample").layout(E, A)
    policy_of_slot = np.repeat(np.arange(S), E * A) * K + np.tile(layout, S)
    np.testing.assert_array_equal(np.asarray(batch.action)[0, :, 0], 1.0 + policy_of_slot)
    revenue = hand_revenue(prices).ravel()                             # market slot order
    np.testing.assert_allclose(np.asarray(batch.reward)[0], revenue[gather], rtol=1e-6)
    assert np.any(np.asarray(batch.reward)[0] != revenue)   # the order really was permuted
    # per-member reward columns: member k's slots' mean revenue in the last iteration
    for k in range(K):
        np.testing.assert_allclose(cols[f"reward/sellers/m{k}"][-1],
                                   revenue[gather][np.tile(layout, S) == k].mean(), rtol=1e-5)
        np.testing.assert_allclose(cols[f"price/sellers/m{k}/p0"][-1],
                                   np.mean(1.0 + np.arange(S) * K + k), rtol=1e-6)


def test_resample_draws_on_the_documented_schedule():
    pop = Population(K, "resample", every=3, first=2)
    draws = [int(episodes_trigger_draw(pop, jnp.int32(n - 1), jnp.int32(n)))
             for n in range(1, 11)]
    # after episodes 1 and 2 (the first 2), then at every multiple of 3
    assert draws == [1, 1, 1, 0, 0, 1, 0, 0, 1, 0]
    # several episodes in one iteration: a multiple of 3 crossed inside the jump counts
    assert int(episodes_trigger_draw(pop, jnp.int32(4), jnp.int32(7))) == 1
    assert int(episodes_trigger_draw(pop, jnp.int32(3), jnp.int32(5))) == 0


def test_the_assignment_changes_only_when_the_schedule_says(tmp_path):
    # no episode_length: one episode per iteration; every 3, first 1 -> draws after
    # iterations 1, 3 and 6; step the compiled chunk one iteration at a time
    config = market({"kind": "resample", "every": 3, "first": 1})
    trainer = Trainer(resolve(copy.deepcopy(config)), tmp_path)
    runner = trainer.initial_runner()
    seen = [np.asarray(runner.components["population"]["sellers"][0])]
    for n in range(1, 8):
        runner, _ = trainer.chunk_fn(1)(runner)
        assert int(runner.episodes) == n
        seen.append(np.asarray(runner.components["population"]["sellers"][0]))
    changed = [n for n in range(1, 8) if not np.array_equal(seen[n - 1], seen[n])]
    # a draw may repeat the old assignment by chance (1 in (4!)^2 here), never change it
    # off-schedule
    assert set(changed) <= {1, 3, 6} and len(changed) >= 2, changed


def test_resume_with_a_resampled_population_is_bit_identical(tmp_path, capsys):
    config = market({"kind": "resample", "every": 2, "first": 1, "mix_in_env": True},
                    {"kind": "ppo_bandit", "buffer_length": 2, "initial_stddev": 1.0})
    config["train"].update(num_iterations=12, chunk_size=4, checkpoint_every=1)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    from jaxmarket.train.__main__ import main
    assert run_cli(main, [str(path), "--run-dir", str(tmp_path / "full")]) == 0
    assert run_cli(main, [str(path), "--run-dir", str(tmp_path / "part"),
                          "train.num_iterations=4"]) == 0
    assert run_cli(main, ["--resume", str(tmp_path / "part"), "train.num_iterations=12"]) == 0
    capsys.readouterr()
    for name in ("metrics.csv", "seeds.csv", "mapping.csv"):
        assert (tmp_path / "full" / name).read_text() == (tmp_path / "part" / name).read_text()
    full = Trainer(resolve(copy.deepcopy(config)), tmp_path / "full").restore()[0]
    part = Trainer(resolve(copy.deepcopy(config)), tmp_path / "part").restore()[0]
    for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(part)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


LEARNER_KINDS = {
    "ppo_bandit": {"kind": "ppo_bandit", "buffer_length": 2, "update_epochs": 1},
    "ucb1": {"kind": "ucb1", "grid_size": 5},
    "ppo": {"kind": "ppo", "num_minibatches": 1},
    "q_learning": {"kind": "q_learning", "grid_size": 3, "q_init": "zero"},
}
MAPPINGS = {
    "sync": "sync",
    "resample": {"kind": "resample", "every": 1},
    "resample_mixed": {"kind": "resample", "every": 1, "mix_in_env": True},
    "table": {"kind": "table", "table": [[0, 1], [1, 0], [0, 0], [1, 1]]},
}


KINDS, NAMES = sorted(LEARNER_KINDS), sorted(MAPPINGS)


@pytest.mark.parametrize("shift", range(4))
def test_every_learner_kind_trains_under_every_mapping(tmp_path, shift):
    """A Latin square: run ``shift`` has four seller groups, group ``i`` learning with
    kind ``i`` under mapping ``i + shift``; the four runs cover all 16 pairs."""
    config = market("sync")
    seller = dict(config["market"]["sellers"][0], low=1.0, high=3.0,
                  observation=[{"kind": "history", "k": 1}])
    config["market"]["sellers"] = [dict(seller, name=f"g{i}") for i in range(4)]
    config["learners"] = {f"g{i}": {**LEARNER_KINDS[KINDS[i]], "population": K,
                                    "mapping": MAPPINGS[NAMES[(i + shift) % 4]]}
                          for i in range(4)}
    config["train"].update(num_iterations=4, chunk_size=4, rollout_length=2)
    runner, cols = train(config, tmp_path / "r")
    for i in range(4):
        g = f"g{i}"
        # the members' columns average back to the group's (members hold equal shares
        # here, the table's included: each member has 4 of the 8 slots)
        members = np.stack([cols[f"reward/{g}/m{k}"] for k in range(K)])
        np.testing.assert_allclose(members.mean(0), cols[f"reward/{g}"], rtol=1e-5)
        prices = np.stack([cols[f"price/{g}/m{k}/p0"] for k in range(K)])
        np.testing.assert_allclose(prices.mean(0), cols[f"price/{g}/p0"], rtol=1e-5)
        assert np.all((prices >= 1.0 - 1e-6) & (prices <= 3.0 + 1e-6))
        # one parameter set per member and seed in the learner's state
        leaves = jax.tree.leaves(runner.learners[g])
        assert any(x.ndim >= 1 and x.shape[0] == S * K for x in leaves), KINDS[i]


def _alternate(key, episode, market, agent, K):
    """Member (market + episode) mod K for every agent of the market."""
    del key, agent
    return (market + episode) % K


@pytest.mark.parametrize("mapping", ["league", "custom"])
def test_every_learner_kind_trains_under_league_and_a_custom_mapping(tmp_path, mapping):
    import jaxmarket
    jaxmarket.register_mapping("test_alternate", _alternate)
    spec = ({"kind": "league", "snapshot_every": 2, "pool_size": 2} if mapping == "league"
            else {"kind": "test_alternate", "every": 1})
    config = market("sync")
    seller = dict(config["market"]["sellers"][0], low=1.0, high=3.0,
                  observation=[{"kind": "history", "k": 1}])
    config["market"]["sellers"] = [dict(seller, name=f"g{i}") for i in range(4)]
    config["learners"] = {f"g{i}": {**LEARNER_KINDS[KINDS[i]], "population": K,
                                    "mapping": spec} for i in range(4)}
    config["train"].update(num_iterations=4, chunk_size=4, rollout_length=2)
    runner, cols = train(config, tmp_path / "r")
    for i in range(4):
        g = f"g{i}"
        prices = np.stack([cols[f"price/{g}/m{k}/p0"] for k in range(K)])
        assert np.all((prices >= 1.0 - 1e-6) & (prices <= 3.0 + 1e-6)), KINDS[i]
        leaves = jax.tree.leaves(runner.learners[g])
        assert any(x.ndim >= 1 and x.shape[0] == S * K for x in leaves), KINDS[i]
        if mapping == "league":   # snapshots after iterations 2 and 4, ring of 2
            np.testing.assert_array_equal(cols[f"league/{g}/pool"], [1, 2, 2, 2])
            # the newest entry (ring position (3 - 1) mod 2 = 0) is the snapshot taken
            # after the last update: the learner's current parameters (or Q tables)
            from jaxmarket.train.components import snapshot_fields
            assert int(runner.components["league"][g]["count"]) == 3
            for now, pooled in zip(jax.tree.leaves(snapshot_fields(runner.learners[g], KINDS[i])),
                                   jax.tree.leaves(runner.components["league"][g]["pool"])):
                np.testing.assert_array_equal(np.asarray(pooled[0]), np.asarray(now))
        else:     # the members' columns average back to the group's (equal shares)
            members = np.stack([cols[f"reward/{g}/m{k}"] for k in range(K)])
            np.testing.assert_allclose(members.mean(0), cols[f"reward/{g}"], rtol=1e-5)


@pytest.mark.parametrize("mapping, population, field, allowed", [
    ("sync", 3, "learners.sellers.population", "a divisor of train.num_envs (4)"),
    ("elo", 2, "learners.sellers.mapping", "one of sync, resample, table, league"),
    ({"kind": "table", "table": [[0, 1]]}, 2, "learners.sellers.mapping.table",
     "a [4, 2] array"),
    ({"kind": "table", "table": [[0, 2]] * 4}, 2, "learners.sellers.mapping.table",
     "integers in [0, 1]"),
    ({"kind": "resample", "balanced": False}, 2, "learners.sellers.mapping.balanced", "true"),
    ({"kind": "resample", "evry": 3}, 2, "learners.sellers.mapping.evry", "known keys"),
    ("sync", 0, "learners.sellers.population", "an integer >= 1"),
])
def test_bad_population_config_is_one_line_exit_2_before_compiling(
        tmp_path, capsys, mapping, population, field, allowed):
    config = market(mapping)
    config["learners"]["sellers"]["population"] = population
    config["learners"]["sellers"]["kind"] = "ppo_bandit"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    from jaxmarket.train.__main__ import main
    code = run_cli(main, [str(path), "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"config error: {field}: got "), lines[0]
    assert allowed in lines[0], lines[0]
    assert not (tmp_path / "r").exists()


def test_population_sync_config_trains_and_reports_members(tmp_path):
    summary = start_run(str(CONFIGS / "population_sync.yaml"),
                        ["train.num_iterations=20", "train.chunk_size=10"], str(tmp_path / "r"))
    header, _ = read_metrics(tmp_path / "r" / "metrics.csv")
    config = yaml.safe_load((CONFIGS / "population_sync.yaml").read_text())
    for group, learner in config["learners"].items():
        members = [h for h in header if h.startswith(f"reward/{group}/m")]
        assert len(members) == learner.get("population", 0)
    assert summary["iterations"] == 20


def test_cross_play_matrix_is_each_members_reward_against_each_other_member(tmp_path):
    # one seed, members dealt per agent: the spy prices member k at 1 + k, so against
    # another member the cheaper member 0 takes all Q queries at price 1 and member 1
    # earns nothing; against itself a member splits the queries at its own price
    config = market({"kind": "resample", "every": 1, "first": 0, "mix_in_env": True})
    config["train"].update(num_seeds=1, num_iterations=50, chunk_size=50)   # window: 5 draws
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    summary = start_run(str(path), [], str(tmp_path / "r"))
    expected = [[1.0 * Q / 2, 1.0 * Q], [0.0, 2.0 * Q / 2]]
    got = summary["members"]["sellers"]["crossplay"]
    assert got[0][1] is not None and got[1][0] is not None   # mixed markets did occur
    for i in range(K):
        for j in range(K):
            if got[i][j] is not None:
                np.testing.assert_allclose(got[i][j], expected[i][j], rtol=1e-6)
    np.testing.assert_allclose(summary["members"]["sellers"]["mean_price"], [[1.0], [2.0]])
    # the plot draws the same matrix, and a member column is not a group of its own
    from jaxmarket.analysis.plots import cross_play, plot_run, run_data, run_groups
    run = run_data(tmp_path / "r")
    assert run_groups(run.header) == ["sellers"]
    matrix = cross_play(run, "sellers")
    np.testing.assert_array_equal(np.isnan(matrix), [[v is None for v in row] for row in got])
    np.testing.assert_allclose(np.nan_to_num(matrix),
                               [[0.0 if v is None else v for v in row] for row in got])
    assert [p.name for p in plot_run(tmp_path / "r")] == ["sellers.png", "sellers_crossplay.png"]


def test_check_prints_the_resolved_population(capsys):
    from jaxmarket.check import main
    assert run_cli(main, [str(CONFIGS / "population_sync.yaml"), "train.num_envs=8",
                          "learners.sellers.mapping={kind: resample, every: 3}"]) == 0
    out = capsys.readouterr().out
    size = yaml.safe_load((CONFIGS / "population_sync.yaml").read_text())[
        "learners"]["sellers"]["population"]
    assert (f"population: {size} members per seed, mapping resample (every 3 episodes, "
            "first 5, mix_in_env False)") in out


# ---- custom mappings (jaxmarket.register_mapping) ---------------------------------------

def _stripes(key, episode, market, agent, K):
    """Member (market + agent + episode) mod K: balanced, and it moves every episode."""
    del key
    return (market + agent + episode) % K


def _lopsided(key, episode, market, agent, K):
    """Everything to member 0 from episode 1 on (balanced only at episode 0)."""
    del key, agent
    return jnp.where(episode == 0, market % K, 0)


def test_a_registered_mapping_drives_each_slot_as_its_fn_says_after_real_steps(tmp_path):
    """Catches: the fn's member ignored or transposed (market vs agent), the episode count
    not passed, the data of a slot reaching another member's update."""
    import jaxmarket
    jaxmarket.register_mapping("test_stripes", _stripes)
    runner, _ = train(market({"kind": "test_stripes", "every": 1, "first": 0}),
                      tmp_path / "r")
    # 7 iterations = 7 episodes (no episode_length); the draw after each one: the
    # market's prices of the last step come from the draw after 6 episodes
    members = member_of_price(np.asarray(runner.env_state.prices["sellers"])[..., 0])
    e, a = np.meshgrid(np.arange(E), np.arange(A), indexing="ij")
    np.testing.assert_array_equal(members, np.tile((e + a + 6) % K, (S, 1)))
    # and the learner's view of the last step: slot j of member layout[j] holds its own
    # price and the reward of the market slot it drove
    batch = runner.learners["sellers"]["batch"]
    layout = Population(K, "test_stripes").layout(E, A)
    policy = np.repeat(np.arange(S), E * A) * K + np.tile(layout, S)
    np.testing.assert_array_equal(np.asarray(batch.action)[0, :, 0], 1.0 + policy)
    # every market holds one agent of each member here, so all of a member's market
    # slots in a seed earn the same revenue: the learner slots of that member carry it
    revenue = hand_revenue(np.asarray(runner.env_state.prices["sellers"])[..., 0])
    for s in range(S):
        for k in range(K):
            earned = np.unique(revenue[s * E:(s + 1) * E][members[s * E:(s + 1) * E] == k])
            assert earned.size == 1
            got = np.asarray(batch.reward)[0, s * E * A:(s + 1) * E * A][layout == k]
            np.testing.assert_allclose(got, earned[0], rtol=1e-6)
    # mapping.csv: the first draw (0 episodes), then the assignment in force after the
    # chunk (drawn after episode 7), one row per seed and market
    import csv
    with open(tmp_path / "r" / "mapping.csv") as f:
        logged = list(csv.DictReader(f))
    assert [int(r["iteration"]) for r in logged] == [0] * (S * E) + [7] * (S * E)
    for r in logged:
        t, e = int(r["iteration"]), int(r["market"])
        assert r["group"] == "sellers"
        assert [int(x) for x in r["members"].split()] == [(e + a + t) % K for a in range(A)]


def test_an_unbalanced_custom_draw_is_repaired_into_equal_shares_and_counted(tmp_path):
    import jaxmarket
    jaxmarket.register_mapping("test_lopsided", _lopsided)
    runner, cols = train(market({"kind": "test_lopsided", "every": 1, "first": 0}),
                         tmp_path / "r")
    members = member_of_price(np.asarray(runner.env_state.prices["sellers"])[..., 0])
    for s in range(S):
        counts = np.bincount(members[s * E:(s + 1) * E].ravel(), minlength=K)
        np.testing.assert_array_equal(counts, [E * A // K] * K)
    # each draw asked for all E A slots of both seeds on member 0: E A / K of each seed's
    # slots overflow member 0's share
    np.testing.assert_array_equal(cols["mapping/sellers/repaired"], [S * E * A // K] * 7)


def test_assignment_from_members_is_a_permutation_that_keeps_balanced_draws_exact():
    from jaxmarket.learners.population import assignment_from_members
    rng = np.random.default_rng(0)
    for trial in range(20):
        balanced = trial % 2 == 0
        if balanced:
            m = np.stack([rng.permutation(np.repeat(np.arange(K), E * A // K)) for _ in range(S)])
        else:
            m = rng.integers(0, K, (S, E * A))
        gather, scatter, repaired = map(np.asarray, assignment_from_members(
            jnp.asarray(m.reshape(S, E, A)), K))
        assert sorted(scatter) == list(range(S * E * A))                    # a permutation
        np.testing.assert_array_equal(gather[scatter], np.arange(S * E * A))  # inverses
        assert np.all(scatter // (E * A) == np.repeat(np.arange(S), E * A))  # seeds apart
        layout = Population(K, "resample").layout(E, A)
        got = layout[scatter % (E * A)].reshape(S, E * A)
        counts = [np.bincount(row, minlength=K) for row in m]
        assert repaired == sum(np.maximum(c - E * A // K, 0).sum() for c in counts)
        if balanced:
            np.testing.assert_array_equal(got, m)
        else:   # a slot keeps its member unless it overflowed (past its member's share)
            rank = np.array([[np.sum(row[:i] == row[i]) for i in range(E * A)] for row in m])
            keep = rank < E * A // K
            np.testing.assert_array_equal(got[keep], m[keep])


def test_custom_mapping_errors_before_compiling(tmp_path):
    import jaxmarket
    from jaxmarket.config.errors import ConfigError
    from jaxmarket.train.plan import resolve
    jaxmarket.register_mapping("test_all_zero", lambda key, ep, m, a, K: m * 0)
    jaxmarket.register_mapping("test_float", lambda key, ep, m, a, K: 0.5 * m)
    for name, needle in (("test_all_zero", f"[{E * A}, 0]"), ("test_float", "float32")):
        with pytest.raises(ConfigError) as err:
            resolve(market(name))
        assert err.value.field == "learners.sellers.mapping" and needle in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve(market({"kind": "test_all_zero", "mix_in_env": True}))
    assert err.value.field == "learners.sellers.mapping.mix_in_env"
    with pytest.raises(ValueError):
        jaxmarket.register_mapping("sync", _stripes)


# ---- league (fictitious self-play) -------------------------------------------------------

from flax import struct  # noqa: E402


@struct.dataclass
class AgeSpyState:
    params: jax.Array      # [policies] float32: the number of updates each policy has seen
    batch: Transition


def make_age_spy(hyper, spec) -> Learner:
    """Prices every slot at ``1 + params[policy]`` (the updates its parameters have seen),
    so a frozen snapshot's price tells its age; records the last batch."""
    index, num_slots, P = spec.index(), spec.num_agents, spec.num_products

    def init(key, spec_=None):
        z = jnp.zeros((1, num_slots))
        return AgeSpyState(jnp.zeros((spec.policies,), jnp.float32),
                           Transition(obs=jnp.zeros((1, num_slots, 0)),
                                      action=jnp.zeros((1, num_slots, P)), reward=z,
                                      next_obs=jnp.zeros((1, num_slots, 0)),
                                      done=z.astype(bool), aux={}))

    def act(state, obs, key):
        price = 1.0 + state.params[index]
        return jnp.broadcast_to(price[:, None], (obs.shape[0], P)).astype(jnp.float32), {}

    def update(state, batch):
        return AgeSpyState(state.params + 1.0, batch), {}

    return Learner(init, act, update)


if "test_age_spy" not in LEARNERS:
    LEARNERS.register(LearnerDef("test_age_spy", make_age_spy, {}, doc="tests/test_population.py"))


def league(iterations, latest_prob, envs=16):
    config = market({"kind": "league", "snapshot_every": 2, "pool_size": 3,
                     "latest_prob": latest_prob}, {"kind": "test_age_spy"})
    config["learners"]["sellers"]["population"] = 1
    config["train"].update(num_iterations=iterations, chunk_size=iterations, num_envs=envs,
                           num_seeds=1)
    return config


@pytest.mark.parametrize("latest_prob", [1.0, 0.0])
def test_league_opponents_are_frozen_snapshots_and_only_the_live_seat_learns(tmp_path,
                                                                             latest_prob):
    """8 iterations, snapshots after updates 2, 4, 6 into a pool of 3 that starts with
    the initial parameters (age 0): at the last step the live seat is 7 updates old; with
    latest_prob 1 every opponent plays the newest snapshot (age 6); with 0 the opponents
    draw uniformly from the pool, whose ring now holds ages {6, 2, 4} (6 replaced 0)."""
    runner, cols = train(league(8, latest_prob), tmp_path / "r")
    prices = np.asarray(runner.env_state.prices["sellers"])[..., 0]     # [E, A]
    np.testing.assert_array_equal(prices[:, 0], 1.0 + 7)
    ages = prices[:, 1] - 1.0
    if latest_prob == 1.0:
        np.testing.assert_array_equal(ages, 6.0)
    else:
        assert set(ages) <= {2.0, 4.0, 6.0} and len(set(ages)) >= 2
    np.testing.assert_array_equal(cols["league/sellers/pool"], [1, 2, 2, 3, 3, 3, 3, 3])
    # the learner's batch holds the live seats only: their prices and their revenue
    batch = runner.learners["sellers"].batch
    assert batch.action.shape[1] == 16
    np.testing.assert_array_equal(np.asarray(batch.action)[0, :, 0], prices[:, 0])
    np.testing.assert_allclose(np.asarray(batch.reward)[0], hand_revenue(prices)[:, 0])


def test_league_resumes_bit_identically(tmp_path):
    """The pool, its count and the draws are checkpointed."""
    config = league(6, 0.5, envs=8)
    config["train"].update(chunk_size=3, checkpoint_every=1)
    full, _ = train(config, tmp_path / "full")
    (tmp_path / "half").mkdir()
    t = Trainer(resolve(copy.deepcopy({**config, "train": {**config["train"], "num_iterations": 3}})),
                tmp_path / "half")
    t.train(Tracker(), t.initial_runner(), 0)
    t2 = Trainer(resolve(copy.deepcopy(config)), tmp_path / "half")
    runner, start = t2.restore()
    assert start == 3
    t2.train(Tracker(), runner, start)
    assert (tmp_path / "half" / "metrics.csv").read_text() == \
        (tmp_path / "full" / "metrics.csv").read_text()
    half, _ = t2.restore()
    for a, b in zip(jax.tree.leaves(half.components["league"]),
                    jax.tree.leaves(full.components["league"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_league_errors_before_compiling():
    from jaxmarket.config.errors import ConfigError
    from jaxmarket.train.plan import resolve
    for mapping, field in (({"kind": "league", "pool_size": 0}, "mapping.pool_size"),
                           ({"kind": "league", "latest_prob": 1.5}, "mapping.latest_prob"),
                           ({"kind": "league", "opponents": "buyers"}, "mapping.opponents"),
                           ({"kind": "league", "opponents": 3}, "mapping.opponents")):
        with pytest.raises(ConfigError) as err:
            resolve(market(mapping))
        assert err.value.field == f"learners.sellers.{field}"
    one = market("league")
    one["market"]["sellers"][0]["count"] = 1
    with pytest.raises(ConfigError) as err:
        resolve(one)
    assert err.value.field == "learners.sellers.mapping"


def test_league_snapshots_can_drive_another_group(tmp_path):
    """``opponents: rivals``: every agent of ``sellers`` learns, both agents of
    ``rivals`` play the newest snapshot (latest_prob 1), and ``rivals`` needs no learner."""
    config = league(8, 1.0)
    seller = config["market"]["sellers"][0]
    config["market"]["sellers"] = [dict(seller, count=1), dict(seller, name="rivals", count=2)]
    config["learners"]["sellers"]["mapping"]["opponents"] = "rivals"
    runner, _ = train(config, tmp_path / "r")
    prices = runner.env_state.prices
    np.testing.assert_array_equal(np.asarray(prices["sellers"])[..., 0], 1.0 + 7)
    np.testing.assert_array_equal(np.asarray(prices["rivals"])[..., 0], 1.0 + 6)
    batch = runner.learners["sellers"].batch
    assert batch.action.shape[1] == 16      # the 16 markets' one seller each
    allp = np.concatenate([np.asarray(prices["sellers"]), np.asarray(prices["rivals"])], 1)
    np.testing.assert_allclose(np.asarray(batch.reward)[0], hand_revenue(allp[..., 0])[:, 0])
    # a learner for the rivals, or rivals with other bounds, are config errors
    from jaxmarket.config.errors import ConfigError
    from jaxmarket.train.plan import resolve
    bad = copy.deepcopy(config)
    bad["learners"]["rivals"] = {"kind": "constant", "value": 1.0}
    with pytest.raises(ConfigError) as err:
        resolve(bad)
    assert err.value.field == "learners.rivals"
    bad = copy.deepcopy(config)
    bad["market"]["sellers"][1]["high"] = 50.0
    with pytest.raises(ConfigError) as err:
        resolve(bad)
    assert err.value.field == "learners.sellers.mapping.opponents"
