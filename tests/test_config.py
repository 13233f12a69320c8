"""Config loading, overrides and every class of config error (named field, value,
what is allowed), raised before anything compiles."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import CONFIGS, ROOT, duopoly_config

import jaxmarket
from jaxmarket import ConfigError, load_config
from jaxmarket.train.plan import resolve


def error_of(config=None, overrides=(), source=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        jaxmarket.make(source if source is not None else config, overrides)
    return info.value


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_resolves(name):
    env, params = jaxmarket.make(CONFIGS / f"{name}.yaml")
    assert env.agent_groups, name


def test_dotted_overrides_change_values_and_shapes():
    env, params = jaxmarket.make(CONFIGS / "logit_duopoly.yaml",
                                 ["market.num_products=4", "market.sellers[0].count=3",
                                  "market.sellers.0.high=[2, 2.5, 3, 3.5]"])
    assert env.spec.num_products == 4
    assert params.sellers["sellers"].high.shape == (3, 4)
    np.testing.assert_allclose(params.sellers["sellers"].high[2], [2, 2.5, 3, 3.5])


def test_scalar_per_product_and_full_array_broadcast():
    cfg = duopoly_config(num_products=2)
    cfg["market"]["sellers"][0]["cost"] = [[0.1, 0.2], [0.3, 0.4]]
    cfg["market"]["sellers"][0]["quality"] = [1.0, 2.0]
    _, params = jaxmarket.make(cfg)
    np.testing.assert_allclose(params.sellers["sellers"].cost, [[0.1, 0.2], [0.3, 0.4]], rtol=1e-6)
    np.testing.assert_allclose(params.sellers["sellers"].quality, [[1, 2], [1, 2]])
    np.testing.assert_allclose(params.sellers["sellers"].low, [[1, 1], [1, 1]])


@pytest.mark.parametrize("override, field, allowed", [
    ("market.distributor.kind=nope", "market.distributor.kind", "one of"),
    ("market.sellers[0].count=-1", "market.sellers[0].count", "integer >= 1"),
    ("market.sellers[0].count=0", "market.sellers[0].count", "integer >= 1"),
    ("market.num_products=0", "market.num_products", "integer >= 1"),
    ("market.sellers[0].high=[1, 2, 3]", "market.sellers[0].high", "[2, 1] array"),
    ("market.sellers[0].low=3", "market.sellers[0].low", "<= high"),
    ("market.sellers[0].cost=cheap", "market.sellers[0].cost", "a number"),
    ("market.sellers[0].colour=red", "market.sellers[0].colour", "known keys are"),
    ("market.distributor.temprature=1", "market.distributor.temprature", "known keys are"),
    ("market.distributor.temperature=0", "market.distributor.temperature", "> 0"),
    ("market.sellers[0].action=bid", "market.sellers[0].action", "one of 'price', 'multiplier'"),
    ("market.sellers[0].reward=[{kind: fame}]", "market.sellers[0].reward[0].kind", "one of"),
    ("market.sellers[0].observation=[{kind: gossip}]", "market.sellers[0].observation[0].kind",
     "one of"),
    ("market.consumers[0].demand={kind: tides}", "market.consumers[0].demand.kind", "one of"),
    ("market.consumers[0].demand={kind: regime, steps: [5], levels: [1]}",
     "market.consumers[0].demand.levels", "2 numbers"),
    ("market.sellers[0].reward=[{kind: team, teams: [0]}]", "market.sellers[0].reward[0].teams",
     "2 team ids"),
    ("market.episode_length=-5", "market.episode_length", ">= 1"),
    ("markt.x=1", "markt", "top-level keys"),
])
def test_config_errors_name_field_value_and_allowed(override, field, allowed):
    err = error_of(source=CONFIGS / "logit_duopoly.yaml", overrides=[override])
    assert err.field == field
    assert allowed in err.allowed
    value_text = override.split("=", 1)[1]
    assert str(err).startswith(f"{field}: got ")
    if field != "markt" and "[" not in value_text and "{" not in value_text:
        assert value_text.strip() in str(err)


def test_missing_required_fields_are_named():
    cfg = duopoly_config()
    del cfg["market"]["sellers"][0]["name"]
    assert error_of(cfg).field == "market.sellers[0].name"
    cfg = duopoly_config()
    del cfg["market"]["distributor"]
    assert error_of(cfg).field == "market.distributor"
    assert error_of({"train": {}}).field == "market"


def test_duplicate_group_names_and_entity_rewards_rejected():
    cfg = duopoly_config()
    cfg["market"]["consumers"][0]["name"] = "sellers"
    assert error_of(cfg).field == "market.sellers[0].name"
    cfg = duopoly_config()
    cfg["market"]["consumers"][0]["reward"] = [{"kind": "traffic"}]
    assert error_of(cfg).field == "market.consumers[0].reward"


def test_seller_only_reward_rejected_for_consumer_agents():
    cfg = duopoly_config()
    cfg["market"]["consumers"][0].update(agent=True, reward=[{"kind": "profit"}])
    err = error_of(cfg)
    assert err.field == "market.consumers[0].reward[0].kind"
    assert "regret_ratio" in err.allowed


def test_multiplier_sellers_need_shared_base_prices_for_fast_distributors():
    cfg = duopoly_config()
    cfg["market"]["consumers"][0]["count"] = 2
    cfg["market"]["consumers"][0]["base_price"] = [[1.0], [2.0]]
    cfg["market"]["sellers"][0]["action"] = "multiplier"
    err = error_of(cfg)
    assert "base_price" in err.field and "logit" in err.allowed


def test_bad_override_syntax():
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "logit_duopoly.yaml", ["market.num_products"])
    assert "KEY=VALUE" in info.value.allowed
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "logit_duopoly.yaml", ["market.sellers[5].count=1"])
    assert info.value.field == "market.sellers[5]"


def test_missing_file_is_a_config_error(tmp_path):
    assert error_of(source=tmp_path / "absent.yaml").field == "config"


def run_check(*args):
    return subprocess.run([sys.executable, "-m", "jaxmarket.check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_check_cli_prints_resolved_scenario():
    out = run_check("configs/multi_product.yaml", "market.sellers[0].count=4")
    assert out.returncode == 0, out.stderr
    assert "seller group 'posted': count=4 (agents, action=price), arrays [4, 3]" in out.stdout
    assert "seller group 'multiplied': count=2 (agents, action=multiplier)" in out.stdout
    assert "distributor: logit" in out.stdout
    assert "demand: cyclic" in out.stdout


def test_check_cli_error_is_one_line_exit_2_no_traceback():
    out = run_check("configs/logit_duopoly.yaml", "market.sellers[0].count=0")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines == ["config error: market.sellers[0].count: got 0; allowed: an integer >= 1"]


@pytest.mark.parametrize("key, right", [("normalise", "normalize"),
                                        ("normalise_horizon", "normalize_horizon")])
def test_the_british_spelling_of_a_public_key_names_the_right_key(key, right):
    config = load_config(CONFIGS / "poi_demand.yaml",
                         [f"learners.me.external_model.poi.{key}=none"])
    with pytest.raises(ConfigError) as err:
        resolve(config)
    assert err.value.field == f"learners.me.external_model.poi.{key}"
    assert f"the key {right} " in err.value.allowed
    # and the right spelling is accepted with the same value space
    value = "none" if right == "normalize" else 7
    plan = resolve(load_config(CONFIGS / "poi_demand.yaml",
                               [f"learners.me.external_model.poi.{right}={value}"]))
    assert plan.models["me"].poi_settings[right] == value
