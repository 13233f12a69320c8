"""Importing this module registers every learner kind in ``LEARNERS``."""

import importlib

for _module in ("fixed", "gaussian_bandits", "discrete_bandits", "qlearning", "ppo"):
    try:
        importlib.import_module(f"jaxmarket.learners.{_module}")
    except ModuleNotFoundError as err:  # a learner module not present in this build
        if err.name != f"jaxmarket.learners.{_module}":
            raise
