"""Recording a provider's answer across a dropped database connection (issue 12).

The provider answered and the worker holds the answer; the commit that records it
(``settle``) failed because the database connection died (the server restarted, a
proxy or an operator ended the session, the network blinked). That commit rolled back
as a whole, so nothing of it was written. The worker still holds the instance's lease
unless it ran out, and every write of the commit is fenced (ADR 0003), so making the
commit again on a fresh connection is safe: if another holder took over meanwhile, the
fence refuses it and nothing changes.

:class:`Reconnect` counts those attempts (``CONNECTION_RETRIES`` fresh connections,
``RETRY_PAUSE`` seconds apart and doubling, about 1.5 s in all — well inside a lease).
Only a lost lease or an exhausted retry leaves the step to the next holder, and then
the answer is kept as a late observation (``answers.late_answer_keep``).
"""

from __future__ import annotations

import logging
import time

from django.db import InterfaceError, OperationalError, connection

__all__ = ["CONNECTION_RETRIES", "DROPPED", "Reconnect"]

log = logging.getLogger("govflow.engine")

DROPPED = (OperationalError, InterfaceError)
"""What a dropped connection raises (psycopg's errors, as Django wraps them)."""

CONNECTION_RETRIES = 4
RETRY_PAUSE = 0.1


class Reconnect:
    """Fresh connections for one recording, while retries are left."""

    def __init__(self) -> None:
        self.dropped = 0

    def again(self, exc: Exception, what: str) -> bool:
        """After ``exc`` (a dropped connection): close it, pause, and say whether to try
        again. Never inside a caller's transaction: only the outermost commit can be
        made again."""
        if connection.in_atomic_block:
            return False
        self.dropped += 1
        if self.dropped > CONNECTION_RETRIES:
            log.error("instance %s: the database stayed unreachable (%s); giving up", what, exc)
            return False
        log.warning(
            "instance %s: the database connection was lost (%s); trying again on a fresh one",
            what,
            type(exc).__name__,
        )
        connection.close()  # the next statement opens a new one
        time.sleep(RETRY_PAUSE * 2 ** (self.dropped - 1))
        return True
