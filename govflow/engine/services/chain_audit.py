"""The periodic chain audit, run by the sweeper (ADR 0038).

An instance's end verifies its whole chain (``writes.write_instance``), and every run's
first success does; nothing else reads a chain again by itself. A checkpoint changed after
its instance ended, or in an instance nobody runs any more, would wait for someone to run
``recovery_verify``. The sweeper therefore runs a pass of ``recovery.api.chain_audit`` at
most every ``GOVFLOW_CHAIN_AUDIT_INTERVAL`` seconds: the whole chains (with the anchors)
of at most ``GOVFLOW_CHAIN_AUDIT_SUBJECTS`` subjects that grew since the audit last
verified them; a broken one opens the integrity incident ``recovery_verify`` opens. Its
progress is kept in the database, so a restarted or another host's sweeper goes on where
the last pass stopped.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from django.db import DatabaseError

from recovery.api import (
    AnchorStoreError,
    AuditPass,
    ChainKeyError,
    RevisionRollback,
    chain_audit,
)

from ..conf import chain_audit_interval, chain_audit_settle, chain_audit_subjects

__all__ = ["chains_audit", "chains_audit_if_due", "chains_audit_schedule_reset"]

log = logging.getLogger("govflow.engine.sweep")

_last_pass = -math.inf
_due_lock = threading.Lock()


def chains_audit() -> AuditPass:
    """One audit pass with the configured bounds (owns its commits; outside any transaction)."""
    return chain_audit(subjects=chain_audit_subjects(), settle=chain_audit_settle())


def chains_audit_if_due() -> AuditPass | None:
    """The sweeper's audit: one pass at most every ``GOVFLOW_CHAIN_AUDIT_INTERVAL`` seconds,
    the next at once while passes find more waiting.

    Never raises for the anchor store or the database: the sweep must go on. Those are
    logged as errors and tried again after the interval. Returns the pass, or ``None``
    when none was due or it could not be made.
    """
    global _last_pass
    now = time.monotonic()
    with _due_lock:
        if now - _last_pass < chain_audit_interval():
            return None
        _last_pass = now
    try:
        result = chains_audit()
    except (AnchorStoreError, ChainKeyError, RevisionRollback, DatabaseError) as exc:
        log.error("the chain audit could not make its pass: %s", exc)
        return None
    if result.broken:
        log.error(
            "the chain audit found %d broken chain(s): %s",
            len(result.broken),
            ", ".join(f"{v.subject} (incident #{i.pk})" for v, i in result.broken),
        )
    if result.more:
        chains_audit_schedule_reset()
    return result


def chains_audit_schedule_reset() -> None:
    """Make the next :func:`chains_audit_if_due` due at once (tests, and a pass that found
    more waiting)."""
    global _last_pass
    with _due_lock:
        _last_pass = -math.inf
