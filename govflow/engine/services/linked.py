"""Watching a linked run: ask the other module for its descriptor, take what it says.

The watch step (a ready token with ``wait_kind`` ``linked``) is the second step of a
``linked_run`` node (``linked_watch``). Each look is the protocol below; it records no
ledger operation (a look has no effect) and never decides the run's outcome:

1. The descriptor is asked for outside any transaction, under the kept-alive lease. No
   answer (an exception, or something that is not a descriptor) is no information: the
   step looks again later.
2. ``running``: look again after the backoff (``poll_backoff`` doubled per look, at most
   ``poll_max_delay``). Past ``poll_budget`` looks the instance is blocked with an engine
   incident for a person, and the step keeps looking at the longest interval.
3. ``unknown_publication``: the other module does not know whether its effect happened
   and settles that itself. The instance is blocked with a handoff whose only action is
   Cancel (decisions on it are refused: ``LINKED_DECISION_REFUSED``); the step keeps
   looking.
4. The first conclusive descriptor (``succeeded`` with outputs, or ``failed`` with a
   reason code) is recorded — its fingerprint on the ``LinkedRun`` row and as a
   ``linked_run.described`` fact on the chain — and confirmed by one more look at once.
   Only a second look that says the same moves the workflow: the outputs through the
   node's output mapping, or the node's failure path (``on_failure``).
5. A descriptor that differs from the recorded conclusive one (another state, other
   outputs, another reason code) contradicts it: an integrity incident is opened and the
   instance is blocked (I8); nothing advances.
6. Once that incident is resolved (two people, on a chain that verifies: the cause was
   found), the next look sets the recorded conclusion aside — a chained
   ``linked_run.conclusion_reset`` fact naming the one set aside — and takes the module's
   answer anew: it moves the workflow only when two looks agree again (ADR 0036). The
   workflow never moved on the contradicted conclusion (it needed a second look), so
   nothing that followed depends on it.

Each look's writes are one commit on the run's fence.
"""

from __future__ import annotations

import logging
from typing import Any

from recovery.api import (
    CanonicalError,
    FingerprintKind,
    fact_append,
    fenced_update,
    fingerprint_value,
    incident_report,
    input_guard,
)

from ..db import clock
from ..limits import payload_max_bytes
from ..linked import CONCLUSIVE, STATES, UNKNOWN_PUBLICATION, RunDescriptor, run_providers
from ..models import InstanceStatus, LinkedRun, LinkedState, Token, TokenState
from ..results import Failed
from .blocking import block
from .dispatch import Next
from .routing import after_seconds
from .run import Run, incident_message
from .settle import MAX_DELAY, complete_with_output, retry_or_fail

__all__ = [
    "LINKED_DECISION_REFUSED",
    "linked_cancel_record",
    "linked_cancel_send",
    "linked_look",
    "unknown_publication_message",
]

log = logging.getLogger("govflow.engine")

LINKED_DECISION_REFUSED = (
    "This step watches a linked run of another module. Its outcome, even a publication "
    "outcome that module reports as unknown, is that module's to settle (by its own "
    "reconcile): GovFlow records no effect confirmed or effect absent here. The only action "
    "is Cancel; otherwise the step moves on by itself once the module reports a conclusive "
    "outcome."
)


def unknown_publication_message(link: LinkedRun, note: str = "") -> str:
    """The reason an instance shows while its linked run's outcome is unknown."""
    said = f" It says: {note[:300]}" if note else ""
    return (
        f"Handoff: the linked run {link.run_ref} ({link.provider}) of step "
        f"'{link.node_id}' reports that the outcome of its publication is unknown.{said} "
        "That module settles it itself; GovFlow keeps asking and moves on only from a "
        "conclusive answer. The only action here is Cancel."
    )[:2000]


