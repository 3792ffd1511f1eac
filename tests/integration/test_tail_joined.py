"""The tail check's joined rows (migration 0026) are the same text in Python and PostgreSQL.

``recovery_tail_observe_record`` and ``recovery_lone_success`` compare the stored rows past
a run's mark with the rows the run wrote, each side as its fields joined by the unit
separator and its rows by the record separator. The comparison is only as good as the two
sides' agreement: if they differed for some text, a step would fall back to reading the
chain (slower, still right); if two different rows joined alike, a changed row could pass.
Python joins only rows whose fields hold no separator (and no None); such a text is equal
to the server's for the same rows, and to no other rows' the server could hold. Both are
checked here, on hypothesis-made texts of any characters.
"""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery.services.lone import FIELD, ROW, joined_rows

pytestmark = pytest.mark.django_db

_MIGRATION = importlib.import_module("recovery.migrations.0026_tail_joined_not_framed")
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
SEPARATED = st.text(st.sampled_from(["a", "1", ":", FIELD, ROW]), max_size=4)
FIELDS = st.one_of(TEXT, SEPARATED, st.none())
ROWS = st.lists(st.lists(FIELDS, min_size=3, max_size=3), max_size=4)


def stored(rows) -> str | None:
    """The server's text of ``rows``, as the two functions aggregate the stored rows."""
    row_sql = _MIGRATION.joined(["r.a", "r.b", "r.c"])
    values = ", ".join(f"(%s::text, %s::text, %s::text, {i})" for i in range(len(rows)))
    sql = (
        f"SELECT string_agg({row_sql}, E'\\x1e' ORDER BY r.n) FROM (VALUES {values}) r(a, b, c, n)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [field for row in rows for field in row])
        return cursor.fetchone()[0]


def test_python_joins_rows_as_the_server_does_and_no_other_rows_alike():
    if connection.vendor != "postgresql":
        pytest.skip("the text compared is PostgreSQL's; SQLite has no one-call path")
    _joined_alike()
    _never_another_rows_text()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=ROWS.filter(bool))
def _joined_alike(rows):
    mine = joined_rows(rows)
    clean = all(f is not None and FIELD not in f and ROW not in f for row in rows for f in row)
    assert (mine is not None) == clean
    if clean:
        assert stored(rows) == mine


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(written=ROWS.filter(bool), held=ROWS.filter(bool))
def _never_another_rows_text(written, held):
    """What the server holds (any texts, separators and NULLs included) equals what the run
    wrote, joined, only when they are the same rows."""
    mine = joined_rows(written)
    if mine is not None and held != written:
        assert stored(held) != mine


def test_a_field_moved_between_columns_or_rows_is_not_joined_alike():
    assert joined_rows([["ab", "c", "d"]]) != joined_rows([["a", "bc", "d"]])
    assert joined_rows([["a", "b", "c"], ["d", "e", "f"]]) == "a\x1fb\x1fc\x1ed\x1fe\x1ff"
    assert joined_rows([["a" + FIELD, "b", "c"]]) is None
    assert joined_rows([["a", "b" + ROW + "c", "d"]]) is None
    assert joined_rows([[None, "", "x"]]) is None
    assert joined_rows([["", "", ""]]) == FIELD * 2
