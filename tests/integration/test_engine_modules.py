"""Provider modules: install order changes nothing; a missing provider blocks, never crashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from govflow.engine.errors import InvalidRequest
from govflow.engine.models import Incident, InstanceStatus, TokenState
from govflow.engine.registry import registry
from govflow.engine.services.definitions import definitions_unresolved
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from recovery.models import Operation
from tests.engine_helpers import op_states, publish, token_of
from tests.flows import action, drive, linear
from tests.providers.alpha import effects

ROOT = Path(__file__).resolve().parents[2]

DOCUMENT = linear(
    action("a"), action("b", name="beta.stamp"), action("c"), key="tests.modules", version=1
)

# Runs in a fresh process against its own SQLite file: publish, start, run, report.
SCRIPT = """
import json, sys
import django
django.setup()
from django.apps import apps
from django.core.management import call_command
call_command("migrate", verbosity=0)
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from recovery.models import Operation
definition = definition_publish(document=json.loads(sys.argv[1]))
instance = instance_start(definition=definition, variables={"value": "v1"})
instance_run(instance_id=instance.pk)
instance.refresh_from_db()
print(json.dumps({
    "apps": [c.name for c in apps.get_app_configs() if c.name.startswith("tests.providers")],
    "fingerprint": definition.fingerprint,
    "pinned": instance.definition_fp,
    "status": instance.status,
    "operations": list(Operation.objects.order_by("pk").values_list(
        "step_id", "action", "key", "idempotency_fp", "input_fp")),
}))
"""


def run_with(settings_module: str, tmp_path: Path) -> dict:
    folder = tmp_path / settings_module.rsplit(".", 1)[-1]
    folder.mkdir()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": "",
        "GOVFLOW_SQLITE_PATH": str(folder / "db.sqlite3"),
        "ALPHA_STORE": str(folder / "alpha.sqlite3"),
        "GOVFLOW_LOG_LEVEL": "WARNING",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(DOCUMENT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_provider_order_changes_neither_fingerprint_nor_operation_keys(tmp_path):
    ab = run_with("tests.settings_order_ab", tmp_path)
    ba = run_with("tests.settings_order_ba", tmp_path)
    assert ab["apps"] == ["tests.providers.alpha", "tests.providers.beta"]
    assert ba["apps"] == ["tests.providers.beta", "tests.providers.alpha"]
    assert ab["status"] == ba["status"] == InstanceStatus.COMPLETED
    assert ab["fingerprint"] == ba["fingerprint"] == ab["pinned"] == ba["pinned"]
    assert [op[:2] for op in ab["operations"]] == [
        ["a", "alpha.write"],
        ["b", "beta.stamp"],
        ["c", "alpha.write"],
    ]
    assert ab["operations"] == ba["operations"]
    assert all(op[2].startswith("op-") for op in ab["operations"])


@pytest.mark.django_db
def test_a_missing_provider_blocks_its_instances_with_a_clear_reason():
    definition = publish(DOCUMENT)
    instance = instance_start(definition=definition, variables={"value": "v1"})
    with registry.override(remove=("beta.stamp",)):
        report = instance_run(instance_id=instance.pk)
        instance_run(instance_id=instance.pk)  # the sweep tries again: no second incident
        assert definitions_unresolved() == [
            (
                "tests.modules",
                1,
                "node 'b': no installed provider registers action 'beta.stamp'. Install its "
                "module or fix the name.",
            )
        ]
        with pytest.raises(InvalidRequest, match="cannot run here: node 'b'"):
            instance_start(definition=definition, variables={"value": "v1"})
    instance.refresh_from_db()
    assert report.status == instance.status == InstanceStatus.BLOCKED
    assert instance.reason == (
        "The definition no longer resolves here: node 'b': no installed "
        "provider registers action 'beta.stamp'. Install its module or "
        "fix the name."
    )
    assert list(Incident.objects.values_list("kind", flat=True)) == ["definition_unresolved"]
    assert not Operation.objects.exists() and effects.call_count() == 0
    # Reinstalled, the provider's instances move on by themselves.
    assert definitions_unresolved() == []
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.reason == ""
    assert op_states(instance) == ["succeeded"] * 3


@pytest.mark.django_db
def test_a_provider_removed_mid_run_blocks_at_the_step(settings):
    definition = publish(DOCUMENT)
    instance = instance_start(definition=definition, variables={"value": "v1"})
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 2
    instance_run(instance_id=instance.pk)  # start, a
    assert token_of(instance, "b").state == TokenState.READY
    with registry.override(remove=("beta.stamp",)):
        instance_run(instance_id=instance.pk)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED and "beta.stamp" in instance.reason
    assert token_of(instance, "b").state == TokenState.READY
    assert op_states(instance) == ["succeeded"]


@pytest.mark.django_db
def test_manage_py_check_warns_about_definitions_that_no_longer_resolve(capsys):
    publish(DOCUMENT)
    with registry.override(remove=("beta.stamp",)):
        call_command("check")
    err = capsys.readouterr().err
    assert "engine.W001" in err and "tests.modules v1 no longer resolves" in err
    assert "beta.stamp" in err
