"""Reward and observation components (:data:`~jaxmarket.combinators.rewards.REWARDS`,
:data:`~jaxmarket.combinators.observations.OBSERVATIONS`): importing the package
registers every shipped kind."""

from jaxmarket.combinators import observations, rewards, view  # noqa: F401  (registration)
