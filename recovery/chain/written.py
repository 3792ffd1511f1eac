"""What a run wrote after its verified mark, known without reading it back (ADR 0040).

A run's mark (:mod:`.marks`, ADR 0034) says how far it verified a subject's chain. The
checkpoints the run itself commits after that are known to it too: it computed their
facts and keyed links. Kept here, they let a standalone call skip the reads a success and a
dispatch write would otherwise make: the head comes from the last write, and a success's
single statement checks, inside its write, that the stored rows after the mark are exactly
these (``recovery.services.lone``). Equal rows are what a replay of them would verify, so
that check is the tail verification, made by the server instead of by reading the rows.

Only writes known to be committed are kept (a standalone call outside any transaction),
and only while they follow one another; anything else forgets them and the next call
reads the chain as before.
"""

from __future__ import annotations

from typing import Any

from ..db import GENESIS_LINK
from .links import Prepared
from .marks import GENESIS_LIMIT, Mark, mark_drop, mark_keep, mark_peek, texts
from .replay import _apply

LIMIT = 4
"""Checkpoints kept after a mark; a longer tail is read and verified instead."""


def wrote(fence, checkpoint: Prepared, fact: dict[str, Any], *, fresh: bool = False) -> None:
    """Remember a committed checkpoint this process wrote under ``fence``.

    ``fresh``: the write's own condition proved that the subject had no checkpoint and no
    operation before it, so the chain before it is the empty chain (a mark at #0). Without
    a mark to follow, or when the write does not follow the run's last one, nothing is kept.
    """
    mark = mark_peek(fence)
    if fresh:
        mark = Mark(checkpoint.subject, 0, GENESIS_LINK, genesis=[])
    if mark is None or mark.subject != checkpoint.subject:
        return
    seq, link = mark.head
    if (checkpoint.seq, checkpoint.prev_link) != (seq + 1, link) or len(mark.written) >= LIMIT:
        forget(fence, mark)
        return
    key = fact.get("operation")
    replayed: dict[str, dict[str, Any]] = {}
    if key in mark.touched or key in mark.ops:
        replayed[key] = dict(mark.touched.get(key) or mark.ops[key])
    if _apply(replayed, checkpoint.seq, checkpoint.kind, fact):
        forget(fence, mark)
        return
    if key in replayed:
        mark.touched[key] = replayed[key]
    mark.written.append(checkpoint)
    mark_keep(fence, mark)


def forget(fence, mark: Mark | None = None) -> None:
    """Forget what the run holding ``fence`` wrote; keep its verified mark, if any."""
    mark = mark or mark_peek(fence)
    if mark is None:
        return
    if mark.seq == 0:  # a fresh chain's mark holds nothing verified beyond the writes
        mark_drop(fence)
    mark.forget_written()


def verified_through(fence, mark: Mark) -> None:
    """The server found the run's written tail as written: move the mark over it.

    Called after a success's write committed on the condition that the stored rows after
    the mark equal :attr:`Mark.written` and :attr:`Mark.touched` (ADR 0040); the replayed
    operations move on as :func:`~.replay.verify_tail` would move them.
    """
    if mark.written:
        if mark.genesis is not None:
            genesis = [*mark.genesis, *(texts([c.seq, *c.row()[3:]]) for c in mark.written)]
            mark.genesis = genesis if len(genesis) <= GENESIS_LIMIT else None
        mark.ops.update(mark.touched)
        mark.seq, mark.link = mark.head
    mark.forget_written()
    mark_keep(fence, mark)
