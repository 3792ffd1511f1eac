"""Anchors outside the database: an append-only, keyed, hash-chained log of chain heads.

A database writer can remove the newest checkpoints of a chain, roll the operation rows
back to match, or restore an older backup of the whole database: what is left verifies.
Anchors are what the database once held, kept where a database writer cannot reach. Each
anchor record holds the database time, the ledger's watermark (the newest checkpoint id,
its link and the number of checkpoints up to it) and the heads of the chains that changed
since the record before. Verification compares the database with them
(``recovery/watermarks.py``); writing them is ``recovery/services/anchors.py``.

This package knows nothing of the database. It holds (``stores.py``, ``records.py``):

- the store protocol (:class:`AnchorStore`) and the default store, a file of JSON lines
  (:class:`FileAnchorStore`), chosen by the setting ``RECOVERY_ANCHOR_STORE``;
- the records' own chain: record ``n`` carries ``prev`` (the link of record ``n - 1``) and
  ``link``, keyed BLAKE3 over its canonical bytes with a chain key
  (``RECOVERY_CHAIN_KEYS``, so keys rotate as the checkpoints' do). Editing, removing or
  reordering a line breaks the links; a line cannot be forged without a key;
- :func:`anchor_index_read`, which verifies every record and indexes the anchored heads.

Appending is serialised by the store (an exclusive ``flock`` for the file), so several
processes and hosts may append: read the last record, build the next, append, release.
"""

from .records import (
    AnchoredHead,
    AnchorIndex,
    AnchorRecord,
    AnchorSession,
    LedgerMark,
    anchor_index_read,
    appending,
)
from .stores import AnchorStore, AnchorWriter, FileAnchorStore, anchor_store

__all__ = [
    "AnchorIndex",
    "AnchorRecord",
    "AnchorSession",
    "AnchorStore",
    "AnchorWriter",
    "AnchoredHead",
    "FileAnchorStore",
    "LedgerMark",
    "anchor_index_read",
    "anchor_store",
    "appending",
]
