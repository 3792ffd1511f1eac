"""A claimed run's handover and load are one statement on PostgreSQL (ADR 0060).

``load.handed_over_and_loaded`` puts the lease's handover in front of the load's reads
(the instance with its definition and the load's answers, its active steps). It must read
exactly what the separate statements read (``lease_handover``, then ``load_run``), refuse
a lapsed claim with nothing changed, and hand over the lease of an instance that is not
there. SQLite keeps the separate statements (its handover is tested everywhere else).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from govflow.engine.db import engine_commit
from govflow.engine.models import Token, TokenState
from govflow.engine.projection import instance_subject
from govflow.engine.queue import instances_claim
from govflow.engine.services.load import handed_over_and_loaded, load_run
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.models import Lease
from tests.engine_helpers import graph, node, split_into
from tests.flows import start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("one statement with a data-modifying WITH: PostgreSQL's path")


class RolledBack(Exception):
    """Leaves the engine commit: whatever the block wrote is undone."""


def view(run) -> dict:
    """What a run starts from, as plain values."""
    instance = run.instance
    return {
        "instance": {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.fields},
        "answers": (run.recorded_projection, run.integrity_incident, run.stuck_at_load),
        "definition": (run.definition_fp, run.spec.start, sorted(run.spec.nodes)),
        "tokens": {
            pk: {f.attname: getattr(token, f.attname) for f in Token._meta.fields}
            for pk, token in run.active.items()
        },
        "status": run.committed_status,
    }


def both_loads(instance_id: int, claim) -> tuple[tuple, tuple]:
    """The one statement's fence and view, then the separate statements', each in a
    transaction rolled back after it (the claim's lease as it was before each)."""
    claimed = api.Fence(key=instance_lease_key(instance_id), holder=claim.holder, fence=claim.fence)
    seen = []
    for one in (True, False):
        with pytest.raises(RolledBack), engine_commit():
            if one:
                fence, run = handed_over_and_loaded(
                    instance_id, claimed=claimed, holder="worker-1", ttl=30
                )
            else:
                fence = api.lease_handover(fence=claimed, holder="worker-1", ttl=30)
                run = load_run(instance_id, fence)
            seen.append((fence, None if run is None else view(run)))
            raise RolledBack
    return seen[0], seen[1]


def test_one_statement_reads_what_the_separate_statements_read(settings):
    """Three active branches, one of them failed (a stuck step), an open integrity
    incident and a recorded projection: every value of the view is the same."""
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1  # the start node and the split: a, b, c ready
    instance = start(split_into("a", "b", "c"))
    instance_run(instance_id=instance.pk)
    tokens = Token.objects.filter(instance=instance, node_id__in=["a", "b", "c"])
    assert tokens.count() == 3
    Token.objects.filter(instance=instance, node_id="c").update(state=TokenState.FAILED)
    incident = api.incident_report(subject=instance_subject(instance.pk), reason="a test's")
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)

    one, separate = both_loads(instance.pk, claim)
    assert one == separate
    fence, loaded = one
    assert fence.fence == claim.fence + 1 and fence.holder == "worker-1"
    assert loaded["answers"][1:] == (incident.pk, True) and loaded["answers"][0]
    assert {t["node_id"] for t in loaded["tokens"].values()} == {"a", "b"}, "active ones only"
    lease = Lease.objects.get(key=instance_lease_key(instance.pk))
    assert (lease.holder, lease.fence) == ("pusher-1", claim.fence), "both rolled back"


def test_an_instance_with_nothing_but_its_row_loads_the_same():
    """No active step, nothing stuck, no incident: the reads' one row, no step rows."""
    instance = start(graph([node("s", "start"), node("e", "end")], [("s", "e")]))
    instance_run(instance_id=instance.pk)
    instance.refresh_from_db()
    Lease.objects.filter(key=instance_lease_key(instance.pk)).delete()
    fence = api.lease_acquire(key=instance_lease_key(instance.pk), holder="pusher-1", ttl=30)
    claim = type("Claim", (), {"holder": fence.holder, "fence": fence.fence})()
    one, separate = both_loads(instance.pk, claim)
    assert one == separate and one[1]["tokens"] == {}


def test_a_lapsed_claim_is_refused_and_nothing_changes():
    instance = start(split_into("a", "b", "c"))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    key = instance_lease_key(instance.pk)
    Lease.objects.filter(key=key).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    before = Lease.objects.filter(key=key).values().get()
    claimed = api.Fence(key=key, holder=claim.holder, fence=claim.fence)
    with pytest.raises(api.StaleFence, match="hand the lease over"), engine_commit():
        handed_over_and_loaded(instance.pk, claimed=claimed, holder="worker-1", ttl=30)
    assert Lease.objects.filter(key=key).values().get() == before


def test_the_lease_of_an_instance_that_is_not_there_is_handed_over_and_nothing_loaded():
    key = instance_lease_key(987654)
    claimed = api.lease_acquire(key=key, holder="pusher-1", ttl=30)
    with engine_commit():
        fence, run = handed_over_and_loaded(987654, claimed=claimed, holder="worker-1", ttl=30)
    assert run is None and fence.fence == claimed.fence + 1
    lease = Lease.objects.get(key=key)
    assert (lease.holder, lease.fence) == ("worker-1", claimed.fence + 1)
