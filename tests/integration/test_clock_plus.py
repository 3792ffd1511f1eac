"""A delay is written at the database clock's own precision (``db.ClockPlus``).

On SQLite the engine's clock is text to the millisecond and due times are compared with it
as text: a due time written to the microsecond (``…:05.123000``) compares after the clock's
``…:05.123`` and came due a millisecond late, or, for a step due "now", not within the run
that asked for it.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection

from govflow.engine.db import clock_read, engine_dialect
from govflow.engine.models import Token
from govflow.engine.services.routing import after_seconds
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db

CLOCK_TEXT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$")


def written(token_id: int, seconds: float):
    Token.objects.filter(pk=token_id).update(not_before=after_seconds(seconds))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT CAST(not_before AS TEXT), {engine_dialect().now} FROM engine_token "
            "WHERE id = %s",
            [token_id],
        )
        return cursor.fetchone()


@pytest.mark.parametrize("seconds", [0, 0.25, 1.5, 3600])
def test_a_due_time_is_written_as_the_clock_is_and_lies_that_far_ahead(seconds):
    token = Token.objects.filter(instance=start(linear(action("a")))).first()
    before = clock_read()
    due, now = written(token.pk, seconds)
    if connection.vendor == "sqlite":  # text: the clock's own form, to the millisecond
        assert CLOCK_TEXT.match(due) and CLOCK_TEXT.match(now), (due, now)
    stored = Token.objects.get(pk=token.pk).not_before
    ahead = stored - before
    assert dt.timedelta(seconds=seconds) <= ahead < dt.timedelta(seconds=seconds + 5), ahead


def test_a_step_due_now_is_due_at_once():
    token = Token.objects.filter(instance=start(linear(action("a")))).first()
    Token.objects.filter(pk=token.pk).update(not_before=after_seconds(0))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM engine_token WHERE id = %s AND not_before <= "
            f"{engine_dialect().now}",
            [token.pk],
        )
        assert cursor.fetchone()[0] == 1
