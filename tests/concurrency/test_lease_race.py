"""Real threads racing for one lease on PostgreSQL: one winner, growing fences, no stale write.

Each thread has its own database connection (Django opens one per thread) and closes it
when it ends, so the transactional test's flush never waits on a lock a thread left behind.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from recovery import api
from recovery.models import Lease, Operation
from recovery.testing import new_subject, record
from tests.dbclock import wait_until_expired

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

WORKERS = 8
ROUNDS = 200
STALE_ROUNDS = 20
WAIT = 30  # seconds any single barrier or join may take before the test gives up


class Racer(threading.Thread):
    """A thread with its own database connection, opened before it races, closed after.

    A failing racer aborts ``barriers`` so its siblings stop waiting for it.
    """

    def __init__(
        self, target: Callable[[], Any], *, barriers: tuple[threading.Barrier, ...] = ()
    ) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.barriers = barriers
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            # Connect first, so the race is between statements, not connection setups.
            connection.ensure_connection()
            self.result = self.target()
        except BaseException as exc:  # re-raised in the main thread by outcome()
            self.error = exc
            for barrier in self.barriers:
                barrier.abort()
        finally:
            connection.close()

    def outcome(self) -> Any:
        self.join(timeout=WAIT * 4)
        assert not self.is_alive(), "a racing thread hung"
        if self.error is not None:
            raise self.error
        return self.result


def run_threads(
    targets: list[Callable[[], Any]], *, barriers: tuple[threading.Barrier, ...] = ()
) -> list[Any]:
    """Run each target in its own :class:`Racer`; return their results in order."""
    racers = [Racer(target, barriers=barriers) for target in targets]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=WAIT * 4)
    return [racer.outcome() for racer in racers]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def blocking_pids(pid: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
        return list(cursor.fetchone()[0])


def test_exactly_one_of_eight_racing_workers_wins_each_round_and_fences_grow():
    subject = new_subject("race.instance")
    key = f"lease:{subject}"
    start = threading.Barrier(WORKERS)
    attempted = threading.Barrier(WORKERS)

    def worker(index: int) -> dict[str, list]:
        me = f"worker-{index}"
        seen: dict[str, list] = {"wins": [], "refusals": []}
        for round_no in range(ROUNDS):
            start.wait(timeout=WAIT)
            try:
                fence = api.lease_acquire(key=key, holder=me, ttl=30)
            except api.LeaseHeld as exc:
                fence = None
                seen["refusals"].append((round_no, str(exc)))
            # Nobody releases before everyone has tried: a late thread cannot win too.
            attempted.wait(timeout=WAIT)
            if fence is not None:
                op = record(subject, fence, nonce=f"{subject.id}:round-{round_no}")
                api.lease_release(fence=fence)
                seen["wins"].append((round_no, fence.fence, me, op.key))
        return seen

    results = run_threads(
        [lambda i=i: worker(i) for i in range(WORKERS)], barriers=(start, attempted)
    )

    wins = sorted(win for result in results for win in result["wins"])
    assert [win[0] for win in wins] == list(range(ROUNDS)), "not exactly one winner a round"
    fences = [win[1] for win in wins]
    assert all(a < b for a, b in itertools.pairwise(fences)), fences
    assert fences == list(range(1, ROUNDS + 1))
    winner_of = {round_no: holder for round_no, _, holder, _ in wins}
    refusals = [r for result in results for r in result["refusals"]]
    assert len(refusals) == ROUNDS * (WORKERS - 1)
    for round_no, message in refusals:
        assert f"held by {winner_of[round_no]} " in message, message

    # Every winner's fenced write landed, under its own fence, and the chain holds.
    recorded = dict(Operation.objects.filter(subject_id=subject.id).values_list("key", "fence"))
    assert recorded == {op_key: fence for _, fence, _, op_key in wins}
    assert api.chain_verify(subject).ok
    assert api.subject_revision(subject) == ROUNDS
    lease = Lease.objects.get(key=key)
    assert (lease.holder, lease.fence) == (None, ROUNDS)


def test_an_expired_holder_racing_the_takeover_can_neither_renew_release_nor_write(
    django_user_model,
):
    row = django_user_model.objects.create(username="engine-row", first_name="untouched")
    jitter = random.Random(20240611)
    for round_no in range(STALE_ROUNDS):
        subject = new_subject("stale.instance")
        old = api.lease_acquire(key=f"lease:{subject}", holder="old", ttl=0.1)
        record(subject, old, nonce=f"{subject.id}:live")  # written while the lease was live
        wait_until_expired(old.key)
        go = threading.Barrier(6)  # two claimants and four stale attempts

        def attempt(action: Callable[[], Any], go=go, delay=0.0) -> Any:
            go.wait(timeout=WAIT)
            time.sleep(delay)  # a millisecond or two, so every order of arrival occurs
            try:
                return action()
            except api.ConflictError as exc:
                return exc

        def take_over(subject=subject, old=old):
            new = api.lease_acquire(key=old.key, holder="new", ttl=30)
            return new, record(subject, new, nonce=f"{subject.id}:new")

        def rival(old=old):
            return api.lease_acquire(key=old.key, holder="rival", ttl=30)

        stale_attempts = {
            "renew": lambda old=old: api.lease_renew(fence=old, ttl=30),
            "release": lambda old=old: api.lease_release(fence=old),
            "record": lambda subject=subject, old=old: record(
                subject, old, nonce=f"{subject.id}:stale"
            ),
            "fenced_update": lambda old=old: api.fenced_update(
                django_user_model.objects.filter(pk=row.pk), fence=old, first_name="stale"
            ),
        }
        # The four stale attempts race two claimants of the expired lease, each thread
        # starting up to 3 ms after the barrier, so every order of arrival occurs.
        actions = [take_over, rival, *stale_attempts.values()]
        delays = [jitter.uniform(0, 0.003) for _ in actions]
        taken, rivalled, *outcomes = run_threads(
            [
                lambda a=action, d=delay: attempt(a, delay=d)
                for action, delay in zip(actions, delays, strict=True)
            ],
            barriers=(go,),
        )
        for name, outcome in zip(stale_attempts, outcomes, strict=True):
            assert isinstance(outcome, api.StaleFence), (round_no, name, outcome)

        # Exactly one claimant got the lease, with the next fence.
        if isinstance(taken, api.LeaseHeld):
            assert isinstance(rivalled, api.Fence), (round_no, rivalled)
            new = rivalled
        else:
            assert isinstance(rivalled, api.LeaseHeld), (round_no, rivalled)
            assert isinstance(taken, tuple), (round_no, taken)
            new = taken[0]
        assert new.fence == old.fence + 1
        lease = Lease.objects.get(key=old.key)
        assert (lease.holder, lease.fence) == (new.holder, new.fence)
        fences = set(
            Operation.objects.filter(subject_id=subject.id).values_list("fence", flat=True)
        )
        assert old.fence in fences and fences <= {old.fence, new.fence}
        assert Operation.objects.filter(subject_id=subject.id, fence=old.fence).count() == 1
        assert api.chain_verify(subject).ok
    row.refresh_from_db()
    assert row.first_name == "untouched"


def test_a_new_holder_waits_for_the_stale_holders_in_flight_write_then_sees_it():
    subject = new_subject("inflight.instance")
    key = f"lease:{subject}"
    written = threading.Event()
    may_commit = threading.Event()
    shared: dict[str, Any] = {}

    def holder_a() -> str:
        fence = api.lease_acquire(key=key, holder="a", ttl=1)
        shared["a_fence"] = fence
        with transaction.atomic():
            op = record(subject, fence, nonce=f"{subject.id}:a")
            shared["a_pid"] = backend_pid()
            written.set()
            # A's lease expires while its write is still uncommitted.
            assert may_commit.wait(timeout=WAIT), "never allowed to commit"
        return op.key

    def holder_b() -> tuple[api.Fence, dict[str, int]]:
        shared["b_pid"] = backend_pid()
        fence = api.lease_acquire(key=key, holder="b", ttl=30)
        seen = dict(Operation.objects.filter(subject_id=subject.id).values_list("key", "fence"))
        return fence, seen

    racer_a = Racer(holder_a)
    racer_a.start()
    racer_b = Racer(holder_b)
    try:
        deadline = time.monotonic() + WAIT
        while not written.wait(timeout=0.01):
            if not racer_a.is_alive():
                racer_a.outcome()  # an error in A surfaces here
            assert time.monotonic() < deadline, "holder A never recorded"
        wait_until_expired(key)
        # Expired by the database clock, yet A's operation is not committed: invisible.
        assert not Operation.objects.filter(subject_id=subject.id).exists()
        racer_b.start()
        deadline = time.monotonic() + WAIT
        while "b_pid" not in shared or shared["a_pid"] not in blocking_pids(shared["b_pid"]):
            if not racer_b.is_alive():
                racer_b.outcome()  # an error in B surfaces here
                pytest.fail("B acquired the lease without waiting for A's in-flight write")
            assert time.monotonic() < deadline, "B was never blocked by A"
            time.sleep(0.01)
        assert Lease.objects.get(key=key).holder == "a"
    finally:
        may_commit.set()
    a_op = racer_a.outcome()
    fence_b, seen_by_b = racer_b.outcome()

    assert fence_b.fence == shared["a_fence"].fence + 1
    assert seen_by_b == {a_op: shared["a_fence"].fence}
    # B carries on from A's checkpoint: its write extends the same verified chain.
    record(subject, fence_b, nonce=f"{subject.id}:b")
    assert api.subject_revision(subject) == 2
    assert api.chain_verify(subject).ok
