"""The engine's database layer: its commit, its one clock, and its few SQL differences.

``engine_commit`` is the transaction of every engine write — a run's step, an instance
start, a sweeper batch.

The recovery core keeps its per-database fragments in one ``Dialect``
(``recovery.api.dialect``). The engine's own raw statements — firing due timers, queueing
tasks in bulk, stamping queued instances — take theirs from :class:`EngineDialect`, built
on it: no other engine module asks which database it runs on.

**One clock.** The engine reads the database clock the way the ledger does: the time when
the statement runs (``clock_timestamp()`` on PostgreSQL, not ``STATEMENT_TIMESTAMP()``,
which is when the statement *arrived* and may be long before a lock it waited for was
granted). :func:`clock` is that clock for the ORM, ``EngineDialect.now`` for SQL. A
statement that scans many rows by time reads it once instead (``now_once``, or a value
read by :func:`clock_read`): PostgreSQL cannot bound an index scan, or turn an ``EXISTS``
into a join, by a function whose value changes while the statement runs.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection as default_connection
from django.db import connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Func, Value
from django.db.models.functions import Now

from recovery.api import Dialect, atomic, dialect, dialect_of, joined

__all__ = [
    "Clock",
    "EngineDialect",
    "clock",
    "clock_read",
    "engine_commit",
    "engine_dialect",
    "engine_read",
    "next_id_and_clock",
    "one_of",
]


@contextmanager
def engine_commit() -> Iterator[None]:
    """One engine commit (owns it): a run's step, an instance start, a sweeper batch.

    The ledger's writes inside it join it without savepoints. Nested in another engine
    commit it joins that one; any error rolls the whole commit back (all or nothing).
    """
    with atomic(), joined():
        yield


@dataclass(frozen=True)
class EngineDialect:
    base: Dialect
    """Recovery's fragments (clock, lease lock): the engine never spells them again."""

    id_in: str
    """``<column> {id_in}``: the column is one of a list of ids, passed as one parameter
    (:meth:`list_param`), so a statement with 2,000 ids is still one prepared statement."""

    text_rows: str
    """A ``FROM`` item yielding one row per string of a list passed as one parameter,
    in a column named ``value``."""

    skip_locked: str
    """Locks the selected rows, passing over rows another transaction holds (PostgreSQL).
    SQLite serialises writers with ``BEGIN IMMEDIATE`` and needs nothing here."""

    chained_writes: bool
    """One statement may chain ``UPDATE``s through ``WITH`` (PostgreSQL's data-modifying
    CTEs); otherwise each is a statement of its own in the same transaction."""

    reads_grouped: bool
    """Reads that belong together share one transaction (PostgreSQL: one server
    transaction instead of one per statement). SQLite's would take the write lock
    (``BEGIN IMMEDIATE``), so there they stay one statement each."""

    list_param: Callable[[Sequence[object]], object]

    next_id: str
    """An expression for a table's next primary key, taken before its row is inserted,
    with the table and the key column as its two parameters (PostgreSQL: the identity's
    sequence). Empty where the key is known only once the row is (SQLite)."""

    @property
    def now(self) -> str:
        """The database clock when the statement runs (recovery's)."""
        return self.base.now

    reading_end: str
    """What ``now_once`` appends to the clock's reading (SQLite: ``|| '999'``). SQLite's
    clock reads milliseconds, as text (``….fff``); a time the process read from it and
    wrote back (an instance's start, ADR 0057) is stored as Django writes a datetime, with
    microseconds (``….fff000``), which as text sorts after the clock's own reading of the
    same millisecond. Compared with the end of the millisecond read, such a time is due
    within the millisecond it was read, not one millisecond later. PostgreSQL compares
    timestamps: nothing to append."""

    @property
    def now_once(self) -> str:
        """The same clock, read once per statement: an index can bound a scan by it."""
        return f"(SELECT {self.base.now}{self.reading_end})"


_POSTGRES = dict(
    id_in="= ANY(%s)",
    text_rows="unnest(%s::text[]) AS queued(value)",
    skip_locked="FOR UPDATE SKIP LOCKED",
    chained_writes=True,
    reads_grouped=True,
    list_param=list,
    next_id="nextval(pg_get_serial_sequence(%s, %s))",
    reading_end="",
)
_SQLITE = dict(
    id_in="IN (SELECT value FROM json_each(%s))",
    text_rows="json_each(%s)",
    skip_locked="",
    chained_writes=False,
    reads_grouped=False,
    list_param=lambda values: json.dumps(list(values)),
    next_id="",
    reading_end=" || '999'",
)


def engine_dialect(connection=None) -> EngineDialect:
    """The fragments for ``connection`` (the default database unless given: recovery's
    dialect, kept until a setting changes, so that a step's asking costs no look-up of the
    thread's connection)."""
    return _engine_dialect(dialect() if connection is None else dialect_of(connection))


@functools.cache
def _engine_dialect(base: Dialect) -> EngineDialect:
    extra = _POSTGRES if base.vendor == "postgresql" else _SQLITE
    return EngineDialect(base=base, **extra)


