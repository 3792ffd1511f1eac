"""The keyed checkpoint chain detects every kind of tampering, and blocks success until fixed.

Each test builds a subject with three operations (succeeded, outcome_unknown, failed: six
checkpoints), tampers with the stored rows the way an attacker with database access
would, and checks that verification names the broken position and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from blake3 import blake3
from django.db import transaction
from django.test import override_settings

from recovery import api
from recovery.canonical import FingerprintKind, canonical_bytes, fingerprint
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.subjects import Subject
from recovery.testing import record

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Built:
    subject: Subject
    succeeded: str
    unknown: str
    failed: str


def build(subject: Subject, fence: api.Fence) -> Built:
    """#1-#2 succeeded, #3-#4 outcome_unknown, #5-#6 failed."""
    keys = []
    for step, state in (
        ("notify", "succeeded"),
        ("register", "outcome_unknown"),
        ("pay", "failed"),
    ):
        op = record(subject, fence, step_id=step)
        api.operation_observe(key=op.key, state=state, fence=fence, result={"step": step})
        keys.append(op.key)
    built = Built(subject, *keys)
    assert api.chain_verify(subject) == api.Verification(subject, True, 6)
    return built


@pytest.fixture
def chain(subject, fence) -> Built:
    return build(subject, fence)


def checkpoints(subject: Subject):
    return Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)


def fact_of(subject: Subject, seq: int) -> str:
    return checkpoints(subject).get(seq=seq).fact


def rewrite(fact: str, old: str, new: str) -> str:
    forged = fact.replace(old, new, 1)
    assert forged != fact, f"{old} is not in {fact}"
    return forged


def broken_at(subject: Subject, position: int, reason: str, **kwargs) -> api.Verification:
    result = api.chain_verify(subject, **kwargs)
    assert not result.ok, "tampering went unnoticed"
    assert result.position == position, str(result)
    assert reason in result.reason, str(result)
    assert str(result).startswith(f"{subject}: BROKEN at #{position}: ")
    return result


# (a) a checkpoint's fact changed


def test_a_rewritten_fact_is_detected_by_its_fingerprint(chain):
    s = chain.subject
    forged = rewrite(fact_of(s, 4), '"outcome_unknown"', '"succeeded"')
    checkpoints(s).filter(seq=4).update(fact=forged)
    broken_at(s, 4, "checkpoint #4's fact does not match its fingerprint (the fact was changed)")


def test_a_rewritten_fact_with_a_recomputed_fingerprint_fails_the_keyed_link(chain):
    s = chain.subject
    forged = rewrite(fact_of(s, 4), '"outcome_unknown"', '"succeeded"')
    checkpoints(s).filter(seq=4).update(
        fact=forged, fact_fp=fingerprint(FingerprintKind.FACT, forged.encode())
    )
    broken_at(
        s,
        4,
        "checkpoint #4's link does not verify with key 'test2' (rewritten or "
        "re-hashed without the key)",
    )


def test_a_fact_that_is_no_longer_canonical_json_is_detected(chain):
    s = chain.subject
    checkpoints(s).filter(seq=2).update(fact=rewrite(fact_of(s, 2), ",", ", "))
    broken_at(s, 2, "checkpoint #2's fact is not canonical JSON")


# (b) a middle checkpoint deleted


@pytest.mark.parametrize("seq", [1, 3, 5])
def test_a_deleted_checkpoint_is_reported_missing(chain, seq):
    checkpoints(chain.subject).filter(seq=seq).delete()
    broken_at(chain.subject, seq, f"checkpoint #{seq} is missing (next is #{seq + 1})")


# (c) two checkpoints swapped

FIELDS = ("kind", "fact", "fact_fp", "prev_link", "link", "key_id")


def test_swapped_checkpoint_contents_break_the_chain_where_the_order_changes(chain):
    s = chain.subject
    third, fourth = checkpoints(s).get(seq=3), checkpoints(s).get(seq=4)
    checkpoints(s).filter(seq=3).update(**{f: getattr(fourth, f) for f in FIELDS})
    checkpoints(s).filter(seq=4).update(**{f: getattr(third, f) for f in FIELDS})
    broken_at(
        s,
        3,
        "checkpoint #3 does not follow #2 (previous link differs: removed, reordered or rewritten)",
    )


def test_swapped_sequence_numbers_break_the_chain_where_the_order_changes(chain):
    s = chain.subject
    checkpoints(s).filter(seq=3).update(seq=-3)
    checkpoints(s).filter(seq=4).update(seq=3)
    checkpoints(s).filter(seq=-3).update(seq=4)
    broken_at(s, 3, "checkpoint #3 does not follow #2")


# (d) an operation row changed behind the chain's back


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("state", "effect_confirmed"),
        ("result_fp", "f" * 64),
        ("fence", 999),
        ("input_fp", "e" * 64),
        ("revision", 3),
    ],
)
def test_an_operation_row_changed_behind_the_chain_is_detected(chain, column, value):
    Operation.objects.filter(key=chain.unknown).update(**{column: value})
    result = broken_at(
        chain.subject, 4, f"operation {chain.unknown}'s {column} is {value!r} in its row but "
    )
    assert result.reason.endswith("in the chain (changed behind the chain's back)")


