"""Verified marks: how far one run has verified a subject's chain (ADR 0034).

A success verifies its subject's chain (I7). Verifying the whole chain at every success
makes a step's cost grow with the instance's length, so a run keeps, in its own memory, a
*mark*: the position and link through which it verified the chain, and the operations as
the chain replayed them there. A later success of the same run reads and verifies only the
checkpoints from the mark on and the operation rows they touch
(:func:`~recovery.chain.replay.verify_tail`).

A mark is trustworthy because nobody but this process could have made it: it lives in this
process's memory only, it was computed by a full verification made by this run, and it is
bound to the run's lease (key, holder and fence). A new run or claim takes a new fence, so
it starts without one: its first verification reads the whole chain, or the chain from its
subject's sealed mark on when that seal holds (:mod:`.stored`, ADR 0066). A mark whose
checkpoint no longer carries its link (rewritten, removed, a rolled-back write) is dropped
and the chain is verified whole. Marks are few and small; the oldest are forgotten first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..subjects import Subject

LIMIT = 256
"""Marks kept per process (one per run in flight is all a worker needs)."""

GENESIS_LIMIT = 64
"""Checkpoints a mark keeps of its whole chain (:attr:`Mark.genesis`, ADR 0076): a longer
chain is read and verified whole at an instance's end instead of compared."""


def texts(row) -> list[str | None]:
    """A checkpoint's columns as the server's text of them (``seq`` … ``projection_fp``)."""
    return [None if value is None else str(value) for value in row]


@dataclass
class Mark:
    """The chain of ``subject`` verified through checkpoint ``seq`` whose link is ``link``."""

    subject: Subject
    seq: int
    link: str
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every operation as the verified chain replays it at ``seq``."""
    written: list[Any] = field(default_factory=list)
    """Checkpoints this run committed after ``seq``, in order (``links.Prepared``; ADR 0040):
    known because this process computed them, not verified as stored until a success's
    write finds them unchanged (``recovery.services.lone``)."""
    touched: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The operations ``written`` changed, as replaying it after ``seq`` leaves them."""
    stored: int = 0
    """The position of the subject's sealed mark this run read or wrote (ADR 0066), 0 when
    none: a run seals its mark again only once it has gone far enough past it."""
    genesis: list[list[str | None]] | None = None
    """Every checkpoint of the chain through ``seq``, each its columns as texts (``seq``,
    ``kind``, ``fact``, ``fact_fp``, ``prev_link``, ``link``, ``key_id``, ``projection_fp``),
    when the run verified the whole chain by reading it (:func:`~.replay.verify_marking`)
    or found it empty, and each move of the mark since went over checkpoints this run wrote
    that the server found as written (``written.verified_through``, ADR 0076); None
    otherwise, or past :data:`GENESIS_LIMIT`. With them and :attr:`ops` the run knows its
    whole chain row for row, and a verification of the whole chain (:func:`mark_whole`) may
    compare the stored rows with it instead of reading them."""

    @property
    def head(self) -> tuple[int, str]:
        """The chain's head as this run knows it: its last write, else the mark."""
        if self.written:
            return self.written[-1].seq, self.written[-1].link
        return self.seq, self.link

    def forget_written(self) -> None:
        """What the run wrote is no longer known to be the chain: read it next time."""
        self.written = []
        self.touched = {}


_marks: OrderedDict[tuple[str, str, int], Mark] = OrderedDict()
_whole: OrderedDict[tuple[str, str, int], None] = OrderedDict()
"""The runs whose next verification must read the whole chain (:func:`mark_whole`)."""
_lock = threading.Lock()


def _slot(fence) -> tuple[str, str, int]:
    return (fence.key, fence.holder, fence.fence)


def mark_peek(fence) -> Mark | None:
    """The mark kept for the run holding ``fence``, if any (it stays kept)."""
    with _lock:
        return _marks.get(_slot(fence))


def mark_drop(fence) -> Mark | None:
    """Forget the mark of ``fence`` and return it: a verification about to use it owns it."""
    with _lock:
        return _marks.pop(_slot(fence), None)


def mark_keep(fence, mark: Mark) -> None:
    """Keep ``mark`` for the run holding ``fence`` (a whole verification asked of it is
    made: :func:`mark_whole`)."""
    with _lock:
        _marks[_slot(fence)] = mark
        _marks.move_to_end(_slot(fence))
        _whole.pop(_slot(fence), None)
        while len(_marks) > LIMIT:
            _marks.popitem(last=False)


def mark_forget(fence) -> None:
    """Forget the mark of the run holding ``fence``: its lease was released, so no later
    verification can use it (a new run takes a new fence). Kept, a mark would hold its
    whole chain's rows (:attr:`Mark.genesis`) until newer marks pushed it out: up to
    :data:`LIMIT` marks per process, of runs that ended. A whole verification asked of
    the run (:func:`mark_whole`) stays asked: a commit that released the lease and rolled
    back may be made again, and it must then still read the whole chain."""
    with _lock:
        _marks.pop(_slot(fence), None)


def mark_whole(fence) -> None:
    """Ask the next verification of the run holding ``fence`` to cover the whole chain: not
    from its mark, nor from its subject's sealed mark (ADR 0038, 0066), until a mark is
    kept. A mark that knows the whole chain (:attr:`Mark.genesis`) stays, for a call that
    compares every stored row with it (ADR 0076); any other is forgotten, and the chain is
    read and verified whole."""
    with _lock:
        mark = _marks.get(_slot(fence))
        if mark is None or mark.genesis is None:
            _marks.pop(_slot(fence), None)
        _whole[_slot(fence)] = None
        _whole.move_to_end(_slot(fence))
        while len(_whole) > LIMIT:
            _whole.popitem(last=False)


def whole_asked(fence) -> bool:
    """Whether :func:`mark_whole` asked the run holding ``fence`` for a whole verification."""
    with _lock:
        return _slot(fence) in _whole


def marks_clear() -> None:
    """Forget every mark: the next success of every run verifies its chain whole."""
    with _lock:
        _marks.clear()
        _whole.clear()


def marks_of(subject: Subject) -> list[tuple[int, str]]:
    """Where the runs of this process verified ``subject``'s chain through (tests, audits)."""
    with _lock:
        return sorted((m.seq, m.link) for m in _marks.values() if m.subject == subject)
