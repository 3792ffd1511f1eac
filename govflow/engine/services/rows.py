"""The engine's rows written together in one statement on PostgreSQL (ADR 0044).

A chained step inserts the next step's row and updates the instance row one after the
other; on PostgreSQL both go as one statement (data-modifying ``WITH``), each as its own
writer would send it. SQLite keeps the separate statements (calls inside the process, not
round trips), and so does code inside :func:`separate_rows` — the property test of ADR
0031 compares both on one database.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import connection
from django.db.models import Model
from django.db.models.functions import Now

from recovery.api import dialect

__all__ = ["insert_sql", "rows_in_one", "separate_rows"]

_SEPARATE: ContextVar[bool] = ContextVar("govflow_separate_rows", default=False)


def rows_in_one() -> bool:
    """Whether the engine's rows of a step go as one statement here."""
    return dialect().step_call and not _SEPARATE.get()


@contextmanager
def separate_rows() -> Iterator[None]:
    """Write the engine's rows one statement each, as on SQLite (tests, benchmarks)."""
    token = _SEPARATE.set(True)
    try:
        yield
    finally:
        _SEPARATE.reset(token)


def insert_sql(obj: Model) -> tuple[str, list[Any]]:
    """``recovery.api.insert_row``'s statement for ``obj`` as ``(sql, params)``, not run:
    ``INSERT … RETURNING`` its primary key, plain values or ``Now()``."""
    meta = type(obj)._meta
    values = [getattr(obj, field.attname) for field in meta.concrete_fields]
    shape = tuple(
        "pk" if field.primary_key and value is None else "now" if isinstance(value, Now) else ""
        for field, value in zip(meta.concrete_fields, values, strict=True)
    )
    if any(hasattr(v, "resolve_expression") for v, k in zip(values, shape, strict=True) if not k):
        raise TypeError(f"insert_sql: {meta.label} holds an expression; use the ORM")
    params = [
        field.get_db_prep_save(value, connection)
        for field, value, kind in zip(meta.concrete_fields, values, shape, strict=True)
        if not kind
    ]
    return _insert_text(type(obj), shape, connection.vendor), params


@functools.lru_cache(maxsize=16)
def _insert_text(model: type[Model], shape: tuple[str, ...], vendor: str) -> str:
    meta = model._meta
    quote = connection.ops.quote_name
    columns, values = [], []
    for field, kind in zip(meta.concrete_fields, shape, strict=True):
        if kind != "pk":
            columns.append(quote(field.column))
            values.append(dialect().now if kind == "now" else "%s")
    return (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(values)}) RETURNING {quote(meta.pk.column)}"
    )