def test_a_deleted_operation_row_is_detected(chain):
    Operation.objects.filter(key=chain.unknown).delete()
    broken_at(chain.subject, 4, f"operation {chain.unknown} is in the chain but its row is missing")


def test_an_operation_row_inserted_without_a_checkpoint_is_detected(chain):
    row = Operation.objects.get(key=chain.unknown)
    row.pk, row.key, row.chain_seq = None, "op-" + "9" * 64, 6
    row.save()
    broken_at(chain.subject, 7, f"operation {row.key} has no checkpoint in the chain")


# (e) the chain recomputed without the key


def unkeyed(data: bytes) -> str:
    return blake3(data).hexdigest()


def other_key(data: bytes) -> str:
    return blake3(data, key=b"\x33" * 32).hexdigest()


def forge_from(
    subject: Subject, start: int, hasher: Callable[[bytes], str], key_id: str | None = None
) -> None:
    """Rewrite checkpoint ``start``'s fact to a success and re-link everything after it."""
    prev = None
    for cp in checkpoints(subject).order_by("seq"):
        if cp.seq < start:
            prev = cp.link
            continue
        fact = rewrite(cp.fact, '"outcome_unknown"', '"succeeded"') if cp.seq == start else cp.fact
        fact_fp = fingerprint(FingerprintKind.FACT, fact.encode())
        link = hasher(canonical_bytes([subject.type, subject.id, cp.seq, cp.kind, fact_fp, prev]))
        checkpoints(subject).filter(pk=cp.pk).update(
            fact=fact, fact_fp=fact_fp, prev_link=prev, link=link, key_id=key_id or cp.key_id
        )
        prev = link


@pytest.mark.parametrize(
    ("hasher", "key_id", "reason"),
    [
        (
            unkeyed,
            None,
            "checkpoint #4's link does not verify with key 'test2' (rewritten or "
            "re-hashed without the key)",
        ),
        (other_key, None, "checkpoint #4's link does not verify with key 'test2'"),
        (other_key, "forged", "checkpoint #4 names an unknown chain key 'forged'"),
    ],
    ids=["unkeyed-blake3", "attacker-key", "attacker-key-id"],
)
def test_a_chain_recomputed_without_the_key_is_detected(chain, hasher, key_id, reason):
    Operation.objects.filter(key=chain.unknown).update(state="succeeded")
    forge_from(chain.subject, 4, hasher, key_id)
    broken_at(chain.subject, 4, reason)


# (f) tail truncation


def test_truncation_is_detected_from_operation_rows_pointing_past_the_end(chain):
    checkpoints(chain.subject).filter(seq=6).delete()
    broken_at(
        chain.subject,
        6,
        f"the chain ends at #5 but operation {chain.failed}'s row "
        "points to checkpoint #6: checkpoints were removed from its end",
    )
    checkpoints(chain.subject).filter(seq=5).delete()
    broken_at(
        chain.subject,
        5,
        f"the chain ends at #4 but operation {chain.failed}'s row points to checkpoint #6",
    )


def test_consistent_truncation_is_detected_against_a_watermark(chain):
    s = chain.subject
    watermark = api.revision_require(s, watermark=6)
    checkpoints(s).filter(seq__gte=5).delete()
    Operation.objects.filter(key=chain.failed).delete()
    # Without a watermark a shorter chain is indistinguishable from an older one.
    assert api.chain_verify(s).ok
    broken_at(
        s,
        5,
        "the chain ends at #4 but #6 was seen before: checkpoints were removed from its end",
        watermark=watermark,
    )
    with pytest.raises(api.RevisionRollback, match="is at revision 4 but revision 6 was seen"):
        api.revision_require(s, watermark=watermark)
    assert api.revision_require(s, watermark=4) == 4


# Key rotation

OLD = "old:" + "aa" * 32
NEW = "new:" + "bb" * 32


def test_checkpoints_under_a_retired_key_verify_while_the_key_is_kept(subject, fence):
    with override_settings(RECOVERY_CHAIN_KEYS=OLD):
        first = record(subject, fence)
        api.operation_observe(key=first.key, state="outcome_unknown", fence=fence)
    with override_settings(RECOVERY_CHAIN_KEYS=f"{NEW},{OLD}"):
        assert api.chain_verify(subject).ok
        second = record(subject, fence)
        api.operation_observe(key=second.key, state="succeeded", fence=fence)  # verifies
        assert api.chain_verify(subject) == api.Verification(subject, True, 4)
    assert list(checkpoints(subject).order_by("seq").values_list("key_id", flat=True)) == [
        "old",
        "old",
        "new",
        "new",
    ]
    with override_settings(RECOVERY_CHAIN_KEYS=NEW):
        broken_at(subject, 1, "checkpoint #1 names an unknown chain key 'old'")
    with override_settings(RECOVERY_CHAIN_KEYS=f"{NEW},old:{'cc' * 32}"):
        broken_at(subject, 1, "checkpoint #1's link does not verify with key 'old'")


