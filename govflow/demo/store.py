"""The demo municipal registry: an external system outside the engine's transaction.

It is a separate SQLite file (``settings.GOVFLOW_DEMO_STORE``, default
``VAR_DIR/demo-registry.sqlite3``) reached through its own ``sqlite3`` connection, so
a write here commits or not independently of the engine's database: exactly the kind of
effect the engine must never guess about. Every record is keyed by the provider
idempotency key the engine hands over, so a duplicate dispatch finds the first record
instead of writing a second one, and ``reconcile`` can look an effect up afterwards.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS applications (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    application_id TEXT UNIQUE,
    applicant TEXT NOT NULL,
    parcel_id TEXT NOT NULL,
    data TEXT NOT NULL,
    registered_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS payments (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    payment_reference TEXT UNIQUE,
    application_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'requested',
    polls INTEGER NOT NULL DEFAULT 0,
    requested_at TEXT NOT NULL,
    paid_at TEXT
);
CREATE TABLE IF NOT EXISTS refunds (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    refund_reference TEXT UNIQUE,
    payment_reference TEXT NOT NULL,
    application_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    refunded_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS parcel_restorations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    parcel_id TEXT NOT NULL,
    backup_ref TEXT NOT NULL,
    reason TEXT NOT NULL,
    restored_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS permits (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    permit_number TEXT UNIQUE,
    application_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    parcel_id TEXT NOT NULL,
    approval_ref TEXT NOT NULL,
    approved_by TEXT NOT NULL,
    issued_at TEXT NOT NULL
);
"""

# Polls of a payment request after which the demo "citizen" has paid, so a demo instance
# completes on its own.
PAID_AFTER_POLLS = 2


def finding(record: Mapping[str, Any] | None, found: str, missing: str) -> str:
    """An automatic check's answer: ``found`` filled from ``record``, or ``missing``."""
    return found.format(**record) if record else missing


def money(cents: int, currency: str) -> str:
    """An amount the store keeps in cents, as a person reads it ("EUR 120.00")."""
    return f"{currency} {cents // 100}.{cents % 100:02d}"


def store_path() -> Path:
    """Where the registry lives; read lazily so tests can point it at a temporary file."""
    configured = getattr(settings, "GOVFLOW_DEMO_STORE", None)
    return Path(configured) if configured else Path(settings.VAR_DIR) / "demo-registry.sqlite3"


def _now() -> str:
    # The registry's own clock: it is another system, not the engine's database.
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _connect() -> sqlite3.Connection:
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return conn


@contextlib.contextmanager
def _transaction() -> Iterator[sqlite3.Connection]:
    """One write transaction of the registry (``BEGIN IMMEDIATE``: writers queue)."""
    conn = _connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


def _one(table: str, key: str) -> dict[str, Any] | None:
    conn = _connect()
    try:
        row = conn.execute(f"SELECT * FROM {table} WHERE idempotency_key = ?", (key,)).fetchone()
    finally:
        conn.close()
    return dict(row) if row else None


def _numbered(conn, table: str, column: str, prefix: str, key: str) -> dict[str, Any]:
    """Give a freshly inserted row its human-readable number, then return the row."""
    year = dt.datetime.now(dt.UTC).year
    conn.execute(
        f"UPDATE {table} SET {column} = printf('%s-%d-%05d', ?, ?, seq) "
        f"WHERE idempotency_key = ? AND {column} IS NULL",
        (prefix, year, key),
    )
    row = conn.execute(f"SELECT * FROM {table} WHERE idempotency_key = ?", (key,)).fetchone()
    return dict(row)


# -- applications ----------------------------------------------------------------------


def application_register(
    *, key: str, applicant: str, parcel_id: str, data: dict[str, Any]
) -> dict[str, Any]:
    """Register an application once per idempotency key; a repeat returns the first one."""
    with _transaction() as conn:
        conn.execute(
            "INSERT OR IGNORE INTO applications (idempotency_key, applicant, parcel_id, data, "
            "registered_at) VALUES (?, ?, ?, ?, ?)",
            (key, applicant, parcel_id, json.dumps(data, sort_keys=True), _now()),
        )
        return _numbered(conn, "applications", "application_id", "BP", key)


def application_find(key: str) -> dict[str, Any] | None:
    return _one("applications", key)


# -- payments --------------------------------------------------------------------------


