"""The database clock, as the lease services read it, for tests that wait for an expiry."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.db import connection, connections

from recovery.db import dialect
from recovery.models import Lease


def db_now() -> datetime:
    """Return the database's current time, read with the same expression the leases use."""
    with connection.cursor() as cursor:
        # An empty parameter list makes the backend unescape the '%%' of SQLite's strftime.
        cursor.execute(f"SELECT {dialect().now}", [])
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM:SS.SSS' in UTC
        value = datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value


def wait_until_expired(key: str, *, timeout: float = 10.0) -> datetime:
    """Poll until the database clock has passed the lease's expiry; return that clock."""
    expires_at = Lease.objects.get(key=key).expires_at
    assert expires_at is not None, f"lease {key!r} is released, not live"
    deadline = time.monotonic() + timeout
    while True:
        now = db_now()
        if now >= expires_at:
            return now
        assert time.monotonic() < deadline, f"lease {key!r} did not expire by the DB clock"
        time.sleep(min(0.02, max(0.001, (expires_at - now).total_seconds())))


def terminate_backend() -> None:
    """End this connection's server session from another connection (PostgreSQL)."""
    pid = connection.connection.info.backend_pid
    default = connections["default"]
    other = type(default)(dict(default.settings_dict), alias="killer")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            assert cursor.fetchone()[0]
    finally:
        other.close()
