"""Server counters for one scenario database: commits, transaction ids, WAL flushes and
(with ``pg_stat_statements``) statements and their server time.

Each scenario gets databases of its own (GovFlow's cloned from a migrated template), so
``pg_stat_database`` and ``pg_stat_statements`` count one scenario's traffic only.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pgserver import Server


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
    """Server time planning and executing those statements (pg_stat_statements)."""


def counters(server: Server, database: str) -> Counters:
    with server.connect() as conn:
        commit = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database]
        ).fetchone()[0]
        xid = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0]
        wal_sync = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]
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
        int(commit), int(xid), int(wal_sync), int(statements), int(begin_commit), float(exec_ms)
    )


def top_statements(server: Server, database: str, limit: int = 12) -> list[tuple[int, str]]:
    """The most frequent statements in ``database`` (calls, shortened text)."""
    if not server.statements:
        return []
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT calls, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) "
            "ORDER BY calls DESC LIMIT %s",
            [database, limit],
        ).fetchall()
    return [(int(calls), text) for calls, text in rows]
