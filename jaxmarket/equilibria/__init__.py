"""The benchmarks of a run: the static one-shot game of its scenario on its learners'
own action sets (Nash equilibrium and joint optimum, :mod:`.static_game`, solved by
:mod:`jaxmarket.market.equilibrium`) and the profit gain against them. It reads a
resolved :class:`~jaxmarket.train.plan.RunPlan`, so it sits in the train layer; the
run's summary, ``check --equilibrium``, the session engine and
``jaxmarket.equilibrium(config)`` use it."""

from jaxmarket.equilibria.static_game import (action_set, benchmarks, deterministic,
                                              equilibrium, exact, fixed_actions,
                                              learning_groups, profit_gain,
                                              summary_profit_gain)

__all__ = ["action_set", "benchmarks", "deterministic", "equilibrium", "exact",
           "fixed_actions", "learning_groups", "profit_gain", "summary_profit_gain"]
