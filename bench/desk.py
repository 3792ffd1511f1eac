"""The operator's desk under volume: page times and queries with 10,000 instances.

    make bench ARGS="--only desk"                 # full: 10,000 instances, 1,000 blocked
    .venv/bin/python bench/desk.py --quick        # 2,000 instances, 200 blocked

Rows are made as ``tests/desk_rows.py`` makes them for the tests (blocked instances with
a step of unknown outcome and its decision request, incidents, stale leases, dead
letters, waiting approvals; the rest completed instances), and one instance of 200 steps
is run through the engine, so its page reads a real chain and ledger. Each page is
rendered through Django's test client as an approver bound to the tenant: once to warm
the session, then ``--repeat`` times, timed; the queries of the last render are counted.
Targets (issue 10): the home page (the work queue), the instance list and an instance page
of 200 steps each render in under 300 ms (95th percentile) with a bounded number of
queries (the tests assert the bounds; this prints them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from time import perf_counter, process_time

from harness import django_test_db, run_bench
from pgserver import postgres_server
from report import Target, say, table, verdicts
from sections import load

TARGET_MS = 300.0
FULL = {"instances": 10_000, "blocked": 1_000, "steps": 200, "repeat": 20}
QUICK = {"instances": 2_000, "blocked": 200, "steps": 200, "repeat": 8}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/desk.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 instances, 8 renders each")
    parser.add_argument("--instances", type=int, help="instances in all")
    parser.add_argument("--blocked", type=int, help="of which blocked on an unknown outcome")
    parser.add_argument("--steps", type=int, help="steps of the long instance")
    parser.add_argument("--repeat", type=int, help="timed renders of each page")
    parser.add_argument(
        "--slowest", type=int, default=0, help="print each page's N slowest queries"
    )
    parser.add_argument("--targets-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.blocked * 2 > args.instances:
        parser.error("--blocked may be at most half of --instances (each comes with a waiter)")
    return args


def populate(args: argparse.Namespace):
    """The rows, the long instance and the approver who reads the pages; say what exists."""
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.utils import timezone

    from govflow.engine.models import Definition, Instance
    from govflow.engine.tenancy import tenant_group_name
    from tests.desk_rows import definitions, make_rows
    from tests.flows import action, drive, linear, start

    requester = User.objects.create_user("olga", password="-", is_staff=True)
    reader = User.objects.create_user("anna", password="-", is_staff=True)
    for user, roles in ((requester, ("Operator",)), (reader, ("Operator", "Approver"))):
        user.groups.add(*Group.objects.filter(name__in=roles))
        user.groups.add(Group.objects.get_or_create(name=tenant_group_name("north"))[0])
    definitions()
    started = perf_counter()
    made = make_rows("north", args.blocked, requester=requester)
    acting = Definition.objects.get(key="desk.acting")
    rest = args.instances - 2 * args.blocked
    old = timezone.now() - dt.timedelta(days=3)
    Instance.objects.bulk_create(
        (
            Instance(
                definition=acting,
                definition_fp=acting.fingerprint,
                tenant="north",
                status="completed",
                created_at=old,
                updated_at=old,
            )
            for _ in range(rest)
        ),
        batch_size=2000,
    )
    document = linear(
        *[action(f"s{i}", name="alpha.note") for i in range(args.steps)], key="desk.long"
    )
    long = drive(start(document, tenant="north"), rounds=args.steps + 5)
    with connection.cursor() as cursor:
        # Statistics, as autovacuum would gather within a minute of such a load: without
        # them the planner takes the fresh tables for empty and picks nested loops.
        cursor.execute("ANALYZE")
    say(
        f"made {Instance.objects.count():,} instances in {perf_counter() - started:.0f} s: "
        f"{args.blocked:,} blocked with a decision request, {args.blocked:,} waiting for an "
        f"approval, {rest:,} completed, and one of {long.tokens.count()} steps ({long.status})"
    )
    return reader, made.instances[0], long


def measure(
    client, url: str, repeat: int, slowest: int = 0
) -> tuple[list[float], list[float], int]:
    """Render ``url`` once to warm up, then ``repeat`` times: the wall-clock times (ms), the
    CPU times of this process (ms: the page's Python, without the database server's work,
    and far less sensitive to other load on the machine), the queries of the last render
    (and its ``slowest`` slowest queries, printed)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    first = client.get(url)
    if first.status_code != 200:
        raise RuntimeError(f"{url} answered {first.status_code}, not 200")
    times, cpu = [], []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            began, began_cpu = perf_counter(), process_time()
            client.get(url)
            times.append((perf_counter() - began) * 1000)
            cpu.append((process_time() - began_cpu) * 1000)
    for query in sorted(queries, key=lambda q: -float(q["time"]))[:slowest]:
        say(f"  {float(query['time']) * 1000:7.1f} ms  {query['sql'][:300]}")
    return times, cpu, len(queries)


def p95(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def bench(args: argparse.Namespace) -> list[Target]:
    from django.test import Client
    from django.urls import reverse

    reader, blocked, long = populate(args)
    client = Client()
    client.force_login(reader)
    change = "admin:engine_instance_change"
    pages = {
        "home (work queue)": reverse("admin:index"),
        "home, filtered (tenant, 1 h old)": reverse("admin:index") + "?tenant=north&age=1h",
        "instance list": reverse("admin:engine_instance_changelist"),
        "instance list, blocked": reverse("admin:engine_instance_changelist") + "?status=blocked",
        f"instance page, {args.steps} steps": reverse(change, args=[long.pk]),
        "instance page, blocked (handoff)": reverse(change, args=[blocked.pk]),
    }
    rows, targets = [], []
    for name, url in pages.items():
        if args.slowest:
            say(f"{name}: its slowest queries")
        times, cpu, queries = measure(client, url, args.repeat, args.slowest)
        median, high = statistics.median(times), p95(times)
        cpu_median = statistics.median(cpu)
        rows.append((name, f"{median:.0f}", f"{high:.0f}", f"{cpu_median:.0f}", str(queries)))
        targets.append(
            Target(f"{name}: p95 ms", f"{high:.0f}", f"< {TARGET_MS:.0f}", high < TARGET_MS)
        )
    say()
    say(f"Pages (load average now {load()}: on a busy machine every time is longer)")
    say(table(("page", "median ms", "p95 ms", "CPU ms (median)", "queries"), rows, {1, 2, 3, 4}))
    say()
    say(verdicts(targets, [("renders per page", str(args.repeat), "", "reference")]))
    return targets


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    say("GovFlow benchmark: the operator's desk with many instances, on PostgreSQL")

    def body() -> list[Target]:
        with postgres_server() as server, django_test_db(server, "govflow_bench_desk"):
            return bench(args)

    return run_bench(args.targets_json, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
