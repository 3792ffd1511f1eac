"""``manage.py recovery_verify``: verify chains, report broken ones, open incidents."""

from __future__ import annotations

from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from recovery import api
from recovery.models import Checkpoint, IncidentResolution, IntegrityIncident, Operation
from recovery.subjects import Subject
from recovery.testing import live_fence, new_subject, record

pytestmark = pytest.mark.django_db


def make_subject(*states: str) -> tuple[Subject, list[str]]:
    """A subject with one recorded-and-observed operation per state (two checkpoints each)."""
    subject = new_subject()
    fence = live_fence(subject)
    keys = []
    for state in states:
        op = record(subject, fence)
        api.operation_observe(key=op.key, state=state, fence=fence)
        keys.append(op.key)
    return subject, keys


def verify(*args: str, **options) -> tuple[int, list[str]]:
    """Run the command; return its exit code and its output lines."""
    out = StringIO()
    try:
        call_command("recovery_verify", *args, stdout=out, **options)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def no_anchors_yet() -> str:
    """The line that says nothing was anchored yet (each test has a fresh anchor file)."""
    return (
        f"Anchors: none yet in {settings.RECOVERY_ANCHOR_PATH}, nothing to compare with "
        "(the sweeper appends them; --anchor appends a full one now)."
    )


def open_incidents() -> dict[str, IntegrityIncident]:
    return {i.subject_id: i for i in IntegrityIncident.objects.filter(status="open")}


def test_all_chains_ok_exits_normally_and_prints_the_count():
    first, _ = make_subject("succeeded", "failed")
    second, _ = make_subject("outcome_unknown")
    assert verify() == (0, [no_anchors_yet(), "2 chain(s) verified, 0 broken."])
    code, lines = verify(verbosity=2)
    assert code == 0
    assert lines[-2:] == [no_anchors_yet(), "2 chain(s) verified, 0 broken."]
    assert sorted(lines[:-2]) == sorted(
        [f"ok {first} (4 checkpoints)", f"ok {second} (2 checkpoints)"]
    )
    assert not IntegrityIncident.objects.exists()


def test_an_empty_ledger_verifies_nothing_and_passes():
    assert verify() == (0, [no_anchors_yet(), "0 chain(s) verified, 0 broken."])


def test_each_broken_chain_gets_one_line_and_one_incident_and_the_exit_code_is_1():
    rewritten, _ = make_subject("succeeded", "failed")
    edited, (key,) = make_subject("outcome_unknown")
    make_subject("succeeded")
    cp = Checkpoint.objects.get(subject_id=rewritten.id, seq=2)
    Checkpoint.objects.filter(pk=cp.pk).update(fact=cp.fact.replace("succeeded", "failed"))
    Operation.objects.filter(key=key).update(state="effect_absent")

    code, lines = verify()
    assert code == 1
    broken = sorted(line for line in lines if line.startswith("BROKEN "))
    assert len(broken) == 2 and lines[-1] == "3 chain(s) verified, 2 broken."
    incidents = open_incidents()
    assert set(incidents) == {rewritten.id, edited.id}
    expected = {
        rewritten: f"BROKEN {rewritten} at #2: checkpoint #2's fact does not match its "
        "fingerprint (the fact was changed)",
        edited: f"BROKEN {edited} at #2: operation {key}'s state is 'effect_absent' in its "
        "row but 'outcome_unknown' in the chain (changed behind the chain's back)",
    }
    for subject, text in expected.items():
        line = next(line for line in broken if line.startswith(f"BROKEN {subject} "))
        assert line == f"{text} (incident {incidents[subject.id].pk})"
        assert incidents[subject.id].position == 2
        assert incidents[subject.id].reason in line

    assert verify()[0] == 1  # running again keeps the same incidents
    assert IntegrityIncident.objects.count() == 2


def test_subject_limits_verification_to_one_chain():
    good, _ = make_subject("succeeded")
    bad, (key,) = make_subject("failed")
    Operation.objects.filter(key=key).update(fence=42)
    assert verify("--subject", str(good)) == (
        0,
        [no_anchors_yet(), "1 chain(s) verified, 0 broken."],
    )
    assert not IntegrityIncident.objects.exists()
    code, lines = verify(f"--subject={bad}")
    assert code == 1 and len(lines) == 3
    assert lines[0].startswith(f"BROKEN {bad} at #2: operation {key}'s fence is 42 in its row")
    assert set(open_incidents()) == {bad.id}


