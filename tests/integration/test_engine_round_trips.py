"""What a step costs on the wire: round trips and server transactions (PostgreSQL).

``test_engine_cost.py`` counts the statements Django sends. This reads what went over the
connection itself, from libpq's protocol trace: each ``ReadyForQuery`` ends one round trip,
and one whose status is ``I`` (idle) ends a server transaction (a ``COMMIT``, or a
statement in autocommit). A run's chained steps are one round trip and
one server transaction each: the step's one statement, sent alone as the whole commit, with
no ``BEGIN`` and no ``COMMIT`` (ADR 0051). PostgreSQL only: SQLite has no wire.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from django.db import connection
from psycopg import pq

from govflow.engine.db import engine_commit
from govflow.engine.models import Instance, InstanceStatus, Token
from govflow.engine.queue import instances_claim
from govflow.engine.services import instances
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from govflow.events.models import Event
from recovery import api
from recovery.models import Checkpoint, Lease
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)

TAIL = "recovery_tail_observe_record("


@dataclass
class ServerTransaction:
    statements: list[str] = field(default_factory=list)  # as sent: BEGIN, COMMIT, the SQL
    round_trips: int = 0
    parameters: list[int] = field(default_factory=list)  # of each statement sent with some


def server_transactions(trace: str) -> list[ServerTransaction]:
    """The trace cut at each ``ReadyForQuery I``; a prepared statement's executions are
    named by the text it was parsed with. psycopg's round trip that prepares a statement
    (once per connection and text) is left out."""
    named: dict[str, str] = {}
    unnamed = ""
    done: list[ServerTransaction] = []
    current = ServerTransaction()
    for line in trace.splitlines():
        direction, _, message, *rest = line.split("\t")
        detail = rest[0].strip() if rest else ""
        if direction == "F" and message == "Query":
            current.statements.append(detail.strip('"'))
        elif direction == "F" and message == "Parse":
            name, text = re.match(r'"([^"]*)" "(.*)" \d+', detail, re.S).groups()
            named[name] = text
            unnamed = text if not name else unnamed
        elif direction == "F" and message == "Bind":
            name, count = re.match(r'"[^"]*" "([^"]*)" (\d+)', detail).groups()
            current.statements.append(named[name] if name else unnamed)
            current.parameters.append(int(count))
        elif direction == "B" and message == "ReadyForQuery":
            current.round_trips += 1
            if detail == "I" and not current.statements:
                # psycopg preparing a statement it saw before (Parse, Sync): once per
                # connection and statement text, no transaction
                current = ServerTransaction()
            elif detail == "I":
                done.append(current)
                current = ServerTransaction()
    assert not current.statements, "the trace ended inside a server transaction"
    return done


@contextmanager
def traced() -> Iterator[list[ServerTransaction]]:
    """libpq's trace of the default connection while the block runs, parsed at its end
    (on a fresh connection: every statement's text is in the trace, none prepared before)."""
    connection.close()
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    parsed: list[ServerTransaction] = []
    with tempfile.TemporaryFile() as file:
        pgconn.trace(file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield parsed
        finally:
            pgconn.untrace()
        file.seek(0)
        parsed += server_transactions(file.read().decode("utf-8", "replace"))


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("round trips are PostgreSQL's; SQLite runs in the process")


def five_steps(settings, instance=None):
    """The server transactions of a run of five non-atomic steps (the start node run
    before it), and the instance."""
    instance = instance or start(linear(*(action(f"s{i}") for i in range(1, 6))))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with traced() as transactions:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 5 and report.status == InstanceStatus.COMPLETED
    return transactions


def test_a_runs_chained_steps_are_one_round_trip_each(settings):
    transactions = five_steps(settings)
    chained = [t for t in transactions if any(TAIL in sql for sql in t.statements)]
    # Steps 1 to 4 succeed and dispatch the next step: each is its one statement alone,
    # no BEGIN, no COMMIT, one round trip. Step 1's dispatch read and verified the chain
    # where it needed only the head, so the run's mark covers it (ADR 0052): no step reads
    # the chain, and nothing reads the head alone.
    assert len(chained) == 4, transactions
    sent = [sql for t in transactions for sql in t.statements]
    assert not any(sql.startswith("SELECT seq, link FROM") for sql in sent), sent
    # The chain is read once, by step 1's dispatch: the ending compares it (ADR 0076).
    assert sum("FROM recovery_checkpoint" in sql and "UNION ALL" in sql for sql in sent) == 1
    for transaction in chained:
        assert transaction.round_trips == 1, transaction
        assert len(transaction.statements) == 1, transaction
        # psycopg converts a statement's %s placeholders once and caches the result only
        # for statements of at most 50 parameters; above that it parses the SQL again at
        # every step (migration 0018 packs the call's values for this).
        assert transaction.parameters[0] <= 50, transaction.parameters
    # The ending: one statement alone, no BEGIN, no COMMIT (ADR 0076): step 5's move, the
    # instance row and the instance.completed event in front of the observation's call,
    # which compares the whole chain instead of reading it and releases the lease. No
    # look for a stuck branch (the load found none). It was eight round trips, then six.
    ending = transactions[-1]
    assert ending.round_trips == 1, ending
    [sql] = ending.statements
    assert "recovery_tail_observe(" in sql and 'INSERT INTO "events_event"' in sql, sql
    assert max(ending.parameters) <= 50, ending.parameters
    total = sum(t.round_trips for t in transactions)
    print(f"\n5 non-atomic steps: {total} round trips in {len(transactions)} server transactions")
    for number, transaction in enumerate(transactions, 1):
        first = transaction.statements[0][:60] if transaction.statements else "(none)"
        print(f"  {number}: {transaction.round_trips} round trips, {first!r}")


def test_a_claimed_runs_first_commit_hands_over_and_loads_in_one_statement():
    document = linear(action("s1"), action("s2"))
    instance_run(instance_id=start(document).pk)  # its definition read once, then cached
    instance = start(document)
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    with traced() as transactions:
        report = instance_run(instance_id=instance.pk, claim=claim)
    assert report.status == InstanceStatus.COMPLETED
    # BEGIN; the lease handed over with the instance, its definition's stored bytes, the
    # load's answers and its active steps; the chain's read; the start node's rows with
    # step 1's dispatch; COMMIT. The handover and the load were three statements (ADR 0060).
    first = transactions[0]
    assert first.round_trips == 5, first
    # Then step 1's success with step 2's dispatch alone, and the ending (ADR 0059).
    assert [t.round_trips for t in transactions] == [5, 1, 1], transactions
    # The first dispatch joins the start node's rows to the operation's insert, whose
    # values go as one JSON parameter: within the 50 whose conversion psycopg caches.
    assert max(first.parameters) <= 50, first.parameters
    print(f"\nfirst commit's statements' parameters: {first.parameters}")
    assert first.statements[1].startswith("WITH handed AS (UPDATE recovery_lease"), first
    assert "UNION ALL" in first.statements[1] and '"engine_token"' in first.statements[1]
    assert Lease.objects.get(key=f"instance:{instance.pk}").holder != "pusher-1"


def test_inside_multi_statement_every_commit_is_a_transaction(settings):
    with api.multi_statement():
        transactions = five_steps(settings)
    assert not any(TAIL in sql for t in transactions for sql in t.statements)
    # Each server transaction is BEGIN … COMMIT (the lease's standalone calls aside).
    assert sum(t.statements[:1] == ["BEGIN"] for t in transactions) >= 6, transactions


def test_a_claim_is_one_round_trip_and_inside_a_callers_transaction_rolls_back_with_it():
    first = start(linear(action("s1")))
    with traced() as transactions:
        [claim] = instances_claim(holder="worker-1", limit=5, ttl=30)
    # The one statement (pick, lease, return) is the whole commit: no BEGIN, no COMMIT.
    assert claim.instance_id == first.pk
    assert [(t.round_trips, len(t.statements)) for t in transactions] == [(1, 1)]
    assert Lease.objects.get(key=f"instance:{first.pk}").holder == "worker-1"
    # Inside a caller's commit the claim joins it (no savepoint), and is not committed
    # on its own: it rolls back with the caller's.
    second = start(linear(action("s1")))
    with pytest.raises(RuntimeError), engine_commit():
        [taken] = instances_claim(holder="worker-2", limit=5, ttl=30)
        assert taken.instance_id == second.pk
        raise RuntimeError("the caller gives up")
    assert not Lease.objects.filter(key=f"instance:{second.pk}", holder="worker-2").exists()


def test_a_start_is_a_read_and_one_statement_alone():
    """The new id and the clock are one read; the instance's row, its start step, its
    chain's first checkpoint and its event are one statement, sent alone (ADR 0058): two
    round trips and two server transactions, no BEGIN and no COMMIT (were seven round
    trips: BEGIN, the clock, four writes, COMMIT)."""
    definition = definition_publish(document=linear(action("s1")))
    with traced() as transactions:
        instance = instance_start(definition=definition, variables={"value": "v1"})
    assert [(t.round_trips, len(t.statements)) for t in transactions] == [(1, 1), (1, 1)]
    sent = [sql for t in transactions for sql in t.statements]
    assert not any(sql in {"BEGIN", "COMMIT"} for sql in sent), sent
    assert all(count <= 50 for t in transactions for count in t.parameters)
    stored = Instance.objects.get(pk=instance.pk)
    assert stored.variables == {"value": "v1"} and stored.runnable_at == instance.created_at
    assert Token.objects.get(instance=stored).created_at == instance.created_at
    assert [e.type for e in Event.objects.filter(instance_id=instance.pk)] == ["instance.started"]
    assert api.chain_verify(subject=api.Subject("govflow.instance", str(instance.pk))).ok
    report = instance_run(instance_id=instance.pk)
    assert report.status == InstanceStatus.COMPLETED


def test_a_start_inside_a_callers_transaction_rolls_back_with_it():
    definition = definition_publish(document=linear(action("s1")))
    with pytest.raises(RuntimeError), engine_commit():
        instance = instance_start(definition=definition, tenant="t-gone")
        assert Instance.objects.filter(pk=instance.pk).exists()  # written in the caller's …
        raise RuntimeError("the caller gives up")
    # … and gone with it: the row, the step, the event and the chain's first checkpoint.
    assert not Instance.objects.filter(tenant="t-gone").exists()
    assert not Token.objects.filter(instance_id=instance.pk).exists()
    assert not Event.objects.filter(instance_id=instance.pk).exists()
    assert not Checkpoint.objects.filter(subject_id=str(instance.pk)).exists()


def test_a_start_whose_id_has_a_chain_already_is_refused_and_writes_nothing(monkeypatch):
    """A chain already there for the new id (a database restored without its sequence, a
    row written by hand) is a conflict, as ``projection_record(new=True)`` raises it:
    never a chain continued, and none of the start's rows is written."""
    definition = definition_publish(document=linear(action("s1")))
    taken = 990_001
    api.projection_record(
        subject=api.Subject("govflow.instance", str(taken)), projection_fp="a" * 64, new=True
    )
    real = instances.next_id_and_clock
    monkeypatch.setattr(instances, "next_id_and_clock", lambda model: (taken, real(model)[1]))
    with pytest.raises(api.ChainConflict, match="written by someone else first"):
        instance_start(definition=definition, tenant="t-taken")
    assert not Instance.objects.filter(pk=taken).exists()
    assert not Token.objects.filter(instance_id=taken).exists()
    assert not Event.objects.filter(instance_id=taken).exists()
