"""``SlotLayout``: per-slot arrays meet policy-stacked parameters by broadcasting, with the
same values as the gather ``x[policy_index]`` for every slot-to-policy map."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxmarket.learners.base import LearnerSpec, SlotLayout
from jaxmarket.train.slots import tile_spec


def base_spec(num_agents: int, policy_index=None, num_policies=None) -> LearnerSpec:
    return LearnerSpec(num_agents=num_agents, obs_dim=0, num_products=2,
                       action_low=np.zeros((num_agents, 2), np.float32),
                       action_high=np.ones((num_agents, 2), np.float32),
                       num_policies=num_policies, policy_index=policy_index)


CASES = [
    # (one-market spec, markets per seed, seeds)
    (base_spec(3), 4, 1),
    (base_spec(3), 4, 2),
    (base_spec(4, policy_index=(0, 0, 1, 1), num_policies=2), 5, 3),   # shared policies
    (base_spec(3, policy_index=(2, 0, 1), num_policies=3), 2, 2),      # permuted
    (base_spec(5), 1, 1),
]


@pytest.mark.parametrize("spec, markets, seeds", CASES)
def test_folded_specs_tile_and_match_the_gather(spec, markets, seeds):
    folded = tile_spec(spec, markets, seeds)
    layout = SlotLayout(folded)
    assert layout.tiled
    assert layout.shape == (seeds, markets, spec.num_agents)
    index = np.asarray(folded.index())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(folded.policies, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(layout.view(x)), x[index])
    per_slot = rng.normal(size=(7, folded.num_agents, 2)).astype(np.float32)
    split = layout.split(per_slot, axis=1)
    assert split.shape == (7,) + layout.shape + (2,)
    np.testing.assert_array_equal(np.asarray(layout.merge(split, axis=1)), per_slot)
    # broadcasting the parameters against a split array is the gather
    params = np.asarray(layout.params(x))
    full = np.broadcast_to(params, layout.shape + x.shape[1:])
    np.testing.assert_array_equal(np.asarray(layout.merge(full)), x[index])


def test_an_irregular_map_falls_back_to_the_gather():
    spec = tile_spec(base_spec(3), 4, 1)
    index = np.asarray(spec.index()).copy()
    index[5] = 0  # one slot of market 1 driven by another agent's policy
    spec = dataclasses.replace(spec, policy_index=tuple(int(i) for i in index))
    layout = SlotLayout(spec)
    assert not layout.tiled
    x = np.arange(spec.policies * 2, dtype=np.float32).reshape(spec.policies, 2)
    np.testing.assert_array_equal(np.asarray(layout.view(x)), x[index])
    np.testing.assert_array_equal(
        np.asarray(layout.merge(np.broadcast_to(layout.params(x), layout.shape + (2,)))),
        x[index])
