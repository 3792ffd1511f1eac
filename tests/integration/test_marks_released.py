"""A run's chain mark lives as long as its lease (ADR 0034, 0076): released, it is forgotten.

A mark is bound to its run's lease (key, holder, fence); a new run takes a new fence, so a
released run's mark can serve nobody, and a mark may hold its whole chain's rows. Both
databases.
"""

from __future__ import annotations

import contextlib

import pytest
from django.db import transaction

from recovery import api, chain
from recovery.models import Lease
from recovery.testing import live_fence, new_subject, record

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_mark_is_forgotten_when_the_release_commits_not_when_it_rolls_back():
    """Releasing a run's lease forgets its mark once the releasing commit commits; a
    commit that released it and rolled back leaves the lease, and so the mark, the run's."""
    subject = new_subject()
    fence = live_fence(subject)
    record(subject, fence=fence)
    mark = chain.Mark(subject, 0, "0" * 64)  # as a run's first verification keeps one
    chain.mark_keep(fence, mark)

    class Undone(Exception):
        pass

    with contextlib.suppress(Undone), transaction.atomic():
        api.lease_release(fence=fence)
        assert chain.mark_peek(fence) is mark  # not before the commit
        raise Undone
    assert chain.mark_peek(fence) is mark
    assert Lease.objects.get(key=fence.key).holder == fence.holder
    api.lease_release(fence=fence)
    assert chain.mark_peek(fence) is None
