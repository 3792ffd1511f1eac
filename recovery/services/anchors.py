"""Writing anchors: the sweeper's incremental anchor and ``recovery_verify --anchor``'s full one.

One append, under the store's exclusive hold (``flock`` for the file store):

1. Read the store's last record; it must verify (``recovery.anchors.appending``).
2. Refuse to go on from a state the anchors contradict, and open the incident:
   the store must not be shorter than the newest record the database remembers appending
   (``AnchorMark``; else :class:`AnchorStoreError`, incident on ``recovery.anchors:store``),
   and the newest anchored checkpoint must still be there with its link (else
   :class:`RevisionRollback`, incident on ``recovery.ledger:watermark``). Anchoring on
   would hide the loss from every later reader.
3. Read the checkpoints after the newest anchored one, in id order, at most
   ``RECOVERY_ANCHOR_BATCH``, and those that appeared since in the gaps remembered.
4. Nothing new: write nothing. Otherwise append one record: the database time, the new
   watermark (newest id and link, count), the gaps left, and each changed subject's head
   (its highest position among the rows read).
5. Remember the record's number and link in ``AnchorMark``, then release the store.

**Why gaps.** On PostgreSQL a checkpoint's id is taken from a sequence when it is
inserted, but transactions commit in any order: a checkpoint with a lower id can become
visible after a higher one was anchored. The ids skipped between two anchors are kept as
ranges in the record and looked at again on each append, for ``GAP_TTL`` seconds (a
rolled-back insert leaves its id unused for ever). A checkpoint that commits later than
that is anchored when its subject next changes, or by the next full anchor. SQLite
serialises writers, so its ids commit in order.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..anchors import AnchorRecord, AnchorSession, AnchorStore, LedgerMark, anchor_store, appending
from ..chain import Verification
from ..errors import AnchorStoreError, ChainKeyError, RevisionRollback
from ..models import AnchorMark
from ..watermarks import (
    ANCHOR_STORE,
    chain_heads,
    checkpoints_after,
    checkpoints_within,
    db_now,
    ledger_verify,
    mark_problem,
    parse_time,
)
from .incidents import incident_open

__all__ = ["Anchored", "anchor_append", "anchor_if_due"]

log = logging.getLogger("recovery.anchors")

GAP_TTL = 600.0
"""Seconds an id skipped between two anchors is looked for again (see the module doc)."""

MAX_GAPS = 256
"""Gap ranges a record keeps at most (the newest)."""


def anchor_batch() -> int:
    """Checkpoints read for one record (``RECOVERY_ANCHOR_BATCH``); also heads per full record."""
    return int(getattr(settings, "RECOVERY_ANCHOR_BATCH", 2000))


def anchor_interval() -> float:
    """Seconds between the sweeper's anchors (``RECOVERY_ANCHOR_INTERVAL``)."""
    return float(getattr(settings, "RECOVERY_ANCHOR_INTERVAL", 10))


@dataclass(frozen=True)
class Anchored:
    """What one call appended: its records (none when nothing changed)."""

    store: str
    records: tuple[AnchorRecord, ...] = ()
    more: bool = False
    """A full batch was read: more checkpoints wait to be anchored."""
    busy: bool = False
    """Another process held the store (only when asked not to wait)."""

    @property
    def heads(self) -> int:
        return sum(len(record.heads) for record in self.records)


def _configured() -> AnchorStore:
    store = anchor_store()
    if store is None:
        raise AnchorStoreError(
            "Anchors are turned off (RECOVERY_ANCHOR_STORE is empty), so nothing can be "
            "anchored. Set it (the default is recovery.anchors.FileAnchorStore)."
        )
    return store


def _guard(session: AnchorSession) -> None:
    """Step 2: refuse, with an incident, when the database or the store lost records."""
    last = session.last
    store = str(session.store)
    problem = mark_problem(
        store,
        last.n if last else 0,
        lambda n: last.link if last is not None and n == last.n else None,
    )
    if problem:
        incident_open(verification=Verification(ANCHOR_STORE, False, 0, None, problem))
        raise AnchorStoreError(
            f"Not anchored: {problem}. Nothing is appended until this is investigated; "
            "run manage.py recovery_verify (docs/recovery.md, 'Anchors')."
        )
    result = ledger_verify(last, count=False)
    if not result.ok:
        incident_open(verification=result)
        raise RevisionRollback(
            f"Not anchored: {result.reason}. Anchoring on would hide the loss, so nothing "
            "is appended until this is investigated; run manage.py recovery_verify "
            "(docs/recovery.md, 'Anchors')."
        )


def _remember(session: AnchorSession, record: AnchorRecord) -> None:
    """Step 5: the database remembers the newest record appended (never a lower one)."""
    store = str(session.store)
    values = {"record": record.n, "link": record.link, "written_at": Now()}
    if AnchorMark.objects.filter(store=store, record__lt=record.n).update(**values):
        return
    try:
        with transaction.atomic():
            AnchorMark.objects.get_or_create(store=store, defaults=values)
    except IntegrityError:  # created meanwhile by another process: it holds a newer one
        pass