def test_a_subject_whose_checkpoints_were_all_removed_is_still_found():
    subject, (key,) = make_subject("succeeded")
    Checkpoint.objects.filter(subject_id=subject.id).delete()
    code, lines = verify()
    assert code == 1
    assert lines[0].startswith(
        f"BROKEN {subject} at #1: the chain ends at #0 but operation "
        f"{key}'s row points to checkpoint #2"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--subject", "instance-42"],
            "'instance-42' is not a subject; write it as type:id, e.g. govflow.instance:42.",
        ),
        (["--subject", ":42"], "A subject type must be a string of 1-100 characters, not ''."),
        (["--subject", "govflow.instance:"], "A subject id must be a string of 1-100 characters"),
        (["--watermark", "3"], "--watermark needs --subject."),
        (["--anchor", "--no-anchors"], "--anchor cannot be combined with --no-anchors."),
        (["--restart-anchors"], "--restart-anchors needs --anchor."),
        (
            ["--subject", "recovery.anchors:store", "--no-anchors"],
            "recovery.anchors:store is verified against the anchors: drop --no-anchors.",
        ),
    ],
)
def test_malformed_arguments_are_refused_with_a_clear_message(args, message):
    make_subject("succeeded")
    with pytest.raises(CommandError) as exc:
        call_command("recovery_verify", *args, stdout=StringIO())
    assert message in str(exc.value)
    assert not IntegrityIncident.objects.exists()


def test_watermark_detects_a_truncated_chain():
    subject, (_, last) = make_subject("succeeded", "failed")
    watermark = api.subject_revision(subject)
    # A careful attacker removes the tail and the operation row it belongs to: the rest of
    # the chain is still valid, and only the reader's earlier revision reveals the loss.
    Checkpoint.objects.filter(subject_id=subject.id, seq__gt=2).delete()
    Operation.objects.filter(key=last).delete()
    assert verify("--subject", str(subject)) == (
        0,
        [no_anchors_yet(), "1 chain(s) verified, 0 broken."],
    )
    code, lines = verify("--subject", str(subject), "--watermark", str(watermark))
    assert code == 1
    assert lines[0].startswith(
        f"BROKEN {subject} at #3: the chain ends at #2 but #4 was seen "
        "before: checkpoints were removed from its end (incident "
    )
    assert open_incidents()[subject.id].position == 3


def test_a_watermark_on_an_unknown_subject_reports_a_missing_chain():
    code, lines = verify("--subject", "govflow.instance:404", "--watermark", "1")
    assert code == 1
    assert lines[0].startswith("BROKEN govflow.instance:404 at #1: the chain ends at #0")


def test_resolve_requests_resolution_only_where_the_chain_verifies_and_a_second_user_approves(
    resolver, second_resolver
):
    repaired, (fixed_key,) = make_subject("succeeded")
    still, (broken_key,) = make_subject("failed")
    original = Operation.objects.get(key=fixed_key).fence
    Operation.objects.filter(key__in=[fixed_key, broken_key]).update(fence=original + 6)
    assert verify()[0] == 1
    incidents = open_incidents()
    Operation.objects.filter(key=fixed_key).update(fence=original)  # the cause is repaired

    assert verify()[0] == 1  # a clean chain alone resolves nothing
    assert set(open_incidents()) == {repaired.id, still.id}

    with pytest.raises(CommandError, match="--resolve needs --by"):
        verify("--resolve")
    with pytest.raises(CommandError, match="--resolve needs --rationale"):
        verify("--resolve", "--by", "rita")
    code, lines = verify("--resolve", "--by", "rita", "--rationale", "Fence restored from backup.")
    assert code == 1
    fixed = incidents[repaired.id].pk
    request = IncidentResolution.objects.get(incident_id=fixed)
    assert (
        f"REQUESTED resolution {request.pk} of incident {fixed} on {repaired}: a second person "
        "with the permission recovery.resolve_incident approves it on the incident's admin "
        f"page, or with recovery_verify --approve {fixed} --by THEIR_USERNAME"
    ) in lines
    assert sum(line.startswith("BROKEN ") for line in lines) == 1
    assert not IncidentResolution.objects.filter(incident=incidents[still.id]).exists()
    assert set(open_incidents()) == {repaired.id, still.id}, "a request resolves nothing"

    with pytest.raises(CommandError, match="requested a resolution cannot approve it"):
        verify("--approve", str(fixed), "--by", "rita")
    assert verify("--approve", str(fixed), "--by", "rob") == (
        0,
        [
            f"RESOLVED Incident {fixed} is resolved: the chain of {repaired} verifies again "
            "(2 checkpoints)."
        ],
    )
    assert set(open_incidents()) == {still.id}
    resolved = IntegrityIncident.objects.get(pk=fixed)
    assert resolved.status == "resolved" and resolved.resolved_at is not None
    assert resolved.resolved_by.username == "rob"
    assert (request.requested_by, request.rationale) == (resolver, "Fence restored from backup.")
    # Running it again finds nothing to request on the resolved subject.
    code, lines = verify(
        "--resolve", "--by", "rita", "--rationale", "again", "--subject", str(repaired)
    )
    assert (code, lines) == (0, [no_anchors_yet(), "1 chain(s) verified, 0 broken."])
