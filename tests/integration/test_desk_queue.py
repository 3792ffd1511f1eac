"""The admin's home is the work queue: counts and lists, each a link, narrowed to the
user's tenants and the page's filters, read with a bounded number of queries."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from govflow.engine.tenancy import tenant_group_name
from tests.desk_rows import definitions, make_rows

pytestmark = pytest.mark.django_db
HOME = reverse("admin:index")


def member(django_user_model, username: str, *roles: str, tenants=("north",)):
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    for name in roles:
        user.groups.add(Group.objects.get(name=name))
    for tenant in tenants:
        user.groups.add(Group.objects.get_or_create(name=tenant_group_name(tenant))[0])
    return django_user_model.objects.get(pk=user.pk)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def counts(response) -> dict[str, int]:
    html = response.content.decode()
    found = re.findall(r'class="queue-count" data-queue="(\w+)" href="[^"]*">(\d+)</a>', html)
    return {key: int(n) for key, n in found}


@pytest.fixture
def people(django_user_model):
    definitions()
    return {
        "olga": member(django_user_model, "olga", "Operator"),
        "anna": member(django_user_model, "anna", "Operator", "Approver"),
        "sam": member(django_user_model, "sam", "Operator", tenants=("south",)),
    }


def test_the_home_counts_what_needs_a_person_in_my_tenants_only(people):
    make_rows("north", 3, requester=people["olga"])
    make_rows("south", 2, requester=people["sam"])
    olga = counts(logged_in(people["olga"]).get(HOME))
    assert olga == {
        "unknown": 3,
        "approve": 0,  # she may not approve decisions
        "batches": 0,  # nor batches of them
        "requests": 3,  # she asked for the three decisions
        "approvals": 3,  # the approval node needs engine.operate_instance, an operator's
        "compensations": 0,  # these rows have none (test_desk_compensation counts them)
        "integrity": 3,
        "incidents": 3,
        "stuck": 3,
        "leases": 3,
        "dead": 3,
        "webhooks": 0,  # these rows have none (tests/events/test_desk_webhooks.py counts them)
    }
    anna = counts(logged_in(people["anna"]).get(HOME))
    assert (anna["approve"], anna["requests"]) == (3, 0)  # others' requests, never her own
    sam = counts(logged_in(people["sam"]).get(HOME))
    assert (sam["unknown"], sam["requests"], sam["stuck"]) == (2, 2, 2)


def test_batches_awaiting_my_approval_are_others_batches_of_my_tenants(people):
    from django.utils import timezone

    from govflow.engine.models import Token
    from govflow.handoffs.models import BatchItem, DecisionBatch

    def batch_of(made, requester) -> DecisionBatch:
        instance = made.instances[0]
        batch = DecisionBatch.objects.create(
            kind="effect_absent",
            action="demo.x",
            definition=instance.definition,
            tenant=instance.tenant,
            fingerprint="0" * 64,
            rationale="r",
            requested_by=requester,
            requested_at=timezone.now(),
        )
        for decision in made.decisions:
            BatchItem.objects.create(
                batch=batch,
                decision=decision,
                token=Token.objects.filter(instance_id=decision.operation.subject_id).first(),
                operation_key=decision.operation.key,
                revision=1,
                reference="line",
            )
        return batch

    north = batch_of(make_rows("north", 2, requester=people["olga"]), people["olga"])
    batch_of(make_rows("south", 1, requester=people["sam"]), people["sam"])
    page = reverse("admin:handoffs_decisionbatch_change", args=[north.pk])
    anna = logged_in(people["anna"]).get(HOME)
    assert counts(anna)["batches"] == 1 and page in anna.content.decode()
    assert f"Batch {north.pk}: Effect absent on 2 step(s) of demo.x" in anna.content.decode()
    olga = logged_in(people["olga"]).get(HOME)  # her own, and she may not approve
    assert counts(olga)["batches"] == 0 and page not in olga.content.decode()


def test_every_row_links_to_its_instance_oldest_first_with_its_age(people):
    made = make_rows("north", 2, requester=people["olga"], age=dt.timedelta(hours=5))
    newer = make_rows("north", 1, requester=people["olga"], age=dt.timedelta(minutes=5))
    html = logged_in(people["olga"]).get(HOME).content.decode()
    section = html[html.index('id="section-unknown"') : html.index('id="section-approve"')]
    links = re.findall(r'href="(/admin/engine/instance/\d+/change/)"', section)
    oldest = [reverse("admin:engine_instance_change", args=[i.pk]) for i in made.instances[:2]]
    assert links == [*oldest, reverse("admin:engine_instance_change", args=[newer.instances[0].pk])]
    assert "5\xa0hours" in section
    assert logged_in(people["olga"]).get(links[0]).status_code == 200


def test_filters_narrow_the_queue(people):
    make_rows("north", 2, requester=people["olga"], age=dt.timedelta(days=2))
    make_rows("north", 1, requester=people["olga"], age=dt.timedelta(minutes=1))
    client = logged_in(people["olga"])
    assert counts(client.get(HOME, {"age": "1d"}))["unknown"] == 2
    assert counts(client.get(HOME, {"definition": "desk.approving"}))["unknown"] == 0
    assert counts(client.get(HOME, {"definition": "desk.approving"}))["approvals"] == 3
    assert counts(client.get(HOME, {"action": "alpha.write"}))["requests"] == 3
    assert counts(client.get(HOME, {"action": "other.action"}))["unknown"] == 0
    assert counts(client.get(HOME, {"tenant": "north"}))["stuck"] == 3


@pytest.mark.parametrize(
    "params",
    [
        {"age": "forever"},
        {"tenant": "south"},  # not one of hers
        {"definition": "no.such.workflow"},
        {"action": "<script>"},
    ],
)
def test_a_bad_filter_is_a_message_not_an_error(people, params):
    make_rows("north", 1, requester=people["olga"])
    response = logged_in(people["olga"]).get(HOME, params)
    assert response.status_code == 200
    text = " ".join(str(m) for m in response.context["messages"])
    assert "could not be used and are ignored" in text
    assert counts(response)["unknown"] == 1  # the queue unfiltered


@pytest.mark.parametrize("n", [2, 60])
def test_the_home_reads_a_bounded_number_of_queries(people, django_assert_max_num_queries, n):
    make_rows("north", n, requester=people["olga"])
    make_rows("south", n, requester=people["sam"])
    client = logged_in(people["anna"])
    client.get(HOME)  # warm the session and permission caches
    # Every section (a count and its oldest rows), the session, the user and the
    # filters' choices: the same number for 2 rows a section as for 60.
    with django_assert_max_num_queries(32):
        response = client.get(HOME, {"tenant": "north", "age": "1h"})
    assert counts(response)["unknown"] == n


def test_records_are_for_auditors_and_administrators(people, django_user_model):
    auditor = member(django_user_model, "audrey", "Auditor")
    assert logged_in(people["olga"]).get(reverse("admin:records")).status_code == 403
    assert 'href="/admin/records/"' not in logged_in(people["olga"]).get(HOME).content.decode()
    response = logged_in(auditor).get(HOME)
    assert 'href="/admin/records/"' in response.content.decode()
    records = logged_in(auditor).get(reverse("admin:records"))
    assert records.status_code == 200
    assert "/admin/recovery/operation/" in records.content.decode()


def test_a_user_without_a_role_is_told_so(django_user_model):
    nobody = member(django_user_model, "nina")
    response = logged_in(nobody).get(HOME)
    assert response.status_code == 200
    assert "You hold no desk role yet" in response.content.decode()
