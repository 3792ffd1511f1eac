"""The desk shows an instance's compensations and lets two people run one."""

from __future__ import annotations

import re

import pytest

from govflow.engine.services.instances import instance_cancel
from recovery import api
from tests.flows import action, drive, linear, start
from tests.integration.test_engine_admin import (
    OPERATOR_PERMS,
    logged_in,
    make_user,
    messages_of,
    url,
)
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db
WAIT = {"id": "wait", "type": "timer", "duration": "PT1H"}


@pytest.fixture
def olga(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def carl(django_user_model):
    return make_user(django_user_model, "carl", *OPERATOR_PERMS)


def cancelled(olga, name="alpha.charge_checked"):
    instance = drive(start(linear(action("a", name, compensate_on=["cancel"]), WAIT)))
    instance_cancel(instance_id=instance.pk, actor=olga, reason="The applicant withdrew.")
    return instance


def page(client, instance) -> str:
    response = client.get(url("instance_change", instance.pk))
    assert response.status_code == 200
    return response.content.decode()


def hidden(text: str, name: str) -> str:
    return re.search(rf'name="{name}" value="([^"]*)"', text).group(1)


def test_two_people_run_a_compensation_from_the_instance_page(olga, carl):
    instance = cancelled(olga)
    [intent] = api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))
    ops, checker = logged_in(olga), logged_in(carl)
    text = page(ops, instance)
    assert "Compensations" in text and "awaiting approval" in text
    assert "&quot;will&quot;: &quot;write&quot;" in text  # the compensating action's preview
    response = ops.post(
        url("instance_cmp_request", instance.pk, intent.key),
        {"rationale": "Refund it."},
        follow=True,
    )
    [message] = messages_of(response)
    assert "is requested" in message
    assert "Approve running it" not in page(ops, instance)  # the requester cannot approve
    text = page(checker, instance)
    decision = re.search(r"compensations/decisions/(\d+)/approve/", text).group(1)
    response = checker.post(
        url("instance_cmp_approve", instance.pk, decision),
        {"revision": hidden(text, "revision"), "preview_fp": hidden(text, "preview_fp")},
    )
    assert response.status_code == 302
    drive(instance)
    assert 'data-compensation-state="succeeded"' in page(ops, instance)
    assert len(effects.effects("alpha.undo")) == 1


def test_an_approval_from_a_page_that_is_out_of_date_is_refused(olga, carl):
    instance = cancelled(olga)
    [intent] = api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))
    ops, checker = logged_in(olga), logged_in(carl)
    ops.post(url("instance_cmp_request", instance.pk, intent.key), {"rationale": "Refund it."})
    text = page(checker, instance)
    decision = re.search(r"compensations/decisions/(\d+)/approve/", text).group(1)
    api.fact_append(
        subject=api.Subject("govflow.instance", str(instance.pk)),
        kind="tests.moved_on",
        fact={"n": 1},
    )
    response = checker.post(
        url("instance_cmp_approve", instance.pk, decision),
        {"revision": hidden(text, "revision"), "preview_fp": hidden(text, "preview_fp")},
        follow=True,
    )
    [message] = messages_of(response)
    assert "changed since it was shown to you" in message and "Nothing was approved" in message
    assert api.decision_get(decision_id=int(decision)).state == "requested"


def test_an_unknown_compensation_is_a_handoff_on_the_page(olga):
    effects.SCRIPT["alpha.undo"] = ["raise_after"]
    instance = cancelled(olga, name="alpha.charge")
    drive(instance)
    text = page(logged_in(olga), instance)
    assert 'data-compensation-state="outcome_unknown"' in text
    assert "Its outcome is unknown" in text and "Record what happened" in text


def test_a_get_on_a_compensation_action_goes_back_to_the_page(olga):
    instance = cancelled(olga)
    response = logged_in(olga).get(url("instance_compensate", instance.pk))
    assert response.status_code == 302
    assert response["Location"] == url("instance_change", instance.pk)


def test_the_work_queue_counts_compensations_waiting_in_my_tenants_only(olga, django_user_model):
    from django.contrib.auth.models import Group
    from django.urls import reverse

    from govflow.engine.tenancy import tenant_group_name
    from tests.integration.test_desk_queue import counts

    effects.SCRIPT["alpha.undo"] = ["raise_after"]
    drive(cancelled(olga, name="alpha.charge"))  # unknown outcome: a person's turn
    south = drive(
        start(
            linear(action("a", "alpha.charge_checked", compensate_on=["cancel"]), WAIT),
            tenant="south",
        )
    )
    instance_cancel(instance_id=south.pk, actor=olga, reason="withdrawn")  # awaits approval
    cancelled(olga)  # awaiting approval
    north = make_user(django_user_model, "nina", *OPERATOR_PERMS)
    north.groups.clear()  # the default tenant's only
    north.groups.add(Group.objects.get_or_create(name=tenant_group_name("default"))[0])
    home = logged_in(north).get(reverse("admin:index"))
    assert counts(home)["compensations"] == 2  # not the south tenant's
    text = home.content.decode()
    assert "outcome unknown" in text and "awaiting approval" in text
