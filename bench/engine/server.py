"""The PostgreSQL server both engines run on, and the counters read from it.

``DATABASE_URL``, if set, names the server (the user needs CREATEDB); otherwise a
throwaway durable server is started with ``scripts/pg-server start DIR durable`` (fsync
and synchronous_commit on: every commit waits for its WAL flush, as in production) and
removed at the end, also on error. On a throwaway server ``pg_stat_statements`` is
preloaded (``ALTER SYSTEM`` and a restart), so statements are counted by the server.

Each scenario gets databases of its own (GovFlow's cloned from a migrated template), so
``pg_stat_database`` and ``pg_stat_statements`` count one scenario's traffic only.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parents[2]
PG_SERVER = ROOT / "scripts" / "pg-server"


class BenchSetupError(RuntimeError):
    """The benchmark could not set itself up (no server, no DBOS environment)."""


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class Server:
    url: str
    origin: str
    directory: str | None = None
    statements: bool = False
    """pg_stat_statements is loaded: statements are counted by the server."""
    notes: list[str] = field(default_factory=list)

    def connect(self, database: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(with_database(self.url, database), autocommit=True)

    def postmaster(self) -> int | None:
        """The server's main process id, when the server was started here."""
        if self.directory is None:
            return None
        try:
            return int(Path(self.directory, "data", "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def setting(self, name: str) -> str:
        with self.connect() as conn:
            return conn.execute(f"SHOW {name}").fetchone()[0]

    def reset_statements(self, database: str) -> None:
        """Forget ``database``'s pg_stat_statements entries (if counted at all)."""
        if not self.statements:
            return
        try:
            with self.connect() as conn:
                conn.execute(
                    "SELECT pg_stat_statements_reset(0, "
                    "(SELECT oid FROM pg_database WHERE datname = %s), 0)",
                    [database],
                )
        except psycopg.Error:  # not permitted: deltas stay right, the top list is wider
            pass

    def create_database(self, name: str, template: str | None = None) -> str:
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{suffix}')
        return with_database(self.url, name)


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1])
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _enable_statements(server: Server) -> None:
    """Preload pg_stat_statements on our own throwaway server (one restart)."""
    pg_bin = _pg_bin()
    if pg_bin is None or server.directory is None:
        return
    with server.connect() as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    # -l: the restarted server must not inherit our pipes (run() would wait for it).
    restarted = subprocess.run(
        _as_owner(
            [
                str(pg_bin / "pg_ctl"),
                *("-D", f"{server.directory}/data", "-l", f"{server.directory}/server.log"),
                *("-w", "-t", "60", "restart"),
            ]
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if restarted.returncode != 0:
        server.notes.append(f"pg_stat_statements not enabled: {restarted.stderr.strip()[:200]}")
        return
    with server.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    server.statements = True


def _try_external_statements(server: Server) -> None:
    try:
        with server.connect() as conn:
            loaded = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
            if "pg_stat_statements" in loaded:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                server.statements = True
    except psycopg.Error:
        server.statements = False
    if not server.statements:
        server.notes.append(
            "pg_stat_statements is not preloaded on the DATABASE_URL server: statements "
            "are counted in-process (CaptureQueriesContext) for one instance only."
        )


@contextmanager
def postgres_server() -> Iterator[Server]:
    """Yield the server to benchmark on; stop it afterwards if it was started here."""
    url = os.environ.get("DATABASE_URL", "")
    if url:
        if not url.startswith(("postgres://", "postgresql://")):
            raise BenchSetupError(
                "The engine benchmark needs PostgreSQL, but DATABASE_URL names another "
                "database. Unset it to let the benchmark start a throwaway durable server."
            )
        server = Server(url, "DATABASE_URL from the environment")
        _try_external_statements(server)
        yield server
        return
    parent = tempfile.mkdtemp(prefix="govflow-engine-bench-")
    os.chmod(parent, 0o711)  # the server runs as 'postgres' when we are root
    directory = os.path.join(parent, "server")
    try:
        started = subprocess.run(
            [str(PG_SERVER), "start", directory, "durable"], capture_output=True, text=True
        )
        lines = [ln for ln in started.stdout.splitlines() if ln.startswith("DATABASE_URL=")]
        if started.returncode != 0 or not lines:
            raise BenchSetupError(
                "scripts/pg-server could not start a PostgreSQL server:\n"
                + (started.stderr or started.stdout)[-2000:]
            )
        server = Server(
            lines[0].split("=", 1)[1],
            "throwaway durable server (scripts/pg-server … durable)",
            directory=directory,
        )
        _enable_statements(server)
        yield server
    finally:
        subprocess.run([str(PG_SERVER), "stop", directory], capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)


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
