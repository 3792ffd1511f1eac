"""Resolving an integrity incident takes two people and a chain that verifies.

One person requests the resolution, saying what was repaired; a different person approves
it, and only a clean verification at that moment resolves the incident. Every step is a
fact on the incident's own trail, never on the broken chain itself. For a workflow
instance, the engine's approval queues the instance to continue in the same commit.
"""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connections, transaction

from govflow.engine.models import Incident, InstanceStatus, TokenState
from govflow.handoffs.services.desk import approval_decide
from govflow.handoffs.services.integrity import integrity_incident_resolve_approve
from recovery import api
from recovery.models import Checkpoint, IncidentResolution, IntegrityIncident, Operation
from recovery.services import resolutions as resolution_service
from recovery.testing import new_subject, record
from tests.engine_helpers import chain_ok, marked_runnable, token_of, unmark_all, user_with
from tests.engine_helpers import subject as subject_of_instance
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db

RATIONALE = "Operation row restored from the 02:00 backup; checked against the chain."


def broken_subject(subject, fence) -> tuple[IntegrityIncident, str, int]:
    """A subject whose operation row was edited: (open incident, operation key, fence)."""
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="failed", fence=fence)
    original = Operation.objects.get(key=op.key).fence
    Operation.objects.filter(key=op.key).update(fence=original + 40)
    result, incident = api.subject_verify(subject=subject)
    assert not result.ok and incident is not None
    return incident, op.key, original


def repair(key: str, fence_number: int) -> None:
    Operation.objects.filter(key=key).update(fence=fence_number)


