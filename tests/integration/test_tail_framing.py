"""The tail check's framing (migration 0022) is the same text in Python and in PostgreSQL.

``recovery_tail_observe_record`` compares the stored rows past a run's mark with the rows
the run wrote, each side framed as ``<length>:<text>`` per field. The comparison is only as
good as the two framings' agreement: if they differed for some text, a step would fall back
to reading the chain (slower, still right); if two different rows framed alike, a changed
row could pass. Both are checked here, on hypothesis-made texts of any characters.
"""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery.services.lone import framed_rows

pytestmark = pytest.mark.django_db

_MIGRATION = importlib.import_module("recovery.migrations.0022_tail_compared_as_framed_text")
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
ROWS = st.lists(st.lists(st.one_of(TEXT, st.none()), min_size=3, max_size=3), max_size=4)


def test_python_frames_rows_as_the_server_does():
    if connection.vendor != "postgresql":
        pytest.skip("the framing compared is PostgreSQL's; SQLite has no one-call path")
    _frames_alike()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=ROWS.filter(bool))
def _frames_alike(rows):
    row_sql = _MIGRATION.framed(["r.a", "r.b", "r.c"])
    values = ", ".join(f"(%s::text, %s::text, %s::text, {i})" for i in range(len(rows)))
    sql = f"SELECT string_agg({row_sql}, '' ORDER BY r.n) FROM (VALUES {values}) r(a, b, c, n)"
    with connection.cursor() as cursor:
        cursor.execute(sql, [field for row in rows for field in row])
        assert cursor.fetchone()[0] == framed_rows(rows)


@given(first=ROWS, second=ROWS)
@settings(max_examples=300, deadline=None)
def test_different_rows_never_frame_alike(first, second):
    if first != second and len(first) == len(second):
        assert framed_rows(first) != framed_rows(second)


def test_a_field_moved_between_columns_changes_the_text():
    assert framed_rows([["ab", "c"]]) != framed_rows([["a", "bc"]])
    assert framed_rows([["1:", ""]]) != framed_rows([["", "1:"]])
    assert framed_rows([[None, ""]]) == ":0:"
