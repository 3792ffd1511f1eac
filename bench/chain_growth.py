"""Cost per step against an instance's length: the chain's verification (ADR 0034).

    DATABASE_URL=postgres://… .venv/bin/python bench/chain_growth.py [--lengths 5 200]

Runs, for each length, one subject through the ledger as the engine writes a chain of
non-atomic steps (``operation_observe_record``: step k succeeded and step k+1 dispatched,
one commit per step, one lease for the whole run) and prints per step: statements, rows
returned to the client, rows the server read from the operation and checkpoint tables
(``pg_stat_user_tables``, sampled in the last five steps: the statistics arrive about a
second late), and client CPU (``process_time``), over the whole instance and
over its last five steps. Per-step cost flat in the length means the last five steps of a
200-step instance cost what a 5-step instance's steps do. CPU figures are noisy on a shared
machine; the load average is printed with them. Exits 0 when it ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness import django_test_db
from pgserver import postgres_server


def _counting():
    """A Django execute wrapper counting statements and the rows each returned."""
    counts = {"statements": 0, "rows": 0}

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        counts["statements"] += 1
        cursor = context["cursor"]
        if cursor.description is not None and cursor.rowcount > 0:
            counts["rows"] += cursor.rowcount
        return result

    return counts, wrapper


def _server_rows(cursor) -> int:
    cursor.execute(
        "SELECT COALESCE(SUM(seq_tup_read + COALESCE(idx_tup_fetch, 0)), 0) "
        "FROM pg_stat_user_tables WHERE relname IN ('recovery_operation', 'recovery_checkpoint')"
    )
    return int(cursor.fetchone()[0])


def measure(length: int) -> dict[str, dict[str, float]]:
    """One instance of ``length`` steps; per-step figures over all steps and the last five."""
    from django.db import connection

    from recovery.testing import chained_step, live_fence, new_subject, record

    subject = new_subject("bench.instance")
    fence = live_fence(subject, holder="bench")
    op = record(subject, fence)
    with connection.cursor() as cursor:  # plans as on a table of some size: by its indexes
        cursor.execute("ANALYZE recovery_operation; ANALYZE recovery_checkpoint")
    spans: dict[str, dict[str, float]] = {}
    totals = {"statements": 0, "rows": 0, "server_rows": 0, "cpu_ms": 0.0}
    last = dict(totals)
    sampled = 0
    for number in range(1, length + 1):
        counts, wrapper = _counting()
        tail = number > length - 5
        if tail:
            before = _settled_rows(connection)
        started = time.process_time()
        with connection.execute_wrapper(wrapper):
            op = chained_step(subject, fence, op, action="bench.step")
        cpu = (time.process_time() - started) * 1000
        step = {**counts, "server_rows": 0, "cpu_ms": cpu}
        if tail:
            step["server_rows"] = _settled_rows(connection) - before
            sampled += 1
        for key in totals:
            totals[key] += step[key]
            if tail:
                last[key] += step[key]
    spans["all"] = {k: v / length for k, v in totals.items()}
    spans["all"]["server_rows"] = float("nan")  # sampled in the last five steps only
    spans["last 5"] = {k: v / sampled for k, v in last.items()}
    return spans


def _settled_rows(connection) -> int:
    """The tables' rows read so far, once this backend's counts reached the statistics
    (PostgreSQL flushes them at most once a second)."""
    time.sleep(1.1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        return _server_rows(cursor)


def fill(subjects: int, steps: int) -> None:
    """Other instances' rows, so the tables have the size that makes plans use indexes."""
    from recovery.testing import chained_step, live_fence, new_subject, record

    for _ in range(subjects):
        subject = new_subject("bench.other")
        fence = live_fence(subject, holder="bench")
        op = record(subject, fence)
        for _ in range(steps):
            op = chained_step(subject, fence, op, action="bench.step")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/chain_growth.py")
    parser.add_argument("--lengths", type=int, nargs="+", default=[5, 200])
    parser.add_argument("--fill", type=int, default=300, help="other instances of 10 steps")
    args = parser.parse_args(argv)
    with postgres_server() as server, django_test_db(server, "govflow_chain_growth"):
        from django.test.utils import setup_test_environment

        setup_test_environment()
        fill(args.fill, 10)
        print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores shared)")
        print("length  span    statements  client rows  server rows  client CPU ms")
        for length in args.lengths:
            for span, figures in measure(length).items():
                print(
                    f"{length:6d}  {span:6s}  {figures['statements']:10.1f}  "
                    f"{figures['rows']:11.1f}  {figures['server_rows']:11.1f}  "
                    f"{figures['cpu_ms']:13.2f}"
                )
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
