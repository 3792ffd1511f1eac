"""Anchors outside the database: truncation, rollback and rewrites are incidents.

Each test has its own anchor file (``anchor_path`` in ``tests/conftest.py``), in a folder
that does not exist yet. The attacks are made the way someone with write access to the
database would: the newest checkpoints and the operation rows that point at them are
removed together, so that what is left verifies on its own.
"""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from govflow.engine.services.sweep import Sweeper
from recovery import api
from recovery.chain import compute_link
from recovery.checks import check_anchor_store
from recovery.keys import chain_keys
from recovery.models import AnchorMark, Checkpoint, IntegrityIncident, Operation
from recovery.subjects import Subject
from recovery.testing import live_fence, new_subject, record
from tests.engine_helpers import user_with

pytestmark = pytest.mark.django_db


def make_subject(*states: str, subject: Subject | None = None) -> tuple[Subject, list[str]]:
    """A subject with one recorded-and-observed operation per state (two checkpoints each)."""
    subject = subject or new_subject()
    fence = live_fence(subject, holder=f"worker-{subject.id}")
    keys = []
    for state in states:
        op = record(subject, fence)
        api.operation_observe(key=op.key, state=state, fence=fence)
        keys.append(op.key)
    api.lease_release(fence=fence)
    return subject, keys


def checkpoints(subject: Subject):
    return Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)


