"""The logit distributor's demand steering (``steering``: price-directed prominence,
Johnson, Rhodes & Wildenbeest 2023), against closed forms written out here.

With utilities ``u_s = (a_s - beta p_s) / mu``, the lowest price ``m = min_s p_s`` and
``T`` sellers quoting it:

* ``lowest_price``: a consumer with ``b_c >= m`` buys from seller ``s`` at ``m`` with
  probability ``(1 / T) e^{u_s} / (e^{u_s} + e^{a_0 / mu})`` (``1 / T`` without the
  outside option); sellers above ``m`` sell nothing;
* ``lowest_price_all``: ``e^{u_s} / (sum_{j at m} e^{u_j} + e^{a_0 / mu})`` for ``s`` at
  ``m``;
* ``none``: the plain logit, unchanged.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxmarket.config.errors import ConfigError
from jaxmarket.market.distributors import Quotes
from jaxmarket.market.distributors.logit import allocate

KEY = jax.random.PRNGKey(0)
CALVANO = {"temperature": np.float32(0.25), "price_sensitivity": np.float32(1.0),
           "outside_quality": np.float32(0.0)}


def quotes(price, budget=(1000.0,), queries=None, quality=2.0) -> Quotes:
    price = np.asarray(price, np.float32).reshape(-1, 1)
    budget = np.asarray(budget, np.float32).reshape(-1, 1)
    S, C = price.shape[0], budget.shape[0]
    queries = np.ones((C, 1), np.float32) if queries is None else \
        np.asarray(queries, np.float32).reshape(C, 1)
    quality = np.broadcast_to(np.asarray(quality, np.float32).reshape(-1, 1), (S, 1))
    return Quotes(price=price, is_multiplier=np.zeros(S, bool), budget=budget,
                  queries=queries, base_price=np.ones((C, 1), np.float32),
                  quality=np.array(quality), reliability=np.ones((S, 1), np.float32),
                  latency=np.zeros((S, 1), np.float32), freshness=np.zeros((S, 1), np.float32),
                  stake=np.ones((S, 1), np.float32))


def alone(a, p, mu=0.25, a0=0.0):
    """A seller facing the consumer alone against the outside option."""
    return np.exp((a - p) / mu) / (np.exp((a - p) / mu) + np.exp(a0 / mu))


def conserved(alloc):
    total = float(alloc.traffic.sum() + alloc.unserved.sum())
    assert total == pytest.approx(float(alloc.sent.sum()), rel=1e-6)


def test_lowest_price_strict_undercutter_sells_alone():
    alloc = allocate(KEY, quotes([1.6, 1.5, 1.9]), CALVANO, {"steering": "lowest_price"})
    want = [0.0, alone(2.0, 1.5), 0.0]
    np.testing.assert_allclose(np.asarray(alloc.traffic[:, 0]), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(alloc.fees[:, 0]), np.multiply(want, 1.5), atol=1e-6)
    np.testing.assert_allclose(float(alloc.spend[0, 0]), 1.5 * alone(2.0, 1.5), rtol=1e-6)
    conserved(alloc)
    # showing every seller at the lowest price: the same when one seller quotes it
    every = allocate(KEY, quotes([1.6, 1.5, 1.9]), CALVANO, {"steering": "lowest_price_all"})
    np.testing.assert_allclose(np.asarray(every.traffic), np.asarray(alloc.traffic), atol=1e-6)


def test_lowest_price_tie_shows_one_seller_at_random():
    # qualities differ: each tied seller is shown with probability 1/2 and then faces the
    # consumer alone; the dearer seller sells nothing
    alloc = allocate(KEY, quotes([1.6, 1.6, 1.8], quality=[2.0, 2.2, 2.0]), CALVANO,
                     {"steering": "lowest_price"})
    want = [alone(2.0, 1.6) / 2, alone(2.2, 1.6) / 2, 0.0]
    np.testing.assert_allclose(np.asarray(alloc.traffic[:, 0]), want, atol=1e-6)
    np.testing.assert_allclose(float(alloc.unserved[0, 0]), 1.0 - sum(want), atol=1e-6)
    conserved(alloc)


def test_lowest_price_all_tie_is_a_logit_among_the_tied():
    alloc = allocate(KEY, quotes([1.6, 1.6, 1.8], quality=[2.0, 2.2, 2.0]), CALVANO,
                     {"steering": "lowest_price_all"})
    e0, e1 = np.exp((2.0 - 1.6) / 0.25), np.exp((2.2 - 1.6) / 0.25)
    want = [e0 / (e0 + e1 + 1.0), e1 / (e0 + e1 + 1.0), 0.0]
    np.testing.assert_allclose(np.asarray(alloc.traffic[:, 0]), want, rtol=1e-5, atol=1e-7)
    conserved(alloc)


def test_none_is_the_plain_logit():
    # consumer 0 affords all three sellers, consumer 1 (budget 1.65) the first two
    q = quotes([1.5, 1.6, 1.7], budget=[1000.0, 1.65], queries=[1.0, 3.0])
    e = np.exp((2.0 - np.array([1.5, 1.6, 1.7])) / 0.25)
    want = 1.0 * e / (e.sum() + 1.0) + 3.0 * np.r_[e[:2], 0.0] / (e[:2].sum() + 1.0)
    for given in ({}, {"steering": "none"}):
        alloc = allocate(KEY, q, CALVANO, given)
        np.testing.assert_allclose(np.asarray(alloc.traffic[:, 0]), want, rtol=1e-5)
        conserved(alloc)


def test_budgets_and_no_outside_option():
    # consumer 0 affords the lowest price, consumer 1 (budget 1.4) affords nobody
    q = quotes([1.5, 1.5], budget=[2.0, 1.4], queries=[2.0, 3.0])
    # no outside option: the tied sellers split consumer 0's queries; consumer 1's go
    # unserved ("unserved") or are not sent ("withhold")
    alloc = allocate(KEY, q, CALVANO, {"steering": "lowest_price", "outside_option": False})
    np.testing.assert_allclose(np.asarray(alloc.traffic[:, 0]), [1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(alloc.unserved[:, 0]), [0.0, 3.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(alloc.spend[:, 0]), [3.0, 0.0], atol=1e-6)
    conserved(alloc)
    held = allocate(KEY, q, CALVANO, {"steering": "lowest_price", "outside_option": False,
                                      "no_eligible": "withhold"})
    np.testing.assert_allclose(np.asarray(held.sent[:, 0]), [2.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(held.unserved[:, 0]), [0.0, 0.0], atol=1e-6)
    conserved(held)
    # with the outside option, consumer 1's queries are sent and go unserved
    out = allocate(KEY, q, CALVANO, {"steering": "lowest_price", "no_eligible": "withhold"})
    np.testing.assert_allclose(np.asarray(out.traffic[:, 0]),
                               [alone(2.0, 1.5), alone(2.0, 1.5)], rtol=1e-6)
    np.testing.assert_allclose(float(out.sent[1, 0]), 3.0)
    np.testing.assert_allclose(float(out.unserved[1, 0]), 3.0)
    conserved(out)


def test_bad_steering_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        allocate(KEY, quotes([1.5, 1.6]), CALVANO, {"steering": "cheapest"})
    text = str(err.value)
    assert "steering" in text and "cheapest" in text and "lowest_price" in text


@pytest.mark.parametrize("steering", ["lowest_price", "lowest_price_all"])
@pytest.mark.parametrize("outside", [True, False])
def test_extreme_inputs_stay_finite_nonnegative_and_conserved(steering, outside):
    """Prices, budgets and queries of 0, 1e-30 and 1e30 (and a NaN price, read as the
    price ceiling): every output finite and >= 0, queries conserved."""
    price = [0.0, 1e-30, 1e30, float("nan"), 0.0]
    q = quotes(price, budget=[0.0, 1e-30, 1e30, 1.0], queries=[1e30, 0.0, 1.0, 1e-30],
               quality=[0.0, 1e30, -1e30, 2.0, 5.0])
    alloc = allocate(KEY, q, CALVANO, {"steering": steering, "outside_option": outside})
    for field in ("traffic", "fees", "unserved", "spend", "sent"):
        x = np.asarray(getattr(alloc, field), np.float64)
        assert np.all(np.isfinite(x)) and np.all(x >= 0), field
    total = float(np.asarray(alloc.traffic, np.float64).sum()
                  + np.asarray(alloc.unserved, np.float64).sum())
    assert total == pytest.approx(float(np.asarray(alloc.sent, np.float64).sum()), rel=1e-5)
