"""A dedicated sweeper process: the engine's own sweep loop, outside the qcluster workers.

The sweep task holds the worker that runs it for ``GOVFLOW_SWEEP_DURATION`` (docs/
deployment.md: "keeps one worker of one cluster busy nearly all the time"). For the
throughput and recovery scenarios the benchmark runs ``sweep_loop`` here instead, so the
cluster's N workers only run steps; the sweep tasks django-q2 still delivers find this
sweeper's lease renewing and return at once. Environment as for ``manage.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.engine.settings")
    import django

    django.setup()
    from govflow.engine.services.sweep import sweep_loop

    print("READY", flush=True)
    while True:
        stats = sweep_loop(duration=3600, chain=False)
        if "skipped" in stats:
            time.sleep(0.5)


if __name__ == "__main__":
    main()
