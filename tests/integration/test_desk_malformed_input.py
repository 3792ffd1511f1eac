"""Malformed ids, pages, dates and selections on the desk: a clear answer, never a 500.

Each case was found by walking every admin URL with hostile values: a digit Python calls a
digit but ``int`` refuses ("²"), an id that is not a number, a step id beyond any row's, a
year beyond what a date holds.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from govflow.engine.variables import MissingVariable, lookup
from govflow.handoffs.models import DecisionBatch

from .test_desk_batches import RATIONALE, previewed, submission, uncertain
from .test_engine_admin import OPERATOR_PERMS, blocked, logged_in, make_user, url

pytestmark = pytest.mark.django_db


@pytest.fixture
def desk(django_user_model):
    return logged_in(
        make_user(django_user_model, "olga", *OPERATOR_PERMS, "recovery.view_decision")
    )


def test_a_batch_id_that_is_not_a_number_is_not_found(desk):
    page = desk.get(reverse("admin:handoffs_decisionbatch_change", args=["abc"]))
    assert page.status_code == 404


@pytest.mark.parametrize("page", ["²", "٣", "-1", "1e3", ""])
def test_a_timeline_page_that_is_not_a_plain_number_shows_the_first(desk, page):
    instance = blocked()
    response = desk.get(url("instance_timeline", instance.pk), {"page": page})
    assert response.status_code == 200
    assert (
        response.context["timeline"]
        == desk.get(url("instance_timeline", instance.pk)).context["timeline"]
    )


@pytest.mark.parametrize("step", ["99999999999999999999999", "²", "0", "-4", " 7"])
def test_a_batch_selection_with_a_step_id_no_row_can_have_is_refused_clearly(desk, step):
    steps = uncertain(1)
    response = desk.post(
        reverse("admin:handoffs_decisionbatch_preview"),
        {
            "action": "alpha.write",
            "steps": [str(steps[0].pk), step],
            "kind": "effect_confirmed",
            "rationale": RATIONALE,
            "check_store": "each key is in the export",
        },
        follow=True,
    )
    assert response.status_code == 200
    assert "The selection is malformed; select again." in response.content.decode()
    assert not DecisionBatch.objects.exists()


def test_a_submission_whose_previewed_revision_is_not_a_plain_number_records_nothing(desk):
    steps = uncertain(2)
    data = submission(previewed(desk, steps), steps)
    data["previewed"] = [data["previewed"][0], data["previewed"][1].rsplit(":", 1)[0] + ":²"]
    response = desk.post(reverse("admin:handoffs_decisionbatch_submit"), data, follow=True)
    assert response.status_code == 200
    assert not DecisionBatch.objects.exists()


@pytest.mark.parametrize("year", ["9999", "99999999999", "0"])
def test_an_instance_list_filtered_by_a_year_beyond_any_date_says_the_filter_is_wrong(desk, year):
    changelist = url("instance_changelist")
    response = desk.get(changelist, {"created_at__year": year})
    assert (response.status_code, response["Location"]) == (302, f"{changelist}?e=1")
    assert (
        desk.get(changelist, {"created_at__year": "2026", "created_at__month": "13"}).status_code
        == 302
    )
    assert desk.get(changelist, {"created_at__year": "2026"}).status_code == 200


def test_a_variable_path_with_a_non_ascii_digit_is_missing_not_an_error():
    variables = {"items": ["a", "b", "c", "d"]}
    assert lookup(variables, "items.3") == "d"
    assert lookup(variables, "items.³", default=None) is None
    with pytest.raises(MissingVariable):
        lookup(variables, "items.٣")
