"""Handoffs of a pending provider and the recovery core's own incidents are announced.

A step waiting on a pending provider is a handoff (the REST API lists it as
``pending_provider``); an integrity incident the recovery core opens in its own commit is
an incident. Each opens and closes with an event in the commit of its transition (ADR
0032), and a rolled-back transition leaves none.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.provider import Pending, Unknown
from govflow.events.models import Event
from govflow.handoffs.services.integrity import integrity_incident_resolve_approve
from recovery import api
from recovery.models import IntegrityIncident
from tests.engine_helpers import subject as subject_of_instance
from tests.engine_helpers import token_of
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


def handoff_events(instance) -> list[tuple[str, str, str]]:
    rows = Event.objects.filter(instance_id=instance.pk, type__startswith="handoff.")
    return [(e.type, e.data["kind"], e.data["state"]) for e in rows.order_by("seq")]


def test_a_pending_provider_opens_a_handoff_once_and_its_success_decides_it():
    effects.SCRIPT["alpha.write"] = [Pending(0)]
    effects.SCRIPT["alpha.write:poll"] = [Pending(0), Pending(0)]  # then Succeeded
    instance = drive(start(linear(action("a"))))
    assert instance.status == InstanceStatus.COMPLETED
    # Three answers of pending, one handoff: further polls are no events.
    assert handoff_events(instance) == [
        ("handoff.opened", "pending_provider", "pending"),
        ("handoff.decided", "pending_provider", "completed"),
    ]
    opened = Event.objects.get(instance_id=instance.pk, type="handoff.opened")
    assert opened.data["step"] == "a" and opened.data["token"] == token_of(instance, "a").pk


def test_a_pending_provider_that_turns_unknown_closes_one_handoff_and_opens_the_next():
    effects.SCRIPT["alpha.write"] = [Pending(0)]
    effects.SCRIPT["alpha.write:poll"] = [Unknown("the provider lost track of it")]
    instance = drive(start(linear(action("a"))))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert handoff_events(instance) == [
        ("handoff.opened", "pending_provider", "pending"),
        ("handoff.decided", "pending_provider", "outcome_unknown"),
        ("handoff.opened", "outcome_unknown", "outcome_unknown"),
    ]
    assert "step.blocked" in Event.objects.filter(instance_id=instance.pk).values_list(
        "type", flat=True
    )


def incident_events(instance) -> list[tuple[str, int | None, int | None]]:
    rows = Event.objects.filter(instance_id=instance.pk, type__startswith="incident.")
    return [
        (e.type, e.data.get("incident"), e.data.get("integrity_incident"))
        for e in rows.order_by("seq")
    ]


def waiting_instance():
    return drive(start(linear(action("a"), {"id": "wait", "type": "timer", "duration": "PT1H"})))


def test_an_incident_the_core_opens_in_its_own_commit_is_an_event():
    instance = waiting_instance()
    incident = api.incident_report(
        subject=subject_of_instance(instance), reason="A descriptor contradicted the first."
    )
    assert incident_events(instance) == [("incident.opened", None, incident.pk)]
    event = Event.objects.get(instance_id=instance.pk, type="incident.opened")
    assert event.data["kind"] == "integrity" and event.tenant == instance.tenant
    # The same incident reported again is no new incident, and no new event.
    api.incident_report(subject=subject_of_instance(instance), reason="Again.")
    assert len(incident_events(instance)) == 1


def test_an_incident_rolled_back_with_its_transaction_leaves_no_event():
    instance = waiting_instance()
    with pytest.raises(RuntimeError), transaction.atomic():
        api.incident_report(subject=subject_of_instance(instance), reason="Rolled back.")
        raise RuntimeError("the transition fails after the incident was opened")
    assert not IntegrityIncident.objects.filter(subject_id=str(instance.pk)).exists()
    assert incident_events(instance) == []


def test_the_resolution_of_the_cores_incident_is_an_event(resolver, second_resolver):
    instance = waiting_instance()
    incident = api.incident_report(
        subject=subject_of_instance(instance), reason="The projection was edited."
    )
    api.incident_resolve_request(
        incident_id=incident.pk,
        requested_by=resolver,
        rationale="Checked the projection against the chain; it verifies.",
    )
    outcome = integrity_incident_resolve_approve(incident_id=incident.pk, actor=second_resolver)
    assert outcome.resolved
    assert incident_events(instance) == [
        ("incident.opened", None, incident.pk),
        ("incident.resolved", None, incident.pk),
    ]


def test_a_poll_due_at_once_is_run_at_once_every_time():
    """A provider's ``Pending(0)`` makes its poll due now. On SQLite the clock is text to
    the millisecond, and the poll's due time was written to the microsecond: within the
    same millisecond it compared as later than the clock, the run stopped with the step
    waiting (about one run in six on a fast machine). Forty in a row all complete."""
    for _ in range(40):
        effects.SCRIPT["alpha.write"] = [Pending(0)]
        effects.SCRIPT["alpha.write:poll"] = [Pending(0)]  # then Succeeded
        instance = drive(start(linear(action("a"))))
        assert instance.status == InstanceStatus.COMPLETED, token_of(instance, "a").state
