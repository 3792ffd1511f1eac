"""Anchor records: their own keyed chain, appending one, and reading them all back.

Record ``n`` carries ``prev`` (the link of record ``n - 1``, 64 zeros for the first) and
``link``: keyed BLAKE3 over a domain prefix and the canonical bytes of every other field,
with the active chain key, named by ``key_id`` so that keys rotate as the checkpoints' do.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from blake3 import blake3

from ..canonical import canonical_bytes, canonical_object
from ..db import GENESIS_LINK
from ..errors import AnchorStoreError
from ..keys import chain_keys
from ..subjects import Subject
from .stores import AnchorStore, AnchorWriter

__all__ = [
    "AnchorIndex",
    "AnchorRecord",
    "AnchorSession",
    "AnchoredHead",
    "LedgerMark",
    "anchor_index_read",
    "appending",
    "record_read",
]

VERSION = 1
_PREFIX = b"recovery:v1:anchor-record\x00"


@dataclass(frozen=True)
class LedgerMark:
    """The ledger's watermark: the newest checkpoint id anchored, its link, and how many
    checkpoints there were up to it."""

    checkpoint: int = 0
    tip: str = ""
    count: int = 0

    def as_fact(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "count": self.count, "tip": self.tip}


@dataclass(frozen=True)
class AnchorRecord:
    """One verified line of the anchor store."""

    n: int
    at: str
    mode: str
    ledger: LedgerMark
    gaps: tuple[tuple[int, int, str], ...]
    heads: tuple[tuple[str, str, int, str], ...]
    prev: str
    key_id: str
    link: str


def _link(key: bytes, body: dict[str, Any]) -> str:
    return blake3(_PREFIX + canonical_bytes(body), key=key).hexdigest()


def _sign(fields: dict[str, Any]) -> tuple[bytes, AnchorRecord]:
    keys = chain_keys()
    body = {**fields, "v": VERSION, "key_id": keys.active_id}
    body["link"] = _link(keys.keys[keys.active_id], body)
    line = canonical_bytes(body)
    return line, _parse(body)


class _Bad(Exception):
    pass


def _ints(*values: Any) -> bool:
    return all(type(value) is int and value >= 0 for value in values)


def _parse(body: dict[str, Any]) -> AnchorRecord:
    """Check the shape of a record's fields (the link is checked by the caller)."""
    try:
        ledger = body["ledger"]
        mark = LedgerMark(ledger["checkpoint"], ledger["tip"], ledger["count"])
        gaps = tuple((lo, hi, at) for lo, hi, at in body["gaps"])
        heads = tuple((t, i, seq, link) for t, i, seq, link in body["heads"])
        record = AnchorRecord(
            n=body["n"],
            at=body["at"],
            mode=body["mode"],
            ledger=mark,
            gaps=gaps,
            heads=heads,
            prev=body["prev"],
            key_id=body["key_id"],
            link=body["link"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _Bad("is not an anchor record (a field is missing or malformed)") from exc
    strings = [record.at, record.mode, mark.tip, record.prev, record.key_id, record.link]
    if (
        body.get("v") != VERSION
        or not _ints(record.n, mark.checkpoint, mark.count)
        or not all(isinstance(s, str) for s in strings)
        or not all(_ints(lo, hi) and isinstance(at, str) for lo, hi, at in gaps)
        or not all(
            isinstance(t, str) and isinstance(i, str) and _ints(seq) and isinstance(link, str)
            for t, i, seq, link in heads
        )
    ):
        raise _Bad("is not an anchor record of version 1 (a field has the wrong type)")
    return record


def record_read(line: bytes, *, n: int, prev: str) -> AnchorRecord:
    """Parse and verify one line as record ``n`` following ``prev``; raise ``_Bad``."""
    if not line.endswith(b"\n"):
        raise _Bad("is incomplete (no newline: a write was cut off, or the file was edited)")
    raw = line[:-1]
    body = canonical_object(raw, raw)
    if body is None:
        raise _Bad("is not canonical JSON (the line was edited)")
    record = _parse(body)
    if record.n != n:
        raise _Bad(f"says it is record #{record.n} (records were removed or reordered)")
    if record.prev != prev:
        raise _Bad(
            "does not follow the record before it (previous link differs: a record was "
            "removed, reordered or rewritten)"
        )
    key = chain_keys().get(record.key_id)
    if key is None:
        raise _Bad(f"names an unknown chain key {record.key_id!r}")
    unsigned = {name: value for name, value in body.items() if name != "link"}
    if _link(key, unsigned) != record.link:
        raise _Bad(
            f"does not verify with key {record.key_id!r} (the line was edited, or written "
            "without the key)"
        )
    return record


@dataclass
class AnchorSession:
    """An exclusive hold on the store: the verified last record, and :meth:`append`."""

    store: AnchorStore
    writer: AnchorWriter
    last: AnchorRecord | None

    def append(
        self,
        *,
        at: str,
        mode: str,
        ledger: LedgerMark,
        gaps: Iterable[tuple[int, int, str]],
        heads: Iterable[tuple[str, str, int, str]],
    ) -> AnchorRecord:
        """Sign and append the next record; it becomes :attr:`last`."""
        previous = self.last
        line, record = _sign(
            {
                "n": previous.n + 1 if previous else 1,
                "prev": previous.link if previous else GENESIS_LINK,
                "at": at,
                "mode": mode,
                "ledger": ledger.as_fact(),
                "gaps": [list(gap) for gap in gaps],
                "heads": [list(head) for head in heads],
            }
        )
        self.writer.append(line)
        self.last = record
        return record


@contextlib.contextmanager
def appending(store: AnchorStore, *, wait: bool = True) -> Iterator[AnchorSession | None]:
    """Hold ``store`` exclusively with its verified last record; ``None`` if busy.

    The last record must verify on its own (its shape, key and link; the links before it
    are :func:`anchor_index_read`'s job): nothing is chained onto a record that does not.
    """
    with store.writer(wait=wait) as writer:
        if writer is None:
            yield None
            return
        raw = writer.last()
        last = None
        if raw is not None:
            try:
                body = json.loads(raw)
                n, prev = body["n"], body["prev"]
                last = record_read(raw + b"\n", n=n, prev=prev)
            except (ValueError, TypeError, KeyError, RecursionError, _Bad) as exc:
                reason = str(exc) if isinstance(exc, _Bad) else "is not an anchor record"
                raise AnchorStoreError(
                    f"The last record of the anchor store {store} {reason}. Nothing is "
                    "appended after it. Run manage.py recovery_verify to see what is wrong."
                ) from exc
        yield AnchorSession(store, writer, last)


# --- reading and indexing -------------------------------------------------------------


@dataclass(frozen=True)
class AnchoredHead:
    """The highest position of one subject's chain that was anchored, and where."""

    seq: int
    link: str
    at: str
    record: int


@dataclass
class AnchorIndex:
    """What an anchor store says, from its records that verify (oldest first).

    ``problem`` is ``(record number, reason)`` for the first record that does not verify;
    the records from there on are not used.
    """

    store: str
    records: int = 0
    latest: AnchorRecord | None = None
    heads: dict[tuple[str, str], AnchoredHead] = field(default_factory=dict)
    problem: tuple[int, str] | None = None
    links: dict[int, str] = field(default_factory=dict, repr=False)

    def head(self, subject: Subject) -> AnchoredHead | None:
        return self.heads.get((subject.type, subject.id))

    def subjects(self) -> list[Subject]:
        return [Subject(t, i) for t, i in self.heads]


def anchor_index_read(store: AnchorStore) -> AnchorIndex:
    """Verify every record of ``store`` and index the highest anchored head per subject.

    A subject anchored at the same position twice keeps its first link: a later, different
    link at that position means its chain was rewritten in between.
    """
    index = AnchorIndex(store=str(store))
    prev, mark = GENESIS_LINK, LedgerMark()
    for number, line in enumerate(store.lines(), start=1):
        try:
            record = record_read(line, n=number, prev=prev)
            if record.ledger.checkpoint < mark.checkpoint or record.ledger.count < mark.count:
                raise _Bad("lowers the ledger watermark of the records before it")
        except _Bad as exc:
            index.problem = (number, f"anchor record #{number} {exc}")
            break
        prev, mark = record.link, record.ledger
        index.records, index.latest = number, record
        index.links[number] = record.link
        for subject_type, subject_id, seq, link in record.heads:
            known = index.heads.get((subject_type, subject_id))
            if known is None or seq > known.seq:
                index.heads[(subject_type, subject_id)] = AnchoredHead(seq, link, record.at, number)
    return index
