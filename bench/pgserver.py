"""The PostgreSQL server the benchmark runs against: DATABASE_URL, or a throwaway one.

A throwaway server is started with ``scripts/pg-server start DIR durable`` (fsync and
synchronous_commit stay on, so every commit waits for its WAL flush as in production) and
is stopped and removed when the benchmark ends, also when it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = ROOT / "scripts" / "pg-server"


class BenchSetupError(RuntimeError):
    """The benchmark could not set itself up (no server, wrong database)."""


@dataclass(frozen=True)
class Server:
    url: str
    origin: str
    local: bool
    """Started here: its processes are on this machine (their CPU time can be read)."""


@contextmanager
def postgres_server() -> Iterator[Server]:
    """Yield the server to benchmark; stop it afterwards if this function started it."""
    url = os.environ.get("DATABASE_URL", "")
    if url:
        if not url.startswith(("postgres://", "postgresql://")):
            raise BenchSetupError(
                "make bench measures PostgreSQL, but DATABASE_URL names another database. "
                "Unset DATABASE_URL to let the benchmark start a throwaway durable server, "
                "or point it at a PostgreSQL server (the user needs CREATEDB)."
            )
        yield Server(url, "DATABASE_URL from the environment", local=False)
        return
    parent = tempfile.mkdtemp(prefix="govflow-bench-")
    os.chmod(parent, 0o711)  # the server runs as 'postgres' when we are root
    server_dir = os.path.join(parent, "server")
    try:
        started = subprocess.run(
            [str(PG_SERVER), "start", server_dir, "durable"],
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in started.stdout.splitlines() if ln.startswith("DATABASE_URL=")]
        if started.returncode != 0 or not lines:
            raise BenchSetupError(
                "scripts/pg-server could not start a PostgreSQL server:\n"
                f"{started.stderr.strip()}\nInstall Debian's 'postgresql' package or set "
                "DATABASE_URL to a server."
            )
        yield Server(
            lines[-1].removeprefix("DATABASE_URL="),
            f"throwaway server, scripts/pg-server start {server_dir} durable",
            local=True,
        )
    finally:
        subprocess.call(
            [str(PG_SERVER), "stop", server_dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(parent, ignore_errors=True)
