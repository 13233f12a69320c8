"""Tests written to kill surviving mutants of the mutation run (docs/testing.md).

Each test checks one behaviour with values derived by hand or from the documented
formula (never read back from the code under test); the comment under its name says
which mutmut mutants it kills (``module.function__mutmut_N`` of mutmut 3.8.1 on the
working copy built by the mutation recipe in docs/testing.md).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONFIGS, duopoly_config

import jaxmarket
from jaxmarket.combinators.observations import build_observation, history_length
from jaxmarket.combinators.rewards import build_reward
from jaxmarket.combinators.view import GroupView
from jaxmarket.config.errors import ConfigError
from jaxmarket.market.distributors import DISTRIBUTORS, Quotes

# =========================================================================== env.py


@pytest.fixture(scope="module")
def duopoly():
    return jaxmarket.make(CONFIGS / "logit_duopoly.yaml")


def test_env_equality_is_spec_equality(duopoly):
    # kills env.__eq__ 1 (and -> or) and 2 (== -> !=)
    env, _ = duopoly
    same, _ = jaxmarket.make(CONFIGS / "logit_duopoly.yaml")
    other, _ = jaxmarket.make(CONFIGS / "logit_duopoly.yaml", ["market.num_products=2"])
    assert env == same and hash(env) == hash(same)
    assert env != other
    assert env != "logit_duopoly"   # not an env: plain False, no AttributeError


def test_action_space_of_an_entity_group_names_the_problem(duopoly):
    # kills env.action_space 4 (message replaced by None)
    env, params = duopoly
    with pytest.raises(ValueError, match="'consumer' is not an agent group"):
        env.action_space("consumer", params)


def test_spaces_are_float32_boxes_and_observations_unbounded(duopoly):
    # kills env.action_space 13, env.observation_space 14, 15, 17, 22 (dtype None,
    # bounds None or +inf)
    env, params = duopoly
    act = env.action_space("sellers", params)
    assert act.dtype == jnp.float32
    assert act.sample(jax.random.key(0)).dtype == jnp.float32
    obs = env.observation_space("sellers", params)
    assert obs.dtype == jnp.float32
    assert float(obs.low) == -math.inf and float(obs.high) == math.inf


def test_view_without_quotes_computes_the_quoted_prices_itself():
    # kills env.view 5 (params dropped when the view computes the quotes itself) and
    # env.view 57 (the view's documented `price` field None)
    cfg = duopoly_config()
    cfg["market"]["consumers"][0]["base_price"] = 0.5
    cfg["market"]["sellers"][0].update(action="multiplier", low=0.0, high=10.0)
    env, params = jaxmarket.make(cfg)
    _, state = env.reset(jax.random.key(0), params)
    state = env.apply_actions(state, {"sellers": jnp.array([[3.0], [2.0]])}, params)
    view = env.view(state, params, env.spec.group("sellers"))
    np.testing.assert_allclose(view.all_prices, [[1.5], [1.0]])   # 0.5 x multiplier
    np.testing.assert_allclose(view.price, [[1.5], [1.0]])


def test_posted_price_sellers_quote_their_price(duopoly):
    # kills env._quoted_prices 18 (posted prices scaled by 2.0 instead of 1.0)
    env, params = duopoly
    _, state = env.reset(jax.random.key(0), params)
    prices = jnp.array([[1.6], [1.45]])
    _, state, _, _, _, info = env.step(jax.random.key(1), state, {"sellers": prices}, params)
    np.testing.assert_allclose(info["prices"]["sellers"], prices)


# =========================================================================== combinators


def seller_view(fees, traffic, cost=0.0):
    """A 2-agent, 1-product seller view with the given fees / traffic."""
    fees = jnp.asarray(fees, jnp.float32).reshape(2, 1)
    traffic = jnp.asarray(traffic, jnp.float32).reshape(2, 1)
    z = jnp.zeros((2, 1), jnp.float32)
    return GroupView(action=z, price=z, traffic=traffic, fees=fees, cost=z + cost, value=z,
                     sent=z, budget=z, all_prices=jnp.zeros((2, 1)), self_index=jnp.arange(2),
                     budgets=jnp.zeros((1, 1)), time=jnp.int32(0), episode_length=jnp.int32(1),
                     price_history=jnp.zeros((1, 2, 1)), last_reward=jnp.zeros(2))


def test_history_length_is_the_largest_history_k_with_k_defaulting_to_one():
    # kills observations.history_length 7, 9, 12 (default k None / missing / 2),
    # 13 (kind looked up as None), 19 (0 without a history component -> 1)
    assert history_length([]) == 0
    assert history_length([{"kind": "own_price"}]) == 0
    assert history_length([{"kind": "history"}]) == 1
    assert history_length([{"kind": "history", "k": 3}, {"kind": "history"}]) == 3


def test_sum_without_weights_adds_its_terms_with_weight_one():
    # kills rewards._build_sum 19 ((1.0,) / len), 20 (default weight 2.0)
    v = seller_view(fees=[3.0, 5.0], traffic=[2.0, 1.0])
    got = build_reward([{"kind": "sum", "terms": [{"kind": "revenue"}, {"kind": "traffic"}]}],
                       2, "r", "seller")(v)
    np.testing.assert_allclose(got, [3.0 + 2.0, 5.0 + 1.0])


@pytest.mark.parametrize("terms", [[], {"kind": "revenue"}])
def test_sum_terms_must_be_a_non_empty_list(terms):
    # kills rewards._build_sum 4 (or -> and), 7-14 (error field / value / message)
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "sum", "terms": terms}], 2, "g.reward", "seller")
    assert info.value.field == "g.reward[0].terms"
    assert info.value.value == terms
    assert info.value.allowed == "a non-empty list of reward components"


def test_sum_weights_must_match_the_terms():
    # kills rewards._build_sum 22-28 (error field / value / message)
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "sum", "terms": [{"kind": "revenue"}, {"kind": "traffic"}],
                       "weights": [0.5]}], 2, "g.reward", "seller")
    assert info.value.field == "g.reward[0].weights"
    assert info.value.value == [0.5]
    assert info.value.allowed == "a list of 2 numbers"


def test_sum_sub_chains_see_the_group_size_and_their_own_path():
    # kills rewards._build_sum 31 (n -> None for the sub-chains), 32 (their path None)
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "sum", "terms": [{"kind": "revenue"},
                                                {"kind": "team", "teams": [0, 1, 1]}]}],
                     2, "g.reward", "seller")
    # the path names the sub-term as the user wrote it (the sub-chain is built as a
    # one-element list; its extra [0] must not leak into the path)
    assert info.value.field == "g.reward[0].terms[1].teams"
    assert info.value.allowed == "a list of 2 team ids (one per agent)"


def test_clip_with_equal_bounds_is_allowed_and_pins_the_reward():
    # kills rewards._build_clip 3 (low > high -> low >= high)
    v = seller_view(fees=[3.0, -5.0], traffic=[0.0, 0.0])
    got = build_reward([{"kind": "revenue"}, {"kind": "clip", "low": 1.5, "high": 1.5}],
                       2, "r", "seller")(v)
    np.testing.assert_allclose(got, [1.5, 1.5])


def test_clip_error_reports_low_and_the_high_it_exceeds():
    # kills rewards._build_clip 7, 8 (error value / message None)
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "clip", "low": 2.0, "high": 1.0}], 2, "g.reward", "seller")
    assert info.value.value == 2.0
    assert info.value.allowed == "a number <= high (1.0)"


def test_competitor_prices_needs_two_sellers_and_says_how_many_there_are():
    # kills observations._competitor_prices 47 (error value None)
    v = seller_view(fees=[0.0, 0.0], traffic=[0.0, 0.0])
    one_seller = v.replace(all_prices=jnp.ones((1, 1)), self_index=jnp.zeros(2, jnp.int32))
    with pytest.raises(ConfigError) as info:
        build_observation([{"kind": "competitor_prices"}], "o")(one_seller)
    assert (info.value.field, info.value.value) == ("observation.competitor_prices", 1)
    assert info.value.allowed == "a market with >= 2 sellers"


def test_observation_and_reward_lists_must_be_lists():
    # kills observations.build_observation 9, 11 and rewards.build_reward 7 (message)
    with pytest.raises(ConfigError) as info:
        build_observation({"kind": "own_price"}, "g.observation")
    assert info.value.allowed == "a list of observation components like [{kind: own_price}]"
    with pytest.raises(ConfigError) as info:
        build_reward({"kind": "profit"}, 2, "g.reward", "seller")
    assert info.value.allowed == "a list of reward components like [{kind: profit}]"


def test_component_settings_errors_name_the_setting():
    # kills observations.build_observation 25 and rewards.build_reward 36 (path None)
    with pytest.raises(ConfigError) as info:
        build_observation([{"kind": "own_price"}, {"kind": "history", "k": 0}], "g.observation")
    assert info.value.field == "g.observation[1].k"
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "profit"}, {"kind": "scale"}], 2, "g.reward", "seller")
    assert info.value.field == "g.reward[1].factor"


def test_competitor_summary_error_lists_the_choices():
    # kills observations.build_observation 55 (message None)
    with pytest.raises(ConfigError) as info:
        build_observation([{"kind": "competitor_prices", "summary": []}], "g.observation")
    assert info.value.allowed == "'all' or a non-empty list from min, mean, max"


def test_seller_only_reward_for_consumers_lists_what_consumers_may_use():
    # kills rewards.build_reward 21, 31 (allowed list None)
    # consumer terms: traffic, regret_ratio, noise; transforms for both sides: team,
    # scale, clip, sum -- alphabetically
    with pytest.raises(ConfigError) as info:
        build_reward([{"kind": "profit"}], 2, "g.reward", "consumer")
    assert info.value.field == "g.reward[0].kind"
    assert info.value.allowed == ("for a consumer group one of "
                                  "clip, noise, regret_ratio, scale, sum, team, traffic")


# =========================================================================== isa*.py


@pytest.mark.parametrize("kind, options, field", [
    ("isa_2022", {"mode": "median"}, "distributor(isa_2022).mode"),
    ("isa_greedy", {"max_sellers": 0}, "distributor(isa_greedy).max_sellers"),
])
def test_isa_option_errors_name_the_distributor(kind, options, field):
    # kills isa.allocate 9 and isa_greedy.allocate 8 (kind misspelt in the error path)
    with pytest.raises(ConfigError) as info:
        DISTRIBUTORS[kind].allocate(jax.random.key(0), None, {}, options)
    assert info.value.field == field


def isa_quotes(reliability):
    """Two sellers (prices 0.3 and 0.5, stakes 1 and 2), one consumer (budget 1, 10
    queries), one product."""
    col = lambda xs: jnp.asarray(xs, jnp.float32).reshape(-1, 1)
    return Quotes(price=col([0.3, 0.5]), is_multiplier=jnp.zeros(2, bool),
                  budget=col([1.0]), queries=col([10.0]), base_price=col([1.0]),
                  quality=col([0.0, 0.0]), reliability=col(reliability),
                  latency=col([0.0, 0.0]), freshness=col([0.0, 0.0]), stake=col([1.0, 2.0]))


@pytest.mark.parametrize("kind, options", [("isa_2022", {"mode": "expected"}),
                                           ("isa_greedy", {"max_sellers": 2})])
def test_isa_reliability_above_one_counts_as_one(kind, options):
    # kills isa.clean_reliability 3 (no upper clip): a reliability is a probability
    alloc = lambda rel: DISTRIBUTORS[kind].allocate(
        jax.random.key(0), isa_quotes(rel), {"stake_scale": 1.0}, options)
    clipped, exact = alloc([1.5, 0.8]), alloc([1.0, 0.8])
    for got, want in zip(jax.tree.leaves(clipped), jax.tree.leaves(exact)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(exact.traffic[1, 0]) > 0     # both sellers serve: the test can see a change


# =========================================================================== train/config.py

@pytest.mark.parametrize("rule", [{"metric": "reward/sellers"},
                                  {"metric": "reward/sellers", "above": 1.0, "below": 0.0},
                                  {"metric": "reward/sellers", "above": 1.0, "after": 3}])
def test_early_stop_needs_a_metric_and_exactly_one_of_above_below(rule):
    # kills train.config.resolve_train 19 (the conditions on the metric and on the bounds
    # joined by `or`: a rule with a metric and no bound, or two bounds, passed)
    from jaxmarket.train.config import resolve_train
    with pytest.raises(ConfigError) as info:
        resolve_train({"early_stop": rule})
    assert info.value.field == "train.early_stop"


def test_each_consumer_group_draws_its_own_demand_noise():
    # kills env.step_env 16 (split(k_demand) into 2 keys whatever the number of consumer
    # groups: the third group reused the second's key, out-of-range index clamped)
    cfg = duopoly_config()
    group = cfg["market"]["consumers"][0]
    cfg["market"]["consumers"] = [
        {**group, "name": f"c{i}", "queries": 10.0, "demand": {"kind": "noisy", "sigma": 0.5}}
        for i in range(3)]
    env, params = jaxmarket.make(cfg)
    _, state = env.reset(jax.random.key(0), params)
    _, _, _, _, _, info = env.step(jax.random.key(1), state,
                                   {"sellers": jnp.array([[1.5], [1.5]])}, params)
    q = [float(info["queries"][f"c{i}"][0, 0]) for i in range(3)]
    assert len(set(q)) == 3, q      # three independent draws, no two equal
