"""The few SQL fragments that differ between PostgreSQL and SQLite.

The ledger's hot path is written as plain parameterised SQL (see ``docs/recovery.md``,
"Cost"): it runs for every step of every instance, and the ORM's per-statement overhead
would be most of its cost. Everything else uses the ORM.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.db import connection, transaction

from .kept import default_db, kept_made

GENESIS_LINK = "0" * 64


@dataclass(frozen=True)
class Dialect:
    vendor: str
    """Django's name of the database (``connection.vendor``)."""

    now: str
    """The database clock, read when the statement runs (not when the transaction began)."""

    plus_seconds: str
    """An expression for "now + %s seconds"; takes one parameter."""

    share_lock: str
    """Locks the fence row in a sub-select until commit, so a new holder cannot take the
    lease between our fence check and our commit (PostgreSQL, READ COMMITTED). SQLite
    serialises writers with ``BEGIN IMMEDIATE`` and needs nothing here."""

    seconds_param: staticmethod

    expected: str
    """How a fenced row write compares a column with the value it expects, next to the
    primary key (:func:`recovery.api.fenced_update_row`). On PostgreSQL a comparison an
    index cannot serve, so the key is the statement's only index condition: with ``=`` the
    planner could take an index on the expected column — the steps' ``(state, not_before)``
    — for a row the key already names, and read every row in that state on each write (it
    did, on tables not yet analysed: one index entry per instance waiting to run). Both
    dialects compare NULL-safely (SQLite's ``IS``), so an expected NULL means NULL."""

    step_call: bool
    """A step's ledger writes — step k observed, step k+1 recorded, both checkpoints — go
    to the server as one call of ``recovery_observe_record`` (PostgreSQL, created by
    migration 0011; ADR 0031). SQLite sends them as separate statements of the same
    transaction: its database is in-process, a statement costs no round trip."""


_POSTGRES = Dialect(
    vendor="postgresql",
    now="clock_timestamp()",
    plus_seconds="(clock_timestamp() + %s * interval '1 second')",
    share_lock="FOR SHARE",
    seconds_param=staticmethod(lambda seconds: float(seconds)),
    expected="IS NOT DISTINCT FROM",
    step_call=True,
)
_SQLITE = Dialect(
    vendor="sqlite",
    now="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')",
    plus_seconds="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)",
    share_lock="",
    seconds_param=staticmethod(lambda seconds: f"{float(seconds):+.6f} seconds"),
    expected="IS",
    step_call=False,
)
_MULTI_STATEMENT: ContextVar[bool] = ContextVar("recovery_multi_statement", default=False)


def one_call_steps() -> bool:
    """Whether a step's ledger writes go as one server call here (:attr:`Dialect.step_call`),
    unless :func:`multi_statement` asks for the separate statements."""
    return dialect().step_call and not _MULTI_STATEMENT.get()


@contextmanager
def multi_statement() -> Iterator[None]:
    """Send a step's ledger writes as separate statements even where one call is possible.

    For tests and benchmarks that compare the two paths on the same database; both must
    leave identical rows, fingerprints and links (``tests/integration/test_step_call.py``).
    """
    token = _MULTI_STATEMENT.set(True)
    try:
        yield
    finally:
        _MULTI_STATEMENT.reset(token)


_TRANSACTIONS_ONLY: ContextVar[bool] = ContextVar("recovery_transactions_only", default=False)


def lone_calls() -> bool:
    """Whether a standalone ledger call outside any transaction may be one autocommit
    statement here (ADR 0040): the one-call path, unless :func:`transactions_only` asks
    for the transactions."""
    return one_call_steps() and not _TRANSACTIONS_ONLY.get()


@contextmanager
def transactions_only() -> Iterator[None]:
    """Send standalone ledger calls as transactions (``BEGIN``, reads, writes, ``COMMIT``)
    even outside one, as before ADR 0040: for benchmarks and tests comparing the two."""
    token = _TRANSACTIONS_ONLY.set(True)
    try:
        yield
    finally:
        _TRANSACTIONS_ONLY.reset(token)


def untouched() -> bool:
    """Whether the caller's open transaction has sent nothing to the server yet.

    On PostgreSQL psycopg begins a transaction lazily, with its first statement, and ends
    one that never began without a round trip: such a transaction may send its one and
    only statement alone, in autocommit (:func:`sent_alone`). False elsewhere, outside a
    transaction, under :func:`transactions_only`, and once anything was sent.
    """
    if not lone_calls():
        return False
    db = default_db()
    raw = db.connection
    if not db.in_atomic_block or raw is None or db.needs_rollback:
        return False
    from psycopg.pq import TransactionStatus

    return raw.pgconn.transaction_status == TransactionStatus.IDLE and not raw.autocommit


