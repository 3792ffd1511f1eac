"""Definitions pinned with their actions: re-hashed on every run, migrated by two people.

Issue 7, finding 5: a definition edited in the database ran silently, its ledger rows
carried a fingerprint copied from the instance, and a provider release that changed an
action's recovery mode changed instances already running.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from govflow.engine.checks import check_definitions_pinned
from govflow.engine.contracts import stored_fingerprint
from govflow.engine.errors import DefinitionConflict, EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.models import (
    ContractMigration,
    Definition,
    Instance,
    InstanceStatus,
    MigrationState,
    TokenState,
)
from govflow.engine.provider import VerificationCheck
from govflow.engine.registry import registry
from govflow.engine.services.contract_migrations import (
    instance_migrate_approve,
    instance_migrate_reject,
    instance_migrate_request,
)
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.models import Checkpoint, IntegrityIncident
from tests.engine_helpers import (
    alpha_write,
    chain_ok,
    counted,
    incidents,
    operations,
    subject,
    token_of,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha

pytestmark = pytest.mark.django_db(transaction=True)


def run(instance: Instance):
    report = instance_run(instance_id=instance.pk)
    instance.refresh_from_db()
    return report


def sql(statement: str, params: list) -> None:
    """An edit made behind the engine's back, as someone with database access would."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def open_integrity(instance: Instance) -> list[str]:
    s = subject(instance)
    return list(
        IntegrityIncident.objects.filter(
            subject_type=s.type, subject_id=s.id, status="open"
        ).values_list("reason", flat=True)
    )


# -- (1) a definition edited in the database -------------------------------------------


def test_a_definition_edited_in_the_database_stops_its_running_instance(settings):
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 2  # the start node and step a, then stop
    instance = start(linear(action("a"), action("b", value="value")))
    run(instance)
    assert token_of(instance, "a").state == TokenState.COMPLETED
    assert token_of(instance, "b").state == TokenState.READY
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    # Step b's input now reads another variable: the edit an attacker would make.
    document = Definition.objects.get(pk=instance.definition_id).document
    sql(
        "UPDATE engine_definition SET document = %s WHERE id = %s",
        [
            document.replace('"input":{"value":"value"}', '"input":{"value":"tenant"}', 1),
            instance.definition_id,
        ],
    )
    write, calls = counted()
    with registry.override(write):
        report = run(instance)
    assert report.status == InstanceStatus.BLOCKED
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith(
        f"The definition cannot be trusted: the stored definition {instance.definition} no "
        "longer matches the fingerprint it was published with: changed in the database "
        "after publishing"
    )
    assert "Nothing runs on it" in instance.reason
    assert calls == [], "the provider must not be called"
    assert [op.step_id for op in operations(instance)] == ["a"], "nothing new dispatched"
    assert token_of(instance, "b").state == TokenState.READY
    assert incidents(instance) == [("definition_changed", instance.reason)]
    assert open_integrity(instance) == [instance.reason]
    # Running again changes nothing and opens nothing new.
    with registry.override(write):
        run(instance)
    assert calls == [] and len(incidents(instance)) == 1 and len(open_integrity(instance)) == 1


def test_a_restored_definition_runs_again_once_the_incident_is_reverified(django_user_model):
    instance = start(linear(action("a")))
    original = Definition.objects.get(pk=instance.definition_id).document
    sql(
        "UPDATE engine_definition SET document = %s WHERE id = %s",
        [original.replace('"Test flow"', '"Edited"'), instance.definition_id],
    )
    run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    sql(
        "UPDATE engine_definition SET document = %s WHERE id = %s",
        [original, instance.definition_id],
    )
    s = subject(instance)
    incident = IntegrityIncident.objects.get(subject_type=s.type, subject_id=s.id)
    # Resolved by two people once the chain verifies; the approval queues the instance.
    olga = user_with(django_user_model, "olga", "recovery.resolve_incident")
    carl = user_with(django_user_model, "carl", "recovery.resolve_incident")
    api.incident_resolve_request(
        incident_id=incident.pk, requested_by=olga, rationale="Definition row restored."
    )
    assert api.incident_resolve_approve_via_owner(incident_id=incident.pk, actor=carl).resolved
    assert drive(instance).status == InstanceStatus.COMPLETED
    assert [op.state for op in operations(instance)] == ["succeeded"]


