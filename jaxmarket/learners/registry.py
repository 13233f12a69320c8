"""Kept for the modules that still import it: importing :mod:`jaxmarket.learners` (which
this does) registers every learner kind. Import ``jaxmarket.learners`` instead."""

import jaxmarket.learners  # noqa: F401