@contextmanager
def sent_alone() -> Iterator[None]:
    """Send the statement made in this block in autocommit: its own server transaction.

    For the one statement of a caller's transaction that sent nothing before it
    (:func:`untouched`) and sends nothing after it: the caller's ``COMMIT`` then finds no
    transaction at the server and psycopg sends none, so the commit costs one round trip,
    not three. The statement is all or nothing by itself; if it fails, nothing of it was
    written and the caller's transaction is still untouched.
    """
    db = default_db()
    raw = db.connection
    raw.autocommit = True
    try:
        yield
    finally:
        try:
            raw.autocommit = False
        except Exception:  # the connection broke: never let a later statement autocommit
            db.close()


def dialect() -> Dialect:
    """The fragments for the default database, where the ledger lives: kept until a
    setting changes (``kept_made``), as every ledger statement asks (a dozen times per
    step)."""
    return kept_made("recovery.db.dialect", _default_dialect)


def _default_dialect() -> Dialect:
    return dialect_of(default_db())


def dialect_of(conn) -> Dialect:
    """The fragments for the database behind ``conn`` (a Django connection)."""
    if conn.vendor == "postgresql":
        return _POSTGRES
    if conn.vendor == "sqlite":
        return _SQLITE
    raise NotImplementedError(
        f"GovFlow supports PostgreSQL and SQLite, not {conn.vendor}: its ledger and "
        "engine use a few statements of each (recovery/db.py). Use one of the two."
    )


_JOINED: ContextVar[bool] = ContextVar("recovery_joined", default=False)


@contextmanager
def joined() -> Iterator[None]:
    """Let the recovery writes in this block join the caller's transaction, no savepoints.

    By default a recovery write nested in a caller's transaction runs in a savepoint, so a
    refused write rolls back alone and the caller may carry on. A caller that rolls back
    its whole transaction on any error anyway (the engine's step commits) saves those
    SAVEPOINT/RELEASE round trips with this block. Needs an open transaction.
    """
    if not default_db().in_atomic_block:
        raise RuntimeError("recovery.api.joined() needs an open transaction.")
    token = _JOINED.set(True)
    try:
        yield
    finally:
        _JOINED.reset(token)


def atomic():
    """``transaction.atomic()``, without a savepoint inside :func:`joined`."""
    return transaction.atomic(savepoint=not _JOINED.get())


@functools.cache
def field_saver(field) -> Callable[[object, object], object]:
    """``field.get_db_prep_save`` as a function of ``(value, connection)`` with the same
    answers, and a shortcut for the values the hot paths write most: a ``str`` into a
    plain ``CharField`` or ``TextField`` goes as it is, an ``int`` into a plain integer or
    automatic primary key field (or a foreign key to one) only through the backend's
    adaptation. Django's own method asks the value several questions through several
    calls per field, and a step writes some thirty values
    (``tests/integration/test_field_saver.py`` compares both). Callers look the savers up
    once per model or statement shape: a field's hash is computed in Python."""
    from django.db import models

    slow = field.get_db_prep_save
    # A foreign key saves a value not None and not "" as its target field saves it.
    plain = field.target_field if type(field) is models.ForeignKey else field
    kind = type(plain)
    if plain is field and kind in (models.CharField, models.TextField):
        return lambda value, db: value if value.__class__ is str else slow(value, db)
    if kind in (models.IntegerField, models.BigIntegerField, models.SmallIntegerField):
        internal = plain.get_internal_type()
        return lambda value, db: (
            db.ops.adapt_integerfield_value(value, internal)
            if value.__class__ is int
            else slow(value, db)
        )
    if kind in (models.AutoField, models.BigAutoField, models.SmallAutoField):
        return lambda value, db: (
            db.ops.validate_autopk_value(value) if value.__class__ is int else slow(value, db)
        )
    return slow


@functools.cache
def _model_savers(model) -> tuple[Callable[[object, object], object], ...]:
    """:func:`field_saver` of each of ``model``'s concrete fields, in their order."""
    return tuple(field_saver(field) for field in model._meta.concrete_fields)


def insert_statement(obj) -> tuple[str, list[object]]:
    """:func:`insert_row`'s statement for ``obj`` as ``(sql, params)``, not run:
    ``INSERT … RETURNING`` its primary key (for a caller that sends it as a part of its
    own statement). Values are the fields' plain values or ``Now()`` (the database clock);
    anything else is refused (use the ORM)."""
    from django.db.models.functions import Now

    meta = type(obj)._meta
    values = [getattr(obj, field.attname) for field in meta.concrete_fields]
    for field, value in zip(meta.concrete_fields, values, strict=True):
        if hasattr(value, "resolve_expression") and not isinstance(value, Now):
            raise TypeError(f"insert_row: {field.name} is an expression; use the ORM")
    shape = tuple(
        "pk" if field.primary_key and value is None else "now" if isinstance(value, Now) else ""
        for field, value in zip(meta.concrete_fields, values, strict=True)
    )
    # The connection itself, looked up once: each field asks it several questions per
    # value, and through the ``connection`` proxy each is a thread-local look-up.
    db = default_db()
    params = [
        save(value, db)
        for save, value, kind in zip(_model_savers(type(obj)), values, shape, strict=True)
        if not kind
    ]
    return _insert_sql(type(obj), shape, db.vendor), params


