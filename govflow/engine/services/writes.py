"""A run's writes besides its tokens' own moves: routed rows and the instance row.

``Run.flush`` calls them, inside the caller's commit and on the run's fence. On
PostgreSQL a step's rows are one statement (``rows.StepRows``, ADR 0044), held for the
ledger's call when the run asks (``Run.rows_wait``, ADR 0047).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from django.db import connection

from recovery.api import (
    Fence,
    RowWrite,
    Subject,
    chain_mark_drop,
    chain_verify_whole,
    fenced_update,
    fenced_update_row,
    insert_row,
)

from ..db import clock
from ..definitions import case_text, case_values
from ..errors import EngineConflict, EngineError
from ..models import Incident, Instance, InstanceStatus, Timer, Token, TokenState
from ..states import TERMINAL_STATUSES, token_may_move
from ..token_reads import state_is
from .external_queue import external_tasks_create
from .routing import Router, derive_status
from .rows import StepRows, rows_in_one, unsaved_key
from .triggers import delivery_take

__all__ = [
    "ROUTE_INCIDENT",
    "check_move",
    "first_writes",
    "moved_meanwhile",
    "rows_held",
    "stuck_look_sql",
    "write_held",
    "write_instance",
    "write_pending",
    "write_routed",
]

_MOVING_ON = frozenset({InstanceStatus.RUNNING, InstanceStatus.WAITING, InstanceStatus.COMPLETED})
"""Statuses a derived status would claim although a step this run blocked is stuck."""

ENDS_VERIFIED = frozenset({InstanceStatus.COMPLETED, InstanceStatus.FAILED})
"""Endings that verify the instance's whole chain first (ADR 0038). Not a cancel: it is
how an operator stops an instance, and must stay possible on a broken chain."""


class Run(Protocol):
    """What the writes need of a run (``services.run.Run`` is one)."""

    fence: Fence
    instance: Instance
    active: dict[int, Token]
    block_reason: str
    success_follows: bool
    mark_cleared: bool
    pending: list[RowWrite]
    rows_wait: bool
    held_rows: StepRows | None
    ending: tuple[Any, StepRows | None] | None
    depth: int
    released: bool
    stuck_at_load: bool | None
    stuck_since_load: bool

    @property
    def subject(self) -> Subject: ...

    def update_token(self, token: Token, expected: str, **values: Any) -> None: ...


def write_routed(run: Run, router: Router) -> Token | None:
    """Write what ``router`` collected, on the run's fence (needs the caller's commit).

    Returns the one new step left for the instance row's statement to insert (ADR 0044:
    on PostgreSQL, when nothing else was routed), or None. Pending step moves ride in that
    statement too, unless more was routed: then they are made first, one by one.
    """
    write_held(run)  # a flush before held its rows: they go first (ADR 0047)
    writes = router.writes
    held = None
    alone = len(writes.tokens) <= 1 and not (
        writes.completed_joins or writes.timers or writes.tasks or writes.deliveries
    )
    if alone and writes.tokens and rows_in_one():
        held = writes.tokens[0]
    if not alone:
        write_pending(run)  # first, as they were asked for
    if writes.completed_joins:
        fenced_update(
            Token.objects.filter(pk__in=writes.completed_joins, state=TokenState.WAITING),
            fence=run.fence,
            state=TokenState.COMPLETED,
            updated_at=clock(),
        )
        for pk in writes.completed_joins:
            run.active.pop(pk, None)
    for token in writes.tokens:
        if token is not held:
            insert_row(token)
            run.active[token.pk] = token
    if writes.timers:
        Timer.objects.bulk_create(
            Timer(instance_id=run.instance.pk, token_id=token.pk, due_at=due)
            for token, due in writes.timers
        )
    if writes.tasks:
        external_tasks_create(run, writes.tasks)
    for token, delivery in writes.deliveries:
        # A message that arrived before its step began to wait is taken at once.
        payload = delivery_take(delivery=delivery, token=token, fence=run.fence)
        if payload is not None:
            run.update_token(token, TokenState.WAITING, state=TokenState.READY, payload=payload)
    return held


def write_instance(run: Run, status: str | None, reason: str, held: Token | None = None) -> None:
    """Write the instance row, on the fence (needs the caller's commit): its variables,
    next ordinal, and ``status`` — derived from its active tokens when None. ``held``, a
    new step ``write_routed`` left, is inserted by the same statement."""
    write_held(run)  # a flush before held its rows: they go first (ADR 0047)
    new_status = status or derive_status([*run.active.values(), *([held] if held else [])])
    if status is None and run.block_reason and new_status in _MOVING_ON:
        # A step blocked earlier in this run is still stuck (it is not tried again in
        # this run), so another branch moving on must not hide it.
        new_status, reason = InstanceStatus.BLOCKED, run.block_reason
    if status is None and new_status == InstanceStatus.COMPLETED:
        stuck = _stuck_reason(run)
        if stuck:
            new_status, reason = InstanceStatus.BLOCKED, stuck
    case = case_values(run.spec.document, run.instance.variables)
    values: dict[str, Any] = {
        "variables": run.instance.variables,
        "case": case,
        "case_text": case_text(case),
        "next_ordinal": run.instance.next_ordinal,
        "status": new_status,
        "updated_at": clock(),
    }
    if status is not None or new_status != run.instance.status:
        values["reason"] = reason
        run.instance.reason = reason
    if new_status == InstanceStatus.COMPLETED:
        values["completed_at"] = clock()
    if new_status in TERMINAL_STATUSES:
        values["runnable_at"] = None  # nothing will run again: no claim is worth making
        run.mark_cleared = True  # set back if this commit rolls back (Run.commit)
    if new_status in ENDS_VERIFIED and new_status != run.instance.status:
        _verify_whole_chain(run)
    if held is None and not run.pending:
        fenced_update_row(Instance, pk=run.instance.pk, fence=run.fence, values=values)
    else:
        _rows_with_instance(run, held, values)
    run.instance.status = new_status


def write_pending(run: Run) -> None:
    """Send the rows held for a dispatch that did not come (``write_held``), then make the
    step moves left for a flush (``update_token(later=True)``) one by one."""
    write_held(run)
    pending, run.pending = run.pending, []
    for write in pending:
        write.write(run.fence)


def ending_keep(run: Run, observation: Any, held: StepRows | None) -> bool:
    """Keep ``observation`` (``recovery.api.Observation``, a success not yet written) and
    the rows held for it (``held``) for the statement that closes the run's commit
    (``Run._close_status``), when that commit ends the instance and releases its lease in
    one statement (ADR 0059): they then go in it, and the ending is one statement (ADR
    0076). False, and nothing kept, otherwise: the caller writes them now."""
    ends = run.instance.status in TERMINAL_STATUSES and rows_in_one()
    if run.depth != 1 or run.released or run.ending is not None or not ends:
        return False
    run.ending = (observation, held)
    return True


def ending_write(run: Run) -> None:
    """Write the kept success (:func:`ending_keep`) now, its rows in front of it."""
    ending, run.ending = run.ending, None
    if ending is not None:
        observation, held = ending
        observation.write(first=held)


def held_take(run: Run) -> StepRows | None:
    """The rows a flush held, for the caller to write in front of its ledger call (or
    alone); the run no longer holds them."""
    held, run.held_rows = run.held_rows, None
    return held


def write_held(run: Run) -> None:
    """Send the rows a flush held for the ledger's call, now and alone (needs the caller's
    commit): no dispatch took them (ADR 0047)."""
    held, run.held_rows = run.held_rows, None
    if held is not None:
        held.write(run.fence)


def closes_clean(run: Run) -> bool:
    """Whether the run's commit, as it stands, writes nothing more when it closes
    (``Run.commit``): not nested in another, no step moves or held rows left for it, no
    status event, no ending (the release), no claimed run's load still open; its
    projection is the one the ledger write being made carries (``carry_projection``), so
    no seal. A ledger call made now, with nothing written after it by its caller, is then
    the commit's last statement (ADR 0051)."""
    return (
        run.depth == 1
        and not run.pending
        and run.held_rows is None
        and str(run.instance.status) == run.committed_status
        and run.instance.status not in TERMINAL_STATUSES
        and (run.opened is None or not run.opened.is_open)
    )


