"""The queries that look steps and operations up still find an index (ADR 0046).

The state indexes of ``engine_token`` and ``recovery_operation`` hold active steps and
unsettled operations only, and ``engine_token`` lost its single-column ``instance_id``
index. On a table shaped like a long-running deployment's (most steps completed, most
operations succeeded, a few of each kind still waiting), PostgreSQL's plan for each
look-up the engine makes periodically or per step must scan the intended index: a
sequential scan of either table would cost the sweep or a step time that grows with the
history. The plans are PostgreSQL's, where these tables grow: SQLite is the embedded
development database, and its planner is not the one a deployment runs.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.utils import timezone

from govflow.api.selectors import handoffs
from govflow.engine.models import Instance, Token
from govflow.engine.services import sweep
from govflow.engine.states import TOKEN_ACTIVE
from govflow.handoffs.batches import uncertain_steps
from recovery.models import Operation
from recovery.services.dispatch_write import _BLOCKING
from tests.engine_helpers import publish
from tests.flows import linear

pytestmark = pytest.mark.django_db

ENDED = 20_000  # instances whose five steps all completed
PARKED = 2_000  # instances waiting for a person (four steps completed, one waiting)
FEW = 10  # instances (and operations) of each active kind


@pytest.fixture
def history():
    """A deployment's tables after months: ~110,000 steps and ~100,000 operations."""
    if connection.vendor != "postgresql":
        pytest.skip("the plans of a deployment's tables are PostgreSQL's (SQLite: development)")
    definition = publish(linear(key="tests.index_plans"))
    with connection.cursor() as cursor:
        _instances(cursor, definition, "completed", ENDED)
        _instances(cursor, definition, "waiting", PARKED)
        for status in ("running", "blocked"):
            _instances(cursor, definition, status, 3 * FEW)
        _steps(cursor)
        _operations(cursor)
        cursor.execute("ANALYZE engine_instance")
        cursor.execute("ANALYZE engine_token")
        cursor.execute("ANALYZE recovery_operation")


def _instances(cursor, definition, status: str, count: int) -> None:
    cursor.execute(
        "INSERT INTO engine_instance (definition_id, definition_fp, tenant, variables, access, "
        'status, reason, contracts, next_ordinal, "case", case_text, created_at, updated_at, '
        "wakeups) SELECT %s, %s, 'default', '{}', '{}', %s, '', '', 6, '[]', '', now(), now(), "
        "0 FROM generate_series(1, %s)",
        [definition.pk, definition.fingerprint, status, count],
    )


def _steps(cursor) -> None:
    """Five completed steps per ended instance; four completed and one waiting per parked
    one; the running and blocked instances' last steps ready, executing, polling or of
    unknown outcome, ``FEW`` of each."""
    cursor.execute(
        "INSERT INTO engine_token (instance_id, node_id, ordinal, state, attempt, poll, "
        "wait_kind, wait_key, operation_key, idempotency_key, reason, created_at, updated_at) "
        "SELECT i.id, 'n' || o, o, CASE WHEN o < 5 OR i.status = 'completed' THEN 'completed' "
        "WHEN i.status = 'waiting' THEN 'waiting' WHEN i.status = 'blocked' "
        "THEN 'outcome_unknown' ELSE (ARRAY['ready', 'executing', 'ready'])[i.id %% 3 + 1] END, "
        "1, 0, CASE WHEN o < 5 OR i.status = 'completed' THEN '' WHEN i.status = 'waiting' "
        "THEN 'approval' WHEN i.status = 'blocked' THEN 'reconcile' WHEN i.id %% 3 = 2 "
        "THEN 'poll' ELSE '' END, '', 'op-' || i.id || '-' || o, '', '', now(), now() "
        "FROM engine_instance i, generate_series(1, 5) o",
        [],
    )
    cursor.execute(
        "UPDATE engine_token SET not_before = now() + interval '1 hour' "
        "WHERE wait_kind IN ('poll', 'reconcile')"
    )


