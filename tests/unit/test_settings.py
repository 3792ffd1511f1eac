"""Production settings: secrets from the environment, and a clean deploy check."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "GOVFLOW_"))}
    base.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "govflow.settings.prod", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


PROD_ENV = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "gov.example, admin.gov.example",
    "DATABASE_URL": "postgres://govflow@127.0.0.1:5/govflow",
    "GOVFLOW_CHAIN_KEYS": "k2:" + secrets.token_hex(32) + ",k1:" + secrets.token_hex(32),
}


def test_deploy_check_is_clean_under_production_settings():
    done = manage("check", "--deploy", "--fail-level", "WARNING", **PROD_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_refuses_to_start_without_its_secrets():
    env = dict(PROD_ENV, DJANGO_SECRET_KEY="   ")
    done = manage("check", **env)
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in done.stderr


def test_production_refuses_malformed_chain_keys():
    done = manage("check", "--deploy", **dict(PROD_ENV, GOVFLOW_CHAIN_KEYS="k1:not-hex"))
    assert done.returncode != 0
    assert "recovery.E001" in done.stderr + done.stdout


def test_a_number_setting_that_is_not_a_number_names_the_variable_and_the_fix():
    done = manage("check", **dict(PROD_ENV, GOVFLOW_LEASE_TTL="30s"))
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr
    assert "GOVFLOW_LEASE_TTL='30s' is not a number" in done.stderr
    assert "for example 30" in done.stderr
    assert "ValueError" not in done.stderr


def settings_read(expression: str, **env) -> list[str]:
    """The lines ``manage.py shell`` printed for ``print('read:', <expression>)`` under
    the production settings with ``env``."""
    shown = manage(
        "shell",
        "-c",
        f"from django.conf import settings; print('read:', {expression})",
        **dict(PROD_ENV, **env),
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


def test_a_whole_number_setting_refuses_decimals_and_an_empty_one_keeps_its_default():
    done = manage("check", **dict(PROD_ENV, GOVFLOW_Q_WORKERS="2.5"))
    assert done.returncode != 0
    assert "GOVFLOW_Q_WORKERS='2.5' is not a whole number" in done.stderr
    shown = settings_read(
        "settings.Q_CLUSTER['workers'], settings.GOVFLOW_LEASE_TTL",
        GOVFLOW_Q_WORKERS=" ",
        GOVFLOW_LEASE_TTL="12.5",
    )
    assert "read: 2 12.5" in shown


def test_worker_recycling_is_rare_by_default_and_a_negative_limit_is_refused():
    """A worker process is replaced after GOVFLOW_Q_RECYCLE runs or past GOVFLOW_Q_MAX_RSS
    KiB of memory (0: never); django-q2's 500 drained and restarted a busy worker every few
    seconds. A negative memory limit would replace it after every task: refused."""
    assert "read: 20000 524288" in settings_read(
        "settings.Q_CLUSTER['recycle'], settings.Q_CLUSTER['max_rss']"
    )
    assert "read: None" in settings_read("settings.Q_CLUSTER['max_rss']", GOVFLOW_Q_MAX_RSS="0")
    done = manage("check", **dict(PROD_ENV, GOVFLOW_Q_MAX_RSS="-1"))
    assert done.returncode != 0
    assert "GOVFLOW_Q_MAX_RSS=-1 is below 0" in done.stderr


def test_one_task_waits_per_worker_process_and_a_limit_below_one_is_refused():
    """django-q2 keeps workers squared tasks waiting by default; each of GovFlow's carries
    a worker process's share of the claims with their leases (ADR 0069), so a paused
    cluster held more than it could start. One per worker process (ADR 0074)."""
    read = "settings.Q_CLUSTER['queue_limit']"
    assert "read: 2" in settings_read(read)
    assert "read: 4" in settings_read(read, GOVFLOW_Q_WORKERS="4")
    assert "read: 9" in settings_read(read, GOVFLOW_Q_WORKERS="4", GOVFLOW_Q_QUEUE_LIMIT="9")
    done = manage("check", **dict(PROD_ENV, GOVFLOW_Q_QUEUE_LIMIT="0"))
    assert done.returncode != 0
    assert "GOVFLOW_Q_QUEUE_LIMIT=0 is below 1" in done.stderr


def test_the_test_settings_folders_go_with_their_process(tmp_path):
    """Each process that loads the test settings makes an evidence and an anchors folder;
    they are removed when it exits (``make test`` also runs pytest in a folder of its own,
    for the processes the crash tests kill)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "GOVFLOW_"))}
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; import os; "
            "print(settings.EVIDENCE_ROOT); print(os.path.dirname(settings.RECOVERY_ANCHOR_PATH));"
            "print(all(os.path.isdir(p) for p in (settings.EVIDENCE_ROOT, "
            "os.path.dirname(settings.RECOVERY_ANCHOR_PATH))))",
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "govflow.settings.test", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    evidence, anchors, existed = made.stdout.split()
    assert existed == "True"  # they were there while the process ran
    assert evidence.startswith(str(tmp_path)) and anchors.startswith(str(tmp_path))
    assert not os.path.exists(evidence) and not os.path.exists(anchors)
