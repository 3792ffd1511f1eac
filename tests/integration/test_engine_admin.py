"""The operators' engine admin, driven through the Django test client.

Every page checks its permission; uploads and forms never turn bad input into a 500; each
action calls its service and shows the service's own words when it refuses.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from govflow.engine.models import Definition, Instance, InstanceStatus, TokenState, WaitKind
from govflow.engine.provider import Failed
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from recovery.models import Decision, Operation
from tests.flows import action, drive, linear, start
from tests.identity import verified_login
from tests.providers.alpha import effects
from tests.tenancy import bind_only, bind_tenants

pytestmark = pytest.mark.django_db

CHECK_INSTRUCTION = "Look the idempotency key up in the alpha effect store."
OPERATOR_PERMS = (
    "engine.view_definition",
    "engine.publish_definition",
    "engine.view_instance",
    "engine.start_instance",
    "engine.operate_instance",
    "recovery.request_decision",
    "recovery.approve_decision",
    "engine.view_token",
    "engine.view_timer",
    "engine.view_triggerdelivery",
    "engine.view_incident",
)


def make_user(django_user_model, username: str, *perms: str, staff: bool = True):
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=staff)
    bind_tenants(user)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return django_user_model.objects.get(pk=user.pk)


def logged_in(user, **kwargs) -> Client:
    """A client logged in with a second factor verified (the desk's actions need one)."""
    return verified_login(Client(**kwargs), user)


@pytest.fixture
def operator(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def checker(django_user_model):
    return make_user(django_user_model, "carl", "engine.view_instance", "recovery.approve_decision")


@pytest.fixture
def viewer(django_user_model):
    return make_user(django_user_model, "vera", "engine.view_instance", "engine.view_definition")


@pytest.fixture
def ops(operator) -> Client:
    return logged_in(operator)


def url(name: str, *args) -> str:
    return reverse(f"admin:engine_{name}", args=args)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def blocked() -> Instance:
    """An instance whose only step raised after dispatch: outcome unknown."""
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("write"))))
    assert instance.status == InstanceStatus.BLOCKED
    return instance


def decision_form(token, *, evidence=None, **fields) -> dict:
    data = {
        "kind": "effect_confirmed",
        "check_store": "the key is in the store",
        "rationale": "The alpha store holds the record under this idempotency key.",
        "evidence": [SimpleUploadedFile("store-extract.txt", b"key found, value v1\n")]
        if evidence is None
        else evidence,
    }
    data.update(fields)
    return data


# -- permissions ------------------------------------------------------------------------

GET_PAGES = [
    ("definition_changelist", False),
    ("definition_change", "definition"),
    ("definition_upload", False),
    ("instance_changelist", False),
    ("instance_change", "instance"),
    ("instance_start", False),
    ("token_changelist", False),
    ("timer_changelist", False),
    ("triggerdelivery_changelist", False),
    ("incident_changelist", False),
]
POST_ACTIONS = [
    ("instance_cancel", ("instance",)),
    ("instance_retry", ("instance", "token")),
    ("instance_approval", ("instance", "token")),
    ("instance_handoff", ("instance", "token")),
    ("instance_reconcile", ("instance", "token")),
    ("instance_decision_approve", ("instance", 999)),
    ("instance_decision_reject", ("instance", 999)),
    ("instance_migrate", ("instance",)),
    ("instance_migration_approve", ("instance", 999)),
    ("instance_migration_reject", ("instance", 999)),
]


@pytest.fixture
def objects():
    instance = start(linear(action("write")))
    return {
        "definition": instance.definition_id,
        "instance": instance.pk,
        "token": instance.tokens.get().pk,
    }


def page_url(name: str, arg, objects) -> str:
    return url(name, objects[arg]) if arg else url(name)


def action_url(name: str, args, objects) -> str:
    return url(name, *[objects.get(a, a) for a in args])


