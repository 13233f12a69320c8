"""The session engine: independent sessions of a tabular pricing game against the
market's outcome tables (:mod:`~jaxmarket.sessions.game`), stepped by the XLA or the
kernel backend (:mod:`~jaxmarket.sessions.engine`, :mod:`~jaxmarket.sessions.kernel`)."""
