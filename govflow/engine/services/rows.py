"""The engine's rows written together in one statement on PostgreSQL (ADR 0044, 0047).

A chained step inserts the next step's row and updates the instance row one after the
other; on PostgreSQL both go as one statement (data-modifying ``WITH``), each as its own
writer would send it (:class:`StepRows`). SQLite keeps the separate statements (calls
inside the process, not round trips), and so does code inside :func:`separate_rows` — the
property test of ADR 0031 compares both on one database.

When the commit may chain the new step's dispatch into the ledger's call (a success held
back, ``settle``), the statement is not sent at the flush but held on the run
(``Run.held_rows``) until the dispatch: its parts then go in front of the call, in the
call's own statement (``recovery.api.operation_observe_record(first=…)``), and the new
step is inserted as it is then — already ``executing``, never updated after (ADR 0047).
Until its row exists the step sits in the run's view under a key of its own
(:func:`unsaved_key`: its ordinal, negated), and gets its primary key back from the insert;
so a flush may hold only where nothing but that dispatch needs the step's id before the
commit sends its row (``settle.succeed`` asks for it on the plain path of an action).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from recovery.api import (
    Fence,
    RowWrite,
    default_db,
    dialect,
    fence_condition,
    insert_statement,
    lease_require_live,
)

from ..models import Token

__all__ = [
    "StepRows",
    "rows_in_one",
    "separate_rows",
    "unsaved_key",
]

_SEPARATE: ContextVar[bool] = ContextVar("govflow_separate_rows", default=False)


def rows_in_one() -> bool:
    """Whether the engine's rows of a step go as one statement here."""
    return dialect().step_call and not _SEPARATE.get()


def unsaved_key(token: Token) -> int:
    """The run's view's key of a new step whose row is not inserted yet: its ordinal,
    negated (an instance's ordinals are its own; a primary key is never negative)."""
    return -token.ordinal


@contextmanager
def separate_rows() -> Iterator[None]:
    """Write the engine's rows one statement each, as on SQLite (tests, benchmarks)."""
    token = _SEPARATE.set(True)
    try:
        yield
    finally:
        _SEPARATE.reset(token)


@dataclass(eq=False)
class StepRows:
    """The pending step moves, a new step's insert and the fenced instance row of one
    commit, as the parts of one statement (ADR 0044): each as ``fenced_update_row`` and
    ``insert_row`` send it, refused as they refuse — the moves first, in order.

    Sent alone (:meth:`write`), or as the parts in front of the ledger's call
    (``recovery.api.operation_observe_record(first=self)``: :meth:`parts`, :meth:`took`,
    ADR 0047). ``active`` is the run's view: the new step joins it under its primary key
    when the insert returns it. The new step's values are read when the statement is
    built, so a step dispatched meanwhile is inserted ``executing``.
    """

    moves: list[RowWrite]
    token: Token | None
    instance: RowWrite
    active: dict[int, Token]

    def parts(self, fence: Fence) -> tuple[list[str], list[Any], list[str], str]:
        """The ``WITH`` parts, their parameters, the values handed back to :meth:`took`
        and the condition under which everything matched (builds text, runs nothing)."""
        # The lease is looked up once, a part of its own that every fenced row names
        # (its row locked as each row's own look-up locked it): ADR 0073.
        live, params = fence_condition(fence, part=True)
        parts: list[str] = [live]
        results: list[str] = []
        for number, write in enumerate(self.moves):
            sql, part_params = write.sql(fence, live=True)
            parts.append(f"move_{number} AS ({sql} RETURNING 1)")
            params += part_params
            results.append(f"(SELECT 1 FROM move_{number})")
        if self.token is not None:
            sql, part_params = insert_statement(self.token)
            parts.append(f"new_step AS ({sql})")
            params += part_params
            results.append("(SELECT id FROM new_step)")
        sql, part_params = self.instance.sql(fence, live=True)
        parts.append(f"instance_row AS ({sql} RETURNING 1)")
        params += part_params
        results.append("(SELECT 1 FROM instance_row)")
        matched = [f"{r} = 1" for r in results[: len(self.moves)]]
        matched.append("EXISTS (SELECT 1 FROM instance_row)")
        return parts, params, results, " AND ".join(matched)

    def took(self, fence: Fence, values: Sequence[Any]) -> None:
        """Check what the parts matched, in order (after the statement, in the caller's
        transaction): a move that matched nothing is a ``StaleFence`` or its step's own
        conflict; the new step takes its id; an instance row that matched nothing is
        refused only for a stale fence, as ``fenced_update_row`` refuses it."""
        *moved, count = values
        for write, matched in zip(self.moves, moved, strict=False):
            if matched != 1:
                lease_require_live(fence=fence, doing="write")
                raise write.refused()
        if self.token is not None:
            self.token.pk = moved[-1]
            self.token._state.adding = False
            self.token._state.db = DEFAULT_DB_ALIAS  # the engine writes only there
            self.active.pop(unsaved_key(self.token), None)
            self.active[self.token.pk] = self.token
        if count is None:
            lease_require_live(fence=fence, doing="write")

    def write(self, fence: Fence) -> None:
        """Send the parts as one statement of their own (needs the caller's transaction)."""
        parts, params, results, _ = self.parts(fence)
        with default_db().cursor() as cursor:
            cursor.execute(f"WITH {', '.join(parts)} SELECT {', '.join(results)}", params)
            values = cursor.fetchone()
        self.took(fence, values)
