"""The kernel against the XLA backend on designs a researcher writes next: random
combinations of the settings each design test exercises one at a time
(``tests/test_sessions_kernel_designs.py``), drawn from a seeded generator over the
shipped tabular configs. A combination (three firms with their own costs, memory 2,
per-firm learning rates and discounts, Boltzmann exploration and a uniform initial Q,
say) is where one path of the kernel meets another: a state numbering, a per-firm
table or a rounding that is right alone and wrong beside another setting.

Each case draws a base config and, as far as that config allows, the grid size, the
number of firms and their costs, the memory, per-firm or shared alpha and delta, the
exploration rule (a decay, per firm or shared; an epsilon schedule; Boltzmann) and the
initial Q, with exploration fast and the convergence window short, so that a few
hundred periods hold exploration, greedy changes and convergence. Both backends play
the same sessions in chunks that do not divide the periods, and every leaf of the
sessions' state must be equal bit for bit.
"""

from __future__ import annotations

import random

import jax
import numpy as np
import pytest

from jaxmarket.config.loader import load_config
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.engine import Settings
from jaxmarket.sessions.game import kernel_reason, make_game
from jaxmarket.sessions.run import session_plan

#: config -> (learner group, its exploration rule: decay, epsilon or boltzmann)
BASES = {
    "calvano": ("sellers", "decay"), "calvano2021": ("firms", "decay"),
    "cournot": ("firms", "decay"), "johnson2023": ("sellers", "decay"),
    "klein2021": ("sellers", "epsilon"), "asker2022_sync": ("sellers", "epsilon"),
    "asker2022_async": ("sellers", "epsilon"), "banchio2022_first": ("bidders", "epsilon"),
    "waltman2008": ("firms", "boltzmann"),
}
#: seeds of the cases in every run of the suite (Asker's asynchronous design, Calvano's
#: market with three firms and memory 2, Klein's alternating moves); ``SLOW`` more,
#: marked slow
QUICK = (0, 3, 7)
SLOW = tuple(s for s in range(24) if s not in QUICK)


def combination(seed: int) -> tuple[str, list[str]]:
    """``(config, overrides)`` of case ``seed``."""
    rng = random.Random(seed)
    # each base once, then Calvano's market (firms, costs, memory) every other case
    base = (sorted(BASES)[seed] if seed < len(BASES) else
            "calvano" if seed % 2 else rng.choice(sorted(BASES)))
    group, rule = BASES[base]
    at = f"learners.{group}."
    n = 2
    items = [at + f"grid_size={rng.choice([3, 4, 5])}",
             at + f"convergence_window={rng.choice([15, 40])}"]
    if base == "calvano":   # the plain game's market: firms, their costs, the memory
        n = rng.choice([2, 3])
        memory = rng.choice([0, 1, 2])
        costs = ", ".join(f"[{rng.choice([0.9, 1.0, 1.1])}]" for _ in range(n))
        items += [f"market.sellers.0.count={n}", f"market.sellers.0.cost=[{costs}]",
                  f"{at}memory={memory}",
                  f"market.sellers.0.observation=[{{kind: history, k: {max(memory, 1)}}}]"]

    def per_firm(values):
        if rng.random() < 0.5:
            return str(rng.choice(values))
        return "[" + ", ".join(str(rng.choice(values)) for _ in range(n)) + "]"

    if rng.random() < 0.6:
        items.append(at + "learning_rate=" + per_firm([0.2, 0.5]))
    if rng.random() < 0.6:
        items.append(at + "discount=" + per_firm([0.3, 0.6]))
    if rule == "decay":
        kind = rng.choice(["decay", "epsilon", "boltzmann"])
        if kind == "decay":
            items.append(at + "exploration_decay=" + per_firm([0.01, 0.03]))
        elif kind == "epsilon":
            items.append(at + f"epsilon={{start: {rng.choice([0.5, 1.0])}, decay: 0.02}}")
        else:
            items.append(at + "boltzmann={temperature: 1.0, decay: 0.97}")
    elif rule == "epsilon":
        items.append(at + f"epsilon={{start: {rng.choice([0.5, 1.0])}, decay: 0.02}}")
    else:
        items.append(at + "boltzmann={temperature: 1.0, decay: 0.97}")
    if rng.random() < 0.4:
        items.append(at + "q_init=" + rng.choice(["zero", "{kind: uniform, low: 0.0, high: 2.0}",
                                                  "{kind: constant, value: 1.0}"]))
    return base, items


def leaves(sessions: eng.Sessions) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves((sessions.learner, sessions.index,
                                                    sessions.tail, sessions.outcome))]


@pytest.mark.parametrize("seed", [*QUICK, *(pytest.param(s, marks=pytest.mark.slow)
                                            for s in SLOW)])
def test_kernel_plays_a_random_combination_of_settings_bit_for_bit_like_xla(seed):
    # Bugs caught: a kernel path right for one setting and wrong beside another (the
    # history numbering of memory 2 with three firms' grids, a per-firm alpha read at the
    # wrong seat of alternating moves, Boltzmann's logit with a per-firm discount, a
    # uniform initial Q with full feedback), which no single-setting design test meets.
    base, items = combination(seed)
    game = make_game(session_plan(load_config(f"configs/{base}.yaml", items)))
    assert kernel_reason(game) is None, (base, items)
    settings = {"sessions": 5, "periods": 400, "chunk": 140, "window": 150, "stop": "periods"}
    key = jax.random.key(seed)
    xla = eng.run(game, Settings(**settings, backend="xla"), key, compact=False)
    kernel = eng.run(game, Settings(**settings, backend="kernel"), key, compact=False)
    assert (xla.backend, kernel.backend) == ("xla", "kernel"), kernel.note   # no fallback
    for i, (a, b) in enumerate(zip(leaves(xla.sessions), leaves(kernel.sessions))):
        np.testing.assert_array_equal(a, b, err_msg=f"{base} {items}: leaf {i}")
    # the comparison has teeth: the Q tables moved from their start
    start = leaves(eng.init_sessions(game, 5, key))[0]
    assert not np.array_equal(start, leaves(xla.sessions)[0]), (base, items)


def test_the_combinations_cover_every_base_and_each_setting_both_ways():
    # Bug caught: a generator that never draws a setting (its combinations untested):
    # across the cases, every base config, both firm counts, every memory, per-firm and
    # shared alpha, delta and decay, and every exploration rule occur.
    drawn = [combination(s) for s in (*QUICK, *SLOW)]
    text = [" ".join(items) for _, items in drawn]
    assert {base for base, _ in drawn} == set(BASES)
    for needle in ("count=3", "count=2", "memory=0", "memory=1", "memory=2",
                   "learning_rate=[", "learning_rate=0", "discount=[", "discount=0",
                   "exploration_decay=[", "exploration_decay=0", "epsilon=", "boltzmann=",
                   "q_init="):
        assert any(needle in t for t in text), needle