def _missing(lo: int, hi: int, present: Sequence[int]) -> list[tuple[int, int]]:
    """The ranges of ids in ``lo..hi`` not in ``present`` (sorted)."""
    ranges, start = [], lo
    for pk in present:
        if pk < lo or pk > hi:
            continue
        if pk > start:
            ranges.append((start, pk - 1))
        start = max(start, pk + 1)
    if start <= hi:
        ranges.append((start, hi))
    return ranges


def _heads(rows: Iterable[tuple[int, str, str, int, str]]) -> list[tuple[str, str, int, str]]:
    heads: dict[tuple[str, str], tuple[int, str]] = {}
    for _, subject_type, subject_id, seq, link in rows:
        known = heads.get((subject_type, subject_id))
        if known is None or seq > known[0]:
            heads[(subject_type, subject_id)] = (seq, link)
    return [(t, i, seq, link) for (t, i), (seq, link) in sorted(heads.items())]


def _append_changes(session: AnchorSession, batch: int) -> tuple[AnchorRecord | None, bool]:
    """Steps 3-5 for one incremental record; ``(record or None, a full batch was read)``."""
    last = session.last
    mark = last.ledger if last else LedgerMark()
    gaps = last.gaps if last else ()
    rows = checkpoints_after(mark.checkpoint, batch)
    late = checkpoints_within((lo, hi) for lo, hi, _ in gaps)
    if not rows and not late:
        return None, False
    now = db_now()
    found = [row[0] for row in late]
    kept = []
    for lo, hi, since in gaps:
        if (parse_time(now) - parse_time(since)).total_seconds() <= GAP_TTL:
            kept.extend((a, b, since) for a, b in _missing(lo, hi, found))
    if rows:
        skipped = _missing(mark.checkpoint + 1, rows[-1][0], [row[0] for row in rows])
        kept.extend((a, b, now) for a, b in skipped)
    newest = rows[-1] if rows else None
    ledger = LedgerMark(
        checkpoint=newest[0] if newest else mark.checkpoint,
        tip=newest[4] if newest else mark.tip,
        count=mark.count + len(rows) + len(late),
    )
    record = session.append(
        at=now,
        mode="incremental",
        ledger=ledger,
        gaps=kept[-MAX_GAPS:],
        heads=_heads([*late, *rows]),
    )
    _remember(session, record)
    return record, len(rows) >= batch


def _append_heads(store: AnchorStore, heads: list[tuple[str, str, int, str]]) -> AnchorRecord:
    """One record of a full anchor: these heads, and the watermark as last anchored."""
    with appending(store) as session:
        _guard(session)
        last = session.last
        record = session.append(
            at=db_now(),
            mode="full",
            ledger=last.ledger if last else LedgerMark(),
            gaps=last.gaps if last else (),
            heads=heads,
        )
        _remember(session, record)
        return record


def anchor_append(*, full: bool = False, wait: bool = True) -> Anchored:
    """Anchor what changed since the last record; with ``full``, every chain's head too.

    Incremental: one record with the heads of the subjects whose chains changed (at most
    ``RECOVERY_ANCHOR_BATCH`` checkpoints read; ``more`` says whether more wait), or
    nothing when nothing changed. Full: incremental records until everything is anchored,
    then the head of every subject, ``RECOVERY_ANCHOR_BATCH`` heads per record.

    Raises :class:`AnchorStoreError` when the store cannot be used or lost records,
    :class:`RevisionRollback` when the database is behind its anchors (both also open an
    integrity incident), :class:`ChainKeyError` for malformed chain keys. With
    ``wait=False`` a store held by another process returns ``busy`` at once.
    """
    store = _configured()
    batch = anchor_batch()
    written: list[AnchorRecord] = []
    while True:
        with appending(store, wait=wait) as session:
            if session is None:
                return Anchored(str(store), tuple(written), busy=True)
            _guard(session)
            record, more = _append_changes(session, batch)
        if record is not None:
            written.append(record)
        if not (full and more):
            break
    if full:
        chunk: list[tuple[str, str, int, str]] = []
        for head in chain_heads():
            chunk.append(head)
            if len(chunk) >= batch:
                written.append(_append_heads(store, chunk))
                chunk = []
        if chunk:
            written.append(_append_heads(store, chunk))
        more = False
    return Anchored(str(store), tuple(written), more=more)


_due_lock = threading.Lock()
_last_try = -math.inf


def anchor_if_due() -> Anchored | None:
    """The sweeper's anchor: at most every ``RECOVERY_ANCHOR_INTERVAL`` seconds.

    Appends only when checkpoints were added; goes on at once while a full batch was
    read. Never waits for the store and never raises for the store or a rollback: the
    sweep must go on. Those are logged as errors (each opened an integrity incident,
    shown by ``recovery_verify``), and tried again after the interval. Returns what was
    appended, or ``None`` when nothing was due or anchors are turned off.
    """
    global _last_try
    now = time.monotonic()
    with _due_lock:
        if now - _last_try < anchor_interval():
            return None
        _last_try = now
    try:
        if anchor_store() is None:
            return None
        result = anchor_append(wait=False)
    except (AnchorStoreError, RevisionRollback, ChainKeyError) as exc:
        log.error("%s", exc)
        return None
    if result.more or result.busy:
        with _due_lock:
            _last_try = -math.inf
    return result


def anchor_schedule_reset() -> None:
    """Make the next :func:`anchor_if_due` due at once (tests, and after a restart)."""
    global _last_try
    with _due_lock:
        _last_try = -math.inf