def trail_kinds(incident: IntegrityIncident) -> list[str]:
    trail = api.incident_trail(incident.pk)
    return list(
        Checkpoint.objects.filter(subject_type=trail.type, subject_id=trail.id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def request(incident, user, rationale: str = RATIONALE, **kwargs) -> IncidentResolution:
    return api.incident_resolve_request(
        incident_id=incident.pk, requested_by=user, rationale=rationale, **kwargs
    )


def status(incident: IntegrityIncident) -> str:
    return IntegrityIncident.objects.get(pk=incident.pk).status


@pytest.fixture
def incident(subject, fence) -> tuple[IntegrityIncident, str, int]:
    return broken_subject(subject, fence)


# -- the recovery core --------------------------------------------------------------------


def test_a_request_and_a_second_persons_approval_resolve_a_repaired_incident(
    subject, fence, incident, resolver, second_resolver
):
    incident, key, original = incident
    checkpoints_before = Checkpoint.objects.filter(
        subject_type=subject.type, subject_id=subject.id
    ).count()
    repair(key, original)

    resolution = request(incident, resolver)
    assert (resolution.state, resolution.requested_by) == ("requested", resolver)
    assert status(incident) == "open", "a request alone resolves nothing"

    outcome = api.incident_resolve_approve(incident_id=incident.pk, approved_by=second_resolver)
    assert outcome.resolved
    assert outcome.message == (
        f"Incident {incident.pk} is resolved: the chain of {subject} verifies again "
        "(2 checkpoints)."
    )
    incident.refresh_from_db()
    assert (incident.status, incident.resolved_by) == ("resolved", second_resolver)
    resolution.refresh_from_db()
    assert (resolution.state, resolution.decided_by) == ("approved", second_resolver)
    # The facts are on the incident's own trail; the subject's chain is left as it was.
    assert trail_kinds(incident) == ["incident.resolution_requested", "incident.resolved"]
    assert api.chain_verify(api.incident_trail(incident.pk)).ok
    assert (
        Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id).count()
        == checkpoints_before
    )
    # Success is no longer refused for the subject.
    later = record(subject, fence, step_id="step-2")
    assert api.operation_observe(key=later.key, state="succeeded", fence=fence).changed


def test_the_requester_cannot_approve_their_own_request(incident, resolver):
    incident, key, original = incident
    repair(key, original)
    resolution = request(incident, resolver)
    with pytest.raises(api.IncidentError, match="requested a resolution cannot approve it"):
        api.incident_resolve_approve(incident_id=incident.pk, approved_by=resolver)
    resolution.refresh_from_db()
    assert resolution.state == "requested" and resolution.decided_by is None
    assert status(incident) == "open"
    assert trail_kinds(incident) == ["incident.resolution_requested"]


def test_the_database_refuses_a_resolution_decided_by_its_requester(incident, resolver):
    incident, key, original = incident
    repair(key, original)
    resolution = request(incident, resolver)
    with pytest.raises(IntegrityError), transaction.atomic():
        IncidentResolution.objects.filter(pk=resolution.pk).update(
            state="approved", decided_by=resolver
        )
    assert IncidentResolution.objects.get(pk=resolution.pk).state == "requested"


def test_approval_on_a_chain_broken_again_keeps_the_incident_open_and_says_why(
    subject, incident, resolver, second_resolver
):
    incident, key, original = incident
    repair(key, original)
    resolution = request(incident, resolver)
    Operation.objects.filter(key=key).update(state="succeeded")  # broken again, differently

    outcome = api.incident_resolve_approve(incident_id=incident.pk, approved_by=second_resolver)
    assert not outcome.resolved
    reason = f"operation {key}'s state is 'succeeded' in its row but 'failed' in the chain"
    assert outcome.message.startswith(
        f"Incident {incident.pk} stays open: the chain of {subject} is still broken at "
        f"checkpoint #2: {reason}"
    )
    assert outcome.message.endswith(
        f"Nothing was resolved; resolution request {resolution.pk} still awaits approval. Once "
        "the cause is repaired, approve it again, or reject it with a note."
    )
    incident.refresh_from_db()
    assert incident.status == "open" and incident.resolved_by is None
    assert incident.position == 2 and reason in incident.reason, "the newest reason is kept"
    assert IncidentResolution.objects.get(pk=resolution.pk).state == "requested"
    assert trail_kinds(incident) == [
        "incident.resolution_requested",
        "incident.reverify_failed",
    ]

    Operation.objects.filter(key=key).update(state="failed")
    assert api.incident_resolve_approve(
        incident_id=incident.pk, approved_by=second_resolver
    ).resolved
    assert status(incident) == "resolved"


def test_a_request_on_a_chain_that_is_still_broken_is_refused(incident, resolver):
    incident, key, original = incident
    repair(key, original)
    Operation.objects.filter(key=key).update(ordinal=7)  # another edit since detection
    with pytest.raises(api.IncidentError) as exc:
        request(incident, resolver)
    assert str(exc.value).startswith(f"Incident {incident.pk} cannot be resolved yet: the chain")
    assert "is still broken at checkpoint #2" in str(exc.value)
    assert str(exc.value).endswith("nothing was requested.")
    assert not IncidentResolution.objects.exists()
    assert trail_kinds(incident) == []
    assert "ordinal is 7 in its row" in str(exc.value)
    assert IntegrityIncident.objects.get(pk=incident.pk).reason == incident.reason, (
        "a refused request changes nothing"
    )


@pytest.mark.parametrize(
    ("rationale", "says"),
    [
        ("   ", "A resolution request needs a rationale: say what was repaired and how"),
        ("restored\x00", "contains a NUL character"),
        ("x" * 10_001, "keep it under 10000"),
    ],
)
def test_a_request_needs_a_rationale_in_plain_text(incident, resolver, rationale, says):
    incident, key, original = incident
    repair(key, original)
    with pytest.raises(api.IncidentError, match=says):
        request(incident, resolver, rationale)
    assert not IncidentResolution.objects.exists()


def test_every_step_needs_the_resolve_permission(django_user_model, incident, resolver):
    incident, key, original = incident
    repair(key, original)
    clerk = user_with(django_user_model, "clerk", "recovery.view_integrityincident")
    denied = "the permission 'recovery.resolve_incident' is required"
    with pytest.raises(api.IncidentError, match=denied):
        request(incident, clerk)
    request(incident, resolver)
    for call in (
        lambda: api.incident_resolve_approve(incident_id=incident.pk, approved_by=clerk),
        lambda: api.incident_resolve_reject(incident_id=incident.pk, rejected_by=clerk, note="no"),
        lambda: api.incident_resolve_withdraw(incident_id=incident.pk, withdrawn_by=clerk),
    ):
        with pytest.raises(api.IncidentError, match=denied):
            call()
    assert status(incident) == "open"
    assert IncidentResolution.objects.get().state == "requested"


def test_a_rejected_request_leaves_the_incident_open_for_a_new_request(
    incident, resolver, second_resolver
):
    incident, key, original = incident
    repair(key, original)
    first = request(incident, resolver)
    with pytest.raises(api.IncidentError, match="withdraw it instead"):
        api.incident_resolve_reject(incident_id=incident.pk, rejected_by=resolver, note="mine")
    with pytest.raises(api.IncidentError, match="Say why the request is rejected"):
        api.incident_resolve_reject(incident_id=incident.pk, rejected_by=second_resolver, note="")
    rejected = api.incident_resolve_reject(
        incident_id=incident.pk, rejected_by=second_resolver, note="Which backup? Name it."
    )
    assert (rejected.state, rejected.decided_by, rejected.decision_note) == (
        "rejected",
        second_resolver,
        "Which backup? Name it.",
    )
    assert status(incident) == "open"
    with pytest.raises(api.IncidentConflict, match="No resolution of incident"):
        api.incident_resolve_approve(incident_id=incident.pk, approved_by=second_resolver)

    second = request(incident, resolver, "Restored from backup 2024-05-01T02:00.")
    assert second.pk != first.pk
    assert api.incident_resolve_approve(
        incident_id=incident.pk, approved_by=second_resolver
    ).resolved
    assert trail_kinds(incident) == [
        "incident.resolution_requested",
        "incident.resolution_rejected",
        "incident.resolution_requested",
        "incident.resolved",
    ]


def test_only_the_requester_withdraws_a_request(incident, resolver, second_resolver):
    incident, key, original = incident
    repair(key, original)
    resolution = request(incident, resolver)
    with pytest.raises(api.IncidentError, match="Only its requester \\(rita\\) can withdraw"):
        api.incident_resolve_withdraw(incident_id=incident.pk, withdrawn_by=second_resolver)
    withdrawn = api.incident_resolve_withdraw(incident_id=incident.pk, withdrawn_by=resolver)
    assert withdrawn.pk == resolution.pk and withdrawn.state == "withdrawn"
    assert withdrawn.decided_by is None and withdrawn.decided_at is not None
    assert status(incident) == "open"
    request(incident, second_resolver)  # anyone with the permission may ask again
    assert trail_kinds(incident) == [
        "incident.resolution_requested",
        "incident.resolution_withdrawn",
        "incident.resolution_requested",
    ]


def test_one_request_awaits_approval_at_a_time(incident, resolver, second_resolver):
    incident, key, original = incident
    repair(key, original)
    request(incident, resolver)
    with pytest.raises(api.IncidentConflict, match="already awaits approval"):
        request(incident, second_resolver)
    assert IncidentResolution.objects.count() == 1
    assert trail_kinds(incident) == ["incident.resolution_requested"]


def test_a_second_approval_changes_nothing(incident, resolver, second_resolver, third_resolver):
    incident, key, original = incident
    repair(key, original)
    request(incident, resolver)
    assert api.incident_resolve_approve(
        incident_id=incident.pk, approved_by=second_resolver
    ).resolved
    with pytest.raises(api.IncidentConflict, match="is already resolved by rob"):
        api.incident_resolve_approve(incident_id=incident.pk, approved_by=third_resolver)
    with pytest.raises(api.IncidentConflict, match="is already resolved"):
        request(incident, third_resolver)
    incident.refresh_from_db()
    assert incident.resolved_by == second_resolver
    assert trail_kinds(incident).count("incident.resolved") == 1


@pytest.mark.django_db(transaction=True)
def test_two_approvers_racing_resolve_the_incident_once(
    on_postgres, subject, fence, resolver, second_resolver, third_resolver, monkeypatch
):
    incident, key, original = broken_subject(subject, fence)
    repair(key, original)
    request(incident, resolver)
    barrier = threading.Barrier(2)
    real = resolution_service._recheck

    def slow_recheck(*args, **kwargs):
        # Hold the winner's transaction open so the loser's approval truly overlaps it.
        result = real(*args, **kwargs)
        threading.Event().wait(0.3)
        return result

    monkeypatch.setattr(resolution_service, "_recheck", slow_recheck)
    outcomes: dict[str, object] = {}

    def approve(user) -> None:
        try:
            barrier.wait(timeout=10)
            outcome = api.incident_resolve_approve(incident_id=incident.pk, approved_by=user)
            outcomes[user.username] = "resolved" if outcome.resolved else outcome.message
        except Exception as exc:
            outcomes[user.username] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=approve, args=(u,)) for u in (second_resolver, third_resolver)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(map(type, outcomes.values()), key=str) == sorted(
        [str, api.IncidentConflict], key=str
    ), outcomes
    winner = next(name for name, outcome in outcomes.items() if outcome == "resolved")
    incident.refresh_from_db()
    assert incident.status == "resolved" and incident.resolved_by.username == winner
    assert IncidentResolution.objects.get().decided_by.username == winner
    assert trail_kinds(incident).count("incident.resolved") == 1
    assert api.chain_verify(api.incident_trail(incident.pk)).ok


