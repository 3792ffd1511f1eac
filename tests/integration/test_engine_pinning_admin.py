"""Migrating an instance to an action's changed contract from its admin page."""

from __future__ import annotations

import pytest

from govflow.engine.models import ContractMigration, InstanceStatus, MigrationState
from govflow.engine.registry import registry
from tests.engine_helpers import alpha_write, operations
from tests.flows import action, drive, linear, start
from tests.integration.test_engine_admin import logged_in, make_user, messages_of, url

pytestmark = pytest.mark.django_db(transaction=True)

PERMS = ("engine.view_instance", "engine.migrate_instance")


@pytest.fixture
def blocked_by_a_release():
    instance = start(linear(action("a")))
    with registry.override(alpha_write(recovery_mode="atomic")):
        instance = drive(instance)
        assert instance.status == InstanceStatus.BLOCKED
        yield instance


def test_a_migration_is_requested_and_approved_by_two_people_on_the_instance_page(
    django_user_model, blocked_by_a_release
):
    instance = blocked_by_a_release
    mia = logged_in(make_user(django_user_model, "mia", *PERMS))
    max_ = logged_in(make_user(django_user_model, "max", *PERMS))
    page = mia.get(url("instance_change", instance.pk))
    assert page.status_code == 200
    assert b"Provider changes" in page.content
    assert b"alpha.write: recovery mode was non_atomic, is now atomic" in page.content
    assert b"Request migration of alpha.write" in page.content

    response = mia.post(
        url("instance_migrate", instance.pk),
        {"action": "alpha.write", "rationale": "Release notes: writes are transactional now."},
        follow=True,
    )
    [migration] = ContractMigration.objects.all()
    assert messages_of(response) == [
        f"Migration {migration.pk} of alpha.write is requested. Another person with the "
        "migrate permission must approve it before the instance moves on."
    ]
    assert b"You requested this migration: a second person approves it." in response.content
    # The requester's own approval is refused by the service, in its words.
    response = mia.post(url("instance_migration_approve", instance.pk, migration.pk), follow=True)
    assert "a second person must check" in messages_of(response)[0]

    page = max_.get(url("instance_change", instance.pk))
    assert f"Approve migration {migration.pk}".encode() in page.content
    response = max_.post(url("instance_migration_approve", instance.pk, migration.pk), follow=True)
    assert messages_of(response) == [
        f"Migration {migration.pk} is approved: instance {instance.pk} runs alpha.write "
        "under its current contract and moves on."
    ]
    migration.refresh_from_db()
    assert migration.state == MigrationState.APPROVED
    assert drive(instance).status == InstanceStatus.COMPLETED
    assert [op.recovery_mode for op in operations(instance)] == ["atomic"]


def test_an_empty_rationale_is_shown_on_the_form_and_nothing_is_requested(
    django_user_model, blocked_by_a_release
):
    instance = blocked_by_a_release
    mia = logged_in(make_user(django_user_model, "mia", *PERMS))
    response = mia.post(
        url("instance_migrate", instance.pk), {"action": "alpha.write", "rationale": ""}
    )
    assert response.status_code == 200
    assert b"This field is required." in response.content
    assert not ContractMigration.objects.exists()


def test_a_migration_is_rejected_with_a_note(django_user_model, blocked_by_a_release):
    instance = blocked_by_a_release
    mia = logged_in(make_user(django_user_model, "mia", *PERMS))
    max_ = logged_in(make_user(django_user_model, "max", *PERMS))
    mia.post(url("instance_migrate", instance.pk), {"action": "alpha.write", "rationale": "Ok."})
    migration = ContractMigration.objects.get()
    response = max_.post(
        url("instance_migration_reject", instance.pk, migration.pk),
        {"note": "Ask the provider first."},
        follow=True,
    )
    assert "is rejected" in messages_of(response)[0]
    assert b"Ask the provider first." in response.content
    migration.refresh_from_db()
    assert migration.state == MigrationState.REJECTED
    # The page offers a new request.
    assert b"Request migration of alpha.write" in response.content


def test_a_viewer_sees_the_change_but_no_migration_form(django_user_model, blocked_by_a_release):
    instance = blocked_by_a_release
    viewer = logged_in(make_user(django_user_model, "vera", "engine.view_instance"))
    page = viewer.get(url("instance_change", instance.pk))
    assert b"alpha.write: recovery mode was non_atomic, is now atomic" in page.content
    assert b"Request migration" not in page.content
    assert b"engine.migrate_instance" in page.content


def test_the_definition_page_shows_its_pinned_contracts_and_why_it_no_longer_runs(
    django_user_model,
):
    definition = start(linear(action("a"))).definition
    viewer = logged_in(make_user(django_user_model, "vera", "engine.view_definition"))
    page = viewer.get(url("definition_change", definition.pk))
    assert b"Pinned action contracts" in page.content
    assert b"&quot;mode&quot;: &quot;non_atomic&quot;" in page.content
    with registry.override(alpha_write(recovery_mode="atomic")):
        page = viewer.get(url("definition_change", definition.pk))
    assert (
        b"No: a provider changed what it was published with: alpha.write: recovery mode was "
        b"non_atomic, is now atomic" in page.content
    )


def test_pages_of_a_definition_garbled_in_the_database_say_so_and_do_not_break(
    django_user_model,
):
    from django.db import connection

    instance = start(linear(action("a")))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE engine_definition SET document = %s WHERE id = %s",
            ['{"key": "tests.linear", "nodes": [', instance.definition_id],
        )
    instance = drive(instance)
    assert instance.status == InstanceStatus.BLOCKED
    user = logged_in(
        make_user(django_user_model, "vera", "engine.view_instance", "engine.view_definition")
    )
    page = user.get(url("instance_change", instance.pk))
    assert page.status_code == 200
    assert b"changed in the database after publishing" in page.content
    page = user.get(url("definition_change", instance.definition_id))
    assert page.status_code == 200
    assert b"No: the stored definition" in page.content