def insert_row(obj) -> object:
    """INSERT one model instance as plain SQL; set and return its primary key.

    For hot paths that create a row per step: the ORM's ``save``/``bulk_create`` compile
    every value, which costs more than the round trip. The values as
    :func:`insert_statement` takes them; the statement's text is built once per model and
    shape (which values are ``Now()``).
    """
    sql, params = insert_statement(obj)
    db = default_db()
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        obj.pk = cursor.fetchone()[0]
    obj._state.adding = False
    obj._state.db = db.alias
    return obj.pk


@functools.lru_cache(maxsize=64)
def _insert_sql(model, shape: tuple[str, ...], vendor: str) -> str:
    """:func:`insert_row`'s statement for one model and shape: per concrete field, "pk"
    (left to the database), "now" (the database clock) or "" (a parameter)."""
    meta = model._meta
    quote = connection.ops.quote_name
    columns, values = [], []
    for field, kind in zip(meta.concrete_fields, shape, strict=True):
        if kind == "pk":
            continue
        columns.append(quote(field.column))
        values.append(dialect().now if kind == "now" else "%s")
    return (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(values)}) RETURNING {quote(meta.pk.column)}"
    )


@functools.lru_cache(maxsize=64)
def model_columns(model, prefix: str = "") -> str:
    """The select list of ``model``'s concrete columns in field order, each column as
    ``prefix.column`` when ``prefix`` is given: the first columns :func:`rows_as` reads."""
    quote = connection.ops.quote_name
    head = f"{prefix}." if prefix else ""
    return ", ".join(f"{head}{quote(field.column)}" for field in model._meta.concrete_fields)


def rows_as(model, rows: Iterable[Sequence], extras: Sequence[str] = ()) -> list:
    """Model instances from rows selected with :func:`model_columns` (then ``extras``).

    For hot paths that load a row or two per run: what ``Model.objects.raw`` does (the
    database's and the fields' value converters, ``Model.from_db``), without building its
    query and column map at every call. Each extra column is set as the attribute named
    in ``extras``, unconverted.
    """
    db = default_db()  # looked up once, not once per column and value
    fields = model._meta.concrete_fields
    names = [field.attname for field in fields]
    cols = [field.get_col(model._meta.db_table) for field in fields]
    converters = [
        (index, col, convs)
        for index, (field, col) in enumerate(zip(fields, cols, strict=True))
        if (convs := db.ops.get_db_converters(col) + field.get_db_converters(db))
    ]
    width = len(fields)
    objects = []
    for row in rows:
        values = list(row[:width])
        for index, col, convs in converters:
            for convert in convs:
                values[index] = convert(values[index], col, db)
        obj = model.from_db(db.alias, names, values)
        for name, value in zip(extras, row[width:], strict=True):
            setattr(obj, name, value)
        objects.append(obj)
    return objects


_STAND_IN = dt.datetime(2001, 2, 3, 4, 5, 6, 789012, tzinfo=dt.UTC)
"""The time a :class:`CompiledAt` read is compiled with, replaced by the real one at each
call: a value no real read asks for."""


class CompiledAt:
    """A read that takes a time, compiled by the ORM once per database vendor.

    For reads a loop makes several times a second (the sweeper's): ``build(now)`` returns
    the queryset (``values_list`` of one column); it is compiled once with a stand-in time,
    and each call runs that text with the stand-in's parameters replaced by ``now`` —
    the same statement the ORM would build, without building it again. ``build`` must
    use ``now`` only as a parameter (a filter value), never to shape the query.
    """

    def __init__(self, build: Callable[[dt.datetime], object]) -> None:
        self.build = build
        self.compiled: dict[str, tuple[str, tuple, tuple[int, ...]]] = {}

    def __call__(self, now: dt.datetime) -> list:
        compiled = self.compiled.get(connection.vendor)
        if compiled is None:
            sql, params = self.build(_STAND_IN).query.sql_with_params()
            stand_in = _time_param(_STAND_IN)
            at = tuple(i for i, param in enumerate(params) if param == stand_in)
            compiled = self.compiled[connection.vendor] = (sql, tuple(params), at)
        sql, params, at = compiled
        values = list(params)
        for index in at:
            values[index] = _time_param(now)
        with connection.cursor() as cursor:
            cursor.execute(sql, values)
            return [row[0] for row in cursor.fetchall()]


def _time_param(moment: dt.datetime) -> object:
    from django.db.models import DateTimeField

    return DateTimeField().get_db_prep_value(moment, connection)