def test_an_incident_on_an_empty_chain_needs_the_revision_last_seen(resolver, second_resolver):
    subject = new_subject()
    incident = api.incident_report(
        subject=subject, reason="The instance's stored definition no longer matches its hash."
    )
    assert (incident.status, incident.position) == ("open", None)
    assert api.incident_report(subject=subject, reason="something else") == incident
    with pytest.raises(api.IncidentError, match=r"is empty\. An empty chain verifies trivially"):
        request(incident, resolver)
    with pytest.raises(api.IncidentError, match="chain ends at #0 but #3 was seen before"):
        request(incident, resolver, watermark=3)
    resolution = request(incident, resolver, watermark=0)
    assert resolution.watermark == 0
    assert api.incident_resolve_approve(
        incident_id=incident.pk, approved_by=second_resolver
    ).resolved
    incident.refresh_from_db()
    assert incident.reason == "The instance's stored definition no longer matches its hash."


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"reason": " "}, "An incident needs a reason"),
        ({"reason": "x", "position": 0}, "position must be a checkpoint number"),
        ({"reason": "x", "subject": "govflow.instance:1"}, "subject must be a Subject"),
    ],
)
def test_opening_an_incident_for_a_subject_needs_a_reason(kwargs, says):
    kwargs = {"subject": new_subject(), **kwargs}
    with pytest.raises(api.RecoveryValidationError, match=says):
        api.incident_report(**kwargs)
    assert not IntegrityIncident.objects.exists()


