"""The caller's own rows written in front of the ledger's joint call, in its statement.

``operation_observe_record(first=…)`` (``step_call``) sends data-modifying ``WITH`` parts
of the caller's tables before ``recovery_observe_record`` in one statement: the call runs
only if every part matched, and a part that matched nothing is raised as its write alone
would raise it. :class:`RowWrite` is one fenced ``UPDATE`` (ADR 0031); any
:class:`FirstWrites` is several parts (the engine's step rows, ADR 0047). The recovery core
knows nothing of those tables: the caller hands it the models, values or text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .leases import Fence, fenced_row_sql, fenced_row_stale, fenced_update_row

__all__ = ["FirstWrites", "RowWrite", "WithParts"]


@dataclass(frozen=True)
class RowWrite:
    """A fenced write of one row of the caller's own table, made first, in the same call.

    ``values`` and ``expect`` as :func:`recovery.api.fenced_update_row` (plain values or
    ``Now()``), on the observation's fence. A stale fence raises ``StaleFence``; a row
    that matched nothing while the fence is live raises ``refused()``.
    """

    model: type
    pk: object
    values: Mapping[str, object]
    expect: Mapping[str, object]
    refused: Callable[[], Exception]

    def write(self, fence: Fence) -> None:
        """Make it as a statement of its own (needs the caller's transaction)."""
        count = fenced_update_row(
            self.model, pk=self.pk, fence=fence, values=self.values, expect=self.expect
        )
        if count != 1:
            raise self.refused()

    def sql(self, fence: Fence, live: bool = False) -> tuple[str, list[object]]:
        """The ``UPDATE`` (``live``: as ``fenced_row_sql``'s)."""
        return fenced_row_sql(
            self.model, pk=self.pk, fence=fence, values=self.values, expect=self.expect, live=live
        )

    def parts(self, fence: Fence) -> tuple[list[str], list[object], list[str], str]:
        """As :meth:`FirstWrites.parts`: the one fenced ``UPDATE`` (builds text only)."""
        sql, params = self.sql(fence)
        return (
            [f"first_write AS ({sql} RETURNING 1)"],
            params,
            ["(SELECT 1 FROM first_write)"],
            "EXISTS (SELECT 1 FROM first_write)",
        )

    def took(self, fence: Fence, values: Sequence[object]) -> None:
        """As :meth:`FirstWrites.took`: a row that matched nothing is a stale fence's
        ``StaleFence`` or ``refused()``."""
        if values[0] != 1:
            raise fenced_row_stale(fence) or self.refused()


class FirstWrites(Protocol):
    """Writes of the caller's own rows made first, in the same statement as the call.

    :class:`RowWrite` is one (one fenced ``UPDATE``); the engine's step rows (a step's
    moves, the next step's insert and the instance row, ADR 0047) are another.
    """

    def parts(self, fence: Fence) -> tuple[list[str], list[object], list[str], str]:
        """The data-modifying ``WITH`` parts (``name AS (…)``), their parameters, the SQL
        expressions whose values :meth:`took` is given, and the SQL condition under which
        the call runs (every part that must match did)."""

    def took(self, fence: Fence, values: Sequence[object]) -> None:
        """Given those values after the statement, whether or not the call ran: raise what
        a part that matched nothing stands for (``StaleFence`` on a stale fence). If it
        returns although the condition was false, the call is made on its own."""

    def write(self, fence: Fence) -> None:
        """Make the writes as statements of their own (needs the caller's transaction)."""


@dataclass(frozen=True)
class WithParts:
    """``first`` (or nothing) and more ``WITH`` parts of the caller's, written in the same
    statement whatever they match (``name AS (…)`` and their parameters, as
    ``lease_release(with_parts=…)`` takes them): an instance's event beside its ending's
    call (ADR 0076). Only ``first``'s parts decide whether the call runs."""

    first: FirstWrites | None
    extra: Sequence[str]
    extra_params: Sequence[object]

    def parts(self, fence: Fence) -> tuple[list[str], list[object], list[str], str]:
        if self.first is None:
            return [*self.extra], [*self.extra_params], [], "true"
        parts, params, results, matched = self.first.parts(fence)
        return [*parts, *self.extra], [*params, *self.extra_params], results, matched

    def took(self, fence: Fence, values: Sequence[object]) -> None:
        if self.first is not None:
            self.first.took(fence, values)
