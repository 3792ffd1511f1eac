"""A run's lease taken in the run's first commit, not in a commit of its own.

A claimed run (ADR 0026) begins with the lease the pusher took for it: the worker takes it
over under its own name (``recovery.api.lease_handover``: fence + 1, conditional on the
claimed holder and fence) and loads the instance — on PostgreSQL in one statement
(:meth:`OpenedLoad.begin_reading`, ``load.handed_over_and_loaded``, ADR 0060). An
unclaimed run (``advance`` without a claim) acquires the lease instead
(``recovery.api.lease_acquire``) and loads the instance. Either transaction is left open
(:class:`OpenedLoad`) and closed by the run's first commit (``Run.commit``): the lease,
the load and the first step's writes — usually the start node and the first dispatch
boundary — are one commit at the server instead of two (ADR 0042). Nothing is called
outside before it: a provider call waits for a commit (the dispatch boundary, or
``Run.kept_alive``, which commits the load first).

If that first commit fails, its writes roll back with the lease; the lease is then taken
again in a commit of its own, so the run keeps the lease its fence names, as it did when
the lease had its own commit (a lease taken again under another fence is released at
once: the run's writes are then refused as stale). A worker that dies before the first
commit leaves a claimed lease with the pusher that claimed it: the pusher is alive, so
the lease expires by its time (``GOVFLOW_LEASE_TTL``) and the next claim takes the
instance (ADR 0042); an unclaimed run's acquire is undone with its transaction.

Transactions: :meth:`OpenedLoad.begin` opens one and leaves it open; :meth:`commit` and
:meth:`rollback` close it. Everything between joins it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from django.db import DatabaseError

from recovery.api import ConflictError, Fence, lease_acquire, lease_handover, lease_release

from ..db import engine_commit

__all__ = ["OpenedLoad"]

log = logging.getLogger("govflow.engine")

T = TypeVar("T")


class OpenedLoad:
    """The open transaction of a run's lease and load (one run's, one thread's)."""

    def __init__(self, *, key: str, take: Callable[[], Fence]) -> None:
        self.key, self._take = key, take
        self.fence: Fence | None = None
        self._open: AbstractContextManager | None = None

    @classmethod
    def handing_over(cls, *, claimed: Fence, holder: str, ttl: float) -> OpenedLoad:
        """A claimed run's: the claim's lease taken over under ``holder``."""
        return cls(
            key=claimed.key, take=lambda: lease_handover(fence=claimed, holder=holder, ttl=ttl)
        )

    @classmethod
    def acquiring(cls, *, key: str, holder: str, ttl: float) -> OpenedLoad:
        """An unclaimed run's: the lease acquired (``LeaseHeld`` while another holds it)."""
        return cls(key=key, take=lambda: lease_acquire(key=key, holder=holder, ttl=ttl))

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def begin(self) -> Fence:
        """Open the transaction and take the lease in it; the run's fence.

        Raises ``StaleFence`` (a claim's lease no longer live) or ``LeaseHeld`` (another
        holder's live lease); the transaction rolled back, nothing changed.
        """
        fence, _ = self.begin_reading(lambda: (self._take(), None))
        return fence

    def begin_reading(self, hand_over: Callable[[], tuple[Fence, T]]) -> tuple[Fence, T]:
        """Open the transaction and call ``hand_over``, which takes the claimed lease over
        with the run's reads in the same statement (ADR 0060): its fence and reads.
        Rolls back (nothing changed) on ``StaleFence`` and on any other error."""
        self._open = engine_commit()
        self._open.__enter__()
        try:
            self.fence, read = hand_over()
            return self.fence, read
        except BaseException as exc:
            self.rollback(exc, again=False)
            raise

    def commit(self) -> None:
        """Commit the handover, the load and whatever joined them (the first commit)."""
        opened, self._open = self._open, None
        if opened is not None:
            opened.__exit__(None, None, None)

    def rollback(self, exc: BaseException, *, again: bool = True) -> None:
        """Roll back after ``exc``; with ``again``, take the lease again in a commit of its
        own, so the run still holds the lease its fence names (a failure to do so is
        logged: the run's next write then finds its fence stale and changes nothing)."""
        opened, self._open = self._open, None
        if opened is None:
            return
        opened.__exit__(type(exc), exc, exc.__traceback__)  # rolls back; does not swallow
        if not again:
            return
        try:
            with engine_commit():
                fence = self._take()
                if fence != self.fence:  # another took the lease meanwhile: not the run's
                    lease_release(fence=fence)
                    log.warning("%s: the lease was taken again as %s", self.key, fence)
        except (ConflictError, DatabaseError) as error:
            log.warning("%s: could not take the lease again: %s", self.key, error)
