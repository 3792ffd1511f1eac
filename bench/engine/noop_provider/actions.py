"""``bench.noop``: a non-atomic action whose effect is nothing at all.

Non-atomic, so every step pays the engine's full price: the dispatch-boundary commit, the
provider call outside any transaction, and the settling commit.
"""

from __future__ import annotations

import threading

from bench.engine.govflow_db import EFFECTS_TABLE
from govflow.engine.provider import (
    ActionDefinition,
    Failed,
    Succeeded,
    Unknown,
    VerificationCheck,
)

SCHEMA = {"type": "object", "additionalProperties": True}


def _preview(data):
    return {}


def _execute(context):
    return Succeeded({})


def _reconcile(context):
    return Unknown("a no-op leaves nothing to look up")


NOOP = ActionDefinition(
    name="bench.noop",
    recovery_mode="non_atomic",
    title="Do nothing (benchmark)",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_execute,
    reconcile=_reconcile,
    checks=(VerificationCheck("nothing", "A no-op has no effect to look for."),),
    retry_budget=0,
    retry_backoff=1.0,
)


# -- bench.effect: an effect that can be counted (make chaos) ---------------------------

_store = threading.local()


def _effects():
    """The provider's own connection: one per thread (a worker runs several instances at
    once, each in a thread of its own), opened on first use in autocommit, so an effect
    is committed when its ``INSERT`` returns. (One connection shared by the threads, put
    into autocommit after it was opened, let a thread's ``INSERT`` begin a transaction in
    that gap that was never committed: a success the provider reported for an effect that
    was not there, found by ``make chaos`` as a phantom success.)"""
    import os

    import psycopg

    conn = getattr(_store, "conn", None)
    if getattr(_store, "pid", None) != os.getpid() or conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _store.pid, _store.conn = os.getpid(), conn
    return conn


def _effect_execute(context):
    _effects().execute(
        f"INSERT INTO {EFFECTS_TABLE} (key, instance_id, step_id) VALUES (%s, %s, %s)",
        (context.idempotency_key, context.instance_id, context.step_id),
    )
    return Succeeded({})


def _effect_reconcile(context):
    found = (
        _effects()
        .execute(f"SELECT 1 FROM {EFFECTS_TABLE} WHERE key = %s", (context.idempotency_key,))
        .fetchone()
    )
    if found:
        return Succeeded({})
    return Failed("no effect was made under this idempotency key")


EFFECT = ActionDefinition(
    name="bench.effect",
    recovery_mode="non_atomic",
    title="Make a countable effect (chaos benchmark)",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_effect_execute,
    reconcile=_effect_reconcile,
    checks=(VerificationCheck("row", "Look for the effect's row under its idempotency key."),),
    retry_budget=0,
    retry_backoff=1.0,
    reconcile_settles=True,
    reconcile_backoff=1.0,
)
