"""An external effect store outside the engine's database transaction (a separate SQLite
file), plus switches tests use to steer the actions, in-process or through files."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from django.conf import settings

# In-process steering: action name -> list of scripted outcomes (consumed in order).
SCRIPT: dict[str, list] = {}


def store_path() -> Path:
    return Path(
        os.environ.get("ALPHA_STORE")
        or getattr(settings, "ALPHA_STORE", "")
        or Path(settings.VAR_DIR) / "alpha-effects.sqlite3"
    )


def _connect(path: Path | None = None) -> sqlite3.Connection:
    path = path or store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    # WAL is kept in the file: switched once, when the store is made (``store_create``).
    # Switching takes the file alone and does not wait for a busy one ("database is
    # locked" at once), so connections to a made store only read the mode.
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, action TEXT, "
        "data TEXT, calls INTEGER DEFAULT 1)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT, action TEXT, phase TEXT)")
    return conn


def store_create(path: Path) -> None:
    """Create the store (WAL mode, tables) before any worker opens it.

    Two processes or threads opening a brand-new file at the same moment can both try to
    switch it to WAL, and one gets "database is locked" at once (no busy wait): the action
    raises, and the engine rightly records an unknown outcome that the test did not ask
    for. (Run threads of one worker met there: three calls released together by a test's
    barrier, ``test_run_pool``.)
    """
    _connect(path).close()


def apply_effect(key: str, action: str, data: dict) -> bool:
    """Do the effect once per idempotency key; a duplicate is harmless. True if new."""
    with _connect() as conn:
        conn.execute("INSERT INTO calls VALUES (?, ?, 'execute')", (key, action))
        cur = conn.execute(
            "INSERT OR IGNORE INTO effects (key, action, data) VALUES (?, ?, ?)",
            (key, action, json.dumps(data, sort_keys=True)),
        )
        if cur.rowcount == 0:
            conn.execute("UPDATE effects SET calls = calls + 1 WHERE key = ?", (key,))
            return False
        return True


def effect_exists(key: str) -> bool:
    with _connect() as conn:
        return conn.execute("SELECT 1 FROM effects WHERE key = ?", (key,)).fetchone() is not None


def effects(action: str | None = None) -> list[tuple[str, str, int]]:
    with _connect() as conn:
        sql = "SELECT key, action, calls FROM effects"
        rows = conn.execute(
            sql + (" WHERE action = ?" if action else ""), (action,) if action else ()
        ).fetchall()
    return rows


def call_count(action: str | None = None) -> int:
    with _connect() as conn:
        sql = "SELECT COUNT(*) FROM calls" + (" WHERE action = ?" if action else "")
        return conn.execute(sql, (action,) if action else ()).fetchone()[0]


def reset(*, create: bool = False) -> None:
    """Remove the store and the scripted outcomes; with ``create``, make the store anew
    at once (``store_create``), before any call opens it."""
    path = store_path()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    SCRIPT.clear()
    if create:
        store_create(path)


def pause_point(name: str) -> None:
    """Block while the file ``$ALPHA_PAUSE_DIR/<name>`` exists (cross-process steering).

    Adds a line to ``<name>.reached`` first (its process id), one per call parked, so a
    test knows how many are parked right here.
    """
    folder = os.environ.get("ALPHA_PAUSE_DIR")
    if not folder:
        return
    flag = Path(folder) / name
    if flag.exists():
        with (Path(folder) / f"{name}.reached").open("a") as reached:
            reached.write(f"{os.getpid()}\n")
        while flag.exists():
            time.sleep(0.05)


def pause_after_demo_registration() -> None:
    """In a process test's workers, park right after the demo registry registered an
    application (pause point ``demo_registered``), before the engine records the answer.

    Only where ``ALPHA_PAUSE_DIR`` is set (the clusters a process test starts): the demo
    module stays as it is everywhere else.
    """
    if not os.environ.get("ALPHA_PAUSE_DIR"):
        return
    from govflow.demo import store

    original = store.application_register

    def registered(**kwargs):
        record = original(**kwargs)
        pause_point("demo_registered")
        return record

    store.application_register = registered


def pause_after_dataflow_start() -> None:
    """In a process test's workers, park right after the Dataflow module created a run
    (pause point ``dataflow_started``), before the engine records the start's answer.

    Only where ``ALPHA_PAUSE_DIR`` is set, as :func:`pause_after_demo_registration`.
    """
    if not os.environ.get("ALPHA_PAUSE_DIR"):
        return
    from govflow.demo.dataflow import services

    original = services.run_start

    def started(**kwargs):
        run = original(**kwargs)
        pause_point("dataflow_started")
        return run

    services.run_start = started
