"""Renewing leases while provider calls run: one thread per process, not one per call.

A step's provider call runs outside any transaction, and its instance lease must not run
out while a slow but live call is still working (``Run.kept_alive``). Starting and joining
a thread for every call cost about 125 µs of CPU and 250 µs of wall time per step
(measured under load, ADR 0030), although almost every call ends long before its first
renewal is due (a third of the lease). So one daemon thread per process renews whatever is
due, and a call only registers its lease (:meth:`Keepalive.watch`) and unregisters it
(:meth:`Watch.done`), which waits for a renewal of that lease already under way, as the
join did: nothing renews a lease after its call returned.

The thread writes on its own database connection and closes it after each round of
renewals, so an idle worker holds no extra connection. A forked child (django-q2 forks its
workers) starts afresh and starts its own thread on first use.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection

from recovery.api import ConflictError

__all__ = ["Keepalive", "Watch", "keepalive"]

IDLE_MIN = 1.0
"""The shortest sleep of an idle keepalive thread, in seconds: leases of a shorter third
(a TTL under 3 s) wake it at each call instead of keeping it awake many times a second."""

log = logging.getLogger("govflow.engine")


@dataclass(eq=False)
class Watch:
    """One lease being kept alive: renewed every ``interval`` seconds until :meth:`done`."""

    owner: Keepalive
    renew: Callable[[], None]
    interval: float
    what: str
    due: float = 0.0
    busy: bool = False
    number: int = field(default_factory=itertools.count().__next__)

    def done(self) -> None:
        """Stop renewing; wait for a renewal of this lease that is under way."""
        self.owner.forget(self)


class Keepalive:
    """The process's renewing thread and the leases it keeps (see the module docstring)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """A fresh state: at start, and in a forked child (which has no thread, and whose
        copied lock may have been held by a thread of the parent)."""
        self.changed = threading.Condition()
        self.watches: dict[int, Watch] = {}
        self.started = False
        self.wake_at = math.inf
        """When the thread wakes next on its own (it sleeps until the soonest renewal)."""
        self.idle = math.inf
        """How long the thread sleeps with nothing to renew: the shortest interval asked,
        and at least :data:`IDLE_MIN` (a watch due sooner than that wakes it)."""

    def watch(self, renew: Callable[[], None], *, interval: float, what: str) -> Watch:
        """Keep a lease renewed every ``interval`` seconds until :meth:`Watch.done`.

        The thread is woken only when it would sleep past this lease's first renewal
        (ADR 0054). It sleeps until the soonest one due, or for the interval when it has
        none, so a watch of the usual interval never wakes it: waking it at every call
        handed the GIL back and forth at every step (about three context switches a
        step), although almost every call ends before its first renewal."""
        entry = Watch(self, renew, interval, what, due=time.monotonic() + interval)
        with self.changed:
            self._ensure_thread()
            self.watches[entry.number] = entry
            self.idle = min(self.idle, interval)
            if entry.due < self.wake_at:
                self.changed.notify_all()
        return entry

    def watching(self) -> int:
        """How many leases are being kept alive now: provider calls under way."""
        return len(self.watches)

    def forget(self, entry: Watch) -> None:
        with self.changed:
            self.watches.pop(entry.number, None)
            while entry.busy:
                self.changed.wait()

    def _ensure_thread(self) -> None:
        if not self.started:
            self.started = True
            threading.Thread(target=self._run, name="govflow-lease-keepalive", daemon=True).start()

    def _run(self) -> None:
        while True:
            for entry in self._due():
                self._renew(entry)
            try:
                connection.close()  # this thread's own connection: closed between rounds
            except Exception:  # a broken connection: the next round opens a new one
                log.exception("the keepalive thread could not close its connection")

    def _due(self) -> list[Watch]:
        """Wait until some lease is due; mark the due ones busy and return them."""
        with self.changed:
            while True:
                now = time.monotonic()
                due = [w for w in self.watches.values() if w.due <= now]
                if due:
                    for entry in due:
                        entry.busy = True
                    return due
                idle = max(self.idle, IDLE_MIN)
                soonest = min((w.due for w in self.watches.values()), default=now + idle)
                self.wake_at = soonest
                self.changed.wait(timeout=max(0.0, min(soonest - now, 3600)))
                self.wake_at = math.inf  # awake: a watch made now is seen when it looks

    def _renew(self, entry: Watch) -> None:
        keep = False
        try:
            entry.renew()
            keep = True
        except ConflictError:
            log.warning("%s lost during a provider call", entry.what)
        except Exception:  # the step's fenced commit decides; never crash the worker
            log.exception("could not renew %s during a provider call", entry.what)
        finally:
            with self.changed:
                entry.busy = False
                entry.due = time.monotonic() + entry.interval
                if not keep:
                    self.watches.pop(entry.number, None)
                self.changed.notify_all()


keepalive = Keepalive()
"""The process's keepalive (its thread starts on first use)."""
