"""The desk shows a linked run's state, and an unknown publication as a cancel-only handoff."""

from __future__ import annotations

import pytest

from govflow.demo.dataflow import services as dataflow
from govflow.demo.dataflow.models import DataflowRun
from tests.integration.test_desk_compensation import page
from tests.integration.test_engine_admin import OPERATOR_PERMS, logged_in, make_user, url
from tests.integration.test_linked_runs import look, started

pytestmark = pytest.mark.django_db


@pytest.fixture
def olga(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


def test_the_instance_page_shows_the_linked_run_and_its_state(olga):
    dataflow.fault_set("hold")
    instance = look(started())
    text = page(logged_in(olga), instance)
    assert "Linked runs" in text
    assert 'data-linked-state="running"' in text
    assert DataflowRun.objects.get().reference in text
    assert "Handoff: publication outcome unknown" not in text


def test_an_unknown_publication_is_a_cancel_only_handoff_on_the_page(olga):
    dataflow.fault_set("lost_answer")
    instance = look(started())
    text = page(logged_in(olga), instance)
    assert 'data-linked-state="unknown_publication"' in text
    assert "Handoff: publication outcome unknown" in text
    assert 'href="#cancel-heading"' in text
    # No decision form: the other module settles its publication itself.
    assert "Request a decision on" not in text


def test_the_handoff_speaks_german(olga):
    dataflow.fault_set("lost_answer")
    instance = look(started())
    client = logged_in(olga)
    client.cookies["django_language"] = "de"
    response = client.get(url("instance_change", instance.pk))
    text = response.content.decode()
    assert "Übergabe: Ergebnis der Veröffentlichung unbekannt" in text
    assert "Verknüpfte Läufe" in text