def linked_look(run: Run, token: Token, node) -> Next:
    """One look at a linked run (protocol above; owns its commits)."""
    link = LinkedRun.objects.filter(watch_token_id=token.pk).first()
    provider = run_providers.get(link.provider) if link is not None else None
    if link is None or provider is None:
        name = link.provider if link is not None else node.get("run_provider")
        block(
            run,
            token,
            "action_missing",
            f"No installed module registers the run provider {name!r}, so the linked run "
            f"of step '{token.node_id}' cannot be asked about. Install its module.",
        )
        return None
    descriptor, problem = _describe(run, provider, link.run_ref)
    fp = _fingerprint(descriptor) if descriptor is not None else ""
    # A run is refused while an integrity incident is open: a contradicted link seen here
    # had its incident resolved, and its recorded conclusion is set aside (step 6).
    reset = link.state == LinkedState.CONTRADICTED
    if not reset and descriptor is not None and link.concluded and fp != link.concluded:
        _contradicted(run, token, link, descriptor)
        return None
    with run.commit():
        if reset:
            _conclusion_reset(run, link)
        if descriptor is None:
            _look_later(run, token, link, provider, problem, state=None)
        elif descriptor.conclusive and link.concluded:
            _advance(run, token, node, link, descriptor)
        elif descriptor.conclusive:
            _concluded(run, token, link, descriptor, fp)
        else:
            _look_later(run, token, link, provider, descriptor.note, state=descriptor.state)
    return None


def _describe(run: Run, provider, ref: str) -> tuple[RunDescriptor | None, str]:
    """The other module's descriptor (outside any transaction), or None and why not."""
    try:
        with run.kept_alive():
            answer = provider.describe(ref)
    except Exception as exc:  # no answer is no information: look again later
        log.warning("describe of %s run %s raised %s", provider.name, ref, type(exc).__name__)
        return None, f"the other module did not answer ({type(exc).__name__})"
    if not isinstance(answer, RunDescriptor) or answer.state not in STATES:
        return None, "the other module's answer is not a run descriptor"
    try:
        input_guard(
            {"outputs": dict(answer.outputs), "reason_code": str(answer.reason_code)},
            max_bytes=payload_max_bytes(),
        )
    except (CanonicalError, TypeError, ValueError) as exc:
        return None, f"the other module's descriptor cannot be kept ({exc})"[:500]
    return answer, ""


def _fingerprint(descriptor: RunDescriptor) -> str:
    return fingerprint_value(FingerprintKind.RESULT, descriptor.fact())


def _link_update(run: Run, link: LinkedRun, **values: Any) -> None:
    fenced_update(LinkedRun.objects.filter(pk=link.pk), fence=run.fence, **values)
    for name, value in values.items():
        setattr(link, name, value)


def _described(run: Run, link: LinkedRun, state: str, fp: str) -> None:
    """A new state of the run, as a fact on the instance's chain (needs the caller's
    commit)."""
    fact_append(
        subject=run.subject,
        kind="linked_run.described",
        fact={"step": link.node_id, "state": state, "descriptor_fp": fp, "look": link.polls},
    )


def _look_later(run: Run, token: Token, link: LinkedRun, provider, note: str, *, state) -> None:
    """Not concluded (or no answer): look again after the backoff (needs the caller's
    commit); past the budget, also ask a person."""
    looks = link.polls + 1
    delay = min(provider.poll_backoff * (2.0 ** min(looks, 64)), provider.poll_max_delay, MAX_DELAY)
    changed = state is not None and state != link.state
    values: dict[str, Any] = {"polls": looks, "described_at": clock(), "note": note[:2000]}
    if state is not None:
        values["state"] = state
    _link_update(run, link, **values)
    if changed:
        _described(run, link, state, fingerprint_value(FingerprintKind.RESULT, {"state": state}))
    said = link.get_state_display() if state is not None else note
    run.update_token(
        token,
        TokenState.READY,
        poll=token.poll + 1,
        not_before=after_seconds(delay),
        reason=f"Linked run {link.run_ref}: {said}; looking again in {delay:g} s."[:2000],
    )
    if link.state == UNKNOWN_PUBLICATION:
        run.flush(status=InstanceStatus.BLOCKED, reason=unknown_publication_message(link, note))
    elif looks >= provider.poll_budget:
        message = (
            f"The linked run {link.run_ref} ({link.provider}) of step '{link.node_id}' has "
            f"not concluded after {looks} looks. GovFlow keeps looking every {delay:g} s; "
            "ask the other module what holds it up, or cancel the instance."
        )
        run.engine_incident_open(token, "linked_overdue", message, once=True)
        run.flush(status=InstanceStatus.BLOCKED, reason=message)
    else:
        # Derived (waiting); a handoff shown for an unknown publication ends with it.
        run.flush(reason="")