# Tampering blocks success: incidents (the service opens them only when it owns the
# transaction, so these tests commit for real)


def tamper_and_add_pending_work(subject, fence) -> tuple[str, str, str]:
    built = build(subject, fence)
    waiting = record(subject, fence, step_id="archive")  # #7, dispatched
    original = fact_of(subject, 2)
    checkpoints(subject).filter(seq=2).update(fact=rewrite(original, '"succeeded"', '"failed"'))
    return built.succeeded, waiting.key, original


@pytest.mark.django_db(transaction=True)
def test_success_on_a_tampered_chain_is_refused_and_opens_one_incident(subject, fence):
    _, waiting, _ = tamper_and_add_pending_work(subject, fence)
    for _attempt in range(2):
        with pytest.raises(api.ChainBroken, match="checkpoint chain is broken at #2") as exc:
            api.operation_observe(key=waiting, state="succeeded", fence=fence)
        assert exc.value.result.position == 2
    incident = IntegrityIncident.objects.get(subject_type=subject.type, subject_id=subject.id)
    assert (incident.status, incident.position) == ("open", 2)
    assert "fact does not match its fingerprint" in incident.reason
    row = Operation.objects.get(key=waiting)
    assert (row.state, row.revision) == ("dispatched", 1)
    assert checkpoints(subject).count() == 7


@pytest.mark.django_db(transaction=True)
def test_an_open_incident_blocks_success_until_a_second_person_approves_its_resolution(
    subject, fence, resolver, second_resolver
):
    _, waiting, original = tamper_and_add_pending_work(subject, fence)
    with pytest.raises(api.ChainBroken):
        api.operation_observe(key=waiting, state="succeeded", fence=fence)
    incident = IntegrityIncident.objects.get(subject_id=subject.id, status="open")

    assert not api.incident_reverify(incident=incident).ok
    assert incident.status == "open" and incident.resolved_by is None

    checkpoints(subject).filter(seq=2).update(fact=original)
    assert api.chain_verify(subject).ok
    with pytest.raises(api.IntegrityIncidentOpen, match="open integrity incident"):
        api.operation_observe(key=waiting, state="succeeded", fence=fence)
    assert Operation.objects.get(key=waiting).state == "dispatched"

    # A clean chain alone resolves nothing: one person requests, another approves.
    assert api.incident_reverify(incident=incident).ok
    assert incident.status == "open"
    api.incident_resolve_request(
        incident_id=incident.pk,
        requested_by=resolver,
        rationale="Checkpoint #2 restored from the nightly backup.",
    )
    with pytest.raises(api.IntegrityIncidentOpen):
        api.operation_observe(key=waiting, state="succeeded", fence=fence)
    outcome = api.incident_resolve_approve(incident_id=incident.pk, approved_by=second_resolver)
    assert outcome.resolved, outcome.message
    incident.refresh_from_db()
    assert incident.status == "resolved"
    assert incident.resolved_by == second_resolver and incident.resolved_at is not None
    done = api.operation_observe(key=waiting, state="succeeded", fence=fence)
    assert (done.state, done.chain_seq) == ("succeeded", 8)
    assert api.chain_verify(subject).ok


@pytest.mark.django_db(transaction=True)
def test_a_refusal_inside_the_callers_transaction_leaves_opening_the_incident_to_it(subject, fence):
    _, waiting, _ = tamper_and_add_pending_work(subject, fence)
    with pytest.raises(api.ChainBroken) as exc, transaction.atomic():
        api.operation_observe(key=waiting, state="succeeded", fence=fence)
    assert not IntegrityIncident.objects.exists()
    incident = api.incident_open(verification=exc.value.result)
    assert api.incident_open(verification=exc.value.result) == incident
    assert IntegrityIncident.objects.count() == 1


# (h) what the chain checks beyond its links


def test_a_projection_column_changed_behind_the_chain_is_detected(chain):
    checkpoints(chain.subject).filter(seq=2).update(projection_fp="0" * 64)
    broken_at(
        chain.subject,
        2,
        "checkpoint #2's projection column does not match its fact (changed behind the "
        "chain's back)",
    )


def test_a_fact_forged_with_the_key_still_obeys_the_operations_rules(chain):
    """Even a writer holding the key cannot make the chain skip an operation's revision."""
    from recovery.keys import chain_keys

    keys = chain_keys()
    signed = keys.keys[keys.active_id]
    fact = fact_of(chain.subject, 4)
    assert '"revision":2' in fact, fact
    forge = rewrite(fact, '"revision":2', '"revision":3')
    fact_fp = fingerprint(FingerprintKind.FACT, forge.encode())
    cp = checkpoints(chain.subject).get(seq=4)
    s = chain.subject
    link = blake3(
        canonical_bytes([s.type, s.id, 4, cp.kind, fact_fp, cp.prev_link]), key=signed
    ).hexdigest()
    checkpoints(s).filter(seq=4).update(fact=forge, fact_fp=fact_fp, link=link)
    broken_at(s, 4, f"checkpoint #4 skips a revision of operation {chain.unknown}")
