"""Bulk triage (issue 10 part 8, ADR 0024): select uncertain steps of one kind, preview,
submit bound to the preview's fingerprint with evidence per row, approve as a whole."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.handoffs.batches import batch_fingerprint
from govflow.handoffs.models import BatchState, DecisionBatch
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from recovery import api
from recovery.models import Decision, Operation
from tests.flows import action, drive, linear
from tests.integration.test_engine_admin import logged_in, make_user, messages_of
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

SELECT = "admin:handoffs_decisionbatch_select"
PREVIEW = "admin:handoffs_decisionbatch_preview"
SUBMIT = "admin:handoffs_decisionbatch_submit"
RATIONALE = "The registry's export after the outage lists these submissions."


@pytest.fixture
def operator(django_user_model):
    return make_user(
        django_user_model,
        "olga",
        "engine.view_instance",
        "engine.operate_instance",
        "recovery.request_decision",
        "recovery.view_decision",
    )


@pytest.fixture
def checker(django_user_model):
    return make_user(
        django_user_model,
        "carl",
        "engine.view_instance",
        "recovery.approve_decision",
        "recovery.view_decision",
    )


def uncertain(n: int, *, key: str = "tests.bulk", tenant: str = "default") -> list:
    """``n`` instances of one definition whose step 'write' has an unknown outcome."""
    definition = definition_publish(document=linear(action("write"), key=key))
    effects.SCRIPT["alpha.write"] = ["raise_after"] * n
    steps = []
    for i in range(n):
        instance = instance_start(
            definition=definition, variables={"value": f"v{i}"}, tenant=tenant
        )
        instance = drive(instance)
        assert instance.status == InstanceStatus.BLOCKED, instance.reason
        steps.append(instance.tokens.get(node_id="write"))
    return steps


def terms(steps, **extra) -> dict:
    return {
        "action": "alpha.write",
        "steps": [str(s.pk) for s in steps],
        "kind": "effect_confirmed",
        "rationale": RATIONALE,
        "check_store": "each key is in the export",
        **extra,
    }


def previewed(client, steps, **extra):
    response = client.post(reverse(PREVIEW), terms(steps, **extra))
    assert response.status_code == 200
    return response


def submission(response, steps, *, shared=True, **extra) -> dict:
    """What the preview page would post back, with a reference for each row."""
    preview = response.context["preview"]
    data = {
        **terms(steps, kind=preview.kind),
        "fingerprint": preview.fingerprint,
        "previewed": [row.pair for row in preview.rows],
        **{f"reference_{s.pk}": f"export line {i + 1}" for i, s in enumerate(steps)},
        **extra,
    }
    if shared:
        data["shared"] = [SimpleUploadedFile("registry-export.csv", b"key,state\nk,stored\n")]
    return data


def test_the_preview_lists_exactly_the_selection_and_what_it_records(operator):
    steps = uncertain(4)
    chosen = steps[:3]
    ops = logged_in(operator)
    page = ops.get(reverse(SELECT) + "?action=alpha.write").content.decode()
    assert all(f'value="{s.pk}"' in page for s in steps)

    response = previewed(ops, chosen)
    preview = response.context["preview"]
    assert [row.token_id for row in preview.rows] == [s.pk for s in chosen]
    html = response.content.decode()
    for step in chosen:
        assert f'data-operation="{step.operation_key}"' in html
        assert step.idempotency_key in html
        assert f"Test flow #{step.instance_id}" in html
    assert steps[3].operation_key not in html
    assert "Effect confirmed: the operation becomes effect_confirmed" in html
    expected = batch_fingerprint(
        kind="effect_confirmed",
        rationale=RATIONALE,
        checks={"store": "each key is in the export"},
        operations=[
            (s.operation_key, Operation.objects.get(key=s.operation_key).revision) for s in chosen
        ],
    )
    assert preview.fingerprint == expected and expected in html
    assert Decision.objects.count() == 0  # a preview records nothing


def test_a_batch_approved_by_a_second_person_applies_each_decision_and_the_instances_go_on(
    operator, checker
):
    steps = uncertain(3)
    ops = logged_in(operator)
    done = ops.post(reverse(SUBMIT), submission(previewed(ops, steps), steps), follow=True)
    batch = DecisionBatch.objects.get()
    assert any(f"Batch {batch.pk} is requested: 3 decision(s)" in m for m in messages_of(done))
    decisions = Decision.objects.order_by("pk")
    assert [d.operation.key for d in decisions] == [s.operation_key for s in steps]
    assert all(d.state == "requested" and d.evidence.count() == 1 for d in decisions)
    assert "Evidence reference: export line 2 (decision batch" in decisions[1].rationale
    assert "You requested this batch" in done.content.decode()

    approving = logged_in(checker)
    home = approving.get(reverse("admin:index")).content.decode()
    page = reverse("admin:handoffs_decisionbatch_change", args=[batch.pk])
    assert page in home  # the work queue links to the batch awaiting my approval
    approved = approving.post(
        reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk]), follow=True
    )
    assert any(f"Batch {batch.pk} is approved" in m for m in messages_of(approved))
    batch.refresh_from_db()
    assert (batch.state, batch.decided_by) == (BatchState.APPROVED, checker)
    assert set(Decision.objects.values_list("state", flat=True)) == {"approved"}
    for step in steps:
        instance = drive(step.instance)
        assert instance.status == InstanceStatus.COMPLETED, instance.reason
        assert api.chain_verify(api.Subject("govflow.instance", str(instance.pk))).ok


def test_an_effect_absent_batch_approved_leaves_each_step_failed_with_a_retry(operator, checker):
    steps = uncertain(2)
    ops = logged_in(operator)
    response = previewed(ops, steps, kind="effect_absent")
    ops.post(reverse(SUBMIT), submission(response, steps, kind="effect_absent"), follow=True)
    batch = DecisionBatch.objects.get()
    approved = logged_in(checker).post(
        reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk]), follow=True
    )
    assert any(f"Batch {batch.pk} is approved" in m for m in messages_of(approved))
    assert set(Operation.objects.values_list("state", flat=True)) == {"effect_absent"}
    for step in steps:
        step.refresh_from_db()
        assert step.state == "failed"


def test_a_rationale_of_several_lines_survives_the_preview_s_round_trip(operator):
    """Typed with CR LF, posted back by a client that sends LF alone: the same batch."""
    steps = uncertain(1)
    ops = logged_in(operator)
    response = previewed(ops, steps, rationale="Export checked.\r\nLine 1 shows it.")
    data = submission(response, steps)
    data["rationale"] = "Export checked.\nLine 1 shows it."
    done = ops.post(reverse(SUBMIT), data, follow=True)
    assert any("is requested" in m for m in messages_of(done)), messages_of(done)
    assert Decision.objects.get().rationale.startswith("Export checked.\nLine 1 shows it.")


def test_a_changed_selection_is_refused_and_nothing_is_recorded(operator):
    steps = uncertain(3)
    ops = logged_in(operator)
    response = previewed(ops, steps[:2])
    data = submission(response, steps[:2])
    data["steps"] = [str(s.pk) for s in steps]  # one more than previewed
    data[f"reference_{steps[2].pk}"] = "line 3"
    refused = ops.post(reverse(SUBMIT), data)
    text = " ".join(messages_of(refused))
    assert "The batch changed since its preview: the selection changed" in text
    assert steps[2].operation_key[:15] in text and "Nothing was recorded" in text
    assert Decision.objects.count() == 0 and DecisionBatch.objects.count() == 0
    # The page shows the preview as it is now: three rows, a new fingerprint.
    assert len(refused.context["preview"].rows) == 3


def test_an_operation_that_moved_between_preview_and_submit_is_refused_naming_it(operator):
    steps = uncertain(3)
    ops = logged_in(operator)
    response = previewed(ops, steps)
    # Meanwhile the ledger moves one operation on (its revision grows; still unknown).
    moved = steps[1]
    Operation.objects.filter(key=moved.operation_key).update(revision=99)
    refused = ops.post(reverse(SUBMIT), submission(response, steps))
    text = " ".join(messages_of(refused))
    assert f"operation {moved.operation_key[:15]}… (Test flow #{moved.instance_id}" in text
    assert "moved from ledger revision" in text and "to 99" in text
    assert Decision.objects.count() == 0 and DecisionBatch.objects.count() == 0


def test_a_step_decided_meanwhile_refuses_the_submission_naming_it(operator, checker):
    steps = uncertain(2)
    ops = logged_in(operator)
    response = previewed(ops, steps)
    single = handoff_request(
        instance_id=steps[0].instance_id,
        token_id=steps[0].pk,
        kind="effect_absent",
        rationale="Not in the registry.",
        actor=operator,
        evidence=[SimpleUploadedFile("x.txt", b"absent\n")],
        checks={"store": "absent"},
    )
    handoff_approve(decision_id=single.pk, actor=checker)
    refused = ops.post(reverse(SUBMIT), submission(response, steps))
    text = " ".join(messages_of(refused))
    assert f"Step(s) {steps[0].pk} are not among your steps whose outcome is unknown" in text
    assert Decision.objects.count() == 1 and DecisionBatch.objects.count() == 0


def test_steps_of_different_kinds_are_refused_as_a_mix(operator):
    one = uncertain(1, key="tests.bulk_a")
    other = uncertain(1, key="tests.bulk_b")
    ops = logged_in(operator)
    response = ops.post(reverse(PREVIEW), terms(one + other))
    text = " ".join(messages_of(response))
    assert "A batch takes steps of one kind only" in text and "mixes 2" in text
    assert "tests.bulk_a v" in text and "tests.bulk_b v" in text
    assert "preview" not in response.context or response.context.get("preview") is None
    assert Decision.objects.count() == 0


def test_every_row_needs_its_evidence_reference_and_a_file(operator):
    steps = uncertain(2)
    ops = logged_in(operator)
    response = previewed(ops, steps, kind="effect_absent")
    data = submission(response, steps, kind="effect_absent")
    data[f"reference_{steps[1].pk}"] = ""
    text = " ".join(messages_of(ops.post(reverse(SUBMIT), data)))
    assert "Row 2 (Test flow #" in text and "needs its evidence reference" in text
    data = submission(response, steps, shared=False, kind="effect_absent")
    data[f"evidence_{steps[0].pk}"] = [SimpleUploadedFile("row1.txt", b"row one\n")]
    text = " ".join(messages_of(ops.post(reverse(SUBMIT), data)))
    assert "Row 2 (Test flow #" in text and "has no evidence file" in text
    assert Decision.objects.count() == 0
    # With a file of its own for each row, it is requested.
    data[f"evidence_{steps[0].pk}"] = [SimpleUploadedFile("row1.txt", b"row one\n")]
    data[f"evidence_{steps[1].pk}"] = [SimpleUploadedFile("row2.txt", b"row two\n")]
    ops.post(reverse(SUBMIT), data)
    names = sorted(Decision.objects.values_list("evidence__name", flat=True))
    assert names == ["row1.txt", "row2.txt"]


def test_the_requester_cannot_approve_their_own_batch(django_user_model, operator):
    both = make_user(
        django_user_model,
        "bea",
        "engine.view_instance",
        "engine.operate_instance",
        "recovery.request_decision",
        "recovery.approve_decision",
    )
    steps = uncertain(2)
    client = logged_in(both)
    client.post(reverse(SUBMIT), submission(previewed(client, steps), steps))
    batch = DecisionBatch.objects.get()
    page = client.get(reverse("admin:handoffs_decisionbatch_change", args=[batch.pk]))
    assert "You requested this batch" in page.content.decode()
    assert "batch-approve-button" not in page.content.decode()
    # Not in her own queue either.
    assert f"Batch {batch.pk}:" not in client.get(reverse("admin:index")).content.decode()
    refused = client.post(
        reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk]), follow=True
    )
    assert any(f"You requested batch {batch.pk}" in m for m in messages_of(refused))
    batch.refresh_from_db()
    assert batch.state == BatchState.REQUESTED
    assert set(Decision.objects.values_list("state", flat=True)) == {"requested"}


def test_an_operation_that_moved_before_approval_refuses_the_whole_batch(operator, checker):
    steps = uncertain(3)
    ops = logged_in(operator)
    ops.post(reverse(SUBMIT), submission(previewed(ops, steps), steps))
    batch = DecisionBatch.objects.get()
    moved = steps[2]
    # A provider's answer recorded meanwhile settles one operation in the ledger.
    fence = api.lease_acquire(key=f"instance:{moved.instance_id}", holder="test", ttl=60)
    api.operation_observe(key=moved.operation_key, state="effect_confirmed", fence=fence)
    api.lease_release(fence=fence)

    refused = logged_in(checker).post(
        reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk]), follow=True
    )
    text = " ".join(messages_of(refused))
    assert f"step 'write' of instance {moved.instance_id}" in text
    assert moved.operation_key[:15] in text and "Nothing was applied" in text
    batch.refresh_from_db()
    assert batch.state == BatchState.REQUESTED
    assert set(Decision.objects.values_list("state", flat=True)) == {"requested"}
    for step in steps[:2]:
        step.refresh_from_db()
        assert step.state == TokenState.OUTCOME_UNKNOWN
        assert Operation.objects.get(key=step.operation_key).state == "outcome_unknown"


def test_a_rejected_batch_rejects_each_decision_and_the_steps_keep_waiting(operator, checker):
    steps = uncertain(2)
    ops = logged_in(operator)
    ops.post(reverse(SUBMIT), submission(previewed(ops, steps), steps))
    batch = DecisionBatch.objects.get()
    reject = reverse("admin:handoffs_decisionbatch_reject", args=[batch.pk])
    checking = logged_in(checker)
    text = " ".join(messages_of(checking.post(reject, {"note": ""}, follow=True)))
    assert "Say why the batch is rejected" in text
    checking.post(reject, {"note": "Line 2 is another parcel."})
    batch.refresh_from_db()
    assert batch.state == BatchState.REJECTED
    assert set(Decision.objects.values_list("state", flat=True)) == {"rejected"}
    # The steps can be decided again (a new batch or one by one).
    previewed(ops, steps)


def test_roles_another_tenants_steps_and_batches(django_user_model, operator, checker):
    steps = uncertain(2, tenant="north")
    stranger = make_user(
        django_user_model,
        "sven",
        "engine.view_instance",
        "engine.operate_instance",
        "recovery.request_decision",
        "recovery.approve_decision",
    )
    stranger.groups.clear()
    from tests.tenancy import bind_tenants

    bind_tenants(stranger, "south")
    as_stranger = logged_in(stranger)
    # Another tenant's step cannot be put into a batch: refused, nothing recorded.
    refused = as_stranger.post(reverse(PREVIEW), terms(steps))
    assert any("are not among your steps" in m for m in messages_of(refused))
    assert (
        str(steps[0].operation_key)
        not in as_stranger.get(reverse(SELECT) + "?action=alpha.write").content.decode()
    )
    # Another tenant's batch is not found.
    ops = logged_in(operator)
    ops.post(reverse(SUBMIT), submission(previewed(ops, steps), steps))
    batch = DecisionBatch.objects.get()
    change = reverse("admin:handoffs_decisionbatch_change", args=[batch.pk])
    approve = reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk])
    assert as_stranger.get(change).status_code == 404
    assert as_stranger.post(approve).status_code == 404
    assert DecisionBatch.objects.get().state == BatchState.REQUESTED
    # Roles: an approver without the operator's permissions selects nothing, an operator
    # approves nothing.
    assert logged_in(checker).get(reverse(SELECT)).status_code == 403
    assert logged_in(checker).post(reverse(PREVIEW), terms(steps)).status_code == 403
    assert ops.post(approve).status_code == 403


def test_a_get_on_preview_or_submit_goes_back_to_the_selection(operator):
    ops = logged_in(operator)
    for name in (PREVIEW, SUBMIT):
        response = ops.get(reverse(name))
        assert (response.status_code, response["Location"]) == (302, reverse(SELECT))


def test_previewing_40_steps_takes_a_bounded_number_of_queries(
    operator, django_assert_max_num_queries
):
    steps = uncertain(40)
    ops = logged_in(operator)
    ops.get(reverse("admin:index"))  # sessions and caches warm
    with django_assert_max_num_queries(12):
        response = previewed(ops, steps)
    assert len(response.context["preview"].rows) == 40


def test_a_broken_chain_refuses_the_batch_and_its_incident_stays_open(operator, checker):
    from recovery.models import Checkpoint, IntegrityIncident

    steps = uncertain(2)
    ops = logged_in(operator)
    ops.post(reverse(SUBMIT), submission(previewed(ops, steps), steps))
    batch = DecisionBatch.objects.get()
    broken = steps[1].instance_id
    Checkpoint.objects.filter(subject_id=str(broken), seq=1).update(fact='{"edited": true}')
    assert not IntegrityIncident.objects.exists()

    refused = logged_in(checker).post(
        reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk]), follow=True
    )
    assert any(
        f"of instance {broken}" in m and "Nothing was applied" in m for m in messages_of(refused)
    )
    assert IntegrityIncident.objects.filter(subject_id=str(broken), status="open").exists()
    assert DecisionBatch.objects.get().state == BatchState.REQUESTED
    assert set(Decision.objects.values_list("state", flat=True)) == {"requested"}
    steps[0].refresh_from_db()
    assert steps[0].state == TokenState.OUTCOME_UNKNOWN
