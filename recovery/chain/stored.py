"""A verified mark sealed for the next run of its subject (ADR 0066).

A mark (:mod:`.marks`) lives in one run's memory: a new run verifies its subject's chain
whole at its first dispatch, so an instance that waits and resumes many times pays for its
whole chain at every resume. A run that leaves its instance waiting seals its mark — the
position, the link there and the operations that can still move as the chain replayed
them — with a keyed BLAKE3 under a key derived from the chain key, and the next run that
reads the seal back and finds it intact verifies only what follows it.

Nothing here reads or writes the database (:mod:`recovery.services.stored_marks` does).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

from ..canonical import canonical_bytes
from ..keys import chain_keys
from ..states import TERMINAL
from ..subjects import Subject
from .marks import Mark

_CONTEXT = "govflow recovery chain mark seal v1"


@dataclass(frozen=True)
class Seal:
    """A mark as stored: every column of ``recovery_chain_mark`` but the subject's."""

    seq: int
    link: str
    ops: str
    key_id: str
    mac: str

    @classmethod
    def of_row(cls, row) -> Seal:
        """From the row :func:`~recovery.chain.links.load_sealed` returns."""
        return cls(seq=int(row[0]), link=row[5], ops=row[2], key_id=row[6], mac=row[3])


@functools.lru_cache(maxsize=16)
def _seal_key(chain_key: bytes) -> bytes:
    # A key of its own (BLAKE3's derive-key mode), so a seal is never a valid link.
    return blake3(chain_key, derive_key_context=_CONTEXT).digest()


def _mac(key: bytes, subject: Subject, seq: int, link: str, ops: str) -> str:
    data = canonical_bytes(["mark", str(subject.type), str(subject.id), int(seq), link, ops])
    return blake3(data, key=_seal_key(key)).hexdigest()


def seal(mark: Mark) -> Seal:
    """``mark`` sealed with the active chain key; only operations that can still move."""
    keys = chain_keys()
    open_ops = {key: op for key, op in mark.ops.items() if op["state"] not in TERMINAL}
    ops = canonical_bytes(open_ops).decode()
    key = keys.get(keys.active_id)
    mac = _mac(key, mark.subject, mark.seq, mark.link, ops)
    return Seal(mark.seq, mark.link, ops, keys.active_id, mac)


def unseal(subject: Subject, stored: Seal) -> Mark | None:
    """The mark ``stored`` holds for ``subject``, or None when its seal does not verify
    (written by someone without the key, for another subject, or under a key retired since).
    """
    key = chain_keys().get(stored.key_id)
    if key is None or _mac(key, subject, stored.seq, stored.link, stored.ops) != stored.mac:
        return None
    ops: dict[str, dict[str, Any]] = json.loads(stored.ops)  # GovFlow's own: it verified
    return Mark(subject, int(stored.seq), stored.link, ops, stored=int(stored.seq))
