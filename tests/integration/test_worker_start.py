"""A ``qcluster`` starts without the web side: what it imports and which checks it runs.

ADR 0048: every process a cluster forks inherits what its main process imported before the
fork, and a restarted cluster takes its first step only after that. These tests hold the
cut without timing anything: the modules loaded when ``manage.py qcluster`` is about to
start the cluster (after ``django.setup()`` and the command's checks), in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django.core import checks
from django.core.checks.registry import registry as check_registry

from govflow.engine.checks import NOT_FOR_WORKERS, qcluster_check_tags

ROOT = Path(__file__).resolve().parents[2]

# Runs ``manage.py qcluster`` up to the start of the cluster, then reports sys.modules.
SCRIPT = """
import json, sys
import django
django.setup()
from govflow.engine.management.commands import qcluster
qcluster.cluster_run = lambda **kwargs: print(json.dumps(sorted(sys.modules)))
from django.core.management import call_command
call_command("qcluster", skip_checks=False)
"""

WEB_SIDE = (
    "govflow.urls",  # the URLconf: every view of the desk, the admin and the API
    "govflow.api.views",
    "govflow.api.schema",  # the OpenAPI description
    "drf_spectacular.plumbing",
    "govflow.handoffs.views",
    "govflow.identity.views",
)


def run_script(script: str, tmp_path: Path, *, ok: bool = True, **env: str):
    """Run ``script`` in a fresh process on the development settings (the production
    apps) and a SQLite file of its own; its last line of output, or the finished process
    when ``ok`` is False."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "govflow.settings.dev",
            "DATABASE_URL": "",
            "GOVFLOW_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
            "GOVFLOW_LOG_LEVEL": "WARNING",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if not ok:
        return done
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def admin_modules(modules: set[str]) -> list[str]:
    """Apps' ``admin`` modules (not Django's admin package itself)."""
    return sorted(
        name
        for name in modules
        if not name.startswith("django.contrib.admin")
        and (name.endswith(".admin") or ".admin." in name)
    )


def test_a_qcluster_starts_without_loading_the_admin_the_api_or_the_urlconf(tmp_path):
    modules = set(json.loads(run_script(SCRIPT, tmp_path)))
    # What the workers run is loaded (they inherit it at the fork) ...
    assert {"govflow.engine.cluster", "govflow.engine.runpool", "govflow.engine.broker"} <= modules
    assert "govflow.engine.services.runtime" in modules
    # ... and nothing of the web side they never serve.
    assert admin_modules(modules) == []
    assert sorted(modules & set(WEB_SIDE)) == []


def test_a_misconfigured_engine_still_stops_the_qcluster_before_it_starts(tmp_path):
    """The cluster skips only the web's checks: GovFlow's own still refuse a bad setting
    (here ``engine.E004``: a lease not longer than the sweep's interval)."""
    done = run_script(SCRIPT, tmp_path, ok=False, GOVFLOW_LEASE_TTL="0.1")
    assert done.returncode != 0
    assert "engine.E004" in done.stderr
    assert "SystemCheckError" in done.stderr


def test_every_check_of_govflow_and_the_core_runs_in_a_qcluster():
    """Django picks a command's checks by tag: an untagged check would be skipped by the
    cluster's start without anyone noticing."""
    tags = set(qcluster_check_tags())
    ours = [
        check
        for check in check_registry.get_checks(include_deployment_checks=True)
        if check.__module__.split(".")[0] in {"govflow", "recovery"}
    ]
    assert len(ours) >= 8
    assert [check.__name__ for check in ours if set(check.tags).isdisjoint(tags)] == []
    assert not NOT_FOR_WORKERS & tags
    assert {checks.Tags.models, checks.Tags.security, "govflow", "recovery"} <= tags


def test_the_admin_registry_is_complete_at_its_first_use_in_a_fresh_process(tmp_path):
    """No ``autodiscover`` at ``django.setup()`` (ADR 0048): the first use of the registry
    finds every app's admin, with nothing else loaded first (no URLconf, no request)."""
    script = (
        "import json, sys, django; django.setup()\n"
        "before = 'govflow.handoffs.admin' in sys.modules\n"
        "from django.contrib import admin\n"
        "from govflow.engine.models import Instance\n"
        "from rest_framework_api_key.models import APIKey\n"
        "from govflow.api.models import ApiKey\n"
        "print(json.dumps([before, admin.site.is_registered(Instance),\n"
        "    admin.site.is_registered(APIKey), admin.site.is_registered(ApiKey),\n"
        "    len(admin.site._registry)]))\n"
    )
    before, instance, stock_key, our_key, count = json.loads(run_script(script, tmp_path))
    assert before is False
    # The API's admin removed the stock key model, which its app's admin registered first.
    assert (instance, stock_key, our_key) == (True, False, True)
    assert count >= 20


def test_the_api_schema_still_describes_api_key_authentication_in_a_fresh_process(tmp_path):
    """The OpenAPI extension is no longer imported by the API's AppConfig: the views,
    which every schema generation loads through the URLconf, import it."""
    script = (
        "import json, sys, django; django.setup()\n"
        "assert 'govflow.api.schema' not in sys.modules\n"
        "from drf_spectacular.generators import SchemaGenerator\n"
        "schema = SchemaGenerator().get_schema(request=None, public=True)\n"
        "print(json.dumps(schema['components']['securitySchemes']))\n"
    )
    schemes = json.loads(run_script(script, tmp_path))
    assert schemes["ApiKeyAuth"]["type"] == "apiKey"
    assert schemes["ApiKeyAuth"]["name"] == "Authorization"
