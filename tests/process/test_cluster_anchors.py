"""A real ``qcluster``'s sweeper anchors the ledger outside the database on its own.

It appends the heads of the chains that changed, writes nothing while nothing changes,
and notices within its interval when the database lost what it anchored (a restored
older backup): it opens the ledger incident and appends nothing more.
"""

from __future__ import annotations

import json

import pytest

from recovery import api
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.testing import live_fence, new_subject, record

from .support import wait_for, wait_until_sweeping

pytestmark = pytest.mark.django_db(transaction=True)


def heads_anchored(path) -> list[list]:
    if not path.exists():
        return []
    return [head for line in path.read_bytes().splitlines() for head in json.loads(line)["heads"]]


def test_the_clusters_sweeper_anchors_on_its_own_and_stops_at_a_restored_database(workspace):
    path = workspace.tmp_path / "anchors" / "ledger.anchors"
    cluster = workspace.start_cluster(GOVFLOW_ANCHOR_PATH=str(path), GOVFLOW_ANCHOR_INTERVAL="0.5")
    wait_until_sweeping(cluster)

    subject = new_subject()
    fence = live_fence(subject)
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="succeeded", fence=fence)
    newest = Checkpoint.objects.order_by("-id").first()
    expected = [subject.type, subject.id, 2, newest.link]
    wait_for(
        lambda: expected in heads_anchored(path),
        timeout=20,
        what="the sweeper to anchor the new chain head",
        explain=cluster.log_tail,
    )
    written = path.read_bytes()

    # "Restore a backup" from before that step: the sweeper must not anchor on top of it.
    Checkpoint.objects.filter(subject_id=subject.id).delete()
    Operation.objects.filter(key=op.key).delete()
    incident = wait_for(
        lambda: IntegrityIncident.objects.filter(
            subject_type=api.LEDGER.type, subject_id=api.LEDGER.id, status="open"
        ).first(),
        timeout=20,
        what="the sweeper to open the ledger incident",
        explain=cluster.log_tail,
    )
    assert incident.reason.startswith(f"checkpoint {newest.pk}, the newest when anchored at ")
    wait_for(
        lambda: "Not anchored: checkpoint" in cluster.log_path.read_text(errors="replace"),
        timeout=20,
        what="the sweeper to log why it stopped anchoring",
        explain=cluster.log_tail,
    )
    assert path.read_bytes() == written