def test_an_edited_definition_is_refused_even_with_its_fingerprint_rewritten_to_match():
    instance = start(linear(action("a")))
    definition = Definition.objects.get(pk=instance.definition_id)
    changed = definition.document.replace('"title":"Test flow"', '"title":"Forged"')
    forged_fp = stored_fingerprint(changed, definition.contracts)
    sql(
        "UPDATE engine_definition SET document = %s, fingerprint = %s WHERE id = %s",
        [changed, forged_fp, definition.pk],
    )
    write, calls = counted()
    with registry.override(write):
        run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert f"instance {instance.pk} is pinned to definition fingerprint" in instance.reason
    assert "the instance's pin or the definition was changed in the database" in instance.reason
    assert calls == [] and operations(instance) == []
    assert open_integrity(instance)


def test_a_reformatted_document_is_a_change_too():
    # Whitespace changes nothing a parser sees, but the stored bytes are what was pinned.
    instance = start(linear(action("a")))
    document = Definition.objects.get(pk=instance.definition_id).document
    sql(
        "UPDATE engine_definition SET document = %s WHERE id = %s",
        [json.dumps(json.loads(document), indent=1), instance.definition_id],
    )
    run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert "changed in the database after publishing" in instance.reason
    assert operations(instance) == []


def test_a_changed_definition_starts_no_new_instance():
    definition = definition_publish(document=linear(action("a")))
    sql(
        "UPDATE engine_definition SET contracts = %s WHERE id = %s",
        [definition.contracts.replace('"non_atomic"', '"atomic"'), definition.pk],
    )
    definition.refresh_from_db()
    with pytest.raises(InvalidRequest) as caught:
        instance_start(definition=definition, variables={"value": "v1"})
    assert "no longer matches the fingerprint it was published with" in str(caught.value)
    assert not Instance.objects.exists()


# -- (2) the ledger records the computed hash ------------------------------------------


def test_the_ledger_records_the_hash_of_the_stored_definition():
    instance = drive(start(linear(action("a"), action("b"))))
    assert instance.status == InstanceStatus.COMPLETED
    definition = Definition.objects.get(pk=instance.definition_id)
    computed = stored_fingerprint(definition.document, definition.contracts)
    assert computed == definition.fingerprint == instance.definition_fp
    assert [op.definition_fp for op in operations(instance)] == [computed, computed]
    assert chain_ok(instance)


def test_an_edited_pin_on_the_instance_is_caught_and_never_reaches_the_ledger():
    other = definition_publish(document=linear(action("x"), key="tests.other", version=1))
    instance = start(linear(action("a")))
    sql(
        "UPDATE engine_instance SET definition_fp = %s WHERE id = %s",
        [other.fingerprint, instance.pk],
    )
    write, calls = counted()
    with registry.override(write):
        run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert f"pinned to definition fingerprint {other.fingerprint[:12]}" in instance.reason
    assert calls == [] and operations(instance) == []
    assert incidents(instance)[0][0] == "definition_changed"
    assert open_integrity(instance)


# -- (3) a provider that changed an action ---------------------------------------------


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"recovery_mode": "atomic"},
            "alpha.write: recovery mode was non_atomic, is now atomic",
        ),
        (
            {"checks": (*alpha.CHECK, VerificationCheck("ledger", "Ask the ledger office."))},
            "alpha.write: verification checks changed (added ledger)",
        ),
        (
            {"checks": (VerificationCheck("store", "Just assume it worked."),)},
            "alpha.write: verification checks changed (instructions changed)",
        ),
        (
            {"input_schema": {"type": "object"}},
            "alpha.write: input schema changed",
        ),
        (
            {"output_schema": {"type": "object"}},
            "alpha.write: output schema added",
        ),
    ],
)
def test_a_provider_release_that_changes_an_action_blocks_running_instances(changes, says):
    instance = start(linear(action("a")))
    changed, calls = counted(**changes)
    with registry.override(changed):
        report = run(instance)
    assert report.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith(f"A provider changed what {instance.definition} was")
    assert says in instance.reason
    assert "engine.migrate_instance" in instance.reason
    assert calls == [] and operations(instance) == []
    assert incidents(instance) == [("contract_changed", instance.reason)]
    assert open_integrity(instance) == [], "a provider's release is not tampering"


