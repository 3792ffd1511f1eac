"""Clusters on different "hosts": a killed one is taken over through its liveness locks,
a paused one through its lease's expiry, and a paused worker that resumes changes nothing.

Each cluster gets its own ``GOVFLOW_HOST_ID``, so the same-host check (is that pid still
running?) never applies between them: only the PostgreSQL advisory lock each cluster
process holds (ADR 0022) can tell the other cluster's sweeper that a process is gone.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.db import connection

from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.queue import instances_mark_runnable
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from recovery.models import Lease, Observation, ObservationKind
from tests.flows import action, linear
from tests.providers.alpha import effects

from .support import (
    FAST,
    assert_completed_cleanly,
    dump,
    failed_tasks,
    operations_of,
    status,
    token,
    wait_for,
    wait_status,
    wait_until_sweeping,
)

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_TTL = float(FAST["GOVFLOW_LEASE_TTL"])
# Leases that would take ten minutes to expire: only the liveness locks explain a takeover
# within seconds. The sweep does not re-enqueue live work on its own either.
LONG = {
    "GOVFLOW_LEASE_TTL": "600",
    "GOVFLOW_SWEEP_LEASE_TTL": "600",
}


def live_instance_leases(host: str) -> dict[str, int]:
    """``{key: fence}`` of the live instance leases held by processes of ``host``."""
    return {key: fence for key, (_, fence) in live_instance_holders(host).items()}


def live_instance_holders(host: str) -> dict[str, tuple[str, int]]:
    """``{key: (holder, fence)}`` of the live instance leases held by processes of ``host``."""
    from django.db.models.functions import Now

    rows = Lease.objects.filter(
        key__startswith="instance:", holder__startswith=f"{host}:", expires_at__gt=Now()
    ).values_list("key", "holder", "fence")
    return {key: (holder, fence) for key, holder, fence in rows}


def workers_in_transaction() -> int:
    """Worker sessions idle in a transaction (the clusters name them, ADR 0042)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'govflow worker' AND state = 'idle in transaction'"
        )
        return cursor.fetchone()[0]


def own_pause_dir(ws, name: str) -> str:
    """A pause folder nobody writes to: that cluster's workers never park."""
    folder = ws.tmp_path / name
    folder.mkdir(exist_ok=True)
    return str(folder)


WORKERS = int(FAST["GOVFLOW_Q_WORKERS"])


@pytest.mark.parametrize("runs", [1, 3], ids=["one-run-per-worker", "three-runs-per-worker"])
def test_a_killed_host_is_taken_over_through_its_liveness_locks_within_2_s(workspace, runs):
    ws = workspace
    ws.pause("preview")
    definition = definition_publish(document=linear(action("a"), key="proc.hosts"))
    # As many instances as host-a runs at once (workers x runs, ADR 0041): each parks in
    # its step's preview. Every instance is marked three times, so both hosts race for
    # the same instances.
    ids = [
        instance_start(definition=definition, variables={"value": f"h{n}"}).pk
        for n in range(WORKERS * runs)
    ]
    ws.watch(*ids)
    instances_mark_runnable(ids)
    instances_mark_runnable(ids)
    first = ws.start_cluster(GOVFLOW_HOST_ID="host-a", GOVFLOW_WORKER_RUNS=runs, **LONG)

    def parked() -> dict[str, int] | bool:
        # Claimed by host-a's pusher (a lease per instance); each of its run threads
        # (ADR 0041) took a lease over and loaded its instance in a transaction the run's
        # first commit closes (ADR 0042), and is parked in the step's preview inside it:
        # a worker session per run idle in a transaction, holding the lease rows. With
        # more runs than worker processes, some process runs several at once.
        leases = live_instance_leases("host-a")
        return len(leases) == len(ids) and workers_in_transaction() >= len(ids) and leases

    held = wait_for(
        parked,
        timeout=60,
        what=f"{len(ids)} runs of host-a parked in a step's preview, each holding a lease",
        explain=ws.report,
    )
    marked = Lease.objects.filter(key__in=held).values_list("holder", flat=True)
    assert all(holder.endswith("+pg") for holder in marked), list(marked)

    second = ws.start_cluster(
        GOVFLOW_HOST_ID="host-b", ALPHA_PAUSE_DIR=own_pause_dir(ws, "pause-b"), **LONG
    )
    wait_for(
        lambda: "standing by" in second.log_path.read_text(errors="replace"),
        timeout=60,
        what="host-b's sweeper to stand by",
        explain=ws.report,
    )
    assert live_instance_leases("host-a") == held, "host-a's parked workers keep their leases"

    killed = time.monotonic()
    first.kill()

    def taken_over() -> bool:
        fences = dict(Lease.objects.filter(key__in=held).values_list("key", "fence"))
        return all(fences[key] > fence for key, fence in held.items())

    wait_for(
        taken_over,
        timeout=30,
        interval=0.02,
        what="host-b to take host-a's leases over",
        explain=ws.report,
    )
    took = time.monotonic() - killed
    print(f"\n[host-b took host-a's {len(held)} leases over {took:.2f} s after the SIGKILL]")
    assert took <= 2.0, f"took {took:.2f} s"

    ws.unpause("preview")
    for pk in ids:
        wait_status(ws, pk, InstanceStatus.COMPLETED)
        assert_completed_cleanly(pk)
    # Killed before the dispatch boundary: one provider call per instance, none repeated.
    assert effects.call_count() == len(ids)
    assert all(calls == 1 for _, _, calls in effects.effects()), effects.effects()
    assert failed_tasks() == []
    assert second.alive()
    refused = second.log_path.read_text(errors="replace").count("lease held by another worker")
    print(f"[host-b found a lease held by another worker {refused} time(s)]")


