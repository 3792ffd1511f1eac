"""DBOS Transact's side: its own virtual environment, worker processes, progress queries.

DBOS is installed only into ``bench/.venv-dbos`` (created on first use). The workers and
the enqueuer are subprocesses of :mod:`bench.engine.dbos_app` run by that interpreter;
this module (in GovFlow's environment) only starts them and reads the DBOS system
database with psycopg.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.pgserver import ROOT

from .procs import Group, WorkerDied

VENV = ROOT / "bench" / ".venv-dbos"
PYTHON = VENV / "bin" / "python"
APP = Path(__file__).resolve().parent / "dbos_app.py"
VERSION = "3.4.0"
STEPS = 5


def ensure_venv(log: Path) -> str:
    """Create ``bench/.venv-dbos`` with ``dbos==3.4.0`` unless it is there; return the version."""
    if not PYTHON.exists() or _installed() != VERSION:
        with open(log, "ab") as out:
            if not PYTHON.exists():
                subprocess.run(
                    ["python3.11", "-m", "venv", str(VENV)], check=True, stdout=out, stderr=out
                )
            subprocess.run(
                [str(PYTHON), "-m", "pip", "install", "--quiet", f"dbos=={VERSION}"],
                check=True,
                stdout=out,
                stderr=out,
            )
    installed = _installed()
    if installed != VERSION:
        raise RuntimeError(f"bench/.venv-dbos has dbos {installed!r}, not {VERSION}; see {log}")
    return installed


def _installed() -> str:
    if not PYTHON.exists():
        return ""
    found = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m; print(m.version('dbos'))"],
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() if found.returncode == 0 else ""


@dataclass(frozen=True)
class DbosSettings:
    worker_concurrency: int
    polling_interval_sec: float
    enqueue_threads: int

    def describe(self) -> str:
        return (
            f"Queue 'bench_queue' worker_concurrency={self.worker_concurrency}, "
            f"polling_interval_sec={self.polling_interval_sec:g}; executor_id fixed per "
            f"process (bench-w0, bench-w1, …); workflows enqueued by a DBOSClient with "
            f"{self.enqueue_threads} threads"
        )


class Workers:
    """``count`` DBOS worker processes, each in its own process group."""

    def __init__(self, *, url: str, count: int, settings: DbosSettings, tag: str, log_dir: Path):
        self.groups = [
            Group(
                f"dbos-{tag}-w{i}",
                [
                    str(PYTHON),
                    str(APP),
                    "worker",
                    url,
                    f"bench-w{i}",
                    str(settings.worker_concurrency),
                    str(settings.polling_interval_sec),
                ],
                env={"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
                cwd=ROOT,
                log=log_dir / f"dbos-{tag}-w{i}.log",
            )
            for i in range(count)
        ]

    def wait_ready(self, timeout: float = 90) -> None:
        for group in self.groups:
            group.wait_for_line("READY", timeout)

    def kill(self) -> None:
        for group in self.groups:
            group.kill()


def enqueue(url: str, prefix: str, count: int, threads: int, log: Path) -> float:
    """Enqueue ``count`` workflows from a separate DBOSClient process; return its seconds."""
    with open(log, "ab") as out:
        done = subprocess.run(
            [str(PYTHON), str(APP), "enqueue", url, prefix, str(count), str(threads)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            timeout=600,
        )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("ENQUEUED")]
    if done.returncode != 0 or not lines:
        raise WorkerDied(f"the DBOS enqueuer failed (status {done.returncode}); see {log}")
    return float(lines[0].split()[1])


class Progress:
    """Reads the DBOS system database; counts its own queries."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.queries = 0

    def close(self) -> None:
        self.conn.close()

    def statuses(self, prefix: str) -> dict[str, int]:
        self.queries += 1
        rows = self.conn.execute(
            "SELECT status, count(*) FROM dbos.workflow_status WHERE workflow_uuid LIKE %s "
            "GROUP BY status",
            [prefix + "-%"],
        ).fetchall()
        return {status: n for status, n in rows}

    def steps_done(self, prefix: str) -> int:
        self.queries += 1
        return self.conn.execute(
            "SELECT count(*) FROM dbos.operation_outputs WHERE workflow_uuid LIKE %s",
            [prefix + "-%"],
        ).fetchone()[0]

    def wait_done(self, prefix: str, count: int, *, timeout: float, groups=()) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            counts = self.statuses(prefix)
            if counts.get("SUCCESS", 0) + counts.get("ERROR", 0) >= count:
                return counts
            for group in groups:
                group.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {count} DBOS workflows: {counts}")
            time.sleep(0.2)

    def span(self, prefix: str) -> tuple[float, float]:
        """(first created, last completed) in epoch seconds, from the database."""
        first, last = self.conn.execute(
            "SELECT min(created_at), max(coalesce(completed_at, updated_at)) "
            "FROM dbos.workflow_status WHERE workflow_uuid LIKE %s",
            [prefix + "-%"],
        ).fetchone()
        return first / 1000, last / 1000

    def pending(self, prefix: str) -> list[str]:
        return [
            row[0]
            for row in self.conn.execute(
                "SELECT workflow_uuid FROM dbos.workflow_status WHERE workflow_uuid LIKE %s "
                "AND status = 'PENDING'",
                [prefix + "-%"],
            )
        ]

    def last_completed(self, ids: list[str]) -> float | None:
        if not ids:
            return None
        value = self.conn.execute(
            "SELECT max(coalesce(completed_at, updated_at)) FROM dbos.workflow_status "
            "WHERE workflow_uuid = ANY(%s)",
            [ids],
        ).fetchone()[0]
        return value / 1000 if value is not None else None

    def first_step_since(self, prefix: str, since: float) -> float | None:
        """Epoch seconds of the first step completed at or after ``since`` (epoch s)."""
        value = self.conn.execute(
            "SELECT min(completed_at_epoch_ms) FROM dbos.operation_outputs "
            "WHERE workflow_uuid LIKE %s AND completed_at_epoch_ms >= %s",
            [prefix + "-%", int(since * 1000)],
        ).fetchone()[0]
        return value / 1000 if value is not None else None

    def now(self) -> float:
        return float(
            self.conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
        )


def python_version() -> str:
    return (
        subprocess.run(
            [str(PYTHON), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        or sys.version.split()[0]
    )