@contextmanager
def rows_held(run: Run, hold: bool = True) -> Iterator[None]:
    """While the block runs (``hold``), a flush that inserts a new step holds its rows
    for the ledger's call that may dispatch that step (``run.rows_wait``, ADR 0047); the
    caller sends them alone if no dispatch takes them (:func:`write_held`). Never after
    the block."""
    run.rows_wait = hold
    try:
        yield
    finally:
        run.rows_wait = False


def first_writes(run: Run, token: Token, executing: RowWrite) -> RowWrite | StepRows:
    """What goes in front of the ledger's call that dispatches ``token`` (needs the
    caller's commit): the held rows when ``token`` is their new step — inserted as it is
    now, ``executing``, with no update after (ADR 0047) — else ``executing``, the update of
    a step that has its row, after the held rows are sent alone."""
    held = run.held_rows
    if held is not None and held.token is token:
        run.held_rows = None
        return held
    write_held(run)
    return executing


def _rows_with_instance(run: Run, token: Token | None, values: dict[str, Any]) -> None:
    """The pending step moves, a new step's insert and the fenced instance row as one
    statement (ADR 0044; needs the caller's commit), refused as the separate writes are.

    When the run asks (``rows_wait``: a success held back for the ledger's call) and a
    new step is inserted, the statement is held instead (``run.held_rows``) for the call
    that may dispatch that step (ADR 0047); the step joins the run's view at once, under
    :func:`~.rows.unsaved_key` until the insert returns its id.
    """
    pending, run.pending = run.pending, []
    instance = RowWrite(Instance, run.instance.pk, values, {}, EngineError)
    rows = StepRows(pending, token, instance, run.active)
    # Held without a new step too when the step's success is written next: its call
    # takes them (``settle``, ADR 0076).
    if run.rows_wait and run.held_rows is None and (token is not None or run.success_follows):
        run.held_rows = rows
        if token is not None:
            run.active[unsaved_key(token)] = token
        return
    rows.write(run.fence)


