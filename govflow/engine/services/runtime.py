"""Running an instance: one worker, one lease, every step that can run now.

The protocol (invariants I1-I12), at its one home:

1. ``instance_run`` acquires the instance lease (fence + 1, expiry by database time) and
   loads the instance, in one commit. A worker's run was claimed with its lease already
   taken (``queue.instances_claim``, ADR 0026): it hands the lease to the worker (fence +
   1 again) and loads the instance in a transaction the run's first commit closes
   (``handover``, ADR 0042; one statement: 0060). A second run, or a second cluster,
   finds the lease held (or its claim's fence stale) and leaves.
2. Before anything moves, the load is checked (I12): the definition's stored bytes must
   hash to the instance's pin and still resolve, the action contracts must match, no
   integrity incident may be open, and the stored variables and steps must equal the
   projection the chain recorded last. Any failure blocks the instance with the reason
   (an edited row opens an integrity incident) and the run ends.
3. Tokens left ``executing`` by a previous holder are rehydrated (I10): never dispatched
   (no operation, or a ``prepared`` one) → ``ready`` with attempt + 1; dispatched →
   ``outcome_unknown``, unless the provider's answer was kept while an incident stopped
   the instance: then it is recorded as the answer it was. Nobody else can be mid-step:
   their fence is stale. An ``outcome_unknown`` step whose provider can be asked waits
   for the reconciliation ladder too (``reconcile``): when nothing is ready, the loop
   asks the provider of a step that is due, and the sweep queues such instances.
4. Each ready token runs one step (``steps.run_token``), which returns the loop's next
   move as a value (``dispatch.Next``). Every write is conditional on the fence; a stale
   holder's write changes nothing and raises ``StaleFence``, which ends the run.
5. A non-atomic step is two commits: (a) token ``executing`` + ledger operation
   ``dispatched`` — the dispatch boundary; the ledger's dispatch write itself refuses
   while an integrity incident is open on the instance or the effect's last operation is
   unsettled (I12) — then the provider call outside any transaction; (b) the observation
   + token completion + next tokens + variables, the projection's fingerprint carried by
   the last ledger write. When the next step is a plain non-atomic action, its (a) joins
   the previous step's (b) (``dispatch.dispatch_next`` returns ``Chain``), so a chain of
   steps costs one commit per step; on PostgreSQL that commit's rows (step k completed,
   step k+1 inserted already ``executing``, the instance) ride in the ledger call's own
   statement, each fenced, the call made only if all matched (ADR 0047). An answer the
   ledger refuses for integrity is kept
   (``KeptAnswer``) and recorded after the incident is resolved, never guessed unknown.
6. An atomic step is one commit: the provider's writes share the engine's transaction.
7. The lease is renewed between steps (and by a thread during a provider call); it is
   released in the commit that ends the instance (``Run.commit``, the one place; that
   commit also clears the instance's runnable mark, so a claimed run needs no commit
   after it), or else at the end of the run
   together with a look for work released meanwhile: work left marks the instance
   runnable again, none clears a claimed run's mark unless it was marked meanwhile.

Transactions: every function of the engine's services says whether it *owns* its commit
(opens and closes it: ``Run.commit``, ``db.engine_commit``) or *needs* the caller's.
This module keeps only the loop; the run, its commits and lease are in ``run``, step
planning and dispatch in ``dispatch``, settling in ``settle``, steps in ``steps``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import DatabaseError, connection

from recovery.api import (
    ConflictError,
    Fence,
    IntegrityViolation,
    LeaseHeld,
    StaleFence,
    rows_as,
)

from ..conf import max_steps_per_run, run_budget
from ..db import engine_commit
from ..liveness import worker_name
from ..models import InstanceStatus, Token, TokenState
from ..queue import Claim, instance_mark_runnable_behind, runnable_clear, runnable_defer
from ..states import TERMINAL_STATUSES
from ..token_reads import runnable_select
from .blocking import block, integrity_stop_message, kept_note
from .definitions import pinned_contracts_refusal, pinned_definition_refusal, unresolved_reason
from .dispatch import Chain, Next
from .load import run_reload
from .opening import lease_and_load
from .reconcile import ladder_due, ladder_step
from .rehydration import rehydrate
from .release import release_sealed
from .routing import derive_status
from .run import INTEGRITY_BLOCK, Run
from .saga import saga_enqueue_if_due, saga_run
from .steps import run_chained, run_token

__all__ = ["RunReport", "instance_run"]

log = logging.getLogger("govflow.engine")

RETRY_AFTER_ERROR = 30.0
"""Seconds before an instance whose claimed run failed unexpectedly is claimed again."""


@dataclass
class RunReport:
    instance_id: int
    steps: int = 0
    status: str = ""
    skipped: str = ""
    stale: bool = False
    more: bool = False
    settled: bool = False
    """The run ended without an unexpected error: what it found is all there was."""


def instance_run(
    *, instance_id: int, worker: str | None = None, claim: Claim | None = None
) -> RunReport:
    """Advance one instance as far as it can go now. Safe to call any number of times.

    With ``claim``, the instance was claimed for this run with its lease (ADR 0026).
    Owns its commits (protocol above). Outside any transaction.
    """
    report = RunReport(instance_id)
    worker = worker or worker_name()
    try:
        fence, run = lease_and_load(instance_id, worker, claim)
    except LeaseHeld:
        report.skipped = "lease held by another worker"
        log.info("instance %s: %s; leaving it to them", instance_id, report.skipped)
        return report
    except StaleFence:
        report.skipped = "claim lapsed: its lease expired before a worker could start"
        log.info("instance %s: %s; the next claim takes it", instance_id, report.skipped)
        return report
    looped = False
    try:
        if run is None:
            report.skipped = "no such instance"
            return report
        report.status = run.instance.status
        if _ended_or_refused(run, report):
            return report
        unblock_after_integrity(run)
        rehydrate(run)  # before the budget is set: nothing is chained from it
        looped = True
        _loop(run, report)
        report.status = run.instance.status
        report.settled = True
    except BaseException as exc:
        if run is not None:
            run.load_closed(exc)  # rolled back, the lease handed over on its own
        if not isinstance(exc, IntegrityViolation | ConflictError):
            raise
        _stopped(run, report, exc)
    finally:
        if run is not None:
            run.load_closed()  # a run that committed nothing: the handover and load
        _lease_release_and_requeue(run, fence, report, check=looped and report.settled, claim=claim)
    if looped and not report.stale:
        saga_enqueue_if_due(run)  # it failed: its compensations run in a run of their own
    return report


def _stopped(run: Run, report: RunReport, exc: IntegrityViolation | ConflictError) -> None:
    """A run stopped by an integrity violation or a conflict (owns its commits)."""
    instance_id = report.instance_id
    if isinstance(exc, IntegrityViolation):
        # Every step path stops for integrity itself; this is the last line of defence.
        log.error("instance %s stopped for integrity: %s", instance_id, exc)
        report.status = _stop_for_integrity(run, exc)
        report.settled = True
        return
    # StaleFence, or a late answer after another holder settled the step: this worker's
    # view is stale. Nothing it tried was written; the holder carries on.
    report.stale = True
    log.warning(
        "instance %s: %s: %s; nothing was changed, the current holder carries on",
        instance_id,
        type(exc).__name__,
        exc,
    )


def _ended_or_refused(run: Run, report: RunReport) -> bool:
    """An ended instance runs only its compensations (saga); a refused load blocks the
    instance. Either way the run is over (own commits)."""
    if run.instance.status in TERMINAL_STATUSES:
        run.load_closed()  # compensations: commits of their own (saga)
        report.steps += saga_run(run)
    elif _refused_at_load(run):
        report.status = run.instance.status
    else:
        return False
    report.settled = True
    return True


def _refused_at_load(run: Run) -> bool:
    """Protocol step 2: block the instance (its own commit) if its load is refused."""
    # A definition changed in the database is refused before anything reads it.
    refusal = pinned_definition_refusal(run)
    reason = "" if refusal else unresolved_reason(run.instance.definition)
    if reason:
        refusal = ("definition_unresolved", f"The definition no longer resolves here: {reason}")
    refusal = refusal or pinned_contracts_refusal(run)
    if refusal:
        block(run, None, *refusal)
        return True
    problem = run.integrity_problem()
    if problem:
        block(run, None, "integrity", problem + kept_note(run))
        return True
    return False


def _loop(run: Run, report: RunReport) -> None:
    """Protocol steps 4-7: step after step within the run's budget (owns its commits)."""
    # Stop starting steps well inside django-q2's task timeout: a worker killed by that
    # timeout mid-step would leave an outcome_unknown behind for nothing.
    run.deadline = time.monotonic() + run_budget()
    run.steps_left = max_steps_per_run()
    next_step: Next = None
    while True:
        if isinstance(next_step, Chain):
            # Its dispatch is already durable: it is called whatever the budget says.
            next_step = run_chained(run, next_step)
        else:
            if run.steps_left <= 0 or time.monotonic() >= run.deadline:
                break
            if run.instance.status in TERMINAL_STATUSES:
                break
            token = next_runnable(run)
            if token is not None:
                next_step = run_token(run, token, next_step)
            else:
                # Nothing ready: an uncertain step whose provider is due to be asked.
                token = ladder_due(run)
                if token is None:
                    break
                run.load_closed()  # the provider is asked outside any transaction
                ladder_step(run, token)
                next_step = None
        report.steps += 1
        run.steps_left -= 1
        run.renew_if_due()


