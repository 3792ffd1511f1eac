"""Running an instance: one worker, one lease, every step that can run now.

The protocol (invariants I1-I10), at its one home:

1. ``instance_run`` acquires the instance lease (fence + 1, expiry by database time). A
   second delivery of the same task, or a second cluster, finds the lease held and leaves.
2. Tokens left ``executing`` by a previous holder are rehydrated first: never dispatched
   (no operation, or a ``prepared`` one) → ``ready`` with attempt + 1; dispatched →
   ``outcome_unknown``. Nobody else can be mid-step: their fence is stale.
3. Each ready token runs one step. Every write is conditional on the fence; a stale
   holder's write changes nothing and raises ``StaleFence``, which ends the run.
4. A non-atomic step is two transactions: (a) token ``executing`` + ledger operation
   ``dispatched`` — the dispatch boundary — then the provider call outside any
   transaction; (b) the observation + token completion + next tokens + variables. When
   the next step is a plain non-atomic action, its (a) joins the previous step's (b)
   (``steps.dispatch_next``), so a chain of steps costs one commit per step.
5. An atomic step is one commit: the provider's writes share the engine's transaction.
6. The lease is renewed between steps, and released in the commit that ends the
   instance or at the end of the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Q

from recovery.api import (
    ConflictError,
    Fence,
    IntegrityViolation,
    LeaseHeld,
    OperationState,
    Subject,
    atomic,
    fenced_update,
    fenced_update_row,
    incident_open,
    incident_open_sql,
    incident_report,
    insert_row,
    joined,
    lease_acquire,
    lease_release,
    lease_release_if_held,
    lease_renew,
    operation_get,
    operation_observe,
    projection_head_sql,
    projection_record,
)

from ..definitions import Spec
from ..dialect import clock
from ..liveness import worker_name
from ..models import Incident, Instance, InstanceStatus, Token, TokenState
from ..projection import SUBJECT_TYPE, projection_of
from ..states import TERMINAL_STATUSES, token_may_move
from .definitions import (
    instance_pinned,
    pinned_contracts_refusal,
    pinned_definition_refusal,
    unresolved_reason,
)
from .routing import ACTIVE, RouteError, Router, derive_status

log = logging.getLogger("govflow.engine")


@contextmanager
def step_commit() -> Iterator[None]:
    """One engine commit. The ledger's writes inside it join it without savepoints.

    Nested in another step commit it joins that one too; any error rolls the whole
    commit back (a step is all or nothing).
    """
    with atomic(), joined():
        yield


def lease_ttl() -> float:
    return float(getattr(settings, "GOVFLOW_LEASE_TTL", 30))


def run_budget() -> float:
    return float(getattr(settings, "GOVFLOW_RUN_BUDGET", 25))


def max_steps() -> int:
    return int(getattr(settings, "GOVFLOW_MAX_STEPS_PER_RUN", 500))


def instance_lease_key(instance_id: int) -> str:
    return f"instance:{instance_id}"


@dataclass
class RunReport:
    instance_id: int
    steps: int = 0
    status: str = ""
    skipped: str = ""
    stale: bool = False
    more: bool = False


@dataclass
class Run:
    """The in-memory view of one instance while this worker holds its lease."""

    instance: Instance
    spec: Spec
    fence: Fence
    definition_fp: str = ""
    """The hash of the definition's stored bytes, computed when the run loaded it: the
    ledger records this one, and it must equal the instance's pin (``instance_run``)."""
    active: dict[int, Token] = field(default_factory=dict)
    reached_end: bool = False
    renewed_at: float = field(default_factory=time.monotonic)
    blocked: set[int] = field(default_factory=set)
    """Tokens this run could not step (rejected before dispatch): not tried again here."""
    block_reason: str = ""
    """Why this run blocked the instance; other branches moving on do not unblock it."""
    chained: Any = None
    """A step whose dispatch the last commit recorded (``steps.Plan``): call it next."""
    deferred: tuple[int, Any] | None = None
    """(token pk, plan or rejection) prepared during a commit but left for the loop."""
    steps_left: int = 0
    deadline: float = 0.0
    """This run's step and time budget; a step is chained only within it."""

    released: bool = False
    """The lease was released in the commit that ended the instance."""

    recorded_projection: str = ""
    """The newest projection fingerprint the instance's chain holds (as of this run's
    last commit); '' for an instance that has none yet."""
    integrity_incident: int | None = None
    """The id of the open integrity incident on this instance when it was loaded."""
    no_chain: bool = False
    """A chained dispatch was refused for integrity: dispatch each step in its own commit."""
    _depth: int = 0

    @property
    def subject(self) -> Subject:
        return Subject(SUBJECT_TYPE, str(self.instance.pk))

    def projection(self) -> str:
        """The fingerprint of this run's view of the projection (variables, steps)."""
        return projection_of(self.instance, self.active.values())

    def carry_projection(self) -> str:
        """The fingerprint for a ledger write that is the last projection change of its
        commit: the chain will hold it, so the commit needs no checkpoint of its own."""
        self.recorded_projection = self.projection()
        return self.recorded_projection

    @contextmanager
    def commit(self) -> Iterator[None]:
        """One engine commit of this run (see ``step_commit``), under the chain.

        Before the outermost commit closes, if it changed the projection and no ledger
        write carried the new fingerprint, a ``projection`` checkpoint records it. A
        rolled-back commit leaves the recorded fingerprint as it was.
        """
        outermost = self._depth == 0
        before = self.recorded_projection
        self._depth += 1
        try:
            with step_commit():
                yield
                if outermost and not self.released:
                    self.seal()
        except BaseException:
            if outermost:
                self.recorded_projection = before
            raise
        finally:
            self._depth -= 1

    def seal(self) -> None:
        if self.integrity_incident is not None:
            # Stopped for integrity: what is stored now is not the engine's to vouch for.
            return
        current = self.projection()
        if current != self.recorded_projection:
            projection_record(subject=self.subject, projection_fp=current, fence=self.fence)
            self.recorded_projection = current

    def integrity_problem(self) -> str:
        """Why nothing may move for this instance now, or ''.

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

    def reload(self) -> None:
        """Read the instance and its active tokens again, after a refused commit.

        The refused commit changed nothing in the database, but it did change this view
        (variables, token states, new tokens): start again from what is stored. The fence
        stays; plans made from the old view are dropped.
        """
        fresh = _load_run(self.instance.pk, self.fence)
        if fresh is None:
            raise ConflictError(f"Instance {self.instance.pk} no longer exists.")
        self.instance, self.active = fresh.instance, fresh.active
        self.recorded_projection = fresh.recorded_projection
        self.integrity_incident = fresh.integrity_incident
        self.chained = self.deferred = None
        self.released = False

    def may_chain(self) -> bool:
        return not self.no_chain and self.steps_left > 1 and time.monotonic() < self.deadline

    def release_if_ended(self) -> None:
        """Inside the commit that ended the instance: release the lease in it too.

        The last statement of that commit (nothing fenced may follow it); saves the
        release's own commit. If the commit rolls back, so does the release.
        """
        if self.instance.status in TERMINAL_STATUSES and not self.released:
            self.seal()  # fenced: before the lease goes
            lease_release(fence=self.fence)
            self.released = True

    @property
    def variables(self) -> dict[str, Any]:
        return self.instance.variables

    @staticmethod
    def now_expr():
        return clock()

    def renew_if_due(self) -> None:
        if time.monotonic() - self.renewed_at > lease_ttl() / 3:
            lease_renew(fence=self.fence, ttl=lease_ttl())
            self.renewed_at = time.monotonic()

    @contextmanager
    def kept_alive(self) -> Iterator[None]:
        """Renew the lease in the background while a provider call runs.

        A slow but live call keeps its authority, so nobody marks it outcome_unknown while
        it is still working. If renewal fails (the lease was lost), the thread stops and
        the step's second commit is refused by its fence as usual.
        """
        stop = threading.Event()
        interval = lease_ttl() / 3

        def renew() -> None:
            from django.db import connection

            try:
                while not stop.wait(interval):
                    lease_renew(fence=self.fence, ttl=lease_ttl())
            except ConflictError:
                log.warning("lease %s lost during a provider call", self.fence)
            except Exception:  # the step's fenced commit decides; never crash the worker
                log.exception("could not renew lease %s during a provider call", self.fence)
            finally:
                connection.close()

        thread = threading.Thread(target=renew, name="govflow-lease-keepalive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.renewed_at = time.monotonic()

    # -- writes (inside the caller's transaction) --------------------------------------

    def update_token(self, token: Token, expected: str, **values: Any) -> None:
        """Conditional write: token still ``expected`` and the fence still live.

        A change of state must be a move of the engine's table (``TOKEN_TRANSITIONS``);
        any other is a bug here, refused before anything is written.
        """
        target = values.get("state", expected)
        if target != expected and not token_may_move(expected, target):
            from ..errors import EngineError

            raise EngineError(
                f"Step '{token.node_id}' (#{token.ordinal}) cannot go from {expected} to "
                f"{target}: the engine's table of step moves does not allow it. This is a "
                "bug in the engine; nothing was changed."
            )
        values.setdefault("updated_at", clock())
        count = fenced_update_row(
            Token, pk=token.pk, expect={"state": expected}, fence=self.fence, values=values
        )
        if count != 1:
            from ..errors import EngineConflict

            raise EngineConflict(
                f"Step '{token.node_id}' (#{token.ordinal}) is no longer "
                f"{expected}; someone else changed it. Nothing was changed."
            )
        for name, value in values.items():
            if name != "updated_at":
                setattr(token, name, value)

    def flush(self, router: Router, *, status: str | None = None, reason: str = "") -> None:
        """Write what the router collected and the instance row, on the fence."""
        pending = router.pending
        if pending.completed_joins:
            fenced_update(
                Token.objects.filter(pk__in=pending.completed_joins, state=TokenState.WAITING),
                fence=self.fence,
                state=TokenState.COMPLETED,
                updated_at=clock(),
            )
            for pk in pending.completed_joins:
                self.active.pop(pk, None)
        for token in pending.tokens:
            insert_row(token)
            self.active[token.pk] = token
        if pending.timers:
            from ..models import Timer

            Timer.objects.bulk_create(
                Timer(instance_id=self.instance.pk, token_id=token.pk, due_at=due)
                for token, due in pending.timers
            )
        for token, delivery in pending.deliveries:
            from .triggers import consume_buffered

            consume_buffered(self, token, delivery)
        new_status = status or derive_status(self.active.values())
        if (
            status is None
            and self.block_reason
            and new_status
            in {InstanceStatus.RUNNING, InstanceStatus.WAITING, InstanceStatus.COMPLETED}
        ):
            # A step blocked earlier in this run is still stuck (it is not tried again in
            # this run), so another branch moving on must not hide it.
            new_status, reason = InstanceStatus.BLOCKED, self.block_reason
        if status is None and new_status == InstanceStatus.COMPLETED:
            stuck = self.stuck_reason()
            if stuck:
                new_status, reason = InstanceStatus.BLOCKED, stuck
        values: dict[str, Any] = {
            "variables": self.instance.variables,
            "next_ordinal": self.instance.next_ordinal,
            "status": new_status,
            "updated_at": clock(),
        }
        if status is not None or new_status != self.instance.status:
            values["reason"] = reason
            self.instance.reason = reason
        if new_status == InstanceStatus.COMPLETED:
            values["completed_at"] = clock()
        fenced_update_row(Instance, pk=self.instance.pk, fence=self.fence, values=values)
        self.instance.status = new_status
        router.pending = type(pending)()

    def stuck_reason(self) -> str:
        """Why a branch that is no longer active still needs an operator, or ''.

        Asked only when nothing is left active: a step whose effect was recorded absent
        (failed, awaiting a deliberate retry) or a step whose route out failed (an open
        route incident) in one parallel branch must keep the instance from completing
        when another branch reaches its end. One statement, once per instance.
        """
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT reason FROM {Token._meta.db_table} WHERE instance_id = %s "
                "AND state = %s UNION ALL "
                f"SELECT message FROM {Incident._meta.db_table} WHERE instance_id = %s "
                "AND kind = %s AND resolved_at IS NULL",
                [self.instance.pk, TokenState.FAILED.value, self.instance.pk, "route"],
            )
            row = cursor.fetchone()
        if row is None:
            return ""
        return f"Another branch ended, but this one needs an operator: {row[0]}"[:2000]

    def incident(self, token: Token | None, kind: str, message: str, *, once: bool = False) -> None:
        """Open an engine incident; with ``once``, not while the same one is still open."""
        if (
            once
            and Incident.objects.filter(
                instance_id=self.instance.pk,
                token=token,
                kind=kind,
                message=message,
                resolved_at__isnull=True,
            ).exists()
        ):
            return
        Incident.objects.create(
            instance_id=self.instance.pk,
            token=token,
            kind=kind,
            message=message,
            created_at=clock(),
        )


def _load_run(instance_id: int, fence: Fence) -> Run | None:
    """The instance and its active tokens: two plain queries, the definition re-hashed."""
    quote = connection.ops.quote_name
    subject = Subject(SUBJECT_TYPE, str(instance_id))
    projection_sql, projection_params = projection_head_sql(subject)
    incident_sql, incident_params = incident_open_sql(subject)
    loaded = instance_pinned(
        instance_id,
        extra=[
            (projection_sql, "recorded_projection", projection_params),
            (incident_sql, "integrity_incident", incident_params),
        ],
    )
    if loaded is None:
        return None
    instance, pinned = loaded
    run = Run(
        instance=instance,
        spec=pinned.spec,
        fence=fence,
        definition_fp=pinned.fingerprint,
        recorded_projection=instance.recorded_projection or "",
        integrity_incident=instance.integrity_incident,
    )
    states = sorted(str(state) for state in ACTIVE)
    for token in Token.objects.raw(
        f"SELECT * FROM {quote(Token._meta.db_table)} "
        f"WHERE instance_id = %s AND state IN ({', '.join('%s' for _ in states)})",
        [instance_id, *states],
    ):
        run.active[token.pk] = token
    return run


def block(run: Run, token: Token | None, kind: str, message: str) -> None:
    """Stop the instance for an operator, with a clear reason, on the fence.

    A token that stays ready is not tried again in this run (it would only be rejected
    again); a later run (the sweep re-enqueues blocked instances with ready work) retries
    it, so a step rejected for a reason that went away moves on by itself. Blocking again
    for the same reason changes nothing and opens no second incident.
    """
    if token is not None:
        run.blocked.add(token.pk)
    run.block_reason = message
    if run.instance.status == InstanceStatus.BLOCKED and run.instance.reason == message:
        return
    with run.commit():
        run.incident(token, kind, message, once=True)
        run.flush(Router(run), status=InstanceStatus.BLOCKED, reason=message)
    log.warning("instance %s blocked: %s", run.instance.pk, message)


def rehydrate(run: Run) -> None:
    """Resolve tokens a previous holder left ``executing`` (invariant I10).

    A dispatched step whose provider's answer was kept (it arrived while an integrity
    incident stopped the instance) is settled with that answer, never guessed unknown.
    """
    for token in [t for t in run.active.values() if t.state == TokenState.EXECUTING]:
        operation = operation_get(key=token.operation_key)
        if operation is not None and operation.state == OperationState.DISPATCHED:
            from .steps import settle_kept

            if settle_kept(run, token, operation.key):
                continue
        with run.commit():
            if operation is None or operation.state == OperationState.PREPARED:
                # Never crossed the dispatch boundary: no effect can have happened.
                run.update_token(
                    token,
                    TokenState.EXECUTING,
                    state=TokenState.READY,
                    attempt=token.attempt + 1,
                    operation_key="",
                    reason="resumed after a worker stopped before dispatch",
                )
                run.flush(Router(run))
            elif operation.state == OperationState.DISPATCHED:
                message = (
                    "The worker stopped after dispatching this action and before "
                    "recording its outcome. The effect may or may not have happened: "
                    "an operator must record effect confirmed or effect absent."
                )
                run.update_token(
                    token, TokenState.EXECUTING, state=TokenState.OUTCOME_UNKNOWN, reason=message
                )
                run.flush(Router(run), status=InstanceStatus.BLOCKED, reason=message)
                operation_observe(
                    key=operation.key,
                    state=OperationState.OUTCOME_UNKNOWN,
                    fence=run.fence,
                    projection_fp=run.carry_projection(),
                )
            else:
                from .steps import settle_from_operation

                settle_from_operation(run, token, operation)


INTEGRITY_BLOCK = "Integrity incident #"
"""How the reason of an instance stopped for integrity starts (``incident_message``)."""


def unblock_after_integrity(run: Run) -> None:
    """An instance stopped for an incident that is resolved now shows its real state.

    The resolution queued this run; whatever it finds runnable moves on anyway, but an
    instance with nothing runnable (waiting for a person or a timer) would otherwise keep
    saying it is blocked by an incident that no longer is.
    """
    if run.instance.status == InstanceStatus.BLOCKED and run.instance.reason.startswith(
        INTEGRITY_BLOCK
    ):
        uncertain = [t for t in run.active.values() if t.state == TokenState.OUTCOME_UNKNOWN]
        status = derive_status(run.active.values())
        reason = uncertain[0].reason if uncertain else ""
        with run.commit():
            run.flush(Router(run), status=status, reason=reason)


KEPT_NOTE = (
    " A provider's answer was received meanwhile and is kept; it is recorded when the "
    "incident is resolved."
)


def kept_note(run: Run) -> str:
    from ..models import KeptAnswer

    kept = KeptAnswer.objects.filter(instance_id=run.instance.pk, applied_at__isnull=True)
    return KEPT_NOTE if kept.exists() else ""


def incident_message(incident_id: int, detail: str = "", *, where: str = "on this instance") -> str:
    """What an operator reads on an instance stopped by an integrity incident."""
    return (
        f"{INTEGRITY_BLOCK}{incident_id} is open {where}"
        f"{f' ({detail})' if detail else ''}. No new effect is dispatched and no step "
        "moves until it is resolved: once the cause is repaired, one person requests the "
        "resolution and a second approves it (Recovery ledger → Integrity incidents)."
    )[:2000]


def leave_or_block(run: Run, token: Token) -> None:
    """Follow the transitions out of ``token``'s completed node, or block the instance.

    Runs inside the caller's transaction, after the node's own facts (an observed success,
    merged output) were written: a gateway with no matching branch must not undo them. The
    instance is blocked with the reason instead, for an operator to cancel.
    """
    router = Router(run)
    try:
        router.leave(token.node_id)
    except RouteError as exc:
        message = f"The workflow cannot continue: {exc}."
        run.blocked.add(token.pk)
        run.block_reason = message
        run.incident(token, "route", message, once=True)
        run.flush(Router(run), status=InstanceStatus.BLOCKED, reason=message)
        log.warning("instance %s blocked: %s", run.instance.pk, message)
        return
    run.flush(router)


def next_runnable(run: Run) -> Token | None:
    """The ready token with the lowest ordinal that may run now, or None.

    Read from the run's own view: every token this run created or changed is in
    ``run.active``. Only a token waiting out a backoff (``not_before`` set) needs the
    database clock. Tokens released by others while this run holds the lease (a timer
    fired, a message arrived) are found by the check after the lease is released.
    """
    ready = [
        t for t in run.active.values() if t.state == TokenState.READY and t.pk not in run.blocked
    ]
    if any(t.not_before is not None for t in ready):
        return _next_runnable_now(run)
    return min(ready, key=lambda t: t.ordinal, default=None)


def _runnable(instance_id: int, blocked: set[int]):
    runnable = Token.objects.filter(instance_id=instance_id, state=TokenState.READY).filter(
        Q(not_before__isnull=True) | Q(not_before__lte=clock())
    )
    return runnable.exclude(pk__in=blocked) if blocked else runnable


def _next_runnable_now(run: Run) -> Token | None:
    token = _runnable(run.instance.pk, run.blocked).order_by("ordinal").first()
    if token is not None:
        # The step mutates this object: it must be the one the instance status is derived
        # from, or a later flush in this run would judge the instance by a stale copy.
        run.active[token.pk] = token
    return token


def instance_run(*, instance_id: int, worker: str | None = None) -> RunReport:
    """Advance one instance as far as it can go now. Safe to call any number of times."""
    from .steps import run_chained, run_token

    report = RunReport(instance_id)
    worker = worker or worker_name()
    try:
        # Taking the lease and reading the instance are one transaction (one commit).
        with step_commit():
            fence = lease_acquire(
                key=instance_lease_key(instance_id), holder=worker, ttl=lease_ttl()
            )
            run = _load_run(instance_id, fence)
    except LeaseHeld:
        report.skipped = "lease held by another worker"
        log.info("instance %s: %s; leaving it to them", instance_id, report.skipped)
        return report
    looped = False
    try:
        if run is None:
            report.skipped = "no such instance"
            return report
        report.status = run.instance.status
        if run.instance.status in TERMINAL_STATUSES:
            return report
        # A definition changed in the database is refused before anything reads it.
        refusal = pinned_definition_refusal(run)
        reason = "" if refusal else unresolved_reason(run.instance.definition)
        if reason:
            refusal = ("definition_unresolved", f"The definition no longer resolves here: {reason}")
        refusal = refusal or pinned_contracts_refusal(run)
        if refusal:
            block(run, None, *refusal)
            report.status = InstanceStatus.BLOCKED
            return report
        problem = run.integrity_problem()
        if problem:
            block(run, None, "integrity", problem + kept_note(run))
            report.status = InstanceStatus.BLOCKED
            return report
        unblock_after_integrity(run)
        rehydrate(run)
        looped = True
        # Stop starting steps well inside django-q2's task timeout: a worker killed by
        # that timeout mid-step would leave an outcome_unknown behind for nothing.
        run.deadline = time.monotonic() + run_budget()
        run.steps_left = max_steps()
        while True:
            if run.chained is not None:
                # Its dispatch is already durable: it is called whatever the budget says.
                run_chained(run)
            else:
                if run.steps_left <= 0 or time.monotonic() >= run.deadline:
                    break
                if run.instance.status in TERMINAL_STATUSES:
                    break
                token = next_runnable(run)
                if token is None:
                    break
                run_token(run, token)
            report.steps += 1
            run.steps_left -= 1
            run.renew_if_due()
        report.status = run.instance.status
    except IntegrityViolation as exc:
        # Every step path stops for integrity itself; this is the last line of defence.
        log.error("instance %s stopped for integrity: %s", instance_id, exc)
        report.status = _stop_for_integrity(run, exc)
    except ConflictError as exc:
        # StaleFence, or a late answer after another holder settled the step: this
        # worker's view is stale. Nothing it tried was written; the holder carries on.
        report.stale = True
        log.warning(
            "instance %s: %s: %s; nothing was changed, the current holder carries on",
            instance_id,
            type(exc).__name__,
            exc,
        )
    finally:
        _release(run, fence, report, check=looped and not report.stale)
    return report


def _stop_for_integrity(run: Run, exc: IntegrityViolation) -> str:
    try:
        run.reload()
        block(run, None, "integrity", integrity_stop_message(run, exc))
    except (ConflictError, IntegrityViolation, DatabaseError):
        log.exception("instance %s: could not record the integrity stop", run.instance.pk)
    return run.instance.status


def integrity_stop_message(run: Run, exc: IntegrityViolation) -> str:
    """Open (or find) the incident behind ``exc`` and say why the instance stopped.

    Outside any transaction: the incident must outlive the refused commit.
    """
    from recovery.api import ChainBroken, IntegrityIncidentOpen

    if isinstance(exc, IntegrityIncidentOpen) and exc.incident_id is not None:
        # Stopped by an incident that is already open (the instance's own, or the whole
        # ledger's): nothing new was found here, so no second incident is opened.
        where = "on the whole ledger" if exc.ledger_wide else "on this instance"
        return incident_message(exc.incident_id, str(exc)[:600], where=where)
    if isinstance(exc, ChainBroken):
        incident = incident_open(verification=exc.result)
    else:
        incident = incident_report(subject=run.subject, reason=str(exc))
    run.integrity_incident = incident.pk
    return incident_message(incident.pk, str(exc)[:600])


def _release(run: Run | None, fence: Fence, report: RunReport, *, check: bool) -> None:
    """Release the lease; queue the instance again if work is left that may run now.

    Work is left when this run stopped at its step or time budget, or when a timer, a
    message or a decision released a token while this run held the lease: their own
    task found the lease held and left. Release and check are one transaction, so such
    a change either is seen here or its task finds the lease free.
    """
    check = check and run is not None and run.instance.status not in TERMINAL_STATUSES
    if run is not None and run.released:
        return
    try:
        with step_commit():
            lease_release_if_held(fence=fence)
            if check and _runnable(run.instance.pk, run.blocked).exists():
                report.more = True
                from ..queue import enqueue_advance

                enqueue_advance(run.instance.pk)
    except DatabaseError:
        # Never mask the run's own outcome; an unreleased lease expires by itself.
        log.exception("instance %s: could not release the lease cleanly", fence.key)