@pytest.mark.parametrize("runs", [1, 3], ids=["one-run", "three-runs-in-one-worker"])
def test_a_paused_worker_keeps_its_lock_loses_its_lease_and_changes_nothing_when_resumed(
    workspace, runs
):
    ws = workspace
    ws.pause("after_effect")
    # One worker process running ``runs`` instances at once, each parked after its effect.
    first = ws.start_cluster(
        GOVFLOW_HOST_ID="host-a", GOVFLOW_Q_WORKERS=1, GOVFLOW_WORKER_RUNS=runs
    )
    wait_until_sweeping(first)
    definition = definition_publish(document=linear(action("a"), action("b"), key="proc.pause"))
    instances = [
        instance_start(definition=definition, variables={"value": f"p{n}"}) for n in range(runs)
    ]
    ws.watch(*(instance.pk for instance in instances))
    wait_for(
        lambda: ws.parked("after_effect") == runs and effects.call_count() == runs,
        timeout=60,
        what=f"{runs} run(s) of host-a's worker parked after step a's effect",
        explain=ws.report,
    )
    holders = Lease.objects.filter(
        key__in=[f"instance:{instance.pk}" for instance in instances]
    ).values_list("holder", flat=True)
    assert len({holder.rsplit(":", 1)[0] for holder in holders}) == 1, "one worker process"
    assert len(set(holders)) == runs, "each run its own thread"
    second = ws.start_cluster(
        GOVFLOW_HOST_ID="host-b",
        ALPHA_PAUSE_DIR=own_pause_dir(ws, "pause-b"),
    )
    wait_for(lambda: len(second.pids()) >= 4, timeout=60, what="host-b's cluster to start")

    paused = time.monotonic()
    os.killpg(first.pgid, signal.SIGSTOP)
    # Every process stopped before the pause point opens: none may slip through it.
    wait_for(first.stopped, timeout=30, interval=0.01, what="host-a's processes stopped")
    ws.unpause("after_effect")  # what the paused worker finds when it resumes
    try:
        wait_for(
            lambda: all(
                token(instance.pk, "a").state == TokenState.OUTCOME_UNKNOWN
                for instance in instances
            ),
            timeout=60,
            interval=0.05,
            what="host-b to take every run of the paused worker over",
            explain=ws.report,
        )
        took = time.monotonic() - paused
        print(f"\n[host-b took the paused worker's {runs} run(s) over {took:.2f} s after SIGSTOP]")
        # Its lock is still held: no early expiry, the lease ran out (ttl + 2 s at most).
        assert "that process no longer exists" not in second.log_path.read_text(errors="replace")
        assert took <= LEASE_TTL + 2.0, f"took {took:.2f} s"
        for instance in instances:
            assert status(instance.pk) == InstanceStatus.BLOCKED, dump(instance.pk)
        before = {instance.pk: decided(instance.pk) for instance in instances}
    finally:
        os.killpg(first.pgid, signal.SIGCONT)

    # Each resumed run holds the provider's answer; its fence is stale, so it changes
    # nothing the new holder decided. Its answer is kept as evidence (a late observation).
    wait_for(
        lambda: (
            first.log_path.read_text(errors="replace").count(
                "nothing was changed, the current holder carries on"
            )
            >= runs
        ),
        timeout=60,
        what="every resumed run to be refused by its fence",
        explain=ws.report,
    )
    for n, instance in enumerate(instances):
        assert decided(instance.pk) == before[instance.pk], dump(instance.pk)
        assert token(instance.pk, "a").state == TokenState.OUTCOME_UNKNOWN
        late = Observation.objects.get(
            operation__key=token(instance.pk, "a").operation_key, kind=ObservationKind.LATE
        )
        assert late.outcome == "succeeded" and late.values["stored"] == f"p{n}"
        assert not late.applied
    assert effects.call_count() == runs, "nobody called the provider again"
    assert first.alive() and second.alive()