def payment_request(
    *, key: str, application_id: str, amount_cents: int, currency: str
) -> dict[str, Any]:
    """Create a payment request once per idempotency key (the citizen pays later)."""
    with _transaction() as conn:
        conn.execute(
            "INSERT OR IGNORE INTO payments (idempotency_key, application_id, amount_cents, "
            "currency, requested_at) VALUES (?, ?, ?, ?, ?)",
            (key, application_id, amount_cents, currency, _now()),
        )
        return _numbered(conn, "payments", "payment_reference", "PAY", key)


def payment_check(key: str) -> dict[str, Any] | None:
    """Look at a payment request; the demo citizen pays once it has been asked twice."""
    with _transaction() as conn:
        row = conn.execute("SELECT * FROM payments WHERE idempotency_key = ?", (key,)).fetchone()
        if row is None:
            return None
        if row["status"] == "requested":
            polls = row["polls"] + 1
            paid = polls >= PAID_AFTER_POLLS
            conn.execute(
                "UPDATE payments SET polls = ?, status = ?, paid_at = ? WHERE idempotency_key = ?",
                (polls, "paid" if paid else "requested", _now() if paid else None, key),
            )
            row = conn.execute(
                "SELECT * FROM payments WHERE idempotency_key = ?", (key,)
            ).fetchone()
        return dict(row)


def payment_mark_paid(key: str) -> bool:
    """What the payment provider's callback would do (tests and impatient demos)."""
    with _transaction() as conn:
        cur = conn.execute(
            "UPDATE payments SET status = 'paid', paid_at = ? "
            "WHERE idempotency_key = ? AND status = 'requested'",
            (_now(), key),
        )
        return cur.rowcount == 1


def payment_find(key: str) -> dict[str, Any] | None:
    return _one("payments", key)


def refund_make(
    *, key: str, payment_reference: str, application_id: str, amount_cents: int
) -> dict[str, Any]:
    """Refund a payment once per idempotency key (a repeat finds the first refund)."""
    with _transaction() as conn:
        conn.execute(
            "INSERT OR IGNORE INTO refunds (idempotency_key, payment_reference, application_id, "
            "amount_cents, refunded_at) VALUES (?, ?, ?, ?, ?)",
            (key, payment_reference, application_id, amount_cents, _now()),
        )
        return _numbered(conn, "refunds", "refund_reference", "REF", key)


def refund_find(key: str) -> dict[str, Any] | None:
    return _one("refunds", key)


# -- parcels and permits ---------------------------------------------------------------


def parcel_restore(*, key: str, parcel_id: str, backup_ref: str, reason: str) -> dict[str, Any]:
    """Restore a parcel record from a snapshot, once per idempotency key."""
    with _transaction() as conn:
        conn.execute(
            "INSERT OR IGNORE INTO parcel_restorations (idempotency_key, parcel_id, backup_ref, "
            "reason, restored_at) VALUES (?, ?, ?, ?, ?)",
            (key, parcel_id, backup_ref, reason, _now()),
        )
        row = conn.execute(
            "SELECT * FROM parcel_restorations WHERE idempotency_key = ?", (key,)
        ).fetchone()
        return dict(row)


def restoration_find(key: str) -> dict[str, Any] | None:
    return _one("parcel_restorations", key)


def permit_issue(
    *,
    key: str,
    application_id: str,
    holder: str,
    parcel_id: str,
    approval_ref: str,
    approved_by: str,
) -> dict[str, Any]:
    """Issue a permit once per idempotency key; a repeat returns the permit already issued."""
    with _transaction() as conn:
        conn.execute(
            "INSERT OR IGNORE INTO permits (idempotency_key, application_id, holder, parcel_id, "
            "approval_ref, approved_by, issued_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, application_id, holder, parcel_id, approval_ref, approved_by, _now()),
        )
        return _numbered(conn, "permits", "permit_number", "PERMIT", key)


def permit_find(key: str) -> dict[str, Any] | None:
    return _one("permits", key)


# -- reading for people ----------------------------------------------------------------


def records_for(application_id: str) -> dict[str, list[dict[str, Any]]]:
    """Everything the registry holds about one application (for ``demo_status``)."""
    conn = _connect()
    try:
        return {
            table: [
                dict(r)
                for r in conn.execute(
                    f"SELECT * FROM {table} WHERE application_id = ? ORDER BY seq",
                    (application_id,),
                )
            ]
            for table in ("applications", "payments", "refunds", "permits")
        }
    finally:
        conn.close()


def count(table: str) -> int:
    if table not in {"applications", "payments", "refunds", "parcel_restorations", "permits"}:
        raise ValueError(f"no registry table {table!r}")
    conn = _connect()
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()
