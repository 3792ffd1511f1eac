"""Benchmark fetch-and-lock of external tasks on a durable PostgreSQL server.

    make bench                                   # runs this after the ledger and engine
    make bench ARGS="--only tasks"               # this one alone, on make bench's server
    .venv/bin/python bench/tasks.py [--quick] [--tasks N] [--workers 8] [--batch 10]

Seeds N open tasks of one topic (one instance, N waiting steps: the rows fetch-and-lock
reads, written in bulk), then:

1. **service**: W threads (one connection each) call ``task_fetch_and_lock`` with
   ``max_tasks=batch`` until the queue is empty — task claims/s, and every claim checked
   to be the only one of its task (0 duplicates);
2. **redelivery**: every lock expires (its stored expiry is brought to the database clock,
   as the tests move time), then the W threads take the queue again: the share of tasks
   redelivered, each exactly once and with fence 2;
3. **API**: W threads post ``/api/v1/tasks/fetch-and-lock/`` (Django's test client, the
   whole DRF stack: key, scope, throttle, problems) — requests/s and claims/s beside it.

Targets: ≥ 4,000 claims/s through the service with 8 workers, 0 duplicate claims, 100 %
redelivery after expiry. Exit 0 when it ran, met or not (benchmarks report, tests assert).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from time import perf_counter

from harness import django_test_db, run_bench
from pgserver import postgres_server
from report import Target, say, verdicts

TOPIC = "bench.claims"
TARGET_CLAIMS = 4000.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/tasks.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 tasks instead of 40,000")
    parser.add_argument("--tasks", type=int, help="tasks seeded (40000; --quick 10000)")
    parser.add_argument("--workers", type=int, default=8, help="concurrent workers (8)")
    parser.add_argument("--batch", type=int, default=10, help="max_tasks per fetch (10)")
    parser.add_argument("--api-requests", type=int, default=2000, help="API fetches (2000)")
    parser.add_argument("--targets-json", metavar="PATH")
    args = parser.parse_args(argv)
    args.tasks = args.tasks or (10_000 if args.quick else 40_000)
    return args


def seed(count: int):
    """One instance waiting on ``count`` external-task steps; returns the instance."""
    from govflow.engine.db import clock
    from govflow.engine.models import ExternalTask, Instance, Token
    from govflow.engine.services.definitions import definition_publish

    document = {
        "key": "bench.claims",
        "version": 1,
        "title": "Claims",
        "nodes": [
            {"id": "start", "type": "start"},
            {"id": "work", "type": "external_task", "topic": TOPIC},
            {"id": "end", "type": "end"},
        ],
        "transitions": [{"from": "start", "to": "work"}, {"from": "work", "to": "end"}],
    }
    definition = definition_publish(document=document)
    instance = Instance.objects.create(
        definition=definition,
        definition_fp=definition.fingerprint,
        tenant="bench",
        created_at=clock(),
        updated_at=clock(),
    )
    for start in range(0, count, 2000):
        size = min(2000, count - start)
        tokens = Token.objects.bulk_create(
            Token(
                instance=instance,
                node_id="work",
                ordinal=start + n + 1,
                state="waiting",
                wait_kind="external",
                created_at=clock(),
                updated_at=clock(),
            )
            for n in range(size)
        )
        ExternalTask.objects.bulk_create(
            ExternalTask(
                instance=instance,
                token=token,
                node_id="work",
                tenant="bench",
                topic=TOPIC,
                variables={"n": token.ordinal},
                fetchable_at=clock(),
                created_at=clock(),
            )
            for token in tokens
        )
    return instance


def race(workers: int, work) -> tuple[float, list]:
    """Run ``work(index)`` in ``workers`` threads (own connections); seconds and results."""
    from django.db import connection

    results: list = [None] * workers
    errors: list = []
    go = threading.Barrier(workers + 1)

    def run(index: int) -> None:
        try:
            connection.ensure_connection()
            go.wait()
            results[index] = work(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    go.wait()
    started = perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return perf_counter() - started, results


def drain(args, lock_seconds: float) -> tuple[float, list[tuple[int, int]]]:
    from govflow.engine.services.external_queue import task_fetch_and_lock

    def work(index: int) -> list[tuple[int, int]]:
        claimed = []
        while True:
            batch = task_fetch_and_lock(
                topics=[TOPIC],
                worker=f"bench-{index}",
                lock_seconds=lock_seconds,
                max_tasks=args.batch,
            )
            if not batch:
                return claimed
            claimed.extend((t.id, t.fence) for t in batch)

    seconds, results = race(args.workers, work)
    return seconds, [claim for result in results for claim in result]


def expire_all_locks() -> None:
    """Every lock expires now: its stored expiry is brought to the database clock (as if
    the clock had moved on by the lock's duration), the way the tests move time."""
    from govflow.engine.db import clock
    from govflow.engine.models import ExternalTask

    ExternalTask.objects.filter(state="locked").update(
        lock_expires_at=clock(), fetchable_at=clock()
    )


def api_run(args) -> tuple[float, int, int]:
    from django.test import Client

    from govflow.api.models import ApiKey

    _, raw = ApiKey.objects.create_key(name="bench", tenant="bench", scopes=[f"tasks:{TOPIC}"])
    per_worker = max(1, args.api_requests // args.workers)
    body = {"worker_id": "", "topics": [TOPIC], "lock_duration": 600, "max_tasks": args.batch}

    def work(index: int) -> tuple[int, int]:
        client = Client(HTTP_AUTHORIZATION=f"Api-Key {raw}")
        ok = claims = 0
        for _ in range(per_worker):
            response = client.post(
                "/api/v1/tasks/fetch-and-lock/",
                {**body, "worker_id": f"api-{index}"},
                content_type="application/json",
            )
            ok += response.status_code == 200
            claims += len(response.json().get("tasks", [])) if response.status_code == 200 else 0
        return ok, claims

    seconds, results = race(args.workers, work)
    return seconds, sum(r[0] for r in results), sum(r[1] for r in results)


def bench(args) -> list[Target]:
    from django.conf import settings

    from govflow.engine.db import clock
    from govflow.engine.models import ExternalTask

    say(f"Seeding {args.tasks:,} open tasks of topic {TOPIC!r}…")
    seed(args.tasks)
    seconds, claims = drain(args, lock_seconds=600)
    counts = Counter(task for task, _ in claims)
    duplicates = sum(n - 1 for n in counts.values())
    rate = len(claims) / seconds
    say(f"service: {len(claims):,} claims in {seconds:.2f} s by {args.workers} workers")
    expire_all_locks()
    _, again = drain(args, lock_seconds=600)
    fences = Counter(fence for _, fence in again)
    redelivered = len({task for task, _ in again}) / args.tasks
    say(f"redelivery: {len(again):,} claims of {args.tasks:,} tasks, by fence {dict(fences)}")
    ExternalTask.objects.update(state="open", worker="", fetchable_at=clock())
    settings.GOVFLOW_API_RATE = ""  # the API's throughput, not its rate limit
    api_seconds, api_ok, api_claims = api_run(args)
    targets = [
        Target(
            f"claims/s through the service ({args.workers} workers, batch {args.batch})",
            f"{rate:,.0f}",
            f">= {TARGET_CLAIMS:,.0f}",
            rate >= TARGET_CLAIMS,
        ),
        Target("duplicate claims", f"{duplicates}", "0", duplicates == 0),
        Target(
            "redelivered after expiry (fence 2)",
            f"{redelivered:.0%}",
            "100 %",
            redelivered == 1.0 and len(again) == args.tasks and set(fences) == {2},
        ),
    ]
    notes = [
        ("API fetch-and-lock requests/s", f"{api_ok / api_seconds:,.0f}", "", "reference"),
        ("API claims/s", f"{api_claims / api_seconds:,.0f}", "", "reference"),
    ]
    say(verdicts(targets, notes))
    return targets


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    say("GovFlow benchmark: fetch-and-lock of external tasks on PostgreSQL")

    def body() -> list[Target]:
        with postgres_server() as server, django_test_db(server, "govflow_bench_tasks"):
            return bench(args)

    return run_bench(args.targets_json, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