def test_a_worker_stopped_inside_its_step_transaction_is_taken_over_within_the_lease(workspace):
    """A worker SIGSTOPped inside a step's transaction keeps its row locks (its lease row
    share-locked by the fenced write, its instance row) for as long as it is stopped. The
    other host's claim passes those rows by (ADR 0026) until the server ends the stopped
    session, idle in its transaction, at the lease TTL (ADR 0035): the instance is taken
    over within TTL + 2 s of the stop, not when the worker resumes."""
    ws = workspace
    dirs = {"host-a": own_pause_dir(ws, "pause-a"), "host-b": own_pause_dir(ws, "pause-b")}
    for folder in dirs.values():
        (Path(folder) / "in_atomic_step").touch()  # whichever host claims it parks there
    clusters = {
        host: ws.start_cluster(GOVFLOW_HOST_ID=host, ALPHA_PAUSE_DIR=folder)
        for host, folder in dirs.items()
    }
    for cluster in clusters.values():
        wait_for(lambda c=cluster: len(c.pids()) >= 4, timeout=60, what="both clusters to start")
    document = linear(action("n", name="alpha.note"), action("a"), key="proc.pause_in_tx")
    instance = instance_start(
        definition=definition_publish(document=document), variables={"value": "t"}
    )
    ws.watch(instance.pk)
    reached = {host: Path(folder) / "in_atomic_step.reached" for host, folder in dirs.items()}
    wait_for(
        lambda: any(path.exists() for path in reached.values()),
        timeout=60,
        interval=0.02,
        what="a worker parked inside its atomic step's transaction",
        explain=ws.report,
    )
    host = next(host for host, path in reached.items() if path.exists())
    stopped = clusters[host]
    paused = time.monotonic()
    os.killpg(stopped.pgid, signal.SIGSTOP)
    wait_for(stopped.stopped, timeout=30, interval=0.01, what=f"{host}'s processes stopped")
    other = next(name for name in dirs if name != host)
    (Path(dirs[other]) / "in_atomic_step").unlink()  # the other host runs the step through
    worker = int(reached[host].read_text().split()[0])
    held = live_instance_leases(host)
    try:
        # What the other host's claim has to pass by: the stopped worker's transaction.
        assert idle_in_transaction(worker), "the stopped worker is not inside its transaction"
        wait_for(
            lambda: status(instance.pk) == InstanceStatus.COMPLETED,
            timeout=LEASE_TTL + 30,
            interval=0.05,
            what=f"{other} to take the stopped worker's instance over and complete it",
            explain=ws.report,
        )
        took = time.monotonic() - paused
        print(f"\n[{other} completed the stopped worker's instance {took:.2f} s after SIGSTOP]")
        assert took <= LEASE_TTL + 2.0, f"took {took:.2f} s"
        assert not idle_in_transaction(worker), "the server ended the stopped session"
        fences = dict(Lease.objects.filter(key__in=list(held)).values_list("key", "fence"))
        assert all(fences[key] > fence for key, fence in held.items()), (held, fences)
    finally:
        (Path(dirs[host]) / "in_atomic_step").unlink(missing_ok=True)
        os.killpg(stopped.pgid, signal.SIGCONT)
    # The stopped transaction rolled back: one note, written by the other host's run.
    from tests.providers.alpha.models import Note

    notes = list(Note.objects.filter(instance_id=instance.pk).values_list("text", flat=True))
    assert notes == ["t"], notes
    assert all(cluster.alive() for cluster in clusters.values())


def idle_in_transaction(pid: int) -> bool:
    """Whether a session of process ``pid`` is idle inside a transaction right now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE client_port IS NOT NULL "
            "AND state = 'idle in transaction' AND client_port = ANY(%s)",
            [client_ports(pid)],
        )
        return cursor.fetchone()[0] > 0


def client_ports(pid: int) -> list[int]:
    """The local TCP ports of process ``pid``'s connections (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def decided(instance_id: int) -> dict:
    """What the holder decided: the instance, its steps and its ledger operations."""
    from govflow.engine.models import Instance, Token

    return {
        "instance": list(
            Instance.objects.filter(pk=instance_id).values(
                "status", "variables", "next_ordinal", "completed_at"
            )
        ),
        "tokens": list(
            Token.objects.filter(instance_id=instance_id)
            .order_by("ordinal")
            .values("node_id", "state", "attempt", "operation_key")
        ),
        "operations": list(operations_of(instance_id).values_list("key", "state", "fence")),
    }
