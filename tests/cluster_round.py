"""One round of django-q2's own pusher and worker in this process, as a cluster runs them."""

from __future__ import annotations

import queue
from multiprocessing import Event, Value

from django_q import pusher as pusher_module
from django_q import worker as worker_module
from django_q.conf import Conf


def pusher_and_worker_round(monkeypatch, broker, *, expected: int) -> list[dict]:
    """Dequeue once from ``broker`` with django-q2's pusher, run what it got with its
    worker, and return the ``expected`` task results (asserting that many were dequeued)."""
    monkeypatch.setattr(pusher_module, "setproctitle", None)
    monkeypatch.setattr(worker_module, "setproctitle", None)
    tasks, results = queue.Queue(), queue.Queue()
    done = Event()
    done.set()  # one round of dequeueing, then the pusher returns
    monkeypatch.setattr(Conf, "WORKERS", 2)
    pusher_module.pusher(tasks, done, broker)
    assert tasks.qsize() == expected, f"{tasks.qsize()} dequeued, {expected} expected"
    tasks.put("STOP")
    worker_module.worker(tasks, results, Value("f", -1), -1)
    return [results.get_nowait() for _ in range(expected)]
