"""Reloading a desk page after a POST with a validation error shows the page again."""

from __future__ import annotations

import pytest
from django.urls import reverse

from recovery.models import Decision
from tests.integration.test_engine_admin import (
    OPERATOR_PERMS,
    blocked,
    decision_form,
    logged_in,
    make_user,
)

pytestmark = pytest.mark.django_db


def test_reloading_a_handoff_after_a_validation_error_shows_the_instance(django_user_model):
    instance = blocked()
    token = instance.tokens.get(state="outcome_unknown")
    client = logged_in(make_user(django_user_model, "olga", *OPERATOR_PERMS))
    target = reverse("admin:engine_instance_handoff", args=[instance.pk, token.pk])
    invalid = client.post(target, decision_form(token, rationale=""))
    assert invalid.status_code == 200  # the page again, with the form's error
    assert not Decision.objects.exists()
    reload = client.get(target, follow=True)
    assert reload.status_code == 200
    assert reload.redirect_chain == [
        (reverse("admin:engine_instance_change", args=[instance.pk]), 302)
    ]