def unblock_after_integrity(run: Run) -> None:
    """An instance stopped for an incident that is resolved now shows its real state.

    Owns its commit. The resolution queued this run; whatever it finds runnable moves on
    anyway, but an instance with nothing runnable (waiting for a person or a timer) would
    otherwise keep saying it is blocked by an incident that no longer is.
    """
    if run.instance.status == InstanceStatus.BLOCKED and run.instance.reason.startswith(
        INTEGRITY_BLOCK
    ):
        uncertain = [t for t in run.active.values() if t.state == TokenState.OUTCOME_UNKNOWN]
        status = derive_status(run.active.values())
        reason = uncertain[0].reason if uncertain else ""
        with run.commit():
            run.flush(status=status, reason=reason)


def next_runnable(run: Run) -> Token | None:
    """The ready token with the lowest ordinal that may run now, or None (reads).

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


def _next_runnable_now(run: Run) -> Token | None:
    sql, params = runnable_select(run.instance.pk, run.blocked)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} ORDER BY ordinal LIMIT 1", params)
        token = next(iter(rows_as(Token, cursor.fetchall())), None)
    if token is not None:
        # The step mutates this object: it must be the one the instance status is derived
        # from, or a later flush in this run would judge the instance by a stale copy.
        run.active[token.pk] = token
    return token


def _runnable_left(run: Run) -> bool:
    """Whether the instance has a step that may run now, or whose provider is due to be
    asked (reads; the database's rows, with what others released meanwhile)."""
    sql, params = runnable_select(run.instance.pk, run.blocked, asks=True, select="1")
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} LIMIT 1", params)
        return cursor.fetchone() is not None