@pytest.mark.parametrize(("name", "arg"), GET_PAGES)
def test_pages_send_anonymous_visitors_to_the_login_and_refuse_staff_without_permission(
    client, django_user_model, objects, name, arg
):
    target = page_url(name, arg, objects)
    response = client.get(target)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    staff = make_user(django_user_model, "sam")
    assert logged_in(staff).get(target).status_code == 403


@pytest.mark.parametrize(("name", "args"), POST_ACTIONS)
def test_actions_send_anonymous_visitors_to_the_login_and_refuse_staff_without_permission(
    client, django_user_model, objects, name, args
):
    target = action_url(name, args, objects)
    response = client.post(target, {"reason": "x"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    staff = make_user(django_user_model, "sam")
    assert logged_in(staff).post(target, {"reason": "x"}).status_code == 403


@pytest.mark.parametrize(("name", "args"), [a for a in POST_ACTIONS if a[0] != "instance_approval"])
def test_viewing_an_instance_does_not_allow_operating_it(viewer, objects, name, args):
    response = logged_in(viewer).post(action_url(name, args, objects), {"reason": "x"})
    assert response.status_code == 403
    assert Instance.objects.get(pk=objects["instance"]).status == InstanceStatus.RUNNING


def test_a_non_staff_user_with_every_permission_never_reaches_the_admin(django_user_model, objects):
    user = make_user(django_user_model, "outsider", *OPERATOR_PERMS, staff=False)
    response = logged_in(user).get(url("instance_change", objects["instance"]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_actions_refuse_get_and_posts_without_a_csrf_token(operator, objects):
    # A GET (a reload after a validation error) changes nothing and goes back to the page.
    target = url("instance_cancel", objects["instance"])
    response = logged_in(operator).get(target)
    assert response.status_code == 302
    assert response["Location"] == url("instance_change", objects["instance"])
    guarded = logged_in(operator, enforce_csrf_checks=True)
    assert guarded.post(target, {"reason": "forged"}).status_code == 403
    assert Instance.objects.get(pk=objects["instance"]).status == InstanceStatus.RUNNING


def test_nobody_adds_changes_or_deletes_engine_rows_through_model_forms(django_user_model, objects):
    root = logged_in(django_user_model.objects.create_superuser("root", password="pw"))
    for model in ("definition", "instance", "token", "timer", "triggerdelivery", "incident"):
        assert root.get(url(f"{model}_add")).status_code == 403, model
    assert root.get(url("definition_delete", objects["definition"])).status_code == 403
    page = root.get(url("definition_change", objects["definition"]))
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert (
        root.post(url("definition_change", objects["definition"]), {"title": "Edited"}).status_code
        == 403
    )
    assert Definition.objects.get(pk=objects["definition"]).title == "Test flow"


# -- definitions ------------------------------------------------------------------------


def upload(client: Client, content: bytes, name: str = "permit.json"):
    return client.post(
        url("definition_upload"), {"file": SimpleUploadedFile(name, content, "application/json")}
    )


def test_an_uploaded_definition_is_published_listed_and_shown_pretty(ops, operator):
    document = linear(action("write"), key="tests.admin_upload", version=1)
    response = upload(ops, json.dumps(document).encode())
    definition = Definition.objects.get(key="tests.admin_upload")
    assert response.status_code == 302
    assert response["Location"] == url("definition_change", definition.pk)
    assert (definition.source, definition.published_by) == ("permit.json", operator)
    detail = ops.get(response["Location"])
    assert f"{definition} is published" in messages_of(detail)[0]
    assert b"&quot;action&quot;: &quot;alpha.write&quot;" in detail.content
    assert b"Yes: every action it names is registered." in detail.content
    assert f"?definition={definition.pk}".encode() in detail.content  # "Start an instance"
    listing = ops.get(url("definition_changelist"))
    assert b"tests.admin_upload" in listing.content
    assert url("definition_upload").encode() in listing.content
    assert definition.fingerprint[:12].encode() in listing.content


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "The file is not valid JSON"),
        (b'{"key": "tests.x", "title": "caf\xe9"}', "The file is not UTF-8 text"),
        (b'{"version": NaN}', "NaN is not a JSON number"),
        (b'{"key": "a.b", "key": "a.c"}', "the key &#x27;key&#x27; appears twice"),
        (b'[{"key": "tests.x"}]', "A definition is a JSON object, not list"),
        (b"", "The submitted file is empty"),
    ],
)
def test_an_unreadable_upload_is_refused_on_the_form(ops, content, says):
    response = upload(ops, content)
    assert response.status_code == 200
    assert says in response.content.decode()
    assert not Definition.objects.exists()


def test_an_upload_over_the_size_limit_is_refused(ops, settings):
    settings.GOVFLOW_DEFINITION_MAX_BYTES = 64
    response = upload(ops, json.dumps(linear(action("write"))).encode())
    assert response.status_code == 200
    assert "a definition may be at most 64 bytes" in response.content.decode()
    assert not Definition.objects.exists()


def test_an_invalid_definition_lists_every_problem_and_stores_nothing(ops):
    document = linear(action("write", name="alpha.nope"), key="tests.bad", version=1)
    document["title"] = ""
    response = upload(ops, json.dumps(document).encode())
    assert response.status_code == 200
    problems = [str(p) for p in response.context["problems"]]
    assert any("'title' must be a non-empty string" in p for p in problems)
    assert any("no installed provider registers action 'alpha.nope'" in p for p in problems)
    assert b"2 problems" in response.content
    assert not Definition.objects.exists()


def test_a_changed_published_version_is_refused_with_the_services_message(ops):
    document = linear(action("write"), key="tests.frozen", version=1)
    definition_publish(document=document)
    response = upload(ops, json.dumps({**document, "title": "Changed"}).encode())
    assert response.status_code == 302
    shown = messages_of(ops.get(response["Location"]))
    assert "already published with different content" in shown[0]
    assert "publish it as version 2" in shown[0]
    assert Definition.objects.get(key="tests.frozen").title == "Test flow"


# -- starting and cancelling ------------------------------------------------------------


def test_an_instance_started_from_the_page_is_queued_and_shown(ops, operator):
    bind_only(operator, "default", "city-hall")  # the tenants the start form offers her
    definition = definition_publish(document=linear(action("write"), key="tests.start"))
    assert ops.get(url("instance_start") + f"?definition={definition.pk}").status_code == 200
    response = ops.post(
        url("instance_start"),
        {"definition": definition.pk, "tenant": "city-hall", "variables": '{"value": "v7"}'},
    )
    instance = Instance.objects.get()
    assert response["Location"] == url("instance_change", instance.pk)
    assert (instance.tenant, instance.variables, instance.started_by) == (
        "city-hall",
        {"value": "v7"},
        operator,
    )
    page = ops.get(response["Location"])
    assert b"Running" in page.content and b"&quot;v7&quot;" in page.content
    assert b"<td>start</td>" in page.content


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ("{oops", "Not valid JSON"),
        ("[1, 2]", "Variables must be a JSON object"),
        # The start form checks the schema itself, naming the value (no service call).
        ('{"value": 3}', "3 is not of type &#x27;string&#x27;"),
    ],
)
def test_bad_variables_are_shown_on_the_start_form_and_nothing_starts(ops, variables, says):
    definition = definition_publish(
        document=linear(
            action("write"),
            key="tests.schema",
            variables_schema={"type": "object", "properties": {"value": {"type": "string"}}},
        )
    )
    response = ops.post(
        url("instance_start"),
        {"definition": definition.pk, "tenant": "default", "variables": variables, "raw": "1"},
    )
    assert response.status_code == 200
    assert says in response.content.decode()
    assert not Instance.objects.exists()


