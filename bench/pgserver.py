"""The PostgreSQL server the benchmarks run on: one throwaway durable server, or DATABASE_URL.

Used by ``bench/run.py`` (``make bench``) and by each benchmark run on its own
(``bench/ledger.py``, ``bench/engine_vs_dbos.py``). :func:`postgres_server` yields, in
this order of preference:

1. the server ``make bench`` started for all its benchmarks: ``DATABASE_URL`` and
   ``GOVFLOW_BENCH_SERVER_DIR`` (its folder) are set by ``bench/run.py`` for the
   benchmark it runs; left running, as ``bench/run.py`` stops it;
2. the server ``DATABASE_URL`` names (PostgreSQL; the user needs CREATEDB);
3. a throwaway one, started with ``scripts/pg-server start DIR durable`` (fsync and
   synchronous_commit stay on: every commit waits for its WAL flush, as in production)
   and stopped and removed when the benchmark ends, also when it fails.

A server started here (1 or 3) is *local*: its processes run on this machine, so their CPU
time can be read from /proc. ``statements=True`` asks for ``pg_stat_statements``: on a
local server it is preloaded with ``ALTER SYSTEM`` and one restart (the ledger benchmark,
run first by ``make bench``, does not ask, so it measures without it).
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

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = ROOT / "scripts" / "pg-server"
SHARED_DIR = "GOVFLOW_BENCH_SERVER_DIR"
"""Environment variable naming the folder of the server ``bench/run.py`` started."""


class BenchSetupError(RuntimeError):
    """The benchmark could not set itself up (no server, wrong database, no DBOS)."""


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class Server:
    url: str
    origin: str
    directory: str | None = None
    """The server's folder (``scripts/pg-server``'s DIR) when it was started here."""
    statements: bool = False
    """pg_stat_statements is loaded: statements are counted by the server."""
    notes: list[str] = field(default_factory=list)

    @property
    def local(self) -> bool:
        """Started here: its processes are on this machine (their CPU time can be read)."""
        return self.directory is not None

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


def _statements_loaded(server: Server) -> bool:
    with server.connect() as conn:
        return "pg_stat_statements" in conn.execute("SHOW shared_preload_libraries").fetchone()[0]


def _enable_statements(server: Server) -> None:
    """Preload pg_stat_statements on a server started here (one restart, if not yet)."""
    pg_bin = _pg_bin()
    if pg_bin is None or server.directory is None:
        return
    if not _statements_loaded(server):
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
        # Count planning too: a prepared statement the server plans anew at every execution
        # (a custom plan) shows as plans per call near 1 (ADR 0049).
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
        conn.execute("SELECT pg_reload_conf()")
    server.statements = True


def _try_external_statements(server: Server) -> None:
    try:
        if _statements_loaded(server):
            with server.connect() as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            server.statements = True
    except psycopg.Error:
        server.statements = False
    if not server.statements:
        server.notes.append(
            "pg_stat_statements is not preloaded on the DATABASE_URL server: statements "
            "are counted in-process (CaptureQueriesContext) for one instance only."
        )


def _check_url(url: str) -> None:
    if not url.startswith(("postgres://", "postgresql://")):
        raise BenchSetupError(
            "The benchmarks measure PostgreSQL, but DATABASE_URL names another database. "
            "Unset DATABASE_URL to let the benchmark start a throwaway durable server, or "
            "point it at a PostgreSQL server (the user needs CREATEDB)."
        )


@contextmanager
def postgres_server(*, statements: bool = False) -> Iterator[Server]:
    """Yield the server to benchmark on; stop it afterwards if this call started it."""
    url = os.environ.get("DATABASE_URL", "")
    shared = os.environ.get(SHARED_DIR, "")
    if url and shared:
        server = Server(
            url, f"throwaway durable server in {shared}, shared by make bench", directory=shared
        )
        if statements:
            _enable_statements(server)
        yield server
        return
    if url:
        _check_url(url)
        server = Server(url, "DATABASE_URL from the environment")
        if statements:
            _try_external_statements(server)
        yield server
        return
    parent = tempfile.mkdtemp(prefix="govflow-bench-")
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
                f"{(started.stderr or started.stdout).strip()[-2000:]}\n"
                "Install Debian's 'postgresql' package or set DATABASE_URL to a server."
            )
        server = Server(
            lines[-1].removeprefix("DATABASE_URL="),
            f"throwaway durable server, scripts/pg-server start {directory} durable",
            directory=directory,
        )
        if statements:
            _enable_statements(server)
        yield server
    finally:
        subprocess.run([str(PG_SERVER), "stop", directory], capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)


def shared_env(server: Server) -> dict[str, str]:
    """Environment for a benchmark process that is to run on ``server`` (see case 1)."""
    env = dict(os.environ, DATABASE_URL=server.url)
    env.pop(SHARED_DIR, None)
    if server.directory is not None:
        env[SHARED_DIR] = server.directory
    return env