def _stop_for_integrity(run: Run, exc: IntegrityViolation) -> str:
    """Record why the run stopped for integrity (owns its commits); the new status."""
    try:
        run_reload(run)
        block(run, None, "integrity", integrity_stop_message(run, exc))
    except (ConflictError, IntegrityViolation, DatabaseError):
        log.exception("instance %s: could not record the integrity stop", run.instance.pk)
    return run.instance.status


def _lease_release_and_requeue(
    run: Run | None, fence: Fence, report: RunReport, *, check: bool, claim: Claim | None
) -> None:
    """Release the lease (own commit) unless the commit that ended the instance did;
    mark the instance runnable again if work is left that may run now, or else clear the
    claimed run's mark.

    Work is left when this run stopped at its step or time budget. A timer, a message or
    a decision that released a token while this run held the lease marked the instance
    itself (``wakeups`` grew): its mark is kept, and the next claim takes it once the
    lease is released here. The mark is cleared only when this run released a live lease
    and ended as it meant to (``report.settled``).
    """
    check = check and run is not None and run.instance.status not in TERMINAL_STATUSES
    if run is not None and run.released:
        # The commit that ended the instance (or a saga's last) released the lease; a
        # claimed mark made since (a compensation still to run) stays. The commit that
        # ended the instance cleared the mark itself (no commit of its own: ADR 0039);
        # a saga's commits leave it for this one.
        if claim is not None and report.settled and not run.mark_cleared:
            with engine_commit():
                runnable_clear(instance_id=claim.instance_id, wakeups=claim.wakeups)
        return
    try:
        with engine_commit():
            released = release_sealed(fence, going_on=check)
            if check and _runnable_left(run):
                report.more = True
                # It had its turn: behind every instance that waited meanwhile (ADR 0037).
                instance_mark_runnable_behind(run.instance.pk)
            elif released and claim is not None and report.settled:
                runnable_clear(instance_id=claim.instance_id, wakeups=claim.wakeups)
            elif released and claim is not None and not report.stale:
                # An unexpected error (it propagates to django-q2, which records it):
                # try again later, not in a loop of claims.
                runnable_defer(
                    instance_id=claim.instance_id, wakeups=claim.wakeups, seconds=RETRY_AFTER_ERROR
                )
    except DatabaseError:
        # Never mask the run's own outcome; an unreleased lease expires by itself.
        log.exception("instance %s: could not release the lease cleanly", fence.key)
