"""The client of ``bench/instructions.py``: claimed five-step instances run in this process.

    python bench/engine/instructions_client.py N      # DATABASE_URL: a migrated database

Publishes the five no-op steps' definition, starts, claims and runs ``WARM`` instances (the
definition read and cached, every statement prepared on this connection), then N more, and
prints ``BACKEND <pid>``: the server process that served it, whose instructions the
benchmark reads. Run twice under callgrind, N = 0 and N = K: the difference is what K
instances cost, the start, the claim and the run each (both processes' set-up cancels out).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.engine.settings")

WARM = 10
"""Instances run before the measured ones: psycopg prepares a statement at its fifth
execution on a connection, and the ending's statements run once per instance."""


def instances(definition, n: int) -> None:
    from govflow.engine.queue import instances_claim
    from govflow.engine.services.instances import instance_start
    from govflow.engine.services.runtime import instance_run

    for _ in range(n):
        instance_start(definition=definition)
    claims = []
    while len(claims) < n:
        claims += instances_claim(holder="bench-instructions", limit=100, ttl=300)
    for claim in claims:
        report = instance_run(instance_id=claim.instance_id, claim=claim)
        if report.steps != 6:  # the start node and five actions
            raise SystemExit(f"instance {claim.instance_id} ran {report.steps} steps: {report}")


def main(n: int) -> None:
    import django

    django.setup()
    from django.db import connection

    from bench.engine.govflow_side import five_noops_document, publish

    definition = publish(five_noops_document())
    instances(definition, WARM)
    instances(definition, n)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        print(f"BACKEND {cursor.fetchone()[0]}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
