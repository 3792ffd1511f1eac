"""Shared fixtures. Database tests run on SQLite and on PostgreSQL (see ``make test``)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from recovery.testing import live_fence, new_subject


def pytest_report_header(config):
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return f"database backend: {engine}"


@pytest.fixture(autouse=True)
def alpha_store(tmp_path, settings):
    """Every test gets a fresh external effect store for the test provider's actions."""
    from tests.providers.alpha import effects

    settings.ALPHA_STORE = str(tmp_path / "alpha.sqlite3")
    effects.reset(create=True)
    yield
    effects.reset()


@pytest.fixture(autouse=True)
def chain_marks():
    """Verified chain marks (ADR 0034) live in the process: a test's database is rolled
    back after it, so no test starts with a mark another test's run left behind."""
    from recovery.chain import marks_clear

    marks_clear()
    yield
    marks_clear()


@pytest.fixture(autouse=True)
def language_reset():
    """A test client's request in German (the language cookie) leaves German active in
    the thread after it; the next test starts in the default language again."""
    from django.utils import translation

    yield
    translation.deactivate()


@pytest.fixture(autouse=True, scope="session")
def projection_checked():
    """Every fingerprint a run keeps (ADR 0044) is compared with a whole recomputation, so
    a path that edits a run's variables without saying so fails the test that takes it."""
    from govflow.engine import projection

    projection.CHECKED = True
    yield
    projection.CHECKED = False


@pytest.fixture(autouse=True)
def anchor_path(tmp_path, settings):
    """Every test gets its own anchor file (a missing folder, created on the first append)
    and a sweeper that anchors on its first pass: anchors outlive a test's database."""
    from recovery.services.anchors import anchor_schedule_reset

    path = tmp_path / "anchors" / "ledger.anchors"
    settings.RECOVERY_ANCHOR_PATH = str(path)
    anchor_schedule_reset()
    yield path
    anchor_schedule_reset()


@pytest.fixture
def subject():
    return new_subject()


@pytest.fixture
def fence(subject):
    return live_fence(subject)


def _user(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(
        username=username, password="pw-" + username, is_staff=True
    )
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return django_user_model.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def requester(django_user_model):
    return _user(
        django_user_model, "requester", "request_decision", "view_decision", "operate_instance"
    )


@pytest.fixture
def approver(django_user_model):
    return _user(
        django_user_model,
        "approver",
        "request_decision",
        "approve_decision",
        "view_decision",
        "operate_instance",
    )


@pytest.fixture
def second_approver(django_user_model):
    return _user(django_user_model, "approver2", "approve_decision")


@pytest.fixture
def on_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: SQLite serialises all writers, so there is no race")


@pytest.fixture
def resolver(django_user_model):
    """Rita requests the resolution of integrity incidents (and may approve others')."""
    return _user(django_user_model, "rita", "resolve_incident", "view_integrityincident")


@pytest.fixture
def second_resolver(django_user_model):
    """Rob is the second pair of eyes on an incident's resolution."""
    return _user(django_user_model, "rob", "resolve_incident", "view_integrityincident")


@pytest.fixture
def third_resolver(django_user_model):
    return _user(django_user_model, "ruth", "resolve_incident", "view_integrityincident")
