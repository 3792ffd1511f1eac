"""A claimed lease handed over in the run's first commit, not in a commit of its own.

A claimed run (ADR 0026) begins with the lease the pusher took for it: the worker takes it
over under its own name (``recovery.api.lease_handover``: fence + 1, conditional on the
claimed holder and fence) and loads the instance — on PostgreSQL in one statement
(:meth:`OpenedLoad.begin_reading`, ``load.handed_over_and_loaded``, ADR 0060). That
transaction is left open (:class:`OpenedLoad`) and closed by the run's first commit
(``Run.commit``): the handover, the load and the first step's writes — usually the start
node and the first dispatch boundary — are one commit at the server instead of two (ADR
0042). Nothing is called
outside before it: a provider call waits for a commit (the dispatch boundary, or
``Run.kept_alive``, which commits the load first).

If that first commit fails, its writes roll back with the handover; the handover is then
made again in a commit of its own, so the run keeps the lease its fence names, as it did
when the handover had its own commit. A worker that dies before the first commit leaves
the lease with the pusher that claimed it: the pusher is alive, so the lease expires by
its time (``GOVFLOW_LEASE_TTL``) and the next claim takes the instance (ADR 0042).

Transactions: :meth:`OpenedLoad.begin` opens one and leaves it open; :meth:`commit` and
:meth:`rollback` close it. Everything between joins it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from django.db import DatabaseError

from recovery.api import ConflictError, Fence, lease_handover

from ..db import engine_commit

__all__ = ["OpenedLoad"]

log = logging.getLogger("govflow.engine")

T = TypeVar("T")


class OpenedLoad:
    """The open transaction of a claimed run's handover and load (one run's, one thread's)."""

    def __init__(self, *, claimed: Fence, holder: str, ttl: float) -> None:
        self.claimed, self.holder, self.ttl = claimed, holder, ttl
        self._open: AbstractContextManager | None = None

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def begin(self) -> Fence:
        """Open the transaction and take the claimed lease over in it; the run's fence.

        Raises ``StaleFence`` (the transaction rolled back, nothing changed) when the
        claim's lease is no longer live.
        """
        fence, _ = self.begin_reading(lambda: (self._hand_over(), None))
        return fence

    def begin_reading(self, hand_over: Callable[[], tuple[Fence, T]]) -> tuple[Fence, T]:
        """Open the transaction and call ``hand_over``, which takes the claimed lease over
        with the run's reads in the same statement (ADR 0060): its fence and reads.
        Rolls back (nothing changed) on ``StaleFence`` and on any other error."""
        self._open = engine_commit()
        self._open.__enter__()
        try:
            return hand_over()
        except BaseException as exc:
            self.rollback(exc, again=False)
            raise

    def commit(self) -> None:
        """Commit the handover, the load and whatever joined them (the first commit)."""
        opened, self._open = self._open, None
        if opened is not None:
            opened.__exit__(None, None, None)

    def rollback(self, exc: BaseException, *, again: bool = True) -> None:
        """Roll back after ``exc``; with ``again``, hand the lease over in a commit of its
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
                self._hand_over()
        except (ConflictError, DatabaseError) as error:
            log.warning("%s: could not take the lease over again: %s", self.claimed.key, error)

    def _hand_over(self) -> Fence:
        return lease_handover(fence=self.claimed, holder=self.holder, ttl=self.ttl)
