"""One server call per step on PostgreSQL, and the separate statements elsewhere: same rows.

The commit that records step k's outcome and step k+1's dispatch sends its ledger writes
as one call of ``recovery_observe_record`` on PostgreSQL (ADR 0031) and as separate
statements on SQLite, or on PostgreSQL inside ``recovery.api.multi_statement()``; the
engine's new step and instance row likewise go as one statement there (ADR 0044) and as
two inside ``separate_rows()``, which the separate path also enters. Random
step sequences (success, transient and permanent failure with retry, pending and poll,
outcome unknown with and without the effect, a step blocked before dispatch, atomic
steps, timers) run through both paths with the same instance id, and must leave identical
rows — instance, steps, ledger operations, checkpoints with their fingerprints and keyed
links, incidents — apart from ids and timestamps, and the same verified chain marks
(ADR 0034) in the worker's memory. A fixed sequence's rows are also
compared with a digest recorded here, the same on both databases: the two databases,
each on its own path, write the same chain.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import pytest
from django.db import connection, models
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from govflow.engine.models import Incident, Instance, KeptAnswer, Timer, Token
from govflow.engine.provider import Failed, Pending
from govflow.engine.registry import registry
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.engine.services.rows import separate_rows
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.sweep import SWEEPER
from govflow.engine.services.timers import timers_fire
from recovery import api, chain
from recovery.chain import mark_peek, marks_clear, marks_of
from recovery.models import Checkpoint, IntegrityIncident, Lease, Operation
from recovery.observations import Observation
from tests.engine_helpers import alpha_write
from tests.flows import _projection_recorded, action, linear
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)

# A provider without reconcile (its ladder would ask again on a timer of its own) and
# with long waits that the driver ends itself, so a sequence takes the same runs — and
# the same lease fences, which the chain records — every time.
STEADY = alpha_write(reconcile=None, retry_backoff=3600.0, retry_budget=2)
OUTCOMES = {
    "ok": None,
    "transient": Failed("busy", permanent=False),
    "permanent": Failed("refused", permanent=True),
    "pending": Pending(poll_after=3600),
    "unknown": "raise_after",
    "lost": "raise_before",
}
NODES = ("write", "write", "write", "note", "timer", "blocked")
_ids = itertools.count(1)


def _node(kind: str, number: int) -> dict[str, Any]:
    node_id = f"n{number}"
    if kind == "note":
        return action(node_id, name="alpha.note")
    if kind == "timer":
        return {"id": node_id, "type": "timer", "duration": "PT0S"}
    if kind == "blocked":  # its input needs a variable nobody sets: refused before dispatch
        return {**action(node_id), "input": {"value": "nobody.sets.this"}}
    return action(node_id)


def _definition(kinds: list[str], key: str, pk: int | None = None):
    nodes = [_node(kind, number) for number, kind in enumerate(kinds, 1)]
    if pk is not None:
        _next_id_is(pk, "engine_definition")
    return definition_publish(document=linear(*nodes, key=key, version=1))


def _next_id_is(pk: int, table: str = "engine_instance") -> None:
    """Make the next row of ``table`` get id ``pk`` (an instance's id is in its keys,
    nonces and chain subject; its definition's id in its projection)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)", [table, pk]
            )
        else:
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
            cursor.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, pk - 1]
            )


def _forget(pk: int) -> None:
    """Remove every row of instance ``pk``, so the other path starts from the same place."""
    _released.clear()
    where = {"subject_type": "govflow.instance", "subject_id": str(pk)}
    Observation.objects.filter(
        operation__subject_type=where["subject_type"], operation__subject_id=where["subject_id"]
    ).delete()
    Operation.objects.filter(**where).delete()
    Checkpoint.objects.filter(**where).delete()
    IntegrityIncident.objects.filter(**where).delete()
    Lease.objects.filter(key=f"instance:{pk}").delete()
    Instance.objects.filter(pk=pk).delete()
    marks_clear()  # as a fresh process: the other path's runs verify their chain whole too