def test_an_instance_is_cancelled_with_a_reason_once(ops, operator):
    instance = start(linear(action("write")))
    target = url("instance_cancel", instance.pk)
    without_reason = ops.post(target, {"reason": " "})
    assert without_reason.status_code == 200
    assert b"This field is required" in without_reason.content
    response = ops.post(target, {"reason": "Applicant withdrew"})
    assert response.status_code == 302
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert "Applicant withdrew" in instance.reason
    assert set(instance.tokens.values_list("state", flat=True)) == {TokenState.CANCELLED}
    again = ops.post(target, {"reason": "twice"}, follow=True)
    assert f"Instance {instance.pk} is already cancelled." in messages_of(again)
    assert b"Cancel this instance" not in again.content


# -- the instance page and its actions --------------------------------------------------


def test_the_instance_page_shows_steps_ledger_and_a_verified_chain(ops):
    instance = drive(start(linear(action("write"), action("note", name="alpha.note"))))
    assert instance.status == InstanceStatus.COMPLETED
    page = ops.get(url("instance_change", instance.pk))
    text = page.content.decode()
    for op in Operation.objects.filter(subject_id=str(instance.pk)):
        assert op.key in text
    assert f"Ledger operations of govflow.instance:{instance.pk}" in text
    assert "Verified:" in text and "consistent with the ledger" in text
    assert "alpha.write: Write to the alpha store" in text
    assert "Cancel this instance" not in text