def _concluded(run: Run, token: Token, link: LinkedRun, descriptor: RunDescriptor, fp) -> None:
    """The first conclusive descriptor: recorded, then confirmed by a look at once
    (needs the caller's commit)."""
    _link_update(
        run,
        link,
        state=descriptor.state,
        outputs=dict(descriptor.outputs) if descriptor.state == LinkedState.SUCCEEDED else None,
        reason_code=str(descriptor.reason_code)[:200],
        note=str(descriptor.note)[:2000],
        concluded=fp,
        polls=link.polls + 1,
        described_at=clock(),
    )
    _described(run, link, descriptor.state, fp)
    run.update_token(
        token,
        TokenState.READY,
        poll=token.poll + 1,
        not_before=clock(),
        reason=(
            f"Linked run {link.run_ref} reports {descriptor.state}; confirming it with one "
            "more look before the workflow moves on."
        ),
    )
    run.flush(reason="")


def _advance(run: Run, token: Token, node, link: LinkedRun, descriptor: RunDescriptor) -> None:
    """The conclusive descriptor, confirmed: the workflow moves on (needs the caller's
    commit)."""
    _link_update(run, link, polls=link.polls + 1, described_at=clock())
    if descriptor.state == LinkedState.SUCCEEDED:
        output = dict(descriptor.outputs)
    elif node.get("on_failure") == "continue":
        output = {"state": "failed", "reason_code": str(descriptor.reason_code)[:200]}
    else:
        failure = Failed(
            f"the linked run {link.run_ref} ({link.provider}) failed: "
            f"{descriptor.reason_code or 'no reason code'}",
            permanent=True,
        )
        retry_or_fail(run, token, None, failure, expected=TokenState.READY, operation=None)
        return
    reason = f"Linked run {link.run_ref} {descriptor.state} (confirmed by a second look)."
    complete_with_output(run, token, node, output, expected=TokenState.READY, reason=reason)


def _contradicted(run: Run, token: Token, link: LinkedRun, descriptor: RunDescriptor) -> None:
    """A descriptor that contradicts the recorded conclusive one (owns its commits): an
    integrity incident, outside any transaction so that it stays, and the instance
    blocked; nothing advances."""
    was = link.get_state_display() if link.state in CONCLUSIVE else "conclusive"
    reason = (
        f"the linked run {link.run_ref} ({link.provider}) of step '{link.node_id}' was "
        f"reported {link.state} before and now reports {descriptor.state}"
        + (" with other outputs" if descriptor.state == link.state else "")
        + ": the other module contradicts its own conclusive answer"
    )
    log.error("instance %s: %s (was %s)", run.instance.pk, reason, was)
    incident = incident_report(subject=run.subject, reason=reason)
    run.integrity_incident = incident.pk
    with run.commit():
        _link_update(run, link, state=LinkedState.CONTRADICTED, note=reason[:2000])
    block(run, token, "integrity", incident_message(incident.pk, reason))


def _conclusion_reset(run: Run, link: LinkedRun) -> None:
    """Set a contradicted run's recorded conclusion aside after its incident was resolved
    (needs the caller's commit): chained, so the one set aside stays on record."""
    fact_append(
        subject=run.subject,
        kind="linked_run.conclusion_reset",
        fact={"step": link.node_id, "set_aside_fp": link.concluded, "look": link.polls},
    )
    _link_update(run, link, state=LinkedState.STARTED, concluded="", outputs=None, reason_code="")


# -- cancel ------------------------------------------------------------------------------


def linked_cancel_record(run: Run) -> list[tuple[str, str]]:
    """The instance is being cancelled: note that its unconcluded linked runs are to be
    cancelled too (needs the caller's commit: the cancel's). Returns ``(provider, run)``
    pairs for :func:`linked_cancel_send`, to call once the cancel is durable."""
    links = LinkedRun.objects.filter(
        instance_id=run.instance.pk, cancel_requested_at__isnull=True
    ).exclude(state__in=CONCLUSIVE)
    asked = []
    for link in links:
        _link_update(run, link, cancel_requested_at=clock())
        fact_append(
            subject=run.subject,
            kind="linked_run.cancel_requested",
            fact={"step": link.node_id, "provider": link.provider},
        )
        asked.append((link.provider, link.run_ref))
    return asked


def linked_cancel_send(asked: list[tuple[str, str]]) -> None:
    """Ask each other module to stop its run (outside any transaction). What it does is
    its own: its answer is logged, never taken as an outcome of the workflow."""
    for name, ref in asked:
        provider = run_providers.get(name)
        if provider is None:
            log.warning("cannot cancel run %s: no run provider %r is installed", ref, name)
            continue
        try:
            provider.cancel(ref)
        except Exception as exc:  # the cancel stands; the other module keeps its own record
            log.warning("cancel of %s run %s raised %s", name, ref, type(exc).__name__)