def _verify_whole_chain(run: Run) -> None:
    """The whole chain, once per instance, in the commit that ends it (ADR 0038; needs the
    caller's commit).

    A run verified only the tail after its mark (ADR 0034), and after the end nothing but
    the periodic audit reads this chain again. When the ending's success is written later
    in this commit, dropping the run's mark makes that success read and verify the whole
    chain in its own statements (no extra statement; on PostgreSQL the one statement of
    ADR 0035 reads the whole chain instead of the tail); otherwise the chain is verified
    here. ``ChainBroken`` rolls the ending back; the caller opens the incident and blocks
    the instance (``blocking``).
    """
    if run.success_follows:
        chain_mark_drop(fence=run.fence)
    else:
        chain_verify_whole(subject=run.subject, fence=run.fence)


ROUTE_INCIDENT = "route"
"""The kind of engine incident a step whose route out failed opens (``blocking.block``)."""


def _stuck_rows(instance_id: int) -> tuple[str, str, list[Any]]:
    """The two places a stuck branch shows, as ``FROM … WHERE …`` of the failed steps and
    of the open route incidents, and their parameters: one definition for the load's
    answer and the ending's look."""
    failed, params = state_is(TokenState.FAILED)
    return (
        f"FROM {Token._meta.db_table} WHERE instance_id = %s AND {failed}",
        f"FROM {Incident._meta.db_table} WHERE instance_id = %s AND kind = %s "
        "AND resolved_at IS NULL",
        [instance_id, *params, instance_id, ROUTE_INCIDENT],
    )


def stuck_look_sql(instance_id: int) -> tuple[str, list[Any]]:
    """A scalar subquery: whether a step of the instance is failed or a route incident of
    it is open — what :func:`_stuck_reason` looks for — read with the run's load."""
    steps, incidents, params = _stuck_rows(instance_id)
    return f"(EXISTS (SELECT 1 {steps}) OR EXISTS (SELECT 1 {incidents}))", params


def _stuck_reason(run: Run) -> str:
    """Why a branch that is no longer active still needs an operator, or ''.

    Asked only when nothing is left active: a step whose effect was recorded absent
    (failed, awaiting a deliberate retry) or a step whose route out failed (an open
    route incident) in one parallel branch must keep the instance from completing
    when another branch reaches its end. One statement, once per instance — none when
    the run's load found neither and the run made neither since (``Run.stuck_at_load``):
    only the lease's holder fails a step or opens a route incident, and the run holds it.
    """
    if run.stuck_at_load is False and not run.stuck_since_load:
        return ""
    steps, incidents, params = _stuck_rows(run.instance.pk)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT reason {steps} UNION ALL SELECT message {incidents}", params)
        row = cursor.fetchone()
    if row is None:
        return ""
    return f"Another branch ended, but this one needs an operator: {row[0]}"[:2000]


def check_move(token: Token, expected: str, values: dict[str, Any]) -> None:
    target = values.get("state", expected)
    if target != expected and not token_may_move(expected, target):
        raise EngineError(
            f"Step '{token.node_id}' (#{token.ordinal}) cannot go from {expected} to "
            f"{target}: the engine's table of step moves does not allow it. This is a "
            "bug in the engine; nothing was changed."
        )


def moved_meanwhile(token: Token, expected: str) -> EngineConflict:
    return EngineConflict(
        f"Step '{token.node_id}' (#{token.ordinal}) is no longer "
        f"{expected}; someone else changed it. Nothing was changed."
    )
