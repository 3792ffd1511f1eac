"""``bench/ledger.py``'s raw-psycopg baseline still mirrors the ledger's statements.

The baseline replays, on a psycopg connection of its own, the statements of the ledger's
transaction path with parameters of the same shapes (``bench/baseline.py``). When the
ledger's statements change, the benchmark stops with ``StatementsChanged`` before printing
a figure; this test finds that in the suite instead of in ``make bench``. PostgreSQL only,
where the benchmark runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.db import connection

from recovery.api import transactions_only

pytestmark = pytest.mark.django_db(transaction=True)

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_modules(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the benchmark runs on PostgreSQL only")
    monkeypatch.syspath_prepend(str(BENCH))  # the benchmark's scripts import each other
    import baseline
    import workload

    yield baseline, workload
    for name in ("baseline", "workload"):
        sys.modules.pop(name, None)


def test_the_raw_baseline_replays_the_transaction_paths_statements(bench_modules):
    baseline, workload = bench_modules
    traced_lifecycle = workload.plan("trace", 1, 1)  # its lease taken here, not traced
    with transactions_only(), workload.instrumented(log=True) as traced:
        workload.run(traced_lifecycle)
    sql, captured = baseline.statements(traced.log)  # StatementsChanged when they drifted
    conn = baseline.connect(server_side=True)
    try:
        replayed: list = []
        lifecycles = workload.plan("replay", 2, 2)  # one instance of two operations
        prepared = baseline.prepare(lifecycles)
        one = baseline.lifecycle_runner(conn, sql, replayed)
        for lifecycle in prepared:
            one(lifecycle)
        baseline.check_shapes(captured, sql, replayed[: len(sql)])
    finally:
        conn.close()
    # What the replay wrote is what the ledger writes: every operation succeeded and the
    # chain verifies with the ledger's own key.
    assert workload.check("replay", lifecycles, sample=1) == 1