def _values(queryset, *, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every column but ids, foreign keys and ``skip``; a time only as whether it is set."""
    fields = [
        f
        for f in queryset.model._meta.concrete_fields
        if not (f.primary_key or f.is_relation or f.name in skip)
    ]
    rows = []
    for row in queryset.values(*(f.attname for f in fields)):
        for f in fields:
            if isinstance(f, models.DateTimeField):
                row[f.attname] = row[f.attname] is not None
        rows.append(dict(row))
    return rows


def rows_of(pk: int) -> dict[str, Any]:
    """What both paths must agree on, without ids and timestamps."""
    where = {"subject_type": "govflow.instance", "subject_id": str(pk)}
    return {
        "instance": _values(Instance.objects.filter(pk=pk)),
        "tokens": _values(Token.objects.filter(instance_id=pk).order_by("ordinal", "id")),
        "timers": _values(
            Timer.objects.filter(instance_id=pk).order_by("id"), skip=("fire_fence",)
        ),
        "operations": _values(Operation.objects.filter(**where).order_by("id")),
        "checkpoints": _values(Checkpoint.objects.filter(**where).order_by("seq")),
        "integrity": _values(IntegrityIncident.objects.filter(**where)),
        "incidents": _values(Incident.objects.filter(instance_id=pk).order_by("kind", "message")),
        "kept": _values(KeptAnswer.objects.filter(instance_id=pk).order_by("operation_key")),
        # Where each run's verified mark stood when the commit that released its lease
        # forgot it, and where the marks of runs still holding one stand (ADR 0034): the
        # same verifications made.
        "marks": [
            *(place for subject, place in _released if subject.id == str(pk)),
            *marks_of(api.Subject("govflow.instance", str(pk))),
        ],
    }


_released: list[tuple[api.Subject, tuple[int, str]]] = []
"""Each run's mark as the commit releasing its lease forgot it (``chain.mark_forget``)."""


@pytest.fixture(autouse=True)
def marks_at_release(monkeypatch):
    forget = chain.mark_forget

    def noted(fence):
        mark = mark_peek(fence)
        if mark is not None:
            _released.append((mark.subject, (mark.seq, mark.link)))
        forget(fence)

    monkeypatch.setattr(chain, "mark_forget", noted)
    _released.clear()
    yield
    _released.clear()


def play(definition, outcomes: list[str], pk: int) -> dict[str, Any]:
    """Run one instance (id ``pk``) as far as it goes; return its rows."""
    effects.SCRIPT.clear()
    effects.SCRIPT["alpha.write"] = [OUTCOMES[o] for o in outcomes]
    _next_id_is(pk)
    instance = instance_start(definition=definition, variables={"value": "v1"})
    assert instance.pk == pk
    sweeper = api.lease_acquire(key=SWEEPER, holder="sweeper", ttl=60)
    try:
        for _ in range(12):
            # What time would do: back-offs, polls and timers fall due.
            Token.objects.filter(instance_id=pk, not_before__isnull=False).update(not_before=Now())
            Timer.objects.filter(instance_id=pk, state="scheduled").update(due_at=Now())
            fired = timers_fire(fence=sweeper)
            report = instance_run(instance_id=pk, worker="test-worker")
            if not (report.steps or report.more or fired):
                break
    finally:
        api.lease_release(fence=sweeper)
    _projection_recorded(Instance.objects.get(pk=pk))
    return rows_of(pk)


def both_paths(kinds: list[str], outcomes: list[str], *, pk: int, key: str) -> tuple[dict, dict]:
    """The same sequence through the one-call path and the separate statements."""
    with registry.override(STEADY):
        definition = _definition(kinds, key=key, pk=pk)
        one_call = play(definition, outcomes, pk)
        _forget(pk)
        with api.multi_statement(), separate_rows():
            separate = play(definition, outcomes, pk)
    return one_call, separate


@hypothesis_settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(NODES), min_size=1, max_size=6),
    outcomes=st.lists(st.sampled_from(sorted(OUTCOMES)), max_size=8),
)
def test_random_step_sequences_leave_the_same_rows_on_both_paths(kinds, outcomes):
    number = next(_ids)
    one_call, separate = both_paths(
        kinds, outcomes, pk=700_000 + number, key=f"tests.stepcall{number}"
    )
    for table in one_call:
        assert one_call[table] == separate[table], table


def test_a_chain_of_successes_is_one_call_per_step_on_postgresql():
    with registry.override(STEADY):
        definition = _definition(["write"] * 5, key="tests.stepcall.count")
        with CaptureQueriesContext(connection) as captured:
            play(definition, [], 690_001)
    sqls = [q["sql"] for q in captured.captured_queries]
    calls = sum("observe_record(" in sql for sql in sqls)
    tail = sum("recovery_tail_observe_record(" in sql for sql in sqls)
    # Steps 1-4 each end in the commit that dispatches the next: one call each, which
    # checks inside it that the rows past the run's mark are the ones it wrote (ADR 0051);
    # step 1's dispatch read and verified the chain and left the mark (ADR 0052).
    one_call = connection.vendor == "postgresql"
    assert (calls, tail) == ((4, 4) if one_call else (0, 0))


# The rows of FIXED, canonical and hashed. Both databases must give this digest: SQLite on
# its separate statements, PostgreSQL through the one call. It changes when what the engine
# records changes (a fact, a message, a variable) or the test chain key does; then record
# the new value from one database and see the other agree.
FIXED = (
    ["write", "write", "note", "timer", "write", "write", "write"],
    ["ok", "transient", "pending", "ok", "ok", "unknown"],
)
FIXED_DIGEST = "78daa8d48134a94fb65627f34007a4450cb58764e52fb008ba5d2cb22d8ecbcd"


def test_a_fixed_sequence_writes_the_same_chain_on_both_databases():
    one_call, separate = both_paths(*FIXED, pk=680_001, key="tests.stepcall.fixed")
    assert one_call == separate
    marks = one_call.pop("marks")  # memory, not rows: the digest is of what was written
    assert marks, "the runs verified the chain and kept their marks"
    rows = api.canonical_bytes(one_call)
    digest = hashlib.sha256(rows).hexdigest()
    assert digest == FIXED_DIGEST, (connection.vendor, rows.decode()[:4000])
