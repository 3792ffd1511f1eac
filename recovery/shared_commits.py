"""Lone statements of several threads committed together (ADR 0062).

A lone statement is one that is a caller's whole commit, sent alone in autocommit
(:func:`recovery.db.sent_alone`, ADR 0040, 0051): a run's chained step on PostgreSQL is
one. A worker process that runs several instances at once (the engine's run threads, ADR
0041) sends many of them at the same moments, each a transaction of its own at the
server — a commit, its WAL record and its flush, its snapshot and its locks released.

With shared commits on (:func:`shared_commits_enable`, PostgreSQL), a thread with a lone
statement to send joins a line. The first thread in the line sends every statement then
waiting in it, its own included, on its own connection in one pipeline that ends with one
``Sync`` (psycopg's pipeline mode): PostgreSQL runs the statements between two ``Sync``
messages as one implicit transaction, so they commit together, in one round trip, or not
at all. It hands each thread its statement's answer, then passes the line to the next
waiting thread, which sends what has come meanwhile. This is PostgreSQL's own group
commit one level up: there it shares WAL flushes between transactions, here the
transactions themselves.

**How long the first one waits.** Before it sends, the first thread waits for the
statements that may come soon (``company``: the engine counts its run threads that are
in a run and not in a provider call), at most ``wait`` seconds. A thread that runs alone
never waits; one whose company is in provider calls waits for nobody. The wait is what
makes commits meet: a worker's run threads spend most of a step in Python, and a commit's
round trip is short beside it, so statements that only shared when they happened to meet
would seldom share (measured: 2,003 statements in 2,000 commits at 440 steps/s). The
threads that wait hold no lock and no transaction, and give the interpreter to the ones
that compute.

What each thread gets is what its statement alone would have given it:

1. **Committed:** its row, as the statement returned it. The statement ran after the
   others ahead of it in the same transaction; they are other instances' writes (one
   thread runs one instance; one instance is run by the one thread holding its lease),
   and each statement checks its own fence, chain and rows inside it.
2. **The shared transaction failed on a statement** (a refusal, a lock conflict, any
   error): nothing of it was written. Every thread then sends its own statement alone on
   its own connection, as it would have without shared commits, and gets its own answer
   there, judged against what is committed — never an answer that depended on another
   thread's writes that were rolled back.
3. **The connection broke** (the server went away, the session was ended): whether the
   commit happened is unknown, as for a lone statement whose connection breaks. Every
   thread gets the same error as its own broken connection would raise (Django's
   ``OperationalError``); the engine's recording retries on a fresh connection while the
   fence is current (``govflow.engine.services.reconnect``).

A thread in the line waits for two things only, each bounded: the first thread's wait for
company (at most ``wait``) and the server's answer to the commit it is in. The thread that
sends hands the answers out however its send ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, OperationalError

__all__ = [
    "SharedCommits",
    "lone_statement",
    "shared_commits",
    "shared_commits_disable",
    "shared_commits_enable",
]

MAX_SHARED = 32
"""The most statements one shared commit sends: the rest wait for the next one."""

_SENT, _ALONE, _BROKEN, _RAISED = "sent", "alone", "broken", "raised"


def _held() -> Any:
    """A lock taken at once: its thread waits by acquiring it again, and is let go by one
    release — what an Event does, without the Condition an Event builds at every wait."""
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class _Statement:
    sql: str
    params: Sequence[Any]
    ready: Any = field(default_factory=_held)
    """Released when the statement's thread may go on: to send the next shared commit
    (``leads``; it is held again once that thread has taken it), or with its outcome."""
    leads: bool = False
    """This statement's thread sends the next shared commit."""
    outcome: str = ""
    row: tuple | None = None
    error: BaseException | None = None


