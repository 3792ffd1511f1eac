"""Lifecycles from K threads of one process at once: a second figure, never the first.

The judged figure of ``bench/ledger.py`` is one thread running lifecycles one after
another: each lifecycle waits for its own two commits, and each commit for its own WAL
flush. A worker process runs several claimed instances at once in threads (ADR 0041,
``GOVFLOW_WORKER_RUNS``); then commits of different threads that reach the server together
share one WAL flush (PostgreSQL's group commit), and one thread's Python runs while another
waits. This module measures that shape with the same lifecycles: K threads, each with its
own Django connection (Django keeps one per thread), each running whole instances (an
instance's lifecycles stay in order on one thread, under its one lease). The two figures
answer different questions and are printed side by side (ADR 0045).
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter

import workload


class Threads:
    """K long-lived threads, each with its own connection, warmed up before timing."""

    def __init__(self, k: int, steps: int) -> None:
        self.k = k
        self.inboxes: list[queue.Queue] = [queue.Queue() for _ in range(k)]
        self.done: queue.Queue = queue.Queue()
        self.pids: list[int | None] = [None] * k
        self.threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"ledger-{i}", daemon=True)
            for i in range(k)
        ]
        for thread in self.threads:
            thread.start()
        self._collect()
        # Each connection prepares its statements at their first uses: not timed. Twice,
        # so the statistics flush after each run is prepared too (a statement prepared in
        # autocommit commits a transaction of its own, once).
        for n in range(2):
            self.run(workload.plan(f"tw{k}.{n}-", 2 * k * steps, steps))

    @property
    def overhead(self) -> int:
        """Transactions a timed run adds besides its lifecycles: each thread's flush."""
        return self.k

    def _serve(self, index: int) -> None:
        from django.db import connection

        try:
            connection.ensure_connection()
            self.pids[index] = connection.connection.info.backend_pid
            self.done.put(None)
            while (work := self.inboxes[index].get()) is not None:
                try:
                    workload.run(work)
                    _report_commits(connection)
                except BaseException as exc:  # reported by run(), in the main thread
                    self.done.put(exc)
                else:
                    self.done.put(None)
        except BaseException as exc:
            self.done.put(exc)
        finally:
            connection.close()

    def _collect(self) -> None:
        errors = [error for error in (self.done.get() for _ in range(self.k)) if error]
        if errors:
            raise errors[0]

    def run(self, lifecycles: list) -> float:
        """Run ``lifecycles`` on the K threads, whole instances each; the elapsed seconds."""
        chunks: list[list] = [[] for _ in range(self.k)]
        subjects: dict = {}
        for lc in lifecycles:
            slot = subjects.setdefault(lc.record["subject"], len(subjects) % self.k)
            chunks[slot].append(lc)
        start = perf_counter()
        for inbox, chunk in zip(self.inboxes, chunks, strict=True):
            inbox.put(chunk)
        self._collect()
        return perf_counter() - start

    def server_cpu(self) -> float | None:
        """CPU seconds of the K server processes behind the threads' connections."""
        seconds = [workload.process_cpu_seconds(pid) for pid in self.pids if pid is not None]
        if len(seconds) != self.k or any(s is None for s in seconds):
            return None
        return sum(seconds)

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=30)


def _report_commits(connection) -> None:
    """Make this thread's server process report its commits now (one autocommit statement).

    A backend reports its counters when it goes idle, at most once a second unless told
    otherwise, so a thread's commits could land in a later run's window; the probes of
    ``workload.xact_commit`` only flush their own connection's."""
    with connection.cursor() as cursor:
        cursor.execute(workload.FLUSH)
