"""``recovery.api.field_saver`` answers as Django's ``get_db_prep_save`` answers.

The hot paths save a step's values through it (``insert_statement``, ``fenced_row_sql``,
the events' insert): a shortcut for a ``str`` into a plain text field and an ``int`` into a
plain integer or automatic key field, Django's own method for everything else. Here every
concrete field of every installed model saves random values of many kinds both ways, on
the backend the suite runs on (PostgreSQL adapts integers into its own types).
"""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.translation import gettext_lazy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery.db import field_saver

FIELDS = [
    field
    for model in apps.get_models()
    for field in model._meta.concrete_fields
    # Django's own method for the others: the same answers by construction.
    if field_saver(field) != field.get_db_prep_save
]

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=20),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=2),
    st.builds(lambda s: gettext_lazy(s), st.text(max_size=5)),
    st.just(""),
    st.just("12"),
    st.datetimes(timezones=st.just(dt.UTC)),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def saved(save, value, db):
    try:
        return "value", save(value, db)
    except Exception as exc:  # the same refusal, or it is a difference
        return "raised", type(exc)


def test_the_shortcuts_cover_the_fields_a_step_writes_most():
    """The shortcut is taken at all: the text and integer fields of the engine's step
    rows (and its key to the instance) are among the fields compared below."""
    token = apps.get_model("engine", "Token")
    for name in ("node_id", "state", "ordinal", "attempt", "instance"):
        assert token._meta.get_field(name) in FIELDS, name


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f"{f.model._meta.label}.{f.name}")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=VALUES)
def test_every_field_saves_every_value_as_django_does(field, value):
    db = connections[DEFAULT_DB_ALIAS]
    mine = saved(field_saver(field), value, db)
    django = saved(field.get_db_prep_save, value, db)
    assert mine[0] == django[0], (value, mine, django)
    if mine[0] == "raised":
        assert mine[1] is django[1]
        return
    ours, theirs = mine[1], django[1]
    assert type(ours) is type(theirs), (value, ours, theirs)
    if isinstance(ours, decimal.Decimal | float) or not hasattr(ours, "obj"):
        assert ours == theirs or (ours != ours and theirs != theirs), (value, ours, theirs)
    else:  # an adapter wrapper (psycopg's Jsonb): the same wrapped value
        assert ours.obj == theirs.obj
