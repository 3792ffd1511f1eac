"""The instance's timeline in pages: the instance page shows the latest entries and every
older one that still needs a person; the timeline's own page shows any page, so every
entry stays reachable; no page's queries grow with the instance's steps."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.handoffs import timeline
from recovery import api
from tests.flows import action, drive, linear, start
from tests.integration.test_engine_admin import OPERATOR_PERMS, blocked, logged_in, make_user, url

pytestmark = pytest.mark.django_db
ROW = re.compile(
    r'<tr class="govflow-(\w+)( govflow-attention)?"><td class="nowrap"><time datetime="([^"]+)">'
    r"([^<]+)</time></td><td>([^<]*)</td>"
)


@pytest.fixture
def ops(django_user_model):
    return logged_in(make_user(django_user_model, "olga", *OPERATOR_PERMS))


def rows(text: str) -> list[tuple[str, str, str, bool]]:
    """The timeline's rows on a page: (kind, ISO time, what, needs a person)."""
    section = text[text.index('id="timeline"') :]
    section = section[: section.index("</table>")]
    return [(kind, iso, what, bool(mark)) for kind, mark, iso, _, what in ROW.findall(section)]


def walk(client, instance) -> tuple[list, list[int]]:
    """Every page of the timeline, by its "Older entries" links: all entries, oldest first,
    and each page's query count."""
    pages, queries, link = [], [], url("instance_timeline", instance.pk)
    while link:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(link)
        assert response.status_code == 200
        text = response.content.decode()
        pages.append(rows(text))
        queries.append(len(captured))
        older = re.search(r'<a href="(\?page=\d+)" rel="next">Older entries</a>', text)
        link = url("instance_timeline", instance.pk) + older.group(1) if older else None
    return [row for page in reversed(pages) for row in page], queries


def long_instance(steps: int):
    document = linear(*[action(f"s{i}", name="alpha.note") for i in range(steps)])
    return drive(start(document), rounds=steps + 5)


def test_the_instance_page_shows_the_latest_entries_and_the_older_ones_are_paged(ops):
    instance = long_instance(60)
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    shown = rows(text)
    everything, _ = walk(ops, instance)
    assert len(shown) == timeline.PAGE_ENTRIES < len(everything)
    assert shown == everything[-len(shown) :]  # the latest, oldest first
    assert [iso for _, iso, _, _ in everything] == sorted(iso for _, iso, _, _ in everything)
    assert f"The latest {len(shown)} of {len(everything)} entries." in text
    # Every step's beginning is on one of the pages, the first and the last included.
    began = [what for _, _, what, _ in everything if what.endswith("began")]
    assert len(began) == instance.tokens.count()
    assert everything[0][2] == "Instance started"
    assert "Instance ended: Completed" in [what for _, _, what, _ in shown]


def test_a_page_past_the_last_shows_the_oldest_entries(ops):
    instance = long_instance(60)
    everything, _ = walk(ops, instance)
    text = ops.get(url("instance_timeline", instance.pk) + "?page=999").content.decode()
    assert rows(text)[0][2] == "Instance started"
    assert "Older entries</a>" not in text and "Newer entries</a>" in text
    garbled = ops.get(url("instance_timeline", instance.pk) + "?page=x").content.decode()
    assert rows(garbled) == everything[-timeline.PAGE_ENTRIES :]


def test_an_older_entry_that_needs_a_person_stays_on_the_instance_page(ops, monkeypatch):
    instance = blocked()
    incident = api.incident_report(
        subject=api.Subject("govflow.instance", str(instance.pk)), reason="A row was edited."
    )
    monkeypatch.setattr(timeline, "PAGE_ENTRIES", 1)
    text = ops.get(url("instance_change", instance.pk)).content.decode()
    shown = rows(text)
    attention = [what for _, _, what, mark in shown if mark]
    assert "Step “write” is now outcome unknown" in attention
    assert f"Integrity incident #{incident.pk} opened" in attention
    assert "still need a person" in text and "Older entries</a>" in text
    # On the timeline's own pages every entry is where its time puts it.
    everything, _ = walk(ops, instance)
    assert [iso for _, iso, _, _ in everything] == sorted(iso for _, iso, _, _ in everything)
    assert {what for _, _, what, _ in shown} <= {what for _, _, what, _ in everything}


def test_the_timeline_pages_queries_do_not_grow_with_the_steps(ops):
    small, large = walk(ops, long_instance(5))[1], walk(ops, long_instance(200))[1]
    assert len(small) == 1 and len(large) > 10
    assert set(large) == set(small), f"{small} queries for 5 steps, {large} for 200"


@pytest.mark.parametrize("language", ["en", "de"])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_times_are_written_as_the_date_filter_writes_them(language, zone, settings):
    """The page's times come from Python (present.Times), to the second and in the zone:
    exactly what the template's ``date`` filter wrote for each entry before."""
    from datetime import UTC, datetime

    from django.template import engines
    from django.utils import timezone, translation

    from govflow.handoffs.present import Times

    settings.TIME_ZONE = zone
    template = engines["django"].from_string(
        '{{ at|date:"DATETIME_FORMAT" }}|{{ at|date:"SHORT_DATETIME_FORMAT" }}'
    )
    with translation.override(language), timezone.override(zone):
        for at in (
            datetime(2026, 12, 1, 20, 5, 9, 123456, UTC),
            datetime(2026, 7, 1, 0, 0, 1, tzinfo=UTC),
        ):
            times = Times()
            assert f"{times.format(at)}|{times.short(at)}" == template.render({"at": at})
        assert Times().format(None) == ""


def test_the_copyable_key_is_shortened_whole_in_its_title_and_translated():
    from django.template import engines
    from django.utils import translation

    template = engines["django"].from_string("{% load desk %}{% copyable_key key %}")
    key = "op-" + "ab" * 30
    text = template.render({"key": key})
    assert f'<code class="govflow-key" title="{key}">{key[:16]}…</code>' in text
    assert f'data-copy="{key}"' in text and ">Copy</button>" in text
    assert template.render({"key": "short<key>"}).startswith(
        '<code class="govflow-key" title="short&lt;key&gt;">short&lt;key&gt;</code>'
    )
    assert template.render({"key": ""}) == '<code class="govflow-key" title=""></code>'
    with translation.override("de"):
        assert ">Kopieren</button>" in template.render({"key": key})
