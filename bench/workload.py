"""The benchmarked workload: full non-atomic operation lifecycles through ``recovery.api``.

One lifecycle is what the engine does around one non-atomic step:

1. ``operation_record`` (state ``dispatched``): the dispatch-boundary commit;
2. ``operation_observe(state="succeeded", result=…)``: the terminal state and its
   checkpoint commit, after verifying the subject's chain (the whole chain at a run's
   first success, then its tail; outside a transaction on PostgreSQL, checked inside the
   write: ADR 0040).

Subjects are workflow instances of ``steps`` operations each, run one after another, so
chains stay as short as a real instance's. Each instance gets one lease (long ttl),
acquired while planning: not timed and not counted.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

from django.db import DatabaseError, connection, transaction

from recovery.api import (
    Fence,
    FingerprintKind,
    Subject,
    chain_verify,
    fingerprint_value,
    idempotency_key,
    lease_acquire,
    operation_observe,
    operation_record,
)
from recovery.models import Operation

SUBJECT_TYPE = "bench.instance"
ACTION = "bench.send_letter"
HOLDER = "bench-worker-1"
LEASE_TTL = 3600.0
DEFINITION = {
    "key": "bench.permit_application",
    "version": 3,
    "nodes": ["start", "check", "notify", "archive", "end"],
}


@dataclass(frozen=True)
class Lifecycle:
    """The arguments of one lifecycle, computed before timing (the caller's work)."""

    record: dict[str, Any]
    result: dict[str, Any]
    fence: Fence


def plan(tag: str, count: int, steps: int) -> list[Lifecycle]:
    """Plan ``count`` lifecycles on instances of ``steps`` operations; acquire their leases."""
    definition_fp = fingerprint_value(FingerprintKind.DEFINITION, DEFINITION)
    access_fp = fingerprint_value(
        FingerprintKind.ACCESS_CONTEXT, {"tenant": "municipality-1", "actor": "bench"}
    )
    lifecycles: list[Lifecycle] = []
    for n in range(math.ceil(count / steps)):
        subject = Subject(SUBJECT_TYPE, f"{tag}-{n}")
        fence = lease_acquire(key=f"lease:{subject}", holder=HOLDER, ttl=LEASE_TTL)
        for step in range(min(steps, count - len(lifecycles))):
            step_id = f"step-{step + 1}"
            value = {
                "applicant": f"A-{tag}-{n}",
                "step": step_id,
                "channel": "post",
                "template": "permit-granted",
                "lines": ["Dear applicant", "Granted."],
            }
            input_fp = fingerprint_value(FingerprintKind.INPUT, value)
            idem = idempotency_key(
                definition_fp=definition_fp,
                step_id=step_id,
                action=ACTION,
                input_fp=input_fp,
                nonce=f"{subject.id}:{step}",
            )
            record = {
                "subject": subject,
                "step_id": step_id,
                "action": ACTION,
                "recovery_mode": "non_atomic",
                "definition_fp": definition_fp,
                "input_fp": input_fp,
                "preview_fp": fingerprint_value(FingerprintKind.PREVIEW, {"letter": value}),
                "access_fp": access_fp,
                "idempotency_fp": fingerprint_value(FingerprintKind.IDEMPOTENCY_KEY, idem),
                "nonce": f"{subject.id}:{step}:0",
                "ordinal": 0,
                "fence": fence,
            }
            result = {"status": "sent", "reference": f"L-{tag}-{n}-{step}", "pages": 1}
            lifecycles.append(Lifecycle(record, result, fence))
    return lifecycles


def run(lifecycles: list[Lifecycle]) -> float:
    """Run the lifecycles one after another; return the elapsed seconds."""
    start = perf_counter()
    for lc in lifecycles:
        op = operation_record(**lc.record)
        operation_observe(key=op.key, state="succeeded", fence=lc.fence, result=lc.result)
    return perf_counter() - start


def check(tag: str, lifecycles: list[Lifecycle], sample: int = 20) -> int:
    """Fail loudly unless every lifecycle succeeded; verify a sample of chains."""
    done = Operation.objects.filter(
        subject_type=SUBJECT_TYPE, subject_id__startswith=f"{tag}-", state="succeeded"
    ).count()
    if done != len(lifecycles):
        raise AssertionError(f"run {tag}: {done} of {len(lifecycles)} operations succeeded")
    subjects = list(dict.fromkeys(lc.record["subject"] for lc in lifecycles))
    for subject in subjects[:: max(1, len(subjects) // sample)]:
        verification = chain_verify(subject)
        if not verification.ok:
            raise AssertionError(f"run {tag}: {verification}")
    return len(subjects[:: max(1, len(subjects) // sample)])


# --- counting and timing at the client ---------------------------------------------------


@dataclass
class Instruments:
    """What the client did: statements, commits, and the time spent waiting for them."""

    statements: int = 0
    autocommit_statements: int = 0
    statement_seconds: float = 0.0
    commits: int = 0
    commit_seconds: float = 0.0
    rollbacks: int = 0
    log: list[tuple[str, Any]] | None = field(default=None, repr=False)

    @property
    def client_commits(self) -> int:
        """Explicit COMMITs plus statements run in autocommit (each its own transaction)."""
        return self.commits + self.autocommit_statements

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        if not context["connection"].in_atomic_block:
            self.autocommit_statements += 1
        if self.log is not None:
            self.log.append(("sql", (sql, params)))
        start = perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.statement_seconds += perf_counter() - start
            if self.log is not None and not context["connection"].in_atomic_block:
                self.log.append(("commit", "autocommit"))  # its own implicit transaction


@contextmanager
def instrumented(log: bool = False) -> Iterator[Instruments]:
    """Count every statement Django executes (``execute_wrapper``) and every COMMIT.

    COMMIT and ROLLBACK do not pass through ``execute_wrapper`` (Django calls the driver's
    ``commit()``), so the connection's ``_commit``/``_rollback`` are wrapped here.
    """
    tools = Instruments(log=[] if log else None)
    connection.ensure_connection()
    real_commit, real_rollback = connection._commit, connection._rollback

    def commit():
        tools.commits += 1
        if tools.log is not None:
            tools.log.append(("commit", None))
        start = perf_counter()
        try:
            return real_commit()
        finally:
            tools.commit_seconds += perf_counter() - start

    def rollback():
        tools.rollbacks += 1
        return real_rollback()

    connection._commit, connection._rollback = commit, rollback
    try:
        with connection.execute_wrapper(tools):
            yield tools
    finally:
        del connection._commit, connection._rollback


# --- counting at the database ------------------------------------------------------------

# The FROM clause matters: without it, a backend whose only pending statistics were its
# transaction counters was seen (PostgreSQL 15.18) not to report them at the forced flush,
# so they landed in a later window; reading a table gives it a table statistic to report.
FLUSH = "SELECT pg_stat_force_next_flush() FROM pg_database WHERE datname = current_database()"
CLEAR = "SELECT pg_stat_clear_snapshot()"
READ = (
    "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), "
    "(SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables)"
)
PROBE_OVERHEAD = 3
"""Transactions two probes add between their readings: the first probe's reading
transaction and its closing flush, and the second probe's opening flush (all in
autocommit)."""


def xact_commit() -> tuple[int, int]:
    """Read this database's ``xact_commit`` and autovacuum count, fresh (PostgreSQL 15+).

    A backend reports its commits to the shared statistics when it goes idle, at most once
    a second unless told otherwise, so counts can land late, in another reading's window.
    The opening flush makes this backend report everything pending (its own commit
    included); the reading transaction drops any cached snapshot and reads the shared
    counters; the closing flush reports the reading transaction, so the connection leaves
    nothing pending behind. The second number counts how often autovacuum vacuumed or
    analysed a table here: its workers' commits are counted too.
    """
    with connection.cursor() as cursor:
        cursor.execute(FLUSH)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(CLEAR)
        cursor.execute(READ)
        commits, autovacuum = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute(FLUSH)
    return int(commits), int(autovacuum)


def blocks_hit() -> int:
    """This database's shared-buffer hits so far (``pg_stat_database.blks_hit``), fresh.

    Every page a statement touches is a hit (or a read): a lookup by an index touches a few,
    a sequential scan every page of the table, so hits per lifecycle show a bad plan.
    """
    with connection.cursor() as cursor:
        cursor.execute(FLUSH)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(CLEAR)
        cursor.execute(
            "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def vacuum_analyze() -> None:
    """VACUUM ANALYZE the whole (freshly migrated) database, in autocommit."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def wal_flushes() -> tuple[int, float]:
    """Return (wal_sync, wal_sync_time in ms) from ``pg_stat_wal``, fresh (server-wide).

    ``wal_sync_time`` stays 0 unless ``track_wal_io_timing`` is on (see
    :func:`track_wal_timing`).
    """
    with connection.cursor() as cursor:
        cursor.execute(FLUSH)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(CLEAR)
        cursor.execute("SELECT wal_sync, wal_sync_time FROM pg_stat_wal")
        syncs, ms = cursor.fetchone()
    return int(syncs), float(ms)


def track_wal_timing(on: bool = True) -> bool:
    """Time WAL flushes in this session (superuser only); return whether it worked."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET track_wal_io_timing = {'on' if on else 'off'}")
    except DatabaseError:
        return False
    return True


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a local process, from /proc (None if unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_cpu_seconds() -> float | None:
    """CPU seconds of the server process behind Django's connection (a local server only)."""
    connection.ensure_connection()
    return process_cpu_seconds(connection.connection.info.backend_pid)


def server_settings() -> dict[str, str]:
    names = (
        "server_version",
        "server_version_num",
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "full_page_writes",
        "commit_delay",
        "shared_buffers",
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f"current_setting('{n}')" for n in names))
        values = dict(zip(names, cursor.fetchone(), strict=True))
        cursor.execute("SELECT version()")
        values["version"] = cursor.fetchone()[0]
    return values


# --- counting on the wire ----------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    lifecycles: int
    round_trips: int
    begins: int
    commits: int


def wire_trace(work: Callable[[], object], lifecycles: int) -> Wire:
    """Run ``work`` under a libpq protocol trace; count round trips, BEGINs and COMMITs.

    A round trip ends with the server's ReadyForQuery message.
    """
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as trace:
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                work()
            finally:
                pgconn.untrace()
        lines = path.read_text().splitlines()
    fields = [line.split("\t") for line in lines]
    return Wire(
        lifecycles=lifecycles,
        round_trips=sum(1 for f in fields if f[0] == "B" and f[2] == "ReadyForQuery"),
        begins=sum(1 for f in fields if f[0] == "F" and f[2] == "Query" and "BEGIN" in f[3]),
        commits=sum(1 for f in fields if f[0] == "F" and f[2] == "Query" and "COMMIT" in f[3]),
    )


def plan_counts() -> list[tuple[int, int, str]]:
    """(generic plans, custom plans, start of text) of this connection's prepared ledger
    statements: the calls of the standalone functions (``SELECT recovery_lone_…``, ADR
    0049) and any data-modifying ``WITH``. PostgreSQL plans a prepared statement anew (a
    custom plan) at each of its first five executions, then keeps its generic plan unless
    that looks dearer than the custom plans' average: each custom plan is planning work at
    the server for that execution. The functions' own statements keep one generic plan per
    session whatever these counts say (``plan_cache_mode`` set on the function)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, left(statement, 60) "
            "FROM pg_prepared_statements WHERE statement LIKE 'WITH %%' "
            "OR statement LIKE 'SELECT recovery_lone%%' "
            "ORDER BY generic_plans + custom_plans DESC"
        )
        return [(int(g), int(c), text) for g, c, text in cursor.fetchall()]
