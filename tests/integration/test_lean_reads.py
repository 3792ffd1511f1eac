"""Reads built once for the hot path and the sweeper (ADR 0039): the same rows as the
ORM's own queries, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from govflow.engine.models import Instance, Token
from recovery.api import CompiledAt, model_columns, rows_as
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db


def test_rows_read_by_plain_sql_are_the_models_the_orm_reads():
    instance = start(linear(action("a"), action("b")), {"value": "v", "nested": {"n": [1, 2]}})
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {model_columns(Instance)}, 41 + 1 FROM {Instance._meta.db_table} "
            "WHERE id = %s",
            [instance.pk],
        )
        [loaded] = rows_as(Instance, cursor.fetchall(), ["answer"])
        cursor.execute(
            f"SELECT {model_columns(Token, 't')} FROM {Token._meta.db_table} t "
            "WHERE instance_id = %s",
            [instance.pk],
        )
        tokens = rows_as(Token, cursor.fetchall())
    fresh = Instance.objects.get(pk=instance.pk)
    for field in Instance._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(fresh, field.attname), field.name
    assert loaded.variables == {"value": "v", "nested": {"n": [1, 2]}}
    assert isinstance(loaded.created_at, dt.datetime) and loaded.created_at.tzinfo
    assert loaded.answer == 42 and not loaded._state.adding
    assert tokens == list(Token.objects.filter(instance=instance))
    assert [t.payload for t in tokens] == [
        t.payload for t in Token.objects.filter(instance=instance)
    ]


def test_a_read_compiled_once_answers_for_the_time_it_is_given():
    first = start(linear(action("a")), {"value": "one"})
    second = start(linear(action("a")), {"value": "two"})
    Instance.objects.filter(pk=second.pk).update(
        created_at=first.created_at + dt.timedelta(hours=1)
    )
    between = first.created_at + dt.timedelta(minutes=30)

    def build(now):
        return (
            Instance.objects.filter(created_at__lte=now).order_by("pk").values_list("pk", flat=True)
        )

    read = CompiledAt(build)
    for now in (between, between + dt.timedelta(hours=1), between - dt.timedelta(hours=1)):
        assert read(now) == list(build(now)), now
    assert read(between) == [first.pk]
    assert len(read.compiled) == 1, "compiled once"
