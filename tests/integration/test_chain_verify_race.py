"""A commit that lands between ``chain_verify``'s reads is never taken for tampering.

The checkpoints and the operation rows are read by separate statements; a live instance's
step committed between them shows operation rows past the checkpoints read. Verification
reads again when the chain's head moved meanwhile, and concludes only on a still chain.
"""

import pytest

from recovery import api
from recovery.chain import verify
from recovery.models import IntegrityIncident
from recovery.testing import chained_step, live_fence, new_subject, record

pytestmark = pytest.mark.django_db(transaction=True)


def live_chain():
    """A subject mid-run: its lease held, its last operation dispatched."""
    subject = new_subject()
    fence = live_fence(subject, holder=f"w-{subject.id}")
    op = chained_step(subject, fence, record(subject, fence))
    return subject, fence, op


def racing(monkeypatch, subject, fence, op, times: int):
    """The instance commits a step right after each of the first ``times`` checkpoint reads."""
    real, steps = verify.load_checkpoints, []

    def load_then_commit(cursor, of, *args, **kwargs):
        rows = real(cursor, of, *args, **kwargs)
        if len(steps) < times:
            steps.append(chained_step(subject, fence, steps[-1] if steps else op))
        return rows

    monkeypatch.setattr(verify, "load_checkpoints", load_then_commit)
    return steps


def test_a_step_committed_between_the_reads_is_read_again_not_reported(monkeypatch):
    subject, fence, op = live_chain()
    steps = racing(monkeypatch, subject, fence, op, times=1)
    result, incident = api.subject_verify(subject=subject, anchors=False)
    assert len(steps) == 1
    assert result.ok, result.reason
    assert incident is None
    assert not IntegrityIncident.objects.exists()


def test_a_chain_that_never_stands_still_concludes_nothing(monkeypatch):
    subject, fence, op = live_chain()
    racing(monkeypatch, subject, fence, op, times=verify.VERIFY_ATTEMPTS)
    with pytest.raises(api.ChainConflict, match="kept changing while it was verified"):
        api.subject_verify(subject=subject, anchors=False)
    assert not IntegrityIncident.objects.exists()
