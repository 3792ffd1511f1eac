"""Decisions that cannot deadlock (issue 9, item 4), in the recovery core.

The requester withdraws their own request; a second person approves or rejects it (a
rejection says why); a decision is decided once, and a second decision of it — approve,
reject or withdraw — is refused and changes nothing.
"""

from __future__ import annotations

import pytest

from recovery import api
from recovery.models import Checkpoint, Decision, Operation
from recovery.testing import record
from tests.integration.test_decisions import kinds, request

pytestmark = pytest.mark.django_db


@pytest.fixture
def unknown(subject, fence) -> str:
    """The key of an operation whose outcome is unknown."""
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    return op.key


def test_the_requester_withdraws_a_pending_request_and_may_ask_again(
    subject, unknown, requester, approver
):
    decision = request(unknown, requester)
    withdrawn = api.decision_withdraw(decision_id=decision.pk, withdrawn_by=requester)
    assert withdrawn.state == "withdrawn" and withdrawn.get_state_display() == (
        "Withdrawn by its requester"
    )
    assert withdrawn.decided_by is None and withdrawn.decided_at is not None
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"
    assert kinds(subject)[-2:] == ["decision.requested", "decision.withdrawn"]
    fact = Checkpoint.objects.get(subject_id=subject.id, kind="decision.withdrawn").fact
    assert f'"withdrawn_by":{requester.pk}' in fact
    assert api.chain_verify(subject).ok
    again = request(unknown, requester)  # the operation is free for a new request
    api.decision_approve(decision_id=again.pk, approved_by=approver)
    assert Operation.objects.get(key=unknown).state == "effect_confirmed"


def test_only_the_requester_may_withdraw(subject, unknown, requester, approver):
    decision = request(unknown, requester)
    with pytest.raises(api.DecisionError, match=r"Only its requester \(requester\) can withdraw"):
        api.decision_withdraw(decision_id=decision.pk, withdrawn_by=approver)
    assert Decision.objects.get(pk=decision.pk).state == "requested"
    assert kinds(subject)[-1] == "decision.requested"


def test_the_requester_cannot_approve_their_own_request_in_the_service(subject, unknown, approver):
    # The approver may approve in general; not what they requested themselves.
    decision = request(unknown, approver)
    with pytest.raises(api.DecisionError, match="requested a decision cannot approve it"):
        api.decision_approve(decision_id=decision.pk, approved_by=approver)
    assert Decision.objects.get(pk=decision.pk).state == "requested"
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"


@pytest.mark.parametrize("note", ["", "   ", None])
def test_a_rejection_needs_a_comment(subject, unknown, requester, approver, note):
    decision = request(unknown, requester)
    with pytest.raises(api.DecisionError, match="Say why the decision is rejected"):
        api.decision_reject(decision_id=decision.pk, rejected_by=approver, note=note)
    assert Decision.objects.get(pk=decision.pk).state == "requested"


def decide(how: str, decision, requester, approver):
    if how == "approve":
        return api.decision_approve(decision_id=decision.pk, approved_by=approver)
    if how == "reject":
        return api.decision_reject(decision_id=decision.pk, rejected_by=approver, note="No.")
    return api.decision_withdraw(decision_id=decision.pk, withdrawn_by=requester)


@pytest.mark.parametrize(
    ("first", "state"),
    [("approve", "approved"), ("reject", "rejected"), ("withdraw", "withdrawn by its requester")],
)
@pytest.mark.parametrize("second", ["approve", "reject", "withdraw"])
def test_a_decided_or_withdrawn_request_decided_again_is_refused_and_changes_nothing(
    subject, unknown, requester, approver, first, state, second
):
    decision = request(unknown, requester, kind="effect_absent")
    decide(first, decision, requester, approver)
    before = (kinds(subject), Operation.objects.get(key=unknown).state)
    row = Decision.objects.values().get(pk=decision.pk)
    with pytest.raises(api.DecisionConflict) as caught:
        decide(second, decision, requester, approver)
    assert str(caught.value) == (
        f"Decision {decision.pk} is no longer awaiting approval: it is {state}. A decision "
        "is decided once; nothing was changed."
    )
    assert (kinds(subject), Operation.objects.get(key=unknown).state) == before
    assert Decision.objects.values().get(pk=decision.pk) == row
