"""Hostile input at every way in: refused with the path of the offending value, never a 500.

Hypothesis plants one hostile thing (nesting 10,000 deep, U+0000, a lone surrogate, a
string over the limit, NaN, an integer JSON readers round, a duplicate key, a key that is
not a string) at a random path, and sends it through each entry point: the services from
Python, the admin's forms through Django's test client, and ``load_workflows``. Each must
refuse with a message naming the path, raise nothing but its own validation error, and
record nothing. On PostgreSQL a U+0000 that reached the database would fail the test with
a ``DataError``: the rules hold on both databases because nothing gets that far.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.utils.html import escape
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from govflow.engine.definitions import DefinitionInvalid
from govflow.engine.errors import InvalidRequest
from govflow.engine.models import (
    ContractMigration,
    Definition,
    Incident,
    Instance,
    Token,
    TokenState,
    TriggerDelivery,
    WaitKind,
)
from govflow.engine.services.contract_migrations import (
    instance_migrate_reject,
    instance_migrate_request,
)
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_cancel, instance_start
from govflow.engine.services.triggers import trigger_deliver
from govflow.handoffs.services.desk import (
    approval_decide,
    external_complete,
    handoff_reject,
    handoff_request,
)
from recovery.api import RecoveryValidationError, input_guard
from recovery.models import Checkpoint, Decision, EvidenceFile, Operation
from tests.engine_helpers import evidence, node, user_with
from tests.flows import action, drive, linear, start
from tests.hostile import Planted, hostile, surrogates
from tests.integration.test_engine_admin import OPERATOR_PERMS, blocked, logged_in, make_user, url

pytestmark = pytest.mark.django_db

VARIABLES_LIMIT = 4096
PAYLOAD_LIMIT = 4096
DEFINITION_LIMIT = 16384

# A few dozen examples per entry point: enough to meet every kind of poison, fast enough
# for every run of the suite on both databases.
examples = hypothesis_settings(
    max_examples=30,
    deadline=None,
    # The fixtures are set up once per test on purpose: every example must record nothing,
    # which is asserted, so the examples cannot disturb one another.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(autouse=True)
def small_limits(settings):
    settings.GOVFLOW_VARIABLES_MAX_BYTES = VARIABLES_LIMIT
    settings.GOVFLOW_PAYLOAD_MAX_BYTES = PAYLOAD_LIMIT
    settings.GOVFLOW_DEFINITION_MAX_BYTES = DEFINITION_LIMIT


RECORDS = (Definition, Instance, Token, TriggerDelivery, Incident, Operation, Checkpoint)
RECORDS += (Decision, EvidenceFile)


def evidence_files() -> list[str]:
    root = Path(django_settings.STORAGES["recovery_evidence"]["OPTIONS"]["location"])
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def snapshot() -> dict:
    state = {model.__name__: model.objects.count() for model in RECORDS}
    state["evidence files"] = evidence_files()
    state["token payloads"] = list(Token.objects.order_by("pk").values_list("state", "payload"))
    return state


def says_where(message: str, planted: Planted, *, text_limit: int | None = None) -> None:
    """The message names the path and the problem.

    Text longer than ``text_limit`` is refused for its size before it is parsed: that
    message says how large it may be, and there is no path yet to name.
    """
    if text_limit is not None and len(planted.text.encode()) > text_limit:
        assert f"at most {text_limit} bytes" in message, message
        return
    assert planted.poison.says in message, message
    assert planted.path in message, (planted.path, message)
    message.encode("utf-8")  # printable, so a page or a terminal can show it


def refused_by_service(call, planted: Planted, *errors) -> None:
    before = snapshot()
    with pytest.raises(errors or (RecoveryValidationError,)) as caught:
        call()
    says_where(str(caught.value), planted)
    assert snapshot() == before, "a refused call must record nothing"


# -- definitions ------------------------------------------------------------------------

BASE = linear(action("write"), key="tests.hostile", version=1)
TARGETS = [("description",), ("title",), ("nodes", 1, "title"), ("variables", "description")]
BASE["variables"] = {"type": "object", "description": "what the applicant sends"}


def hostile_definitions(*, text: bool):
    return st.one_of(
        *(
            hostile(limit=DEFINITION_LIMIT, text=text, at=at, base=BASE, top_key=False)
            for at in TARGETS
        )
    )


@examples
@given(hostile_definitions(text=False))
def test_definition_publish_refuses_hostile_documents(planted):
    refused_by_service(
        lambda: definition_publish(document=planted.value), planted, DefinitionInvalid
    )


@examples
@given(hostile_definitions(text=True))
def test_the_upload_page_refuses_hostile_definition_files(client_of_operator, planted):
    before = snapshot()
    response = client_of_operator.post(
        url("definition_upload"),
        {"file": SimpleUploadedFile("flow.json", planted.text.encode())},
    )
    assert response.status_code == 200
    page = response.content.decode()
    shown = dataclasses.replace(planted, path=escape(planted.path))
    says_where(page, shown, text_limit=DEFINITION_LIMIT)
    assert snapshot() == before


@examples
@given(hostile_definitions(text=True))
def test_load_workflows_refuses_hostile_files_one_line_each(tmp_path_factory, capsys, planted):
    folder = tmp_path_factory.mktemp("flows")
    bad = folder / "hostile.json"
    bad.write_text(planted.text, encoding="utf-8")
    before = snapshot()
    with pytest.raises(CommandError, match="1 definition file"):
        call_command("load_workflows", str(bad))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{bad}: "), lines
    says_where(lines[0], planted, text_limit=DEFINITION_LIMIT)
    assert snapshot() == before


def test_the_published_definition_holds_exactly_the_guards_bytes():
    definition = definition_publish(document=BASE)
    assert definition.document.encode() == input_guard(BASE, max_bytes=DEFINITION_LIMIT)


# -- starting instances -----------------------------------------------------------------


@pytest.fixture
def definition():
    return definition_publish(document=linear(action("write"), key="tests.hostile_start"))


def hostile_variables(*, text: bool):
    return hostile(limit=VARIABLES_LIMIT, text=text)


@examples
@given(hostile_variables(text=False))
def test_instance_start_refuses_hostile_variables(definition, planted):
    refused_by_service(
        lambda: instance_start(definition=definition, variables=planted.value), planted
    )


@examples
@given(hostile_variables(text=True))
def test_the_start_page_refuses_hostile_variables(client_of_operator, definition, planted):
    before = snapshot()
    response = client_of_operator.post(
        url("instance_start"),
        # A tenant of the operator's (her groups): the variables reach the service's guard.
        {"definition": definition.pk, "tenant": "city-hall", "variables": planted.text},
    )
    assert response.status_code == 200
    page = response.content.decode()
    shown = dataclasses.replace(planted, path=escape(planted.path))
    says_where(page, shown, text_limit=VARIABLES_LIMIT)
    assert snapshot() == before


def test_python_callers_have_the_forms_size_limit(definition):
    # The issue: 10 MB of variables from Python were accepted while the form capped them.
    variables = {"blob": "x" * (VARIABLES_LIMIT + 1)}
    with pytest.raises(InvalidRequest, match=r"\$\.blob: the value grows past the 4096 bytes"):
        instance_start(definition=definition, variables=variables)
    assert not Instance.objects.exists()


def test_variables_at_the_depth_limit_start_and_show(client_of_operator, definition):
    variables: dict = {"leaf": 1}
    for _ in range(62):  # with "deep" around it: 64 levels, the most an input may have
        variables = {"a": variables}
    instance = instance_start(definition=definition, variables={"deep": variables})
    page = client_of_operator.get(url("instance_change", instance.pk))
    assert page.status_code == 200
    with pytest.raises(InvalidRequest, match="nested deeper than 64 levels"):
        instance_start(definition=definition, variables={"deep": {"one more": variables}})


@examples
@given(st.sampled_from(["\x00"]) | surrogates, st.sampled_from(["tenant", "access"]))
def test_instance_start_refuses_unstorable_text_outside_the_variables(definition, bad, where):
    kwargs = {"tenant": f"ten{bad}ant"} if where == "tenant" else {"access": {"role": bad}}
    before = snapshot()
    with pytest.raises(InvalidRequest) as caught:
        instance_start(definition=definition, variables={}, **kwargs)
    assert ("U+0000" if bad == "\x00" else "lone surrogate") in str(caught.value)
    assert (where == "tenant") == str(caught.value).startswith("tenant: ")
    assert snapshot() == before


# -- trigger messages and external tasks ------------------------------------------------


def hostile_payloads():
    return hostile(limit=PAYLOAD_LIMIT, text=False)


@examples
@given(hostile_payloads())
def test_trigger_deliver_refuses_hostile_payloads(planted):
    refused_by_service(
        lambda: trigger_deliver(
            message="permit.paid", correlation="A-1", delivery_id="d-1", payload=planted.value
        ),
        planted,
    )


@examples
@given(
    st.sampled_from(["message", "correlation", "delivery_id"]),
    st.sampled_from(["\x00"]) | surrogates,
)
def test_trigger_deliver_refuses_unstorable_names(field, bad):
    names = {"message": "permit.paid", "correlation": "A-1", "delivery_id": "d-1"}
    names[field] = f"x{bad}y"
    before = snapshot()
    with pytest.raises(InvalidRequest, match=f"^{field}: the string"):
        trigger_deliver(**names, payload={})
    assert snapshot() == before


@pytest.fixture
def external_token():
    instance = drive(start(linear(node("x", "external", topic="scan"))))
    token = instance.tokens.get(node_id="x")
    assert (token.state, token.wait_kind) == (TokenState.WAITING, WaitKind.EXTERNAL)
    return token


@examples
@given(hostile_payloads())
def test_external_complete_refuses_hostile_payloads(external_token, planted):
    refused_by_service(
        lambda: external_complete(
            instance_id=external_token.instance_id,
            token_id=external_token.pk,
            payload=planted.value,
        ),
        planted,
    )


# -- approvals, cancels and decisions: text that is stored as written -------------------

bad_texts = st.builds(
    lambda before, bad, after: before + bad + after,
    st.text(max_size=5).filter(lambda t: "\x00" not in t),
    st.sampled_from(["\x00"]) | surrogates,
    st.text(max_size=5).filter(lambda t: "\x00" not in t),
)


@pytest.fixture
def operator(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def client_of_operator(operator):
    return logged_in(operator)


@pytest.fixture
def approval_token():
    approval = {"id": "sign", "type": "approval", "permission": "engine.operate_instance"}
    return drive(start(linear(approval))).tokens.get(node_id="sign")


def unstorable(message: str) -> bool:
    return "U+0000" in message or "lone surrogate" in message


@examples
@given(bad_texts)
def test_approval_notes_refuse_unstorable_text(approval_token, operator, note):
    before = snapshot()
    with pytest.raises(InvalidRequest) as caught:
        approval_decide(
            instance_id=approval_token.instance_id,
            token_id=approval_token.pk,
            actor=operator,
            approved=True,
            note=note,
        )
    assert str(caught.value).startswith("note: ") and unstorable(str(caught.value))
    assert snapshot() == before


@examples
@given(bad_texts)
def test_cancel_reasons_refuse_unstorable_text(approval_token, operator, reason):
    if not reason.strip():
        reason = "x" + reason
    before = snapshot()
    with pytest.raises(InvalidRequest) as caught:
        instance_cancel(instance_id=approval_token.instance_id, actor=operator, reason=reason)
    assert unstorable(str(caught.value))
    assert snapshot() == before


@pytest.fixture
def uncertain(operator):
    instance = blocked()
    return instance, instance.tokens.get(node_id="write")


@examples
@given(bad_texts, st.sampled_from(["rationale", "check"]))
def test_decision_requests_refuse_unstorable_text(uncertain, operator, text, field):
    instance, token = uncertain
    rationale = f"checked {text}" if field == "rationale" else "checked the store"
    checks = {"store": f"found {text}" if field == "check" else "found"}
    before = snapshot()
    with pytest.raises(RecoveryValidationError) as caught:
        handoff_request(
            instance_id=instance.pk,
            token_id=token.pk,
            kind="effect_confirmed",
            rationale=rationale,
            actor=operator,
            evidence=[evidence()],
            checks=checks,
        )
    message = str(caught.value)
    assert unstorable(message)
    assert ("$.rationale" if field == "rationale" else "$.checks.store") in message
    assert snapshot() == before


def test_a_decision_rejection_refuses_unstorable_notes(uncertain, operator, django_user_model):
    instance, token = uncertain
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token.pk,
        kind="effect_confirmed",
        rationale="The store has the key.",
        actor=operator,
        evidence=[evidence()],
        checks={"store": "found"},
    )
    checker = user_with(django_user_model, "carl", "recovery.approve_decision")
    with pytest.raises(RecoveryValidationError, match=r"\$\.note: string contains U\+0000"):
        handoff_reject(decision_id=decision.pk, actor=checker, note="no\x00pe")
    decision.refresh_from_db()
    assert decision.state == "requested"


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        ("instance_cancel", {"reason": "stop\x00now"}),
        ("instance_approval", {"decision": "approve", "note": "ok\x00"}),
        ("instance_handoff", {"kind": "cancel", "rationale": "be\x00cause"}),
    ],
)
def test_admin_forms_refuse_nul_without_a_server_error(
    client_of_operator, approval_token, uncertain, route, fields
):
    instance, token = (
        (uncertain[0], uncertain[1])
        if route == "instance_handoff"
        else (approval_token.instance, approval_token)
    )
    args = (instance.pk,) if route == "instance_cancel" else (instance.pk, token.pk)
    before = snapshot()
    response = client_of_operator.post(url(route, *args), fields)
    assert response.status_code == 200
    assert "Null characters are not allowed." in response.content.decode()
    assert snapshot() == before


def test_hostile_strategies_do_reach_every_kind_of_poison():
    """The hostile generators are not vacuous: each family of poison is produced."""
    seen = set()

    @hypothesis_settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(hostile_variables(text=False))
    def collect(planted):
        seen.add(planted.poison.kind)

    collect()
    families = [
        {"deep"},
        {"bad-string", "bad-key"},
        {"huge"},
        {"nan", "inf", "-inf", "1e400"},
        {"big-int", "huge-int"},
        {"int-key", "none-key", "tuple-key", "set", "bytes"},
    ]
    assert all(family & seen for family in families), seen


# -- the cases of the issue, as they were found -----------------------------------------


def deep_json(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


def test_variables_950_deep_on_the_start_page_are_refused_not_a_server_error(
    client_of_operator, definition, settings
):
    settings.GOVFLOW_VARIABLES_MAX_BYTES = 256 * 1024
    response = client_of_operator.post(
        url("instance_start"),
        {"definition": definition.pk, "tenant": "t", "variables": deep_json(950)},
    )
    assert response.status_code == 200
    assert "nested deeper than 64 levels here" in response.content.decode()
    assert not Instance.objects.exists()


def test_a_description_920_deep_is_not_published_and_the_pages_stay_up(client_of_operator):
    document = {**BASE, "description": json.loads(deep_json(920))}
    with pytest.raises(DefinitionInvalid, match=r"^The definition is invalid:\n- \$\.description"):
        definition_publish(document=document)
    assert not Definition.objects.exists()
    assert client_of_operator.get(url("definition_changelist")).status_code == 200


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (deep_json(10_000), "$.x.x.x.x.x.x.x.x…(48 levels)…"),
        (
            json.dumps(BASE)[:-1] + ', "title": "Second title"}',
            "$.title: the key 'title' appears twice in one object.",
        ),
    ],
    ids=["10000-deep", "duplicate-key"],
)
def test_load_workflows_refuses_what_the_upload_refuses_in_one_line(
    tmp_path, capsys, settings, text, says
):
    settings.GOVFLOW_DEFINITION_MAX_BYTES = 1024 * 1024
    bad = tmp_path / "hostile.json"
    bad.write_text(text)
    with pytest.raises(CommandError, match="1 definition file"):
        call_command("load_workflows", str(bad))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"{bad}: not readable JSON: {says}"), err
    assert not Definition.objects.exists()


@pytest.mark.parametrize("where", ["variables", "title"])
def test_nul_in_variables_or_a_title_is_refused_on_every_database(definition, where):
    if where == "title":
        with pytest.raises(DefinitionInvalid, match=r"\$\.title: string contains U\+0000"):
            definition_publish(document={**BASE, "title": "Permit\x00"})
    else:
        with pytest.raises(InvalidRequest, match=r"\$\.applicant: string contains U\+0000"):
            instance_start(definition=definition, variables={"applicant": "A\x00da"})
    assert snapshot()["Instance"] == 0 and not Definition.objects.exclude(pk=definition.pk).exists()


def test_a_value_10000_deep_from_python_is_a_validation_error(definition):
    value = json.loads("1")
    for _ in range(10_000):
        value = {"x": value}
    with pytest.raises(InvalidRequest, match="nested deeper than 64 levels"):
        instance_start(definition=definition, variables=value)
    with pytest.raises(DefinitionInvalid, match="nested deeper than 64 levels"):
        definition_publish(document={**BASE, "description": value})


@pytest.fixture
def migrator(django_user_model):
    return user_with(django_user_model, "mia", "engine.migrate_instance")


@examples
@given(bad_texts, st.sampled_from(["request", "reject"]))
def test_contract_migration_texts_refuse_unstorable_text(migrator, approval_token, text, what):
    before = snapshot()
    with pytest.raises(InvalidRequest) as caught:
        if what == "request":
            instance_migrate_request(
                instance_id=approval_token.instance_id,
                action="alpha.write",
                rationale=f"checked {text}",
                actor=migrator,
            )
        else:
            instance_migrate_reject(migration_id=1, actor=migrator, note=f"no {text}")
    assert unstorable(str(caught.value))
    assert snapshot() == before
    assert not ContractMigration.objects.exists()
