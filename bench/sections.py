"""The benchmark's measured sections, each printing its own table."""

from __future__ import annotations

import os
from time import process_time

from report import say, table

RUN_HEADER = (
    "run",
    "lifecycles",
    "seconds",
    "lifecycles/s",
    "client CPU µs/lc",
    "server CPU µs/lc",
    "commits (db)",
    "commits/lc",
    "autovacuum",
)


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def show_instrumented(count: int, steps: int, local: bool) -> dict:
    """One run with every statement and COMMIT timed, plus CPU and WAL flush accounting."""
    import workload

    work = workload.plan("instr", count, steps)
    # Only the run itself lies between the two commit probes.
    timed_wal = workload.track_wal_timing()
    wal = workload.wal_flushes()
    server_cpu = workload.backend_cpu_seconds() if local else None
    pages = workload.blocks_hit()
    before = workload.xact_commit()
    cpu = process_time()
    with workload.instrumented() as tools:
        seconds = workload.run(work)
    cpu = process_time() - cpu
    after = workload.xact_commit()
    pages = workload.blocks_hit() - pages
    if server_cpu is not None:
        after_cpu = workload.backend_cpu_seconds()
        server_cpu = None if after_cpu is None else after_cpu - server_cpu
    syncs, sync_ms = (b - a for a, b in zip(wal, workload.wal_flushes(), strict=True))
    if timed_wal:
        workload.track_wal_timing(on=False)
    db_commits = (after[0] - before[0] - workload.PROBE_OVERHEAD) / count
    per = 1e6 / count
    python = seconds - tools.statement_seconds - tools.commit_seconds

    def share(part: float) -> str:
        return f"{part / seconds:.0%}"

    rows = [
        ("SQL statements (execute_wrapper)", f"{tools.statements / count:.2f}", ""),
        ("  of them in autocommit", f"{tools.autocommit_statements / count:.2f}", ""),
        (
            "COMMITs, client side (+ autocommit statements)",
            f"{tools.client_commits / count:.2f}",
            "",
        ),
        ("commits at the database (pg_stat_database)", f"{db_commits:.3f}", ""),
        ("  autovacuum vacuums/analyses meanwhile (total)", f"{after[1] - before[1]}", ""),
        ("rollbacks", f"{tools.rollbacks / count:.2f}", ""),
        ("pages touched (pg_stat_database.blks_hit + blks_read)", f"{pages / count:.1f}", ""),
        ("WAL flushes (pg_stat_wal.wal_sync, server-wide)", f"{syncs / count:.2f}", ""),
        (
            "µs in statement calls (driver, round trip, BEGIN)",
            f"{tools.statement_seconds * per:,.0f}",
            share(tools.statement_seconds),
        ),
        (
            "µs in COMMIT calls (driver, round trip, WAL flush)",
            f"{tools.commit_seconds * per:,.0f}",
            share(tools.commit_seconds),
        ),
        (
            "  of it in WAL fdatasync (track_wal_io_timing)",
            f"{sync_ms * 1e3 / count:,.0f}" if timed_wal and sync_ms else "n/a",
            share(sync_ms / 1e3) if timed_wal and sync_ms else "",
        ),
        (
            "µs outside driver calls (Django + recovery Python)",
            f"{python * per:,.0f}",
            share(python),
        ),
        ("µs total", f"{seconds * per:,.0f}", "100%"),
        ("µs client CPU (process_time)", f"{cpu * per:,.0f}", share(cpu)),
        (
            "µs server backend CPU (/proc)",
            "n/a" if server_cpu is None else f"{server_cpu * per:,.0f}",
            "" if server_cpu is None else share(server_cpu),
        ),
    ]
    say(f"Where the time goes: one instrumented run of {count:,} lifecycles (per lifecycle)")
    say(table(("figure", "value", "share"), rows, {1, 2}))
    say("  (a driver call's time is psycopg's own Python work plus the wait for the server; wall")
    say("   time covered by neither client nor server CPU is fsync, scheduling and loopback)")
    say()
    return {
        "statements": tools.statements / count,
        "client": tools.client_commits / count,
        "db": db_commits,
    }