class Clock(Now):
    """The database clock as the ledger reads it, for the ORM (see the module docstring).

    A ``Now``: recovery's plain-SQL writers (``fenced_update_row``, ``insert_row``) write
    it as their own clock expression.
    """

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler, connection, template=dialect_of(connection).now, **extra_context
        )


class ClockPlus(Func):
    """The database clock ``delta`` from now, written as the clock itself is written: on
    SQLite text to the millisecond (``strftime`` with a ``+N seconds`` modifier, as the
    ledger's lease expiries are), elsewhere the clock plus an interval.

    On SQLite the clock is text to the millisecond (``strftime('%f')``) and values are
    compared as text: a sum written by Django to the microsecond (``…:05.123000``) compares
    after the clock's own ``…:05.123``, so a step due at that instant was not due until the
    next millisecond."""

    template = "%(expressions)s"
    output_field = DateTimeField()

    def __init__(self, delta: dt.timedelta) -> None:
        self.delta = delta
        super().__init__(ExpressionWrapper(Clock() + Value(delta), output_field=DateTimeField()))

    def as_sqlite(self, compiler, connection, **extra_context):
        modifier = f"{self.delta.total_seconds():+.3f} seconds"
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', %s)", [modifier]


def in_transaction() -> bool:
    """Whether the engine's connection is inside a transaction (an atomic block)."""
    return default_connection.in_atomic_block


@contextmanager
def engine_read() -> Iterator[None]:
    """Reads that belong together, such as a clock read and the query that uses it.

    Reads only; on PostgreSQL it owns one read transaction (``EngineDialect.reads_grouped``),
    or joins the one it is in (a savepoint would only add round trips to reads).
    """
    if engine_dialect().reads_grouped and not default_connection.in_atomic_block:
        with transaction.atomic():
            yield
    else:
        yield


def one_of(column: str, values: Sequence[str]) -> tuple[str, list[str]]:
    """``column`` is one of ``values``, as a condition no index on ``column`` serves (the
    comparison a fenced row write uses for its expected values, ``Dialect.expected``).

    For a look-up of one instance's steps by their state: the instance names the rows
    (the ``(instance, ordinal)`` index), the state only filters them. Written as ``IN``,
    the planner could also take the steps' ``(state, not_before)`` index and read every
    instance's steps in those states — it did on tables whose statistics were taken when
    they were small, once per run: a cost that grew with the backlog (ADR 0065).
    """
    expected = dialect().expected
    return "(" + " OR ".join(f"{column} {expected} %s" for _ in values) + ")", list(values)


_CLOCK = Clock()


def clock() -> Clock:
    """The database clock as a value to write (one object, shared: an expression is never
    changed by a query, which copies it to resolve it, and making one — Django records
    its constructor's arguments — cost a step some ten times)."""
    return _CLOCK


def clock_read() -> dt.datetime:
    """The database clock now, as a value: for a statement that scans many rows by time."""
    with default_connection.cursor() as cursor:
        # An empty parameter list makes the backend unescape the '%%' of SQLite's strftime.
        cursor.execute(f"SELECT {engine_dialect().now}", [])
        return _clock_value(cursor.fetchone()[0])


def next_id_and_clock(model) -> tuple[int, dt.datetime]:
    """A new primary key for ``model``'s next row and the database clock, in one read
    (``EngineDialect.next_id``: PostgreSQL only). A key taken and never used is a gap,
    as a rolled-back insert leaves one."""
    dialect = engine_dialect()
    if not dialect.next_id:
        raise NotImplementedError("this database assigns a key only when its row is inserted")
    with default_connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {dialect.next_id}, {dialect.now}",
            [model._meta.db_table, model._meta.pk.column],
        )
        pk, now = cursor.fetchone()
    return pk, _clock_value(now)


def _clock_value(value) -> dt.datetime:
    if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM:SS.SSS' in UTC
        value = dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)
    return value


APPLICATION = "govflow"
"""How the ``qcluster``'s connections name themselves to PostgreSQL (``application_name``):
``govflow <role>``, so ``pg_stat_activity`` and the server's log tell the processes apart."""


def application_named(role: str) -> None:
    """Name this thread's PostgreSQL connections ``govflow <role>`` (from their next connect).

    Called by each kind of process and thread of a ``qcluster`` (the main process and the
    processes it forks: ``qcluster``; the workers: ``worker``; the pusher: ``pusher``; the
    sweeper and publisher threads) before it uses the database. A name the configured
    ``OPTIONS`` give is kept. Only this thread's connection objects get a copy of the
    settings with the name, so another thread's name is not changed.
    """
    for conn in connections.all(initialized_only=False):
        options = conn.settings_dict.get("OPTIONS", {})
        given = options.get("application_name")
        if conn.vendor != "postgresql" or (given and not given.startswith(f"{APPLICATION} ")):
            continue
        options = {**options, "application_name": f"{APPLICATION} {role}"}
        conn.settings_dict = {**conn.settings_dict, "OPTIONS": options}
        if conn.connection is not None and not conn.in_atomic_block:
            conn.close()  # named from the next statement on