def test_a_tampered_trail_is_reported_like_any_broken_chain(incident, resolver):
    incident, key, original = incident
    repair(key, original)
    request(incident, resolver)
    trail = api.incident_trail(incident.pk)
    cp = Checkpoint.objects.get(subject_type=trail.type, subject_id=trail.id, seq=1)
    Checkpoint.objects.filter(pk=cp.pk).update(fact=cp.fact.replace(str(resolver.pk), "999"))
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("recovery_verify", stdout=out)
    assert f"BROKEN {trail} at #1: checkpoint #1's fact does not match" in out.getvalue()


# -- the command line ------------------------------------------------------------------------


def command(*args: str) -> tuple[int, list[str]]:
    out = StringIO()
    try:
        call_command("recovery_verify", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def test_the_command_approves_only_as_a_second_person_and_only_a_clean_chain(
    subject, incident, resolver, second_resolver
):
    incident, key, original = incident
    repair(key, original)
    code, lines = command(
        "--subject", str(subject), "--resolve", "--by", "rita", "--rationale", "x"
    )
    assert code == 0 and lines[0].startswith("REQUESTED resolution")
    Operation.objects.filter(key=key).update(fence=original + 1)
    code, lines = command("--approve", str(incident.pk), "--by", "rob")
    assert code == 1
    assert lines[0].startswith(f"KEPT Incident {incident.pk} stays open: the chain of {subject}")
    repair(key, original)
    code, lines = command("--approve", str(incident.pk), "--by", "rob")
    assert code == 0 and lines[0].startswith(f"RESOLVED Incident {incident.pk} is resolved")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--approve", "1"], "--approve needs --by USERNAME"),
        (["--approve", "1", "--by", "rob", "--subject", "a:1"], "takes only --by"),
        (["--approve", "1", "--by", "nobody"], "No active user 'nobody'"),
        (["--approve", "1", "--by", "clerk"], "clerk may not resolve integrity incidents"),
        (["--resolve", "--by", "clerk", "--rationale", "x"], "the permission"),
        (["--rationale", "x"], "--rationale goes with --resolve"),
        (["--approve", "424242", "--by", "rob"], "No integrity incident has id 424242"),
    ],
)
def test_the_command_refuses_incomplete_or_unauthorised_resolution(
    django_user_model, second_resolver, args, says
):
    user_with(django_user_model, "clerk")
    with pytest.raises(CommandError, match=says):
        call_command("recovery_verify", *args, stdout=StringIO())


# -- the engine ----------------------------------------------------------------------------


def waiting_instance():
    """An instance whose first step ran and that now waits for an approval."""
    instance = drive(
        start(
            linear(
                action("a"),
                {"id": "sign", "type": "approval", "permission": "engine.operate_instance"},
                action("b"),
            )
        )
    )
    assert token_of(instance, "sign").state == TokenState.WAITING
    return instance


def advance_tasks(instance) -> int:
    """1 when the instance is marked runnable (a worker's next claim takes it), else 0."""
    return marked_runnable().count(instance.pk)