def test_a_change_that_keeps_the_safety_meaning_does_not_block():
    instance = start(linear(action("a")))
    with registry.override(alpha_write(title="Write (v2)", retry_budget=1)):
        assert drive(instance).status == InstanceStatus.COMPLETED


def test_a_new_version_runs_under_the_changed_provider_and_the_old_one_starts_nothing():
    document = linear(action("a"), key="tests.release", version=1)
    old = start(document)
    atomic, calls = counted(recovery_mode="atomic")
    with registry.override(atomic):
        run(old)
        assert old.status == InstanceStatus.BLOCKED
        with pytest.raises(InvalidRequest, match="a provider changed what it was published"):
            instance_start(definition=old.definition, variables={"value": "v1"})
        # The same document under the changed provider is another pin: a new version.
        with pytest.raises(DefinitionConflict) as caught:
            definition_publish(document=document)
        assert "pinned to other action contracts" in str(caught.value)
        assert "recovery mode was non_atomic, is now atomic" in str(caught.value)
        assert "publish this document as version 2" in str(caught.value)
        new = start({**document, "version": 2})
        assert drive(new).status == InstanceStatus.COMPLETED
        [op] = operations(new)
        assert (op.recovery_mode, op.state) == ("atomic", "succeeded")
        warnings = check_definitions_pinned(None)
        assert [w.id for w in warnings] == ["engine.W002"]
        assert "tests.release v1" in warnings[0].msg
        assert "recovery mode was non_atomic, is now atomic" in warnings[0].msg
    assert len(calls) == 1
    # Back under the provider v1 was published with, its instance runs; now v2 is the
    # one whose action changed.
    [warning] = check_definitions_pinned(None)
    assert "tests.release v2" in warning.msg
    assert drive(old).status == InstanceStatus.COMPLETED


def test_publishing_the_same_document_again_under_the_same_provider_is_the_same_row():
    document = linear(action("a"), key="tests.again", version=1)
    first = definition_publish(document=document)
    with registry.override(alpha_write(title="Write (v2)")):
        assert definition_publish(document=document).pk == first.pk
    assert json.loads(first.contracts)["alpha.write"]["mode"] == "non_atomic"


def test_a_definition_published_before_contracts_were_pinned_still_runs():
    document = linear(action("a"), key="tests.legacy", version=1)
    body = api.canonical_bytes(document).decode()
    legacy = Definition.objects.create(
        key="tests.legacy",
        version=1,
        title="Test flow",
        document=body,
        fingerprint=api.fingerprint(api.FingerprintKind.DEFINITION, body.encode()),
        published_at="2026-01-01T00:00:00Z",
    )
    assert definition_publish(document=document).pk == legacy.pk
    instance = instance_start(definition=legacy, variables={"value": "v1"})
    assert drive(instance).status == InstanceStatus.COMPLETED
    assert {op.definition_fp for op in operations(instance)} == {legacy.fingerprint}


# -- (4) migration by a recorded decision, four eyes -----------------------------------


@pytest.fixture
def migrators(django_user_model):
    return (
        user_with(django_user_model, "mia", "engine.migrate_instance"),
        user_with(django_user_model, "max", "engine.migrate_instance"),
    )


