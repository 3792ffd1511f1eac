"""An instance's audit trail: downloaded from the desk (permission-checked), verified offline
by ``recovery_verify --file`` with the chain key and no database, and an edited file is
refused naming what broke."""

from __future__ import annotations

import copy
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from govflow.engine.models import InstanceStatus, TokenState
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from tests.engine_helpers import evidence, token_of, user_with
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

AUDITOR_PERMS = ("engine.view_instance", "recovery.view_checkpoint")


def decided_instance(requester, approver):
    """a (outcome unknown, then confirmed by two people with evidence) → b: a full trail."""
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("a"), action("b"))))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind="effect_confirmed",
        rationale="The alpha store holds the record.",
        actor=requester,
        evidence=[evidence()],
        checks={"store": "Found the record in the alpha store."},
        result={"key": "k-1"},
    )
    handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    return instance


def download(client: Client, instance) -> dict:
    response = client.get(reverse("admin:engine_instance_trail", args=[instance.pk]))
    assert response.status_code == 200
    assert response["Content-Disposition"] == (
        f'attachment; filename="instance-{instance.pk}-trail.json"'
    )
    assert response["X-Content-Type-Options"] == "nosniff"
    return json.loads(response.content)


def verify(tmp_path, document, django_assert_num_queries) -> tuple[int, str]:
    """Run ``recovery_verify --file`` on ``document`` without touching the database."""
    path = tmp_path / "trail.json"
    path.write_text(json.dumps(document))
    out = io.StringIO()
    with django_assert_num_queries(0):
        try:
            call_command("recovery_verify", "--file", str(path), stdout=out)
        except SystemExit as exc:
            return int(exc.code), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def auditor(django_user_model):
    return user_with(django_user_model, "audrey", *AUDITOR_PERMS)


@pytest.fixture
def trail(requester, approver, auditor):
    instance = decided_instance(requester, approver)
    client = Client()
    client.force_login(auditor)
    return instance, download(client, instance)


def test_the_trail_holds_the_ledger_chain_decisions_evidence_and_observations(trail):
    instance, document = trail
    assert document["format"] == "govflow.trail/1"
    assert document["instance"] == instance.pk
    assert document["subject"] == f"govflow.instance:{instance.pk}"
    kinds = [cp["kind"] for cp in document["checkpoints"]]
    assert "operation.recorded" in kinds and "decision.requested" in kinds
    assert [cp["seq"] for cp in document["checkpoints"]] == list(range(1, len(kinds) + 1))
    assert all(cp["link"] and cp["prev_link"] for cp in document["checkpoints"])
    states = sorted(op["state"] for op in document["operations"])
    assert states == ["effect_confirmed", "succeeded"]
    (decision,) = document["decisions"]
    assert (decision["kind"], decision["state"]) == ("effect_confirmed", "approved")
    (file,) = decision["evidence"]
    assert len(file["blake3"]) == 64 and file["size"] > 0
    assert {o["state"] for o in document["observations"]} >= {"succeeded"}


def test_a_downloaded_trail_verifies_offline(trail, tmp_path, django_assert_num_queries):
    instance, document = trail
    code, out = verify(tmp_path, document, django_assert_num_queries)
    assert code == 0, out
    assert out.startswith(f"ok govflow.instance:{instance.pk}: {len(document['checkpoints'])}")
    assert "2 operation(s) and 1 decision(s) agree with the replay" in out


def edit_fact(document):
    document["checkpoints"][1]["fact"]["state"] = "effect_absent"


def edit_link(document):
    document["checkpoints"][0]["link"] = "0" * 64


def drop_checkpoint(document):
    del document["checkpoints"][1]


def edit_operation(document):
    document["operations"][0]["input_fp"] = "f" * 64


def drop_operation(document):
    del document["operations"][0]


def edit_result(document):
    document["decisions"][0]["result"] = {"forged": True}


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (edit_fact, "fact does not match its fingerprint"),
        (edit_link, "does not verify with key"),
        (drop_checkpoint, "checkpoint #2 is missing"),
        (edit_operation, "input_fp is"),
        (drop_operation, "is in the chain but its row is missing"),
        (edit_result, "result differs from the one its request recorded"),
    ],
)
def test_an_edited_trail_is_refused_naming_what_broke(
    trail, tmp_path, django_assert_num_queries, edit, says
):
    _, document = trail
    edited = copy.deepcopy(document)
    edit(edited)
    code, out = verify(tmp_path, edited, django_assert_num_queries)
    assert code == 1
    assert out.startswith("BROKEN govflow.instance:") and says in out, out


def test_a_trail_checked_with_another_chain_key_does_not_verify(
    trail, tmp_path, settings, django_assert_num_queries
):
    _, document = trail
    settings.RECOVERY_CHAIN_KEYS = "k1:" + "ab" * 32
    code, out = verify(tmp_path, document, django_assert_num_queries)
    assert code == 1 and "chain key" in out, out


def test_a_file_that_is_no_trail_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"checkpoints": []}')
    with pytest.raises(CommandError, match="not an audit trail export"):
        call_command("recovery_verify", "--file", str(path))
    path.write_text("{oops")
    with pytest.raises(CommandError, match="is not a JSON file"):
        call_command("recovery_verify", "--file", str(path))
    with pytest.raises(CommandError, match="takes no other option"):
        call_command("recovery_verify", "--file", str(path), "--anchor")


def test_the_trail_download_is_permission_checked(trail, django_user_model):
    instance, _ = trail
    target = reverse("admin:engine_instance_trail", args=[instance.pk])
    assert Client().get(target).status_code == 302  # to the login page
    viewer = user_with(django_user_model, "vera", "engine.view_instance")
    client = Client()
    client.force_login(viewer)
    assert client.get(target).status_code == 403
    page = client.get(reverse("admin:engine_instance_change", args=[instance.pk]))
    assert b"Download the audit trail" not in page.content
    auditor = user_with(django_user_model, "ann", *AUDITOR_PERMS)
    client.force_login(auditor)
    page = client.get(reverse("admin:engine_instance_change", args=[instance.pk]))
    assert b"Download the audit trail" in page.content
    missing = reverse("admin:engine_instance_trail", args=[instance.pk + 1000])
    assert client.get(missing).status_code == 404