def _operations(cursor) -> None:
    """One operation per ended instance's steps (succeeded), and ``FEW`` dispatched, of
    unknown outcome and pending."""
    cursor.execute(
        "INSERT INTO recovery_operation (key, subject_type, subject_id, step_id, action, "
        "recovery_mode, definition_fp, input_fp, preview_fp, access_fp, idempotency_fp, "
        "result_fp, lease_key, fence, ordinal, state, revision, chain_seq, recorded_at, "
        "updated_at) SELECT 'op-' || g, 'govflow.instance', (g / 5)::text, 'n' || g %% 5, "
        "'alpha.write', 'non_atomic', 'd', 'i', 'p', 'a', md5(g::text), '', 'lease', 1, 1, "
        "CASE WHEN g <= %s THEN 'dispatched' WHEN g <= %s THEN 'outcome_unknown' "
        "WHEN g <= %s THEN 'pending' ELSE 'succeeded' END, 1, g, now(), now() "
        "FROM generate_series(1, %s) g",
        [FEW, 2 * FEW, 3 * FEW, 5 * ENDED],
    )


def plan(sql: str, params=()) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        return _loaded(cursor)


def _loaded(cursor) -> dict:
    raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def scans(node: dict) -> list[tuple[str, str, str]]:
    """Every scan of the plan: (node type, table, index)."""
    found = []
    if "Relation Name" in node or "Index Name" in node:
        found.append((node["Node Type"], node.get("Relation Name", ""), node.get("Index Name", "")))
    for child in node.get("Plans", []):
        found.extend(scans(child))
    return found


def queryset_plan(queryset) -> dict:
    sql, params = queryset.query.sql_with_params()
    return plan(sql, params)


def _in(values) -> str:
    return ", ".join("%s" for _ in values)


def _plans(user) -> dict[str, tuple[dict, str, str]]:
    """Each look-up: its plan, the table it reads and the index it must scan."""
    running = Instance.objects.filter(status="running").values_list("pk", flat=True).first()
    active = sorted(str(state) for state in TOKEN_ACTIVE)
    token_run = "SELECT id FROM engine_token WHERE instance_id = %s AND state IN ("
    guard = "SELECT 1 FROM recovery_operation WHERE idempotency_fp = %s AND state IN ("
    return {
        # Every sweep pass: runnable work of instances nobody marked (ADR 0042).
        "sweep's runnable steps": (
            queryset_plan(sweep._unmarked_with_work(200).build(timezone.now())),
            "engine_token",
            "engine_token_due",
        ),
        # REST API: GET /handoffs (unknown outcomes and pending providers), newest first.
        "API handoffs": (
            queryset_plan(handoffs(None).order_by("-id")[:50]),
            "engine_token",
            "engine_token_due",
        ),
        # The desk's uncertain steps (batches, the queue's "Outcome unknown").
        "desk's unknown outcomes": (
            queryset_plan(uncertain_steps(user)),
            "engine_token",
            "engine_token_due",
        ),
        # The desk's waiting approvals and a message's hand-over to its waiting step.
        "waiting approvals": (
            queryset_plan(Token.objects.filter(state="waiting", wait_kind="approval")),
            "engine_token",
            "engine_token_wait",
        ),
        # Every run: its instance's active steps (load.load_run); by instance, the steps
        # page, the cascade and the per-instance reads: the (instance, ordinal) prefix.
        "a run's active steps": (
            plan(f"{token_run}{_in(active)})", [running, *active]),
            "engine_token",
            "engine_token_ordinal",
        ),
        "an instance's steps": (
            queryset_plan(Token.objects.filter(instance_id=running).order_by("ordinal")),
            "engine_token",
            "engine_token_ordinal",
        ),
        # Operators: the ledger's operations in flight or of unknown outcome (admin filter).
        "dispatched operations": (
            queryset_plan(Operation.objects.filter(state="dispatched")),
            "recovery_operation",
            "recovery_op_unsettled",
        ),
        "operations of unknown outcome": (
            queryset_plan(Operation.objects.filter(state="outcome_unknown")),
            "recovery_operation",
            "recovery_op_unsettled",
        ),
        # Every dispatch: no unsettled operation of the same effect (inside its INSERT).
        "dispatch guard": (
            plan(f"{guard}{_in(_BLOCKING)})", ["0" * 64, *_BLOCKING]),
            "recovery_operation",
            "recovery_op_idempotency",
        ),
        # Every settle: the operation by its key (unique constraint, no _like index).
        "operation by key": (
            queryset_plan(Operation.objects.filter(key="op-77")),
            "recovery_operation",
            "recovery_operation_key",
        ),
    }


def test_every_periodic_and_per_step_look_up_scans_its_index(history, django_user_model):
    admin = django_user_model.objects.create_superuser("plans", password="x")
    missed = {}
    for name, (found, table, index) in _plans(admin).items():
        used = scans(found)
        if ("Seq Scan", table, "") in used or index not in {i for _, _, i in used}:
            missed[name] = (index, used)
    assert not missed, missed
