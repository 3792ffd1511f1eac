"""Settings for the engine benchmark's qcluster processes and its driver.

Everything comes from :mod:`govflow.settings.base` (``DATABASE_URL``, ``GOVFLOW_*`` and
``GOVFLOW_Q_WORKERS`` from the environment); only the no-op provider, fixed chain keys and
the pusher's poll interval (``BENCH_Q_POLL``) are added here.
"""

import os

from govflow.settings.base import *  # noqa: F403
from govflow.settings.base import INSTALLED_APPS, Q_CLUSTER

INSTALLED_APPS = [*INSTALLED_APPS, "bench.engine.noop_provider"]
RECOVERY_CHAIN_KEYS = os.environ.get("GOVFLOW_CHAIN_KEYS", "bench1:" + "b1" * 32)
Q_CLUSTER = {**Q_CLUSTER, "poll": float(os.environ.get("BENCH_Q_POLL", Q_CLUSTER["poll"]))}
