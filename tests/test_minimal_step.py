"""benchmarks/minimal_step.py, the yardstick of ``throughput.py --against-minimal``: it is
the bench_b market of configs/bench_b.yaml, and its allocation is the logit one."""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
from conftest import CONFIGS, ROOT

from jaxmarket.config.loader import load_config


def load_yardstick():
    spec = importlib.util.spec_from_file_location("minimal_step",
                                                  ROOT / "benchmarks" / "minimal_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_yardstick_is_the_bench_b_market():
    m = load_yardstick()
    market = load_config(str(CONFIGS / "bench_b.yaml"))["market"]
    (consumers,), (sellers,) = market["consumers"], market["sellers"]
    assert (m.CONSUMERS, m.SELLERS, m.PRODUCTS) == (consumers["count"], sellers["count"],
                                                    market["num_products"])
    assert list(m.BUDGETS) == consumers["budget"] and m.QUERIES == consumers["queries"]
    assert m.PRICE_HIGH == sellers["high"] and sellers["low"] == 0.0
    assert m.TEMPERATURE == market["distributor"]["temperature"]
    assert market["distributor"]["kind"] == "logit" and market["distributor"]["outside_option"]


def test_the_yardstick_allocates_by_a_logit_over_the_affordable_sellers():
    m = load_yardstick()
    rng = np.random.default_rng(0)
    prices = rng.uniform(0.0, 3.0, (m.SELLERS, m.PRODUCTS)).astype(np.float32)
    prices[:, 0] = 2.9                      # product 0: nobody affordable, no traffic
    expected = np.zeros((m.SELLERS, m.PRODUCTS))
    for p in range(m.PRODUCTS):             # brute force: every consumer of product p
        ok = prices[:, p] <= m.BUDGETS[p]
        w = np.where(ok, np.exp(-prices[:, p].astype(np.float64) / m.TEMPERATURE), 0.0)
        expected[:, p] = m.CONSUMERS * m.QUERIES * w / (w.sum() + 1.0)   # outside: exp(0)
    got = np.asarray(jax.jit(m.allocate)(prices))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert (got[:, 0] == 0).all() and got[:, 1:].sum() > 0
    r = m.measure(num_envs=4, steps=3, seconds=0.0)
    assert r["timed_calls"] == 1 and r["env_steps_per_s"] > 0
