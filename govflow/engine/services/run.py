"""The run: one worker's view of one instance while it holds the instance's lease.

This module owns the ``Run`` object and everything that ends a write of it: its commit
(``Run.commit``, an engine commit of ``db.engine_commit``), the projection's seal (a
``projection`` checkpoint when no ledger write carried the new fingerprint), and the
release of the lease in the commit that ends the instance — the one place that releases
it then. Its routed rows and instance row are written by ``writes``.
Planning, dispatching and settling steps live above it (``dispatch``, ``settle``,
``steps``); the loop that drives them is ``runtime``. The protocol is in ``runtime``'s
docstring.

Transactions: each function says whether it *owns* its commit (opens and closes it) or
*needs* the caller's (runs inside an open ``Run.commit`` / ``engine_commit``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from recovery.api import (
    Fence,
    RowWrite,
    Subject,
    fenced_update_row,
    incident_report,
    lease_release,
    lease_renew,
    projection_record,
)

from ..conf import lease_ttl
from ..db import clock, engine_commit
from ..definitions import Spec
from ..emit import (
    incident_opened,
    moves_a_handoff,
    status_changed,
    status_changed_parts,
    token_moved,
)
from ..models import Incident, Instance, Token
from ..projection import SUBJECT_TYPE, Projector
from ..states import TERMINAL_STATUSES, TokenState
from ..variables import apply_output
from .handover import OpenedLoad
from .keepalive import keepalive
from .routing import Router
from .rows import StepRows, rows_in_one
from .writes import (
    ROUTE_INCIDENT,
    check_move,
    ending_write,
    moved_meanwhile,
    write_instance,
    write_pending,
    write_routed,
)

__all__ = [
    "INTEGRITY_BLOCK",
    "Run",
    "incident_message",
    "instance_lease_key",
]

log = logging.getLogger("govflow.engine")


def instance_lease_key(instance_id: int) -> str:
    return f"instance:{instance_id}"


INTEGRITY_BLOCK = "Integrity incident #"
"""How the reason of an instance stopped for integrity starts (``incident_message``)."""


def incident_message(incident_id: int, detail: str = "", *, where: str = "on this instance") -> str:
    """What an operator reads on an instance stopped by an integrity incident."""
    return (
        f"{INTEGRITY_BLOCK}{incident_id} is open {where}"
        f"{f' ({detail})' if detail else ''}. No new effect is dispatched and no step "
        "moves until it is resolved: once the cause is repaired, one person requests the "
        "resolution and a second approves it (Recovery ledger → Integrity incidents)."
    )[:2000]


@dataclass
class Run:
    """The in-memory view of one instance while this worker holds its lease.

    It holds what the run knows and what it decided for itself (tokens it will not try
    again, its budget); what a step decides for the next one is returned by the step
    (``dispatch.Next``), never left here.
    """

    instance: Instance
    spec: Spec
    fence: Fence
    definition_fp: str = ""
    """The hash of the definition's stored bytes, as loaded: the ledger records it, and
    it must equal the instance's pin (``instance_run``)."""
    active: dict[int, Token] = field(default_factory=dict)
    renewed_at: float = field(default_factory=time.monotonic)
    blocked: set[int] = field(default_factory=set)
    """Tokens this run could not step (rejected before dispatch): not tried again here."""
    block_reason: str = ""
    """Why this run blocked the instance; other branches moving on do not unblock it."""
    steps_left: int = 0
    deadline: float = 0.0  # this run's step and time budget; a step chains only within it
    released: bool = False
    """The lease was released in the commit that ended the instance."""
    mark_cleared: bool = False
    """The commit that ended the instance cleared its runnable mark too (ADR 0039)."""
    recorded_projection: str = ""
    """The newest projection fingerprint the instance's chain holds (as of this run's
    last commit); '' for an instance that has none yet."""
    integrity_incident: int | None = None
    """The open integrity incident on this instance when it was loaded (its id)."""
    no_chain: bool = False
    """A chained dispatch was refused for integrity: dispatch each step in its own commit."""
    success_follows: bool = False
    """A success is written later in this commit: the ending verifies through it (0038)."""
    committed_status: str = ""
    """The instance's status as of this run's last commit (its events: ``emit``)."""
    opened: OpenedLoad | None = None
    """The run's lease and load, open until its first commit (``handover``)."""
    stuck_at_load: bool | None = None
    """Whether a step had failed or a route was blocked when the run loaded the instance
    (None: not read); with :attr:`stuck_since_load` it spares the ending its look
    (``writes._stuck_reason``)."""
    stuck_since_load: bool = False
    """This run failed a step or opened a route incident since it loaded the instance."""
    projector: Projector = field(default_factory=Projector)
    pending: list[RowWrite] = field(default_factory=list)
    """Step moves that ride in the instance row's statement (``update_token(later=)``)."""
    rows_wait: bool = False  # a flush may hold its rows for the ledger's call (ADR 0047)
    held_rows: StepRows | None = None  # and these it held (``writes.first_writes``)
    ending: tuple[Any, StepRows | None] | None = None
    """The success that ends the instance and the rows held for it, kept for the statement
    that releases the lease (``writes.ending_keep``, ADR 0076)."""
    depth: int = 0  # commits open (``commit``): 1 inside the outermost only

    @property
    def subject(self) -> Subject:
        return Subject(SUBJECT_TYPE, str(self.instance.pk))

    @property
    def variables(self) -> dict[str, Any]:
        return self.instance.variables

    def apply_output(self, node_id: str, mapping: Any, data: Any) -> None:
        """Merge a step's or a wait's output into the variables: the one way they change
        in place, so the projection's kept part is made again (``Projector``)."""
        apply_output(self.instance.variables, node_id, mapping, data)
        self.projector.variables_changed()

    def projection(self) -> str:
        """The fingerprint of this run's view of the projection (variables, steps)."""
        return self.projector.fingerprint(self.instance, self.active.values())

    def carry_projection(self) -> str:
        """The fingerprint for a ledger write that is the last projection change of its
        commit: the chain will hold it, so the commit needs no checkpoint of its own."""
        self.recorded_projection = self.projection()
        return self.recorded_projection

    def may_chain(self) -> bool:
        return not self.no_chain and self.steps_left > 1 and time.monotonic() < self.deadline

    # -- commits ----------------------------------------------------------------------

    @contextmanager
    def commit(self) -> Iterator[None]:
        """One engine commit of this run (owns it; nested in another, joins that one).

        Before the outermost commit closes: if it changed the projection and no ledger
        write carried the new fingerprint, a ``projection`` checkpoint records it; if it
        ended the instance, the lease is released in it — the last statement of the
        commit, so nothing fenced follows it, and it rolls back with the commit. A
        rolled-back commit leaves the run's recorded fingerprint as it was.
        """
        outermost = self.depth == 0
        before = self.recorded_projection
        self.depth += 1
        try:
            with engine_commit():
                yield
                if self.pending or self.held_rows is not None:
                    ending_write(self)  # written as made, before rows made after it
                write_pending(self)  # left by no flush or dispatch: never dropped
                if outermost and not self.released:
                    self._seal()
                    self._close_status()
                ending_write(self)  # never dropped either
            if outermost:
                self.load_closed()  # the run's first commit carries the handover (0042)
        except BaseException as exc:
            self.pending.clear()
            self.held_rows = self.ending = None
            if outermost:
                self.recorded_projection = before
                self.released = self.mark_cleared = False
                self.load_closed(exc)
            raise
        else:
            if outermost:
                self.committed_status = str(self.instance.status)
        finally:
            self.depth -= 1

    def load_closed(self, exc: BaseException | None = None) -> None:
        """Close the run's open lease and load: committed, or after ``exc`` rolled back
        with the lease taken again in its own commit (``handover``)."""
        if self.opened is None or not self.opened.is_open:
            return
        if exc is None:
            self.opened.commit()
        else:
            self.opened.rollback(exc)

    def _seal(self) -> None:
        if self.integrity_incident is not None:
            # Stopped for integrity: what is stored now is not the engine's to vouch for.
            return
        current = self.projection()
        if current != self.recorded_projection:
            ending_write(self)  # the kept success goes first, as it was made
            projection_record(subject=self.subject, projection_fp=current, fence=self.fence)
            self.recorded_projection = current

    def _close_status(self) -> None:
        """The status's event, if it moved, and the lease's release if the instance ended:
        on PostgreSQL one statement when both (ADR 0059), the release last either way."""
        ended = self.instance.status in TERMINAL_STATUSES
        moved = self.instance.status != self.committed_status
        if ended and rows_in_one():
            event = status_changed_parts(self, self.committed_status) if moved else None
            ending, self.ending = self.ending, None
            if ending is None:
                lease_release(fence=self.fence, with_parts=event)
            else:  # the success, the event and the release: one statement (ADR 0076)
                observation, held = ending
                observation.write_and_release(first=held, parts=event)
            self.released = True
            return
        if moved:
            status_changed(self, self.committed_status)
        if ended:
            lease_release(fence=self.fence)
            self.released = True

    # -- reading ----------------------------------------------------------------------

    def integrity_problem(self) -> str:
        """Why nothing may move for this instance now, or '' (opens an incident: its own).

        An open integrity incident, or stored rows that differ from the projection the
        chain recorded last (which opens one). Asked once when a run or an operator's
        change loads the instance, under its lease.
        """
        if self.integrity_incident is not None:
            return incident_message(self.integrity_incident)
        if self.recorded_projection and self.recorded_projection != self.projection():
            reason = (
                "the instance's variables or step states differ from the ones its "
                "checkpoint chain recorded last: they were changed outside the engine"
            )
            incident = incident_report(subject=self.subject, reason=reason)
            self.integrity_incident = incident.pk
            return incident_message(incident.pk, reason)
        return ""

    def reloaded(self, fresh: Run) -> None:
        """Take the view of ``fresh``, this instance loaded again under the same fence after
        a refused commit (``load.run_reload``): the refused commit changed nothing stored
        but did change this view. Plans made from the old view are the caller's to drop."""
        self.instance, self.active = fresh.instance, fresh.active
        self.recorded_projection = fresh.recorded_projection
        self.integrity_incident = fresh.integrity_incident
        self.committed_status = fresh.committed_status
        self.stuck_at_load, self.stuck_since_load = fresh.stuck_at_load, False
        self.released = self.mark_cleared = False

    # -- the lease while a step runs ----------------------------------------------------

    def renew_if_due(self) -> None:
        """Renew the lease once a third of it has passed (its own commit)."""
        if time.monotonic() - self.renewed_at > lease_ttl() / 3:
            lease_renew(fence=self.fence, ttl=lease_ttl())
            self.renewed_at = time.monotonic()

    @contextmanager
    def kept_alive(self) -> Iterator[None]:
        """Renew the lease in the background while a provider call runs (outside any
        transaction; each renewal is the keepalive thread's own commit): a slow but live
        call keeps its authority. A lost lease stops the renewing; the step's second
        commit is then refused by its fence as usual."""
        self.load_closed()  # nothing is called outside before a commit
        entry = keepalive.watch(
            lambda: lease_renew(fence=self.fence, ttl=lease_ttl()),
            interval=lease_ttl() / 3,
            what=f"lease {self.fence}",
        )
        try:
            yield
        finally:
            entry.done()
            self.renewed_at = time.monotonic()

    # -- writes (each needs the caller's commit) ----------------------------------------

    def update_token(self, token: Token, expected: str, *, later: bool = False, **values: Any):
        """Conditional write: token still ``expected`` and the fence still live (needs the
        caller's commit).

        A change of state must be a move of the engine's table (``TOKEN_TRANSITIONS``);
        any other is a bug here, refused before anything is written. With ``later`` (on
        PostgreSQL) the write rides in the statement of this commit's next ``flush``.
        """
        if later and rows_in_one():
            self.pending.append(self.token_write(token, expected, **values))
            return
        self._note_stuck(values)
        check_move(token, expected, values)
        values.setdefault("updated_at", clock())
        count = fenced_update_row(
            Token, pk=token.pk, expect={"state": expected}, fence=self.fence, values=values
        )
        if count != 1:
            raise moved_meanwhile(token, expected)
        target = values.get("state", expected)
        wait_kind = values.get("wait_kind")
        if moves_a_handoff(token, expected, target, wait_kind):
            token_moved(self, token, expected, target, wait_kind)  # a handoff opened or decided
        for name, value in values.items():
            if name != "updated_at":
                setattr(token, name, value)

    def token_write(self, token: Token, expected: str, **values: Any) -> RowWrite:
        """The write of :meth:`update_token`, handed to the ledger to make first in its
        own call (``recovery.api.operation_observe_record``; needs the caller's commit).

        The run's view takes the values now, so the fingerprint the ledger write carries
        includes them; a refused call rolls the commit back and the caller reloads.
        """
        check_move(token, expected, values)
        self._note_stuck(values)
        values.setdefault("updated_at", clock())
        target = values.get("state", expected)
        wait_kind = values.get("wait_kind")
        if moves_a_handoff(token, expected, target, wait_kind):
            token_moved(self, token, expected, target, wait_kind)  # rolled back if refused
        for name, value in values.items():
            if name != "updated_at":
                setattr(token, name, value)
        return RowWrite(
            Token, token.pk, values, {"state": expected}, lambda: moved_meanwhile(token, expected)
        )

    def _note_stuck(self, values: dict[str, Any]) -> None:
        if values.get("state") == TokenState.FAILED:
            self.stuck_since_load = True

    def flush(
        self, router: Router | None = None, *, status: str | None = None, reason: str = ""
    ) -> None:
        """Write what ``router`` collected, then the instance row, on the fence (needs the
        caller's commit).

        Without ``status`` the instance's status is derived from its active tokens.
        """
        held = write_routed(self, router) if router is not None else None
        write_instance(self, status, reason, held)

    def engine_incident_open(
        self, token: Token | None, kind: str, message: str, *, once: bool = False
    ) -> None:
        """Open an engine incident for an operator (needs the caller's commit): not an
        integrity incident (``recovery.api.incident_open``) but a failed step, a blocked
        route, a refused dispatch. With ``once``, not while the same one is open."""
        same = {"instance_id": self.instance.pk, "token": token, "kind": kind}
        if kind == ROUTE_INCIDENT:
            self.stuck_since_load = True
        if (
            once
            and Incident.objects.filter(**same, message=message, resolved_at__isnull=True).exists()
        ):
            return
        incident = Incident.objects.create(**same, message=message, created_at=clock())
        incident_opened(self.instance, incident)
