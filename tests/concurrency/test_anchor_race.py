"""Anchors taken while writers commit on PostgreSQL: out-of-order commits miss nothing.

On PostgreSQL a checkpoint's id is taken when it is inserted, but transactions commit in
any order, so an anchor can see id n + 1 before id n. The anchors remember the ids they
skipped and pick them up when they appear (``recovery/services/anchors.py``). Here writers
hold their transactions open for a random moment after inserting, while two threads
anchor as fast as they can; at the end every checkpoint is counted and every chain's head
is anchored, and the anchor chain the two threads wrote verifies.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import transaction

from recovery import api
from recovery.models import Checkpoint
from recovery.testing import live_fence, new_subject, record
from tests.concurrency.test_lease_race import run_threads

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

WRITERS = 4
ROUNDS = 25


def test_anchors_taken_while_writers_commit_out_of_order_miss_no_checkpoint(anchor_path):
    subjects = [new_subject() for _ in range(WRITERS)]
    done = threading.Event()
    writing = threading.Barrier(WRITERS + 2)

    def write(subject) -> int:
        fence = live_fence(subject, holder=f"writer-{subject.id}", ttl=300)
        writing.wait()
        for _ in range(ROUNDS):
            with transaction.atomic():
                op = record(subject, fence)
                api.operation_observe(key=op.key, state="failed", fence=fence)
                time.sleep(random.uniform(0, 0.02))  # commit after others took later ids
        return ROUNDS

    def anchor() -> int:
        writing.wait()
        appended = 0
        while not done.is_set():
            appended += len(api.anchor_append().records)
        return appended

    def writers() -> list[int]:
        try:
            return run_threads([lambda s=s: write(s) for s in subjects])
        finally:
            done.set()

    anchored = run_threads([anchor, anchor, writers])
    assert anchored[0] > 0 and anchored[1] > 0  # both anchored while the writers wrote

    while api.anchor_append().records:  # what committed after the last anchor
        pass
    index = api.anchors_load()
    assert index.problem is None
    assert index.latest.ledger.count == Checkpoint.objects.count() == WRITERS * ROUNDS * 2
    for subject in subjects:
        newest = Checkpoint.objects.filter(subject_id=subject.id).order_by("-seq").first()
        assert (index.head(subject).seq, index.head(subject).link) == (newest.seq, newest.link)
    assert api.anchors_verify().failures == ()