def head(subject: Subject) -> list:
    cp = checkpoints(subject).order_by("-seq").first()
    return [subject.type, subject.id, cp.seq, cp.link]


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def verify(*args: str) -> tuple[int, list[str]]:
    out = StringIO()
    try:
        call_command("recovery_verify", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def truncate(subject: Subject, keep: int, *operation_keys: str) -> None:
    """Remove the chain's checkpoints after ``keep`` and the rows that point at them."""
    checkpoints(subject).filter(seq__gt=keep).delete()
    Operation.objects.filter(key__in=operation_keys).delete()


def open_incident(subject: Subject) -> IntegrityIncident:
    return IntegrityIncident.objects.get(
        subject_type=subject.type, subject_id=subject.id, status="open"
    )


def sweep_once() -> Sweeper:
    sweeper = Sweeper(holder="sweeper-test")
    sweeper.run(duration=0)
    assert sweeper.ended == "duration"
    return sweeper


# The sweeper anchors on its own


def test_the_sweeper_anchors_what_changed_and_nothing_when_nothing_did(anchor_path, settings):
    settings.RECOVERY_ANCHOR_INTERVAL = 0
    assert not anchor_path.parent.exists()
    first, _ = make_subject("succeeded", "failed")
    sweep_once()

    assert anchor_path.parent.is_dir()  # the missing folder was created
    (one,) = records(anchor_path)
    newest = Checkpoint.objects.order_by("-id").first()
    assert one["n"] == 1 and one["mode"] == "incremental"
    assert one["heads"] == [head(first)]
    assert one["ledger"] == {"checkpoint": newest.pk, "tip": newest.link, "count": 4}
    assert AnchorMark.objects.get(store=str(anchor_path)).record == 1

    before = anchor_path.read_bytes()
    sweep_once()
    sweep_once()
    assert anchor_path.read_bytes() == before  # nothing changed: nothing written

    second, _ = make_subject("outcome_unknown")
    sweep_once()
    assert [r["heads"] for r in records(anchor_path)] == [[head(first)], [head(second)]]
    assert records(anchor_path)[1]["ledger"]["count"] == 6


def test_the_sweeper_anchors_at_most_once_per_interval(anchor_path, settings):
    settings.RECOVERY_ANCHOR_INTERVAL = 3600
    make_subject("succeeded")
    sweep_once()
    make_subject("succeeded")
    sweep_once()
    assert len(records(anchor_path)) == 1


def test_anchors_are_bounded_per_record_and_catch_up(anchor_path, settings):
    settings.RECOVERY_ANCHOR_BATCH = 4
    subjects = [make_subject("succeeded")[0] for _ in range(3)]  # six checkpoints
    first = api.anchor_if_due()
    assert first.more and [r.ledger.count for r in first.records] == [4]
    second = api.anchor_if_due()  # due at once while a batch was full
    assert not second.more and [r.ledger.count for r in second.records] == [6]
    assert api.anchor_if_due() is None  # then it waits for the interval

    result = api.anchor_append(full=True)
    assert [r.mode for r in result.records] == ["full"]  # nothing new; every head
    assert [list(h) for h in result.records[0].heads] == sorted(head(s) for s in subjects)
    assert records(anchor_path)[-1]["ledger"]["count"] == 6


def test_a_checkpoint_that_commits_below_the_anchored_id_is_anchored_when_it_appears(
    anchor_path,
):
    # On PostgreSQL a lower id can commit after a higher one was anchored: the anchors
    # keep the skipped ids and look for them again. Here the row is held back by hand.
    late, _ = make_subject("succeeded")
    early, _ = make_subject("succeeded")
    held = checkpoints(late).get(seq=2)
    Checkpoint.objects.filter(pk=held.pk).delete()
    first = api.anchor_append().records[0]
    assert (held.pk, held.pk) in [gap[:2] for gap in first.gaps]
    assert first.ledger.count == 3

    held.save(force_insert=True)  # it "commits" now, with its old id
    second = api.anchor_append().records[0]
    assert second.heads == ((late.type, late.id, 2, held.link),)
    assert not [gap for gap in second.gaps if gap[0] <= held.pk <= gap[1]]
    assert second.ledger.count == 4
    assert second.ledger.checkpoint == first.ledger.checkpoint == checkpoints(early).get(seq=2).pk


# Truncation, rollback and rewrites


def test_a_truncated_chain_with_its_rows_rolled_back_is_an_incident_after_an_anchor():
    subject, (_, last) = make_subject("succeeded", "failed")
    anchored = api.anchor_append().records[0]
    truncate(subject, 2, last)
    assert api.chain_verify(subject).ok  # what is left verifies on its own

    result, incident = api.subject_verify(subject=subject)
    reason = (
        f"the chain ends at #2 but #4 was anchored at {anchored.at} (anchor record #1): "
        f"checkpoints were removed since anchored at {anchored.at}"
    )
    assert (result.ok, result.position, result.reason) == (False, 3, reason)
    assert incident == open_incident(subject) and incident.reason == reason

    code, lines = verify()
    assert code == 1
    assert f"BROKEN {subject} at #3: {reason} (incident {incident.pk})" in lines
    code, lines = verify("--no-anchors")
    assert (code, lines[-2]) == (0, "Anchors: not compared (--no-anchors).")


def test_a_truncated_chain_is_not_resolved_while_it_is_shorter_than_anchored(
    resolver, second_resolver
):
    subject, (_, last) = make_subject("succeeded", "failed")
    api.anchor_append()
    truncate(subject, 2, last)
    incident = api.subject_verify(subject=subject)[1]
    code, lines = verify(
        "--resolve", "--by", "rita", "--rationale", "Looks fine.", "--subject", str(subject)
    )
    assert code == 1 and not any(line.startswith("REQUESTED") for line in lines)
    with pytest.raises(api.IncidentError) as exc:
        api.incident_resolve_request(
            incident_id=incident.pk, requested_by=resolver, rationale="Looks fine."
        )
    assert f"the chain of {subject} is still broken at checkpoint #3: the chain ends at #2" in (
        str(exc.value)
    )
    check = api.incident_reverify(incident=incident)
    assert not check.ok and "removed since anchored" in check.reason
    assert open_incident(subject).pk == incident.pk


def test_a_subject_removed_altogether_is_found_through_its_anchor():
    gone, keys = make_subject("succeeded")
    make_subject("failed")
    api.anchor_append()
    truncate(gone, 0, *keys)
    code, lines = verify()
    assert code == 1
    assert any(
        line.startswith(f"BROKEN {gone} at #1: the chain ends at #0 but #2 was anchored at ")
        for line in lines
    )


def test_a_chain_rewritten_with_the_key_after_its_anchor_is_an_incident():
    subject, _ = make_subject("succeeded", "outcome_unknown")
    anchored = api.anchor_append().records[0]
    # Someone who holds the chain key rewrites checkpoint #2 (a field no row repeats) and
    # re-links everything after it: the chain verifies, but its head is not the anchored one.
    keys = chain_keys()
    prev = checkpoints(subject).get(seq=1).link
    for cp in checkpoints(subject).filter(seq__gte=2).order_by("seq"):
        fact = cp.fact.replace('"by_fence":1', '"by_fence":7') if cp.seq == 2 else cp.fact
        fact_fp = api.fingerprint(api.FingerprintKind.FACT, fact.encode())
        link = compute_link(keys.keys[cp.key_id], subject, cp.seq, cp.kind, fact_fp, prev)
        checkpoints(subject).filter(pk=cp.pk).update(
            fact=fact, fact_fp=fact_fp, prev_link=prev, link=link
        )
        prev = link
    assert api.chain_verify(subject).ok

    result, _ = api.subject_verify(subject=subject)
    assert (result.ok, result.position) == (False, 4)
    assert result.reason == (
        f"checkpoint #4 is not the one anchored at {anchored.at} (anchor record #1): the "
        f"chain was rewritten since anchored at {anchored.at}"
    )


def set_checkpoint_sequence(last_id: int) -> None:
    """Set the id sequence as a restored backup has it: the next id is ``last_id + 1``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence('recovery_checkpoint', 'id'), %s)",
                [last_id],
            )
        else:
            cursor.execute(
                "UPDATE sqlite_sequence SET seq = %s WHERE name = 'recovery_checkpoint'",
                [last_id],
            )


def test_a_database_restored_from_an_older_backup_is_an_incident(anchor_path, caplog):
    a, _ = make_subject("succeeded")
    b, _ = make_subject("failed")
    backup = Checkpoint.objects.order_by("-id").first().pk  # the backup is taken here
    api.anchor_append()
    (_, (a_late,)), (_, (b_late,)) = (
        make_subject("succeeded", subject=a),
        make_subject("outcome_unknown", subject=b),
    )
    c, c_keys = make_subject("succeeded")
    anchored = api.anchor_append().records[0]
    newest = anchored.ledger.checkpoint

    # The restore: every checkpoint and operation after the backup is gone, and so is the
    # sequence's progress. Each chain left verifies on its own.
    Checkpoint.objects.filter(pk__gt=backup).delete()
    Operation.objects.filter(key__in=[a_late, b_late, *c_keys]).delete()
    set_checkpoint_sequence(backup)
    assert all(api.chain_verify(s).ok for s in (a, b, c))

    code, lines = verify()
    assert code == 1
    ledger = open_incident(api.LEDGER)
    assert (
        f"BROKEN recovery.ledger:watermark: checkpoint {newest}, the newest when anchored at "
        f"{anchored.at} (anchor record #2), is missing: the database was restored from an "
        f"older backup, or checkpoints were removed (incident {ledger.pk})"
    ) in lines
    for subject in (a, b, c):
        assert open_incident(subject).reason.endswith(f"since anchored at {anchored.at}")
    assert lines[-1] == "3 chain(s) verified, 3 broken; the anchors show 1 problem(s) (above)."

    # The sweeper does not anchor on top of the loss, and says why.
    before = anchor_path.read_bytes()
    with caplog.at_level(logging.ERROR, logger="recovery.anchors"):
        assert api.anchor_if_due() is None
    assert anchor_path.read_bytes() == before
    assert f"Not anchored: checkpoint {newest}, the newest when anchored" in caplog.text

    # No new effect is dispatched while the whole ledger's incident is open.
    with pytest.raises(api.IntegrityIncidentOpen, match="on the whole ledger"):
        make_subject("succeeded")
    # Facts that are not effects still take the lost ids again: not the anchored ones.
    while Checkpoint.objects.order_by("-id").first().pk < newest:
        api.projection_record(
            subject=new_subject(), projection_fp=api.projection_fingerprint({"after": "restore"})
        )
    result = api.subject_verify(subject=api.LEDGER)[0]
    assert result.reason.startswith(
        f"checkpoint {newest} is not the one anchored at {anchored.at} (anchor record #2): "
        "the database was restored from an older backup (its ids were reused)"
    )


def test_checkpoints_removed_below_the_anchored_one_are_counted(anchor_path):
    old, keys = make_subject("succeeded")
    make_subject("failed")
    anchored = api.anchor_append().records[0]
    truncate(old, 0, *keys)
    result = api.subject_verify(subject=api.LEDGER)[0]
    assert result.reason == (
        f"2 checkpoint(s) up to {anchored.ledger.checkpoint} remain, but 4 were anchored at "
        f"{anchored.at} (anchor record #1): 2 were removed"
    )


def test_after_a_deliberate_restore_the_anchors_are_restarted_on_purpose(
    anchor_path, resolver, second_resolver
):
    subject, (_, last) = make_subject("succeeded", "failed")
    api.anchor_append()
    truncate(subject, 2, last)  # the restore
    assert verify()[0] == 1
    with pytest.raises(api.RevisionRollback):
        api.anchor_append()

    # Moved aside (and kept): the database still remembers the old anchors.
    anchor_path.rename(anchor_path.with_suffix(".before-restore"))
    code, lines = verify("--anchor")
    assert code == 1
    assert lines[-1].startswith(
        "NOT ANCHORED: Not anchored: the database remembers appending anchor record #1 (at "
    )
    code, lines = verify("--anchor", "--restart-anchors")
    assert code == 1  # the incidents are still open
    assert lines[-2] == f"RESTARTED the anchors in {anchor_path}: the database forgot the old ones."
    # The subject's chain and the rights trail (the resolvers' permissions are recorded).
    assert lines[-1].startswith(
        f"ANCHORED the heads of 2 chain(s) in record(s) #1-#2 of {anchor_path}"
    )

    code, lines = verify("--resolve", "--by", "rita", "--rationale", "Restored the backup.")
    assert code == 0, lines
    requested = [line for line in lines if line.startswith("REQUESTED resolution")]
    # The chain's, the ledger's, and the store's (opened while the file was moved aside).
    assert sorted(line.split(" on ")[1].split(":")[0] for line in requested) == [
        "recovery.anchors",
        "recovery.ledger",
        subject.type,
    ]
    for incident in IntegrityIncident.objects.filter(status="open"):
        assert verify("--approve", str(incident.pk), "--by", "rob")[0] == 0
    assert not IntegrityIncident.objects.filter(status="open").exists()


# The anchor store itself


def three_records(anchor_path) -> list[bytes]:
    for state in ("succeeded", "failed", "outcome_unknown"):
        make_subject(state)
        api.anchor_append()
    lines = anchor_path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    return lines


def _edit(line: bytes) -> bytes:
    body = json.loads(line)
    body["ledger"]["count"] += 5
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _resign(line: bytes) -> bytes:
    from blake3 import blake3

    body = json.loads(line)
    body["ledger"]["count"] += 5
    body.update(key_id="forged")
    del body["link"]
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    body["link"] = blake3(b"recovery:v1:anchor-record\x00" + data, key=b"\x33" * 32).hexdigest()
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


TAMPERING = {
    "edited": (
        lambda lines: [lines[0], _edit(lines[1]), lines[2]],
        "at #2: anchor record #2 does not verify with key 'test2' (the line was edited, or "
        "written without the key)",
    ),
    "re-signed": (
        lambda lines: [lines[0], _resign(lines[1]), lines[2]],
        "at #2: anchor record #2 names an unknown chain key 'forged'",
    ),
    "not canonical": (
        lambda lines: [lines[0], lines[1].replace(b",", b", ", 1), lines[2]],
        "at #2: anchor record #2 is not canonical JSON (the line was edited)",
    ),
    "middle deleted": (
        lambda lines: [lines[0], lines[2]],
        "at #2: anchor record #2 says it is record #3 (records were removed or reordered)",
    ),
    "swapped": (
        lambda lines: [lines[1], lines[0], lines[2]],
        "at #1: anchor record #1 says it is record #2",
    ),
    "last deleted": (
        lambda lines: lines[:2],
        "at #3: the database remembers appending anchor record #3 (at ",
    ),
    "emptied": (lambda lines: [], "at #1: the database remembers appending anchor record #3"),
    "nested": (
        lambda lines: [lines[0], b"[" * 100_000 + b"]" * 100_000 + b"\n", lines[2]],
        "at #2: anchor record #2 is not canonical JSON (the line was edited)",
    ),
    "cut off": (
        lambda lines: [*lines[:2], lines[2][:-20]],
        "at #3: anchor record #3 is incomplete (no newline: a write was cut off, or the "
        "file was edited)",
    ),
}


@pytest.mark.parametrize("how", TAMPERING)
def test_a_tampered_anchor_store_is_an_incident(anchor_path, how):
    change, message = TAMPERING[how]
    anchor_path.write_bytes(b"".join(change(three_records(anchor_path))))
    code, lines = verify()
    assert code == 1
    incident = open_incident(api.ANCHOR_STORE)
    line = next(line for line in lines if line.startswith("BROKEN recovery.anchors:store"))
    assert line.startswith(f"BROKEN recovery.anchors:store {message}"), line
    assert line.endswith(f"(incident {incident.pk})")


@pytest.mark.parametrize("how", ["edited", "last deleted", "emptied", "cut off"])
def test_nothing_is_chained_onto_a_store_whose_end_does_not_verify(anchor_path, how):
    change, _ = TAMPERING[how]
    lines = three_records(anchor_path)
    lines = [*lines[:2], _edit(lines[2])] if how == "edited" else change(lines)
    anchor_path.write_bytes(b"".join(lines))
    make_subject("succeeded")
    with pytest.raises(api.AnchorStoreError):
        api.anchor_append()
    assert anchor_path.read_bytes() == b"".join(lines)


def test_records_signed_under_a_retired_key_verify_while_the_key_is_kept(anchor_path):
    old, new = "old:" + "aa" * 32, "new:" + "bb" * 32
    with override_settings(RECOVERY_CHAIN_KEYS=old):
        make_subject("succeeded")
        api.anchor_append()
    with override_settings(RECOVERY_CHAIN_KEYS=f"{new},{old}"):
        make_subject("succeeded")
        api.anchor_append()
        assert [r["key_id"] for r in records(anchor_path)] == ["old", "new"]
        assert verify()[0] == 0
    with override_settings(RECOVERY_CHAIN_KEYS=new):
        index = api.anchors_load()
        assert index.problem == (1, "anchor record #1 names an unknown chain key 'old'")


# Configuration


def test_an_unwritable_anchor_path_is_a_clear_error_a_check_warning_and_no_stop(
    tmp_path, settings, caplog
):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.RECOVERY_ANCHOR_PATH = str(blocker / "ledger.anchors")
    make_subject("succeeded")

    with pytest.raises(api.AnchorStoreError) as exc:
        api.anchor_append()
    assert str(exc.value).startswith(
        f"Cannot open the anchor file {blocker / 'ledger.anchors'}: {blocker} is not a "
        "folder. GovFlow appends chain anchors there to detect a truncated chain or a "
        "restored old database; until it can, nothing is anchored."
    )
    assert "set GOVFLOW_ANCHOR_PATH (RECOVERY_ANCHOR_PATH) to a writable place" in str(exc.value)

    (warning,) = check_anchor_store(None)
    assert warning.id == "recovery.W002"
    assert warning.msg == (
        f"Anchors cannot be appended to {blocker / 'ledger.anchors'}: {blocker} is not a folder."
    )

    with caplog.at_level(logging.ERROR, logger="recovery.anchors"):
        sweeper = sweep_once()  # the sweep goes on
    assert sweeper.stats["passes"] == 1
    assert "Cannot open the anchor file" in caplog.text


def test_a_writable_path_passes_the_check_and_anchors_can_be_turned_off(settings):
    assert check_anchor_store(None) == []
    settings.RECOVERY_ANCHOR_STORE = None
    (warning,) = check_anchor_store(None)
    assert warning.id == "recovery.W003"
    make_subject("succeeded")
    assert api.anchor_if_due() is None
    code, lines = verify()
    assert code == 0 and lines[-2].startswith("Anchors: turned off")


def test_recovery_verify_anchor_appends_a_full_anchor_and_says_so(anchor_path):
    first, _ = make_subject("succeeded")
    second, _ = make_subject("failed")
    code, lines = verify("--anchor")
    newest = Checkpoint.objects.order_by("-id").first().pk
    assert code == 0
    assert lines[-1] == (
        f"ANCHORED the heads of 2 chain(s) in record(s) #1-#2 of {anchor_path} "
        f"(ledger: checkpoint {newest}, 4 checkpoint(s))."
    )
    assert [r["mode"] for r in records(anchor_path)] == ["incremental", "full"]
    assert records(anchor_path)[1]["heads"] == sorted([head(first), head(second)])
    code, lines = verify()
    at = records(anchor_path)[1]["at"]
    assert (code, lines[-2]) == (
        0,
        f"Anchors: compared with 2 record(s) in {anchor_path} (newest #2 at {at}).",
    )


def test_the_incident_page_shows_a_truncated_chain_still_broken_against_its_anchor(
    client, django_user_model
):
    subject, (_, last) = make_subject("succeeded", "failed")
    anchored = api.anchor_append().records[0]
    truncate(subject, 2, last)
    incident = api.subject_verify(subject=subject)[1]
    ledger = api.subject_verify(subject=api.LEDGER)[1]
    client.force_login(user_with(django_user_model, "rita", "recovery.view_integrityincident"))
    html = client.get(
        reverse("admin:recovery_integrityincident_change", args=[incident.pk])
    ).content.decode()
    assert (
        "Still broken at checkpoint #3: the chain ends at #2 but #4 was anchored at "
        f"{anchored.at} (anchor record #1)"
    ) in html
    html = client.get(
        reverse("admin:recovery_integrityincident_change", args=[ledger.pk])
    ).content.decode()
    assert f"Still broken: checkpoint {anchored.ledger.checkpoint}, the newest when" in html