def facts(instance: Instance) -> list[str]:
    s = subject(instance)
    return list(
        Checkpoint.objects.filter(subject_type=s.type, subject_id=s.id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def test_a_migration_requested_and_approved_by_another_person_unblocks(migrators):
    mia, max_ = migrators
    instance = start(linear(action("a")))
    atomic, calls = counted(recovery_mode="atomic")
    with registry.override(atomic):
        run(instance)
        assert instance.status == InstanceStatus.BLOCKED
        migration = instance_migrate_request(
            instance_id=instance.pk,
            action="alpha.write",
            rationale="The provider's release notes say writes are now transactional.",
            actor=mia,
        )
        assert migration.state == MigrationState.REQUESTED
        assert (migration.pinned["mode"], migration.accepted["mode"]) == ("non_atomic", "atomic")
        # Nothing moves on a request alone.
        run(instance)
        assert instance.status == InstanceStatus.BLOCKED and calls == []
        with pytest.raises(InvalidRequest, match="cannot approve it: a second person"):
            instance_migrate_approve(migration_id=migration.pk, actor=mia)
        approved = instance_migrate_approve(migration_id=migration.pk, actor=max_)
        assert (approved.state, approved.decided_by) == (MigrationState.APPROVED, max_)
        instance.refresh_from_db()
        assert instance.status == InstanceStatus.RUNNING and instance.reason == ""
        assert drive(instance).status == InstanceStatus.COMPLETED
    assert len(calls) == 1
    [op] = operations(instance)
    assert (op.recovery_mode, op.definition_fp) == ("atomic", instance.definition_fp)
    engine_facts = [kind for kind in facts(instance) if kind.startswith("engine.")]
    assert engine_facts == ["engine.migration_requested", "engine.contract_migrated"]
    assert chain_ok(instance)
    with pytest.raises(EngineConflict, match="no longer awaiting approval"):
        instance_migrate_approve(migration_id=migration.pk, actor=max_)


def test_a_migration_needs_the_permission_and_a_rationale(django_user_model, migrators):
    mia, _ = migrators
    nobody = user_with(django_user_model, "nobody", "engine.operate_instance")
    instance = start(linear(action("a")))
    with registry.override(alpha_write(recovery_mode="atomic")):
        with pytest.raises(NotPermitted, match=r"engine\.migrate_instance"):
            instance_migrate_request(
                instance_id=instance.pk, action="alpha.write", rationale="x", actor=nobody
            )
        with pytest.raises(InvalidRequest, match="needs a rationale"):
            instance_migrate_request(
                instance_id=instance.pk, action="alpha.write", rationale=" ", actor=mia
            )
        with pytest.raises(InvalidRequest, match=r"does not use action 'alpha\.note'"):
            instance_migrate_request(
                instance_id=instance.pk, action="alpha.note", rationale="x", actor=mia
            )
    with pytest.raises(EngineConflict, match="there is nothing to migrate"):
        instance_migrate_request(
            instance_id=instance.pk, action="alpha.write", rationale="x", actor=mia
        )
    assert not ContractMigration.objects.exists()


def test_a_rejected_migration_leaves_the_instance_blocked_and_may_be_requested_again(migrators):
    mia, max_ = migrators
    instance = start(linear(action("a")))
    with registry.override(alpha_write(recovery_mode="atomic")):
        run(instance)
        first = instance_migrate_request(
            instance_id=instance.pk, action="alpha.write", rationale="Looks fine.", actor=mia
        )
        with pytest.raises(EngineConflict, match="already awaits approval"):
            instance_migrate_request(
                instance_id=instance.pk, action="alpha.write", rationale="Again.", actor=max_
            )
        rejected = instance_migrate_reject(
            migration_id=first.pk, actor=max_, note="Ask the provider first."
        )
        assert rejected.state == MigrationState.REJECTED
        run(instance)
        assert instance.status == InstanceStatus.BLOCKED
        again = instance_migrate_request(
            instance_id=instance.pk, action="alpha.write", rationale="Provider agreed.", actor=mia
        )
        assert again.pk != first.pk
    assert "engine.migration_rejected" in facts(instance)
    assert chain_ok(instance)


def test_an_approval_after_the_provider_changed_again_is_refused(migrators):
    mia, max_ = migrators
    instance = start(linear(action("a")))
    with registry.override(alpha_write(recovery_mode="atomic")):
        migration = instance_migrate_request(
            instance_id=instance.pk, action="alpha.write", rationale="Fine.", actor=mia
        )
    with (
        registry.override(alpha_write(input_schema={"type": "object"})),
        pytest.raises(EngineConflict, match=r"changed alpha\.write again"),
    ):
        instance_migrate_approve(migration_id=migration.pk, actor=max_)
    migration.refresh_from_db()
    assert migration.state == MigrationState.REQUESTED


def test_migrated_contracts_edited_in_the_database_are_an_integrity_incident():
    # Accepting the provider's change without a decision, by editing the instance row.
    instance = start(linear(action("a")))
    atomic, calls = counted(recovery_mode="atomic")
    with registry.override(atomic):
        from govflow.engine.contracts import action_contract

        forged = api.canonical_bytes({"alpha.write": action_contract(atomic)}).decode()
        sql("UPDATE engine_instance SET contracts = %s WHERE id = %s", [forged, instance.pk])
        run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert "do not match the migrations approved on its chain" in instance.reason
    assert calls == [] and operations(instance) == []
    assert open_integrity(instance)
