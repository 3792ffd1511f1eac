"""A compensation whose provider answered ``Pending``: when it is polled, and how long
past its budget it may not be (``saga``, protocol step 4).

Like a pending step (``settle._poll_later``) the provider owns the outcome: the saga
records it ``pending`` with the time of its next poll and marks the instance runnable for
then, in one commit, and the run stops there. The delay is the provider's ``poll_after``,
doubled per poll (at most ``settle.MAX_DELAY``). A ``Pending`` answer past
``Compensate.poll_budget`` polls is not recorded pending: the saga records the
compensation's outcome unknown, a handoff, like an ``Unknown`` answer.
"""

from __future__ import annotations

from recovery.api import CompensationView, compensation_pending

from ..db import clock_read, engine_commit
from ..queue import instance_mark_runnable_after
from ..registry import Compensate
from ..results import Pending
from .run import Run
from .settle import MAX_DELAY

__all__ = ["poll_delay", "poll_due_or_marked", "poll_later"]


def poll_delay(result: Pending, *, polls: int) -> float:
    """Seconds before the next poll: the provider's ``poll_after`` doubled per poll made
    (``result_admitted`` already refused a ``poll_after`` that is not a number)."""
    delay = max(0.0, float(result.poll_after))
    return min(delay * (2.0 ** min(polls, 32)), MAX_DELAY)


def poll_later(run: Run, key: str, result, spec: Compensate, *, polls: int) -> bool:
    """Record a pending compensation and mark its next poll (own commit); False, writing
    nothing, when ``result`` is no ``Pending`` or the poll budget is spent."""
    if not isinstance(result, Pending) or polls >= spec.poll_budget:
        return False
    delay = poll_delay(result, polls=polls)
    with engine_commit():
        compensation_pending(key=key, fence=run.fence, poll_after=delay)
        instance_mark_runnable_after(run.instance.pk, delay)
    return True


def poll_due_or_marked(run: Run, view: CompensationView) -> bool:
    """Whether the pending compensation's next poll is due now; if not, make sure the
    instance is marked for then (own commit: a claim taken early clears the run's mark)."""
    if view.not_before is None:
        return True
    wait = (view.not_before - clock_read()).total_seconds()
    if wait <= 0:
        return True
    with engine_commit():
        instance_mark_runnable_after(run.instance.pk, wait)
    return False
