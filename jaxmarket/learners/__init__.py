"""Learners: the protocol (:mod:`jaxmarket.learners.base`) and its kinds.

Importing the package registers every learner kind in
:data:`jaxmarket.learners.base.LEARNERS` (each module registers its own kinds).
"""

from jaxmarket.learners import (  # noqa: F401  (each registers its learner kinds)
    discrete_bandits,
    fixed,
    gaussian_bandits,
    ppo,
    qlearning,
)