def test_a_failed_step_is_retried_from_its_page(ops):
    effects.SCRIPT["alpha.write"] = [Failed("registry refused", permanent=True)]
    instance = drive(start(linear(action("write"))))
    token = instance.tokens.get(node_id="write")
    assert (instance.status, token.state) == (InstanceStatus.FAILED, TokenState.FAILED)
    assert b"Retry step" in ops.get(url("instance_change", instance.pk)).content
    response = ops.post(url("instance_retry", instance.pk, token.pk), follow=True)
    assert "Step 'write' will be retried (attempt 1)." in messages_of(response)
    token.refresh_from_db()
    assert (token.state, token.attempt) == (TokenState.READY, 1)
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_retry_of_an_unknown_outcome_is_refused_with_the_services_message(ops):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    response = ops.post(url("instance_retry", instance.pk, token.pk), follow=True)
    assert any(
        "Retry is unavailable while the outcome is unknown" in m for m in messages_of(response)
    )
    token.refresh_from_db()
    assert token.state == TokenState.OUTCOME_UNKNOWN


def test_an_approval_step_is_decided_by_someone_with_its_permission(ops, viewer):
    approval = {"id": "sign", "type": "approval", "permission": "engine.operate_instance"}
    instance = drive(start(linear(approval)))
    token = instance.tokens.get(node_id="sign")
    assert (token.state, token.wait_kind) == (TokenState.WAITING, WaitKind.APPROVAL)
    target = url("instance_approval", instance.pk, token.pk)
    as_viewer = logged_in(viewer)
    assert (
        b"Waiting for someone with the permission"
        in as_viewer.get(url("instance_change", instance.pk)).content
    )
    refused = as_viewer.post(target, {"decision": "approve"})
    assert refused.status_code == 200
    assert "it needs the permission &#x27;engine.operate_instance&#x27;" in (
        refused.content.decode()
    )
    token.refresh_from_db()
    assert token.state == TokenState.WAITING
    assert ops.post(target, {"decision": "maybe"}).status_code == 200
    done = ops.post(target, {"decision": "approve", "note": "signed"}, follow=True)
    assert "You approved 'sign'; it is recorded." in messages_of(done)
    token.refresh_from_db()
    assert token.state == TokenState.READY and token.payload["approved"] is True
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_an_unknown_outcome_is_resolved_by_a_decision_and_a_second_person(ops, operator, checker):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    page = ops.get(url("instance_change", instance.pk)).content.decode()
    assert CHECK_INSTRUCTION in page and "Request a decision on 'write'" in page

    response = ops.post(
        url("instance_handoff", instance.pk, token.pk),
        decision_form(
            token,
            evidence=[
                SimpleUploadedFile("store-extract.txt", b"key found\n"),
                SimpleUploadedFile("mail.eml", b"From: alpha\n\nconfirmed\n"),
            ],
        ),
    )
    assert response.status_code == 302
    decision = Decision.objects.get()
    assert (decision.kind, decision.requested_by, decision.checks) == (
        "effect_confirmed",
        operator,
        {"store": "the key is in the store"},
    )
    assert sorted(decision.evidence.values_list("name", flat=True)) == [
        "mail.eml",
        "store-extract.txt",
    ]

    approve = url("instance_decision_approve", instance.pk, decision.pk)
    own = ops.post(approve, follow=True)
    assert any(
        "The person who requested a decision cannot approve it" in m for m in messages_of(own)
    )
    decision.refresh_from_db()
    token.refresh_from_db()
    assert (decision.state, token.state) == ("requested", TokenState.OUTCOME_UNKNOWN)

    second = logged_in(checker).post(approve, {"result_fp": decision.result_fp}, follow=True)
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is approved" in m for m in messages_of(second)
    )
    token.refresh_from_db()
    assert token.state == TokenState.COMPLETED
    assert drive(instance).status == InstanceStatus.COMPLETED
    again = logged_in(checker).post(approve, follow=True)
    assert any("not waiting for a decision" in m for m in messages_of(again))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"evidence": []}, "needs at least one evidence file"),
        ({"check_store": ""}, "Answer the provider&#x27;s verification checks first: store"),
        ({"evidence": [SimpleUploadedFile("tool.exe", b"MZ")]}, "are not accepted as evidence"),
        ({"rationale": ""}, "This field is required"),
        ({"kind": "guess"}, "Select a valid choice"),
    ],
)
def test_an_incomplete_decision_request_is_shown_on_its_form(ops, fields, says):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    response = ops.post(
        url("instance_handoff", instance.pk, token.pk), decision_form(token, **fields)
    )
    assert response.status_code == 200
    assert says in response.content.decode()
    assert not Decision.objects.exists()


