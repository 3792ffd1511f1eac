"""Server counters for one scenario database: commits, transaction ids, WAL flushes and
bytes, and (with ``pg_stat_statements``) statements and their server time.

Each scenario gets databases of its own (GovFlow's cloned from a migrated template), so
``pg_stat_database`` and ``pg_stat_statements`` count one scenario's traffic only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.pgserver import Server
from scripts.procgroup import stat_fields

from .procs import cpu_seconds


@dataclass(frozen=True)
class Counters:
    """Server counters for one database at one moment."""

    xact_commit: int
    xid: int
    """The next transaction id: its growth counts transactions that wrote something."""
    wal_sync: int
    statements: int
    begin_commit: int
    """Of ``statements``: BEGIN, COMMIT and ROLLBACK."""
    exec_ms: float
    """Server time planning and executing those statements (pg_stat_statements; planning
    counted where ``track_planning`` is on, as on a server the bench starts), wall-clock:
    it includes waits for locks, the disk and a CPU, and a COMMIT statement's WAL flush."""
    server_cpu: float = 0.0
    """CPU seconds used by all the server's processes so far (0 when it runs elsewhere)."""
    wal_bytes: int = 0
    """WAL written so far, server-wide (pg_stat_wal): every new row version, index entry
    and full-page image counts, so it shows what a step costs the server's storage."""


def counters(server: Server, database: str) -> Counters:
    with server.connect() as conn:
        commit = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database]
        ).fetchone()[0]
        xid = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0]
        wal_sync, wal_bytes = conn.execute("SELECT wal_sync, wal_bytes FROM pg_stat_wal").fetchone()
    statements = begin_commit = exec_ms = 0
    if server.statements:
        with server.connect() as conn:
            statements, begin_commit, exec_ms = conn.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(calls) FILTER (WHERE "
                "upper(left(ltrim(query), 5)) IN ('BEGIN', 'COMMI', 'ROLLB')), 0), "
                "coalesce(sum(total_exec_time + total_plan_time), 0) "
                "FROM pg_stat_statements WHERE dbid = "
                "(SELECT oid FROM pg_database WHERE datname = %s)",
                [database],
            ).fetchone()
    return Counters(
        int(commit),
        int(xid),
        int(wal_sync),
        int(statements),
        int(begin_commit),
        float(exec_ms),
        server_cpu(server),
        int(wal_bytes),
    )


def server_cpu(server: Server) -> float:
    """CPU seconds of a server started here: the postmaster's own and its exited
    children's (it reaps them), and its live children's (backends, WAL writer,
    checkpointer, autovacuum). Every database's work counts: a scenario runs alone."""
    postmaster = server.postmaster()
    if postmaster is None:
        return 0.0
    total = sum(cpu_seconds(postmaster))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == postmaster:
                total += cpu_seconds(int(entry.name))[0]
    return total


def top_statements(
    server: Server, database: str, limit: int = 12
) -> list[tuple[int, int, float, str]]:
    """The statements in ``database`` that cost the server most: calls, plans (0 unless
    ``pg_stat_statements.track_planning`` is on), milliseconds of planning and execution
    in all, shortened text; the costliest first."""
    if not server.statements:
        return []
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT calls, plans, total_plan_time + total_exec_time, "
            "regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) "
            "ORDER BY 3 DESC LIMIT %s",
            [database, limit],
        ).fetchall()
    return [(int(calls), int(plans), float(ms), text) for calls, plans, ms, text in rows]


def machine_ticks() -> tuple[int, int]:
    """(steal, all) CPU ticks of the whole machine so far (``/proc/stat``; (0, 0) where
    there is none). Steal is time the hypervisor gave this virtual machine's CPUs to
    someone else while they had work: a run that suffered much of it is slower for reasons
    that are not the engine's."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    return fields[7], sum(fields)


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The share of the machine's CPU time stolen between two :func:`machine_ticks`."""
    ticks = after[1] - before[1]
    return (after[0] - before[0]) / ticks if ticks > 0 else None
