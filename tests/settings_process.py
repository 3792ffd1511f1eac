"""Settings for the ``qcluster`` processes the process tests start and kill.

The test settings, plus environment overrides for the timings a kill-and-restart test
needs short: the sweeper's lease, tick and loop length, how soon stuck work is queued
again, and the cluster's worker count and poll interval. The defaults are the engine's.
"""

import os

from govflow.settings.test import *  # noqa: F403
from govflow.settings.test import Q_CLUSTER


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


GOVFLOW_SWEEP_DURATION = _env("GOVFLOW_SWEEP_DURATION", 40)
GOVFLOW_SWEEP_LEASE_TTL = _env("GOVFLOW_SWEEP_LEASE_TTL", 10)
GOVFLOW_SWEEP_TICK = _env("GOVFLOW_SWEEP_TICK", 0.25)
GOVFLOW_SWEEP_FULL_EVERY = _env("GOVFLOW_SWEEP_FULL_EVERY", 2)

# The cluster name stays the engine's: it is the ORM broker's queue key, and every
# cluster of a test must take work from the queue the test process fills.
Q_CLUSTER = {
    **Q_CLUSTER,
    "poll": _env("GOVFLOW_Q_POLL", Q_CLUSTER["poll"]),
}

# The outbox's publisher (ADR 0032): its lease and a webhook attempt's timeout.
GOVFLOW_PUBLISHER_LEASE_TTL = _env("GOVFLOW_PUBLISHER_LEASE_TTL", 30)
GOVFLOW_WEBHOOK_TIMEOUT = _env("GOVFLOW_WEBHOOK_TIMEOUT", 10)
GOVFLOW_PUBLISHER_TICK = _env("GOVFLOW_PUBLISHER_TICK", 1)