class SharedCommits:
    """The line of one process's lone statements and who sends them (see the module)."""

    def __init__(self, company: Callable[[], int] = lambda: 1, wait: float = 0.0) -> None:
        self.company = company
        """How many statements may come soon, the first one's included (the engine: its
        run threads in a run and not in a provider call)."""
        self.wait = wait
        """The longest the first statement waits for them (seconds)."""
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self._line: list[_Statement] = []
        self._sending = False
        self.commits = 0
        """Shared commits sent (counted under the line's lock)."""
        self.statements = 0
        """Statements they carried."""

    def send(self, cursor, sql: str, params: Sequence[Any]) -> tuple | None:
        """Send ``sql`` as a lone statement, with others' if they wait (the caller is in
        :func:`~recovery.db.sent_alone`, its connection in autocommit); its row."""
        mine = _Statement(sql, params)
        with self._lock:
            self._line.append(mine)
            mine.leads = not self._sending
            self._sending = True
            # The first one is woken once its company is complete, not at every arrival:
            # each wake-up is a thread that must take the interpreter back to look.
            if not mine.leads and len(self._line) >= self._wanted():
                self._joined.notify()
        if not mine.leads:
            mine.ready.acquire()
        if mine.leads and not mine.outcome:
            self._lead(cursor)
        return _answer(cursor, mine)

    def _wanted(self) -> int:
        """How many statements the first one waits for in line, its own included."""
        return min(self.company(), MAX_SHARED)

    def _lead(self, cursor) -> None:
        with self._lock:
            deadline = time.monotonic() + self.wait
            while len(self._line) < self._wanted():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._joined.wait(left)
            batch, self._line = self._line[:MAX_SHARED], self._line[MAX_SHARED:]
        try:
            _send_together(cursor, batch)
        finally:
            for statement in batch:
                statement.outcome = statement.outcome or _ALONE
            with self._lock:
                self.commits += 1
                self.statements += len(batch)
                after = self._line[0] if self._line else None
                if after is not None:
                    after.leads = True
                else:
                    self._sending = False
            for statement in batch:
                statement.ready.release()
            if after is not None:
                after.ready.release()


def _send_together(cursor, batch: list[_Statement]) -> None:
    """Send ``batch`` on ``cursor``'s connection in one pipeline, one implicit
    transaction; set each statement's outcome."""
    if len(batch) == 1:  # the sender's own (first in line), as it is always sent alone
        mine = batch[0]
        try:
            cursor.execute(mine.sql, mine.params)
            mine.outcome, mine.row = _SENT, cursor.fetchone()
        except DatabaseError as exc:
            mine.outcome, mine.error = _RAISED, exc
        return
    db = cursor.db
    raw = db.connection
    cursors = []
    try:
        with db.wrap_database_errors, raw.pipeline():
            for statement in batch:
                each = raw.cursor()
                each.execute(statement.sql, statement.params)
                cursors.append(each)
        with db.wrap_database_errors:
            rows = [each.fetchone() for each in cursors]
    except DatabaseError as exc:
        if raw.broken or raw.closed:
            for statement in batch:
                statement.outcome, statement.error = _BROKEN, exc
            return
        # A statement failed, and the transaction with it: each is sent alone by its own
        # thread. psycopg still counts statements it prepared in the aborted pipeline as
        # prepared; the server dropped them. DEALLOCATE ALL empties both its cache and
        # the server's, so that this connection's next statements are prepared again.
        try:
            with db.wrap_database_errors:
                raw.execute("DEALLOCATE ALL")
        except DatabaseError:  # broken now: the sender's own statement will find out
            pass
        return
    finally:
        for each in cursors:
            each.close()
    for statement, row in zip(batch, rows, strict=True):
        statement.outcome, statement.row = _SENT, row


def _answer(cursor, statement: _Statement) -> tuple | None:
    if statement.outcome == _SENT:
        return statement.row
    if statement.outcome == _RAISED:  # its own thread's error, sent on its own connection
        raise statement.error
    if statement.outcome == _BROKEN:
        raise OperationalError(
            "The connection that sent this statement in a shared commit broke before its "
            "answer came: whether it was written is unknown, as when a statement's own "
            f"connection breaks ({statement.error})."
        ) from statement.error
    cursor.execute(statement.sql, statement.params)
    return cursor.fetchone()


class _State:
    shared: SharedCommits | None = None


_STATE = _State()


def shared_commits_enable(*, company: Callable[[], int], wait: float) -> SharedCommits:
    """Share the commits of this process's lone statements from now on (PostgreSQL only:
    the caller asks; a process of several threads that send them — the engine's run
    threads). See :class:`SharedCommits` for ``company`` and ``wait``."""
    _STATE.shared = SharedCommits(company, wait)
    return _STATE.shared


def shared_commits_disable() -> None:
    _STATE.shared = None


def shared_commits() -> SharedCommits | None:
    return _STATE.shared


def lone_statement(cursor, sql: str, params: Sequence[Any]) -> tuple | None:
    """Send a lone statement (inside :func:`~recovery.db.sent_alone`) and return its
    row: with other threads' in a shared commit when shared commits are on."""
    shared = _STATE.shared
    if shared is None:
        cursor.execute(sql, params)
        return cursor.fetchone()
    return shared.send(cursor, sql, params)