def test_approving_an_instances_incident_queues_it_and_it_continues(
    django_user_model, resolver, second_resolver
):
    instance = waiting_instance()
    subject = subject_of_instance(instance)
    (op,) = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    Operation.objects.filter(pk=op.pk).update(input_fp="0" * 64)
    _, incident = api.subject_verify(subject=subject)
    Incident.objects.create(
        instance=instance, kind="integrity", message=incident.reason, created_at=op.recorded_at
    )
    Operation.objects.filter(pk=op.pk).update(input_fp=op.input_fp)
    unmark_all()

    request(incident, resolver)
    assert advance_tasks(instance) == 0, "a request queues nothing"
    outcome = integrity_incident_resolve_approve(incident_id=incident.pk, actor=second_resolver)
    assert outcome.resolved
    assert outcome.message.endswith(f"Instance {instance.pk} is queued to continue.")
    assert advance_tasks(instance) == 1
    assert not Incident.objects.filter(instance=instance, resolved_at__isnull=True).exists()
    engine_incident = Incident.objects.get(instance=instance, kind="integrity")
    assert engine_incident.resolved_by == second_resolver  # who closed it, and why
    assert engine_incident.resolution.startswith(f"Closed with integrity incident #{incident.pk}")

    operator = user_with(django_user_model, "olga", "engine.operate_instance")
    approval_decide(
        instance_id=instance.pk,
        token_id=token_of(instance, "sign").pk,
        actor=operator,
        approved=True,
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert chain_ok(instance)


def test_an_instance_whose_chain_is_still_broken_is_not_queued(resolver, second_resolver):
    instance = waiting_instance()
    subject = subject_of_instance(instance)
    (op,) = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    Operation.objects.filter(pk=op.pk).update(ordinal=9)
    _, incident = api.subject_verify(subject=subject)
    Operation.objects.filter(pk=op.pk).update(ordinal=op.ordinal)
    request(incident, resolver)
    Operation.objects.filter(pk=op.pk).update(ordinal=9)  # broken again before approval
    unmark_all()

    outcome = integrity_incident_resolve_approve(incident_id=incident.pk, actor=second_resolver)
    assert not outcome.resolved
    assert f"is still broken at checkpoint #{op.chain_seq}" in outcome.message
    assert "queued" not in outcome.message
    assert advance_tasks(instance) == 0
    assert status(incident) == "open"


def test_the_approval_of_an_instances_incident_goes_through_the_engine(resolver, second_resolver):
    instance = waiting_instance()
    subject = subject_of_instance(instance)
    incident = api.incident_report(subject=subject, reason="The projection was edited.")
    request(incident, resolver)
    unmark_all()
    outcome = api.incident_resolve_approve_via_owner(incident_id=incident.pk, actor=second_resolver)
    assert outcome.resolved and advance_tasks(instance) == 1


def test_a_subject_type_is_registered_once():
    with pytest.raises(api.RecoveryValidationError, match="already registered"):
        api.subject_type_register("govflow.instance", label="Again")


def test_nobody_else_writes_an_incidents_trail(incident):
    incident, _, _ = incident
    with pytest.raises(api.RecoveryValidationError, match="are the ledger's own"):
        api.fact_append(
            subject=api.incident_trail(incident.pk), kind="incident.resolved", fact={"x": 1}
        )
    assert trail_kinds(incident) == []


def test_a_registered_approver_acts_for_its_subject_type_and_can_be_overridden_in_tests(
    resolver, second_resolver
):
    subject = api.Subject("tests.parcel", "A-1")
    incident = api.incident_report(subject=subject, reason="The parcel row was edited.")
    request(incident, resolver, watermark=0)
    seen = []

    def approve(*, incident_id, actor):
        seen.append((incident_id, actor.username))
        return api.incident_resolve_approve(incident_id=incident_id, approved_by=actor)

    kind = api.SubjectType(
        "tests.parcel", "Parcel", url=lambda s: f"/parcels/{s.id}/", resolve_approve=approve
    )
    with api.subject_types.override(kind):
        assert api.subject_types.url_of(subject) == "/parcels/A-1/"
        outcome = api.incident_resolve_approve_via_owner(
            incident_id=incident.pk, actor=second_resolver
        )
    assert outcome.resolved and seen == [(incident.pk, "rob")]
    assert api.subject_types.get("tests.parcel") is None, "the override ends with the block"
    assert api.subject_types.url_of(subject) is None