def show_main(variant, steps: int) -> None:
    say(
        f"{variant.name}: {len(variant.runs)} timed runs of {variant.count:,} lifecycles "
        f"(instances of {steps} steps)"
    )
    say(table(RUN_HEADER, variant.rows(), {1, 2, 3, 4, 5, 6, 7, 8}))
    import workload

    say(
        "  commits (db) = pg_stat_database.xact_commit after - before - "
        f"{workload.PROBE_OVERHEAD} (the probes' own"
    )
    say("  transactions). It also counts other sessions' commits: autovacuum = tables autovacuum")
    say("  vacuumed or analysed meanwhile (each commits ~2 transactions); the database was")
    say("  VACUUM ANALYZEd after migrating. After each run: every operation succeeded, and a")
    say("  sample of chains verifies.")
    plans = variant.plans
    if plans:
        say("  plans of its prepared statements after its last run (pg_prepared_statements;")
        say("  a custom plan is planned anew for its one execution):")
        for generic, custom, text in plans:
            say(f"    {generic:>6,} generic {custom:>5,} custom  {' '.join(text.split())[:60]}…")
    say()


def show_baseline(variants: list, wire) -> dict:
    """Print the raw-psycopg variants and the round-trip floors; return their median rates."""
    import baseline

    n = len(baseline.SHAPE[0]) + len(baseline.SHAPE[1])
    say(f"Raw psycopg baseline: the {n} statements of the transaction path (ADR 0035, 0050: SQL")
    say("text captured inside recovery.api.transactions_only(), same parameter shapes: checked),")
    say("in 2 transactions, without Django, keys, facts and links computed before timing: what the")
    say("database and the driver allow from Python for the lifecycle as it was before ADR 0040")
    rows = []
    for v in variants:
        summary = v.summary()
        server_cpu = summary["server_cpu"]
        rows.append(
            (
                v.name.removeprefix("raw psycopg, "),
                f"{summary['median']:,.0f}",
                "  ".join(f"{r:,.0f}" for r in summary["rates"]),
                f"{summary['client_cpu']:,.0f}",
                "n/a" if server_cpu is None else f"{server_cpu:,.0f}",
                f"{summary['commits']:.3f}",
            )
        )
    header = (
        "psycopg connection",
        "lifecycles/s",
        "runs",
        "client CPU µs/lc",
        "server CPU µs/lc",
        "commits/lc",
    )
    say(table(header, rows, {1, 2, 3, 4, 5}))
    conn = baseline.connect(server_side=False)
    try:
        round_trip, commit = baseline.floor(conn)
    finally:
        conn.close()
    trips = n + 2 * 2  # the statements, and BEGIN and COMMIT of each transaction
    floor = (trips - 2) * round_trip + 2 * commit
    say(
        f"  floor: a round trip (SELECT 1) takes {round_trip:,.0f} µs, a durable one-row INSERT "
        f"commit {commit:,.0f} µs;"
    )
    say(
        f"  transaction path: {trips} round trips of which 2 flush WAL: {trips - 2} x "
        f"{round_trip:,.0f} + 2 x {commit:,.0f} = "
        f"{floor:,.0f} µs, at most {1e6 / floor:,.0f} lifecycles/s before any work"
    )
    trips = wire.round_trips / wire.lifecycles
    floor = (trips - 2) * round_trip + 2 * commit
    say(
        f"  as configured (traced above): {trips:.1f} round trips of which 2 flush WAL: "
        f"{trips - 2:.1f} x {round_trip:,.0f} + 2 x {commit:,.0f} = {floor:,.0f} µs, at most "
        f"{1e6 / floor:,.0f} lifecycles/s before any work"
    )
    say()
    return {v.tag: v.summary()["median"] for v in variants}


def show_experiment(variant, configured: dict) -> float:
    say("Experiment (not the configured settings): Django + recovery.api with database OPTIONS")
    say(f"server_side_binding=True, prepare_threshold=1 (configured: {configured}). Django's")
    say("default cursor binds parameters in the client, and psycopg never prepares those.")
    say(table(RUN_HEADER, variant.rows(), {1, 2, 3, 4, 5, 6, 7, 8}))
    say()
    return variant.summary()["median"]


def show_threads(variant, steps: int) -> None:
    """The second figure: the same lifecycles from K threads of this process at once."""
    say(
        f"{variant.name}: {len(variant.runs)} timed runs of {variant.count:,} lifecycles "
        f"(instances of {steps} steps, whole instances per thread)"
    )
    say(table(RUN_HEADER, variant.rows(), {1, 2, 3, 4, 5, 6, 7, 8}))
    say("  A second figure, not the judged one: commits of different threads that reach the")
    say("  server together share one WAL flush (group commit), and one thread's Python runs")
    say("  while another waits, as in a worker running several claimed instances (ADR 0041).")
    say("  client CPU = the whole process; server CPU = the K backends together; commits (db)")
    say("  also less the K threads' own statistics flushes.")
    say()
