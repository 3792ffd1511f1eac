"""Benchmark one non-atomic ledger lifecycle on a durable PostgreSQL server.

    make bench                                   # runs this, then bench/engine_vs_dbos.py
    .venv/bin/python bench/ledger.py [--quick] [--lifecycles N] …   # this one alone

A lifecycle is ``operation_record`` (the dispatch-boundary commit) followed by
``operation_observe(state="succeeded")`` (terminal state and checkpoint, after verifying
the subject's chain). The benchmark runs on ``make bench``'s server, on ``DATABASE_URL``'s
or on a throwaway durable server of its own (``pgserver.py``). It creates and migrates a
fresh database, prints throughput, SQL statements and commits per lifecycle against their
targets, a raw-psycopg baseline and where the time goes, then drops the database (and
stops the server if it started one). The timed variants run in interleaved rounds
(``variants.py``), so load from other processes on a shared machine weighs on all of them
alike. The rate judged is one thread's, each lifecycle waiting for its own two WAL
flushes; beside it, not judged, the same lifecycles from ``--threads`` K threads of the
process at once, whose commits share flushes (``threaded.py``, ADR 0045).

It exits 0 when it ran, whether or not the targets were met (benchmarks report, tests
assert), and non-zero when the benchmark itself failed.

Settings: ``govflow.settings.test``: DEBUG off (no query log), the database options
production gets from ``DATABASE_URL`` (``database_from_env``) and fixed chain keys (the
keyed BLAKE3 chain costs the same with any key). ``govflow.settings.prod`` would demand
deployment secrets and hosts a benchmark has no use for.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys

from harness import SETTINGS, django_test_db, run_bench
from pgserver import BenchSetupError, Server, postgres_server
from report import Target, say, verdicts
from sections import (
    load,
    show_baseline,
    show_experiment,
    show_instrumented,
    show_main,
    show_threads,
)

TARGET_RATE = 600.0
TARGET_STATEMENTS = 2  # one per commit outside a transaction on PostgreSQL (ADR 0040)
TARGET_COMMITS = 2


FULL = {"lifecycles": 3000, "reference": 1000, "warmup": 300}
QUICK = {"lifecycles": 1000, "reference": 300, "warmup": 100}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/ledger.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: defaults 1000 lifecycles per timed run, 300 per reference run, "
        "100 warm-up",
    )
    parser.add_argument("--lifecycles", type=int, help="per timed run (3000)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs; the median is kept (3)")
    parser.add_argument("--steps", type=int, default=5, help="operations per instance (5)")
    parser.add_argument(
        "--reference", type=int, help="per run of the baseline and experiment (1000)"
    )
    parser.add_argument("--warmup", type=int, help="warm-up lifecycles (300)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one run of --reference lifecycles with cProfile",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=4,
        metavar="K",
        help="also time K threads of one process running lifecycles at once, a second "
        "figure beside the judged one-thread figure (4; 0: not measured)",
    )
    parser.add_argument(
        "--no-experiment",
        action="store_true",
        help="skip the Django server-side-binding experiment",
    )
    parser.add_argument(
        "--targets-json", metavar="PATH", help="also write the targets to PATH (for bench/run.py)"
    )
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if (
        min(args.lifecycles, args.reference) < args.steps
        or args.runs < 1
        or args.steps < 1
        or args.warmup < 0
    ):
        parser.error(
            "need --lifecycles and --reference >= --steps >= 1, --runs >= 1 and --warmup >= 0"
        )
    return args


def show_setup(args: argparse.Namespace, server: Server, db_name: str) -> None:
    import django
    import psycopg
    import workload
    from django.conf import settings

    pg = workload.server_settings()
    if int(pg["server_version_num"]) < 150000:
        raise BenchSetupError(
            f"PostgreSQL {pg['server_version']} is too old: counting commits at the database "
            "needs pg_stat_force_next_flush() (PostgreSQL 15+)."
        )
    db = settings.DATABASES["default"]
    n, steps = args.lifecycles, args.steps
    say("Setup")
    for name, value in (
        ("server", server.origin),
        ("version", pg["version"]),
        (
            "durability",
            f"fsync={pg['fsync']}  synchronous_commit={pg['synchronous_commit']}  "
            f"wal_sync_method={pg['wal_sync_method']}  "
            f"full_page_writes={pg['full_page_writes']}  "
            f"commit_delay={pg['commit_delay']}",
        ),
        (
            "database",
            f"{db_name}: created, migrated and VACUUM ANALYZEd by this run (again after the "
            "warm-up); dropped at its end",
        ),
        (
            "settings",
            f"{SETTINGS}: DEBUG={settings.DEBUG}, CONN_MAX_AGE={db['CONN_MAX_AGE']}, "
            f"OPTIONS={db.get('OPTIONS', {})}",
        ),
        (
            "client",
            f"Python {platform.python_version()}, Django {django.get_version()}, "
            f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}, libpq "
            f"{psycopg.pq.version()}), {os.cpu_count()} CPUs, load average {load()}",
        ),
        (
            "workload",
            f"instances of {steps} steps: each subject (workflow instance) gets "
            f"{steps} operations, run back to back",
        ),
        (
            "",
            f"(chains of 1-{2 * steps} checkpoints); one lease per instance, ttl 1 h, "
            "acquired before timing",
        ),
        (
            "",
            "and not counted; arguments and input fingerprints made before timing; result "
            "fingerprint,",
        ),
        ("", "operation key, facts, links and the chain verification happen inside"),
        (
            "runs",
            f"warm-up {args.warmup:,} lifecycles, then {args.runs} timed runs of {n:,} "
            f"lifecycles ({-(-n // steps):,} instances each), one process; median kept",
        ),
        ("", f"baseline and experiment: {args.runs} runs of {args.reference:,} lifecycles each"),
    ):
        say(f"  {name:<11}{value}")
    if os.getloadavg()[0] > 0.5:
        say(
            "  WARNING    the machine is busy (1-minute load average above 0.5): throughput "
            "may read low"
        )
    say()


def show_statements(log: list, wire) -> None:
    say("One lifecycle: every statement connection.execute_wrapper saw (nothing excluded)")
    say("  tx 1  operation_record(state='dispatched'): the dispatch boundary")
    number, tx = 0, 1
    for kind, item in log:
        if kind == "commit" and item == "autocommit":
            say("        its own transaction: sent in autocommit, committed as the statement ends")
            tx += 1
            if tx == 2:
                say(
                    "  tx 2  operation_observe(state='succeeded', result=…): the chain checked "
                    "inside the write"
                )
            continue
        if kind == "commit":
            say(
                "        COMMIT: Django calls the driver's commit(), not a statement the wrapper "
                "sees"
            )
            tx += 1
            if tx == 2:
                say(
                    "  tx 2  operation_observe(state='succeeded', result=…): verifies the chain "
                    "first"
                )
            continue
        number += 1
        text = " ".join(item[0].split())
        say(f"    {number}   {text[:90]}{'…' if len(text) > 90 else ''}")
    say(
        f"  on the wire (libpq trace of {wire.lifecycles} lifecycles): "
        f"{wire.round_trips / wire.lifecycles:.1f} round trips per lifecycle "
        f"= statements + {wire.begins / wire.lifecycles:.1f} BEGIN "
        f"+ {wire.commits / wire.lifecycles:.1f} COMMIT"
    )
    say()


def bench(args: argparse.Namespace, server: Server, db_name: str) -> list[Target]:
    import baseline
    import workload

    n, steps = args.lifecycles, args.steps
    args.local = server.local
    show_setup(args, server, db_name)
    workload.vacuum_analyze()  # so autovacuum's first pass over the new database is not timed
    if args.warmup:
        workload.run(workload.plan("warm", args.warmup, steps))
    # Statistics of tables that hold rows, as autovacuum gathers them within a minute of
    # the first writes (ADR 0030). Without them, the statements prepared during the warm-up
    # keep the generic plans made for empty tables — sequential scans of the operations and
    # checkpoints — for the life of the connection: 3-4 ms of server CPU per lifecycle,
    # growing with every row, which no deployment past its first minute sees. ANALYZE also
    # invalidates those cached plans, so the timed runs plan with the statistics.
    workload.vacuum_analyze()
    from recovery.api import transactions_only

    first, first_tx = workload.plan("trace", 1, steps), workload.plan("tracetx", 1, steps)
    with workload.instrumented(log=True) as traced:
        workload.run(first)
    # The raw baseline mirrors the statements of the transaction path (before ADR 0040).
    with transactions_only(), workload.instrumented(log=True) as traced_tx:
        workload.run(first_tx)
    sql, captured = baseline.statements(traced_tx.log)
    sample = workload.plan("wire", 10 * steps, steps)
    args.wire = workload.wire_trace(lambda: workload.run(sample), len(sample))
    show_statements(traced.log, args.wire)

    counted = show_instrumented(min(n, 1000), steps, server.local)

    from django.db import connection
    from variants import baseline_variants, django_variant, run_rounds, threads_variant

    configured = dict(connection.settings_dict["OPTIONS"])
    django = django_variant(args)
    with baseline_variants(args, sql, captured) as raw, threads_variant(args) as threads:
        variants = [django, *([threads] if threads else []), *raw]
        if not args.no_experiment:
            variants.append(django_variant(args, experiment=True))
        say(
            f"Timed rounds: each round runs every variant once, in this order: "
            f"{', '.join(v.tag for v in variants)}"
        )
        say("(interleaved, so a change in the machine's load weighs on all of them alike)")
        run_rounds(variants, args.runs)
    say()
    show_main(django, steps)
    if threads:
        show_threads(threads, steps)
    medians = show_baseline(raw, args.wire)
    experiment = None if args.no_experiment else show_experiment(variants[-1], configured)
    if args.profile:
        from profiling import profile

        workload.run(workload.plan("profwarm", max(steps, min(args.warmup, 100)), steps))
        work = workload.plan("prof", args.reference, steps)
        say("Where the time goes (cProfile)")
        say(profile(lambda: workload.run(work), len(work)))
        say()

    summary = django.summary()
    rate, commits = summary["median"], summary["commits"]
    targets = [
        Target(
            "lifecycles/s, one process, one thread (median)",
            f"{rate:,.0f}",
            f">= {TARGET_RATE:,.0f}",
            rate >= TARGET_RATE,
        ),
        Target(
            "SQL statements per lifecycle",
            f"{counted['statements']:.2f}",
            f"<= {TARGET_STATEMENTS}",
            counted["statements"] <= TARGET_STATEMENTS,
        ),
        Target(
            "commits per lifecycle (pg_stat_database)",
            f"{commits:.3f}",
            f"= {TARGET_COMMITS}",
            round(commits, 2) == TARGET_COMMITS,
        ),
    ]
    agree = round(counted["client"], 2) == round(commits, 2)
    notes = [
        (
            "  cross-check: COMMITs counted by the client",
            f"{counted['client']:.3f}",
            "= db figure",
            "agrees" if agree else "DISAGREES",
        ),
        (
            "reference: raw psycopg, same statements",
            f"{medians['raw']:,.0f}",
            "",
            f"Django + recovery reach {rate / medians['raw']:.0%} of it",
        ),
    ]
    if threads:
        notes.append(
            (
                f"second figure: {args.threads} threads of one process",
                f"{threads.summary()['median']:,.0f}",
                "",
                "not judged: commits share WAL flushes (ADR 0045)",
            )
        )
    if experiment is not None:
        notes.append(
            (
                "experiment: Django, server_side_binding",
                f"{experiment:,.0f}",
                "",
                f"{experiment / rate - 1:+.0%} vs configured settings",
            )
        )
    say(f"Results (load average now {load()})")
    say(verdicts(targets, notes))
    say(
        "The rate judged is one thread's: each lifecycle waits for its own two WAL flushes, "
        "as one caller\nalone does. Threads of one process share flushes, so their figure "
        "answers another question (ADR 0045)."
    )
    return targets


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the server
    say("GovFlow benchmark: one non-atomic ledger lifecycle on PostgreSQL")
    say("(operation_record 'dispatched' -> operation_observe 'succeeded')")
    say()

    def body() -> list[Target]:
        with postgres_server() as server, django_test_db(server, "govflow_bench") as db_name:
            return bench(args, server, db_name)

    return run_bench(args.targets_json, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