def test_a_rejected_decision_leaves_the_step_waiting_for_a_new_request(ops, checker):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    ops.post(url("instance_handoff", instance.pk, token.pk), decision_form(token))
    decision = Decision.objects.get()
    as_checker = logged_in(checker)
    target = url("instance_decision_reject", instance.pk, decision.pk)
    assert as_checker.post(target, {"note": ""}).status_code == 200
    response = as_checker.post(target, {"note": "The extract is from another case."}, follow=True)
    assert any("is rejected" in m for m in messages_of(response))
    decision.refresh_from_db()
    assert (decision.state, decision.decision_note) == (
        "rejected",
        "The extract is from another case.",
    )
    assert b"Request a decision on" in ops.get(url("instance_change", instance.pk)).content


def test_a_decision_is_only_reachable_through_its_own_instance(ops, checker):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    ops.post(url("instance_handoff", instance.pk, token.pk), decision_form(token))
    other = instance_start(definition=instance.definition)
    target = url("instance_decision_approve", other.pk, Decision.objects.get().pk)
    assert logged_in(checker).post(target).status_code == 404
    assert Decision.objects.get().state == "requested"


def test_decisions_are_shown_to_the_recovery_desk_only(ops, checker, viewer):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    ops.post(url("instance_handoff", instance.pk, token.pk), decision_form(token))
    decision = Decision.objects.get()
    page = url("instance_change", instance.pk)
    as_checker = logged_in(checker).get(page).content.decode()
    assert decision.rationale in as_checker and "store-extract.txt" in as_checker
    assert f"Approve decision {decision.pk}" in as_checker
    as_viewer = logged_in(viewer).get(page).content.decode()
    assert decision.rationale not in as_viewer and "store-extract.txt" not in as_viewer
    assert f"Approve decision {decision.pk}" not in as_viewer


# -- read-only records ------------------------------------------------------------------


def test_working_records_are_listed_read_only(ops):
    instance = blocked()
    text = ops.get(url("token_changelist")).content.decode()
    assert f"Instance {instance.pk}" in text and "Outcome unknown" in text
    for model in ("timer", "triggerdelivery", "incident"):
        assert ops.get(url(f"{model}_changelist")).status_code == 200
    token = instance.tokens.get(node_id="write")
    detail = ops.get(url("token_change", token.pk))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
