"""The desk's case view of an uncertain step, the instance's timeline, graph and variables.

What an operator notices on the instance page: the keys and the input the provider got,
every attempt to the second, the checks marked required, what each choice does; a
timeline with who did what, in the operator's time zone; the definition drawn with the
current step highlighted; variables as a table. The page's queries do not grow with the
number of steps.
"""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import Instance, InstanceStatus, Timer
from recovery import api
from tests.flows import action, drive, linear, start
from tests.integration.test_desk_timeline import rows as timeline_rows
from tests.integration.test_desk_timeline import walk as walk_timeline
from tests.integration.test_engine_admin import (
    OPERATOR_PERMS,
    blocked,
    decision_form,
    logged_in,
    make_user,
    url,
)

pytestmark = pytest.mark.django_db
SECOND = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture
def operator(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def checker(django_user_model):
    return make_user(django_user_model, "carl", "engine.view_instance", "recovery.approve_decision")


@pytest.fixture
def ops(operator) -> Client:
    return logged_in(operator)


def case_of(text: str, token) -> str:
    start = text.index(f'id="case-{token.pk}"')
    return text[start : text.index("Request a decision on", start)]


def test_the_handoff_page_shows_the_case_an_operator_checks(ops):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    case = case_of(text, token)
    assert "Write to the alpha store" in case
    # Keys shortened on the page, whole in the title and on the copy button.
    assert f'title="{token.idempotency_key}">{token.idempotency_key[:16]}…</code>' in case
    assert f'data-copy="{token.operation_key}"' in case
    # The input and preview, shown because their fingerprints equal the ledger's.
    assert "this is the input the provider received" in case
    assert '<th scope="row">will</th><td>write</td>' in case
    # Each attempt with its time to the second and its answer.
    assert re.search(SECOND + r" UTC</td><td>Outcome unknown", case)
    assert "Look the idempotency key up in the alpha effect store." in case
    assert "Plain retry is not offered" in case
    # The check's field is marked required, as the admin marks required fields.
    assert re.search(r'<label for="id_handoff_\d+_check_store" class="required">', text)
    assert "At most 20.0" in text and "for all files together" in text


def test_an_input_that_changed_since_the_dispatch_is_not_shown_as_if_it_were_sent(ops):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    Instance.objects.filter(pk=instance.pk).update(variables={"value": "edited later"})
    case = case_of(ops.get(url("instance_change", instance.pk)).content.decode(), token)
    assert "The input itself is not kept" in case
    assert "The variables changed since the dispatch" in case
    assert "edited later" not in case


def test_a_decision_without_a_check_answer_is_refused_on_the_check_field(ops):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    response = ops.post(
        url("instance_handoff", instance.pk, token.pk), decision_form(token, check_store="")
    )
    assert response.status_code == 200
    assert (
        "Answer the provider&#x27;s verification checks first: store" in response.content.decode()
    )


def test_the_timeline_says_who_did_what_to_the_second(ops, operator, checker):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    ops.post(url("instance_handoff", instance.pk, token.pk), decision_form(token))
    decision = instance_decision(instance)
    logged_in(checker).post(
        url("instance_decision_approve", instance.pk, decision.pk),
        {"result_fp": decision.result_fp},
    )
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    timeline = text[text.index('id="timeline"') : text.index('id="graph-heading"')]
    assert "chain verified" in timeline
    rows = re.findall(
        r"<time[^>]*>(" + SECOND + r")</time></td><td>([^<]*)</td><td>([^<]*)</td>", timeline
    )
    what = [(w, who) for _, w, who in rows]
    assert ("Decision requested", "olga") in what
    assert ("Decision approved", "carl") in what
    assert ("Step “Write” began", "—") in what or any("began" in w for w, _ in what)
    assert any(w.startswith("Provider&#x27;s answer observed: outcome unknown") for w, _ in what)
    assert [at for at, _, _ in rows] == sorted(at for at, _, _ in rows)


def instance_decision(instance):
    from recovery.models import Decision

    return Decision.objects.get(operation__subject_id=str(instance.pk))


def test_the_timeline_is_in_the_operators_time_zone_and_shows_a_timers_due_time(ops, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    instance = drive(start(linear({"id": "wait", "type": "timer", "duration": "PT1H"})))
    timer = Timer.objects.get(instance=instance)
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    due = timer.due_at.astimezone(ZoneInfo("Europe/Berlin")).strftime("%Y-%m-%d %H:%M:%S")
    assert re.search(rf">{due}</time></td><td>Timer of “wait” due</td>", text)
    assert "Times to the second, in Europe/Berlin" in text


def test_the_definition_is_drawn_with_the_current_step_highlighted_and_titles(ops):
    instance = blocked()
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    begin = text.index('<svg class="govflow-graph"')
    svg = text[begin : text.index("</svg>", begin)]
    assert '<g class="govflow-node current" data-node="write">' in svg
    assert '<g class="govflow-node done" data-node="start">' in svg
    assert "<title>write (outcome unknown)</title>" in svg
    assert "<script" not in svg and " on" not in svg.replace(" one", "")


def test_node_titles_replace_ids_and_variables_are_a_table(ops):
    document = linear(action("write", title="Register the application"))
    instance = drive(
        start(document, variables={"value": "v1", "applicant": {"name": "T. Nowak"}, "l": [1, 2]})
    )
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    assert "Register the application <small>(write)</small>" in text
    assert '<code>applicant.name</code></th><td class="govflow-json">T. Nowak' in text
    assert '<code>l[1]</code></th><td class="govflow-json">2' in text


def test_history_opens_the_timeline_instead_of_an_empty_page(ops):
    instance = blocked()
    response = ops.get(url("instance_history", instance.pk))
    assert response.status_code == 302
    assert response["Location"] == url("instance_change", instance.pk) + "#timeline"


def test_the_instance_page_queries_do_not_grow_with_its_steps(ops):
    """An instance of 200 steps (each with its ledger operation) costs what one of 5 does;
    its timeline shows the latest entries, and all of them are on the timeline's pages."""

    def page_queries(steps: int) -> int:
        document = linear(*[action(f"s{i}", name="alpha.note") for i in range(steps)])
        instance = drive(start(document), rounds=steps + 5)
        assert instance.status == InstanceStatus.COMPLETED
        assert instance.tokens.count() > steps
        with CaptureQueriesContext(connection) as queries:
            page = ops.get(url("instance_change", instance.pk))
        assert page.status_code == 200
        shown, everything = timeline_rows(page.content.decode()), walk_timeline(ops, instance)[0]
        assert len(everything) > 2 * steps
        assert shown == everything[-len(shown) :]
        return len(queries)

    small, large = page_queries(5), page_queries(200)
    assert large == small, f"{small} queries for 5 steps, {large} for 200"
    assert large <= 40


def test_an_integrity_incident_is_on_the_timeline(ops):
    instance = blocked()
    incident = api.incident_report(
        subject=api.Subject("govflow.instance", str(instance.pk)), reason="A row was edited."
    )
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    timeline = text[text.index('id="timeline"') : text.index('id="graph-heading"')]
    assert f"Integrity incident #{incident.pk} opened</td><td>—</td><td>A row was edited." in (
        timeline
    )
