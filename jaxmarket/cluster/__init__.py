"""Runs across machines on a Ray cluster (docs/cluster.md).

    connect.py   joining a cluster: the head checked within seconds, Ray's own output in
                 the run directory's ray.log, the cluster described for run.json
    blocks.py    one session-engine design's sessions split into blocks, each a Ray task
                 playing its rows of the run's own sessions; the driver writes the one
                 run directory a single process writes, byte for byte

A sweep's cells run as Ray tasks in :mod:`jaxmarket.cli.sweep.backends`.
"""

from jaxmarket.config.errors import ClusterError


__all__ = ["ClusterError"]
