"""A long instance resumed many times: cost per step against the chain's length (ADR 0066).

    make bench ARGS="--only resumes"
    DATABASE_URL=postgres://… .venv/bin/python bench/resumes.py [--steps 200] [--per-run 2]

An instance that waits for timers, messages or people starts a new run at every resume,
and a new run has no verified mark of its own. Here one instance of ``--steps`` steps runs
``--per-run`` steps per run (``GOVFLOW_MAX_STEPS_PER_RUN``), in this process, twice: with
sealed marks (what GovFlow does) and with sealing switched off (every resumed run reads and
verifies its whole chain, as before ADR 0066). Printed per step for the first and the last
tenth of the runs: client CPU (``process_time``) and the checkpoints each run's first
dispatch read. Judged: the last runs' CPU per step against the first runs' (per-step cost
must not grow with the instance's length), and the checkpoints a late run reads.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

from harness import django_test_db, run_bench
from pgserver import postgres_server
from report import Target, say, table, verdicts

TARGET_GROWTH = 1.25
_versions = itertools.count(1)
FULL = {"steps": 200, "per_run": 2}
QUICK = {"steps": 80, "per_run": 2}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/resumes.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="an 80-step instance")
    parser.add_argument("--steps", type=int, help="steps of the instance (default 200)")
    parser.add_argument("--per-run", type=int, help="steps per run (default 2)")
    parser.add_argument("--targets-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def resumed(steps: int, per_run: int, *, sealing: bool) -> list[tuple[int, float, int]]:
    """Run one instance to its end; per run: steps, client CPU ms, checkpoints read by the
    run's first dispatch."""
    from django.test.utils import override_settings

    from bench.engine.govflow_side import noops_document
    from govflow.engine.models import InstanceStatus
    from govflow.engine.services.definitions import definition_publish
    from govflow.engine.services.instances import instance_start
    from govflow.engine.services.runtime import instance_run
    from recovery import chain
    from recovery.services import stored_marks

    read: list[int] = []
    load_sealed, store_after = chain.load_sealed, stored_marks.STORE_AFTER

    def counted(cursor, subject):
        row, checkpoints, operations = load_sealed(cursor, subject)
        read.append(len(checkpoints))
        return row, checkpoints, operations

    chain.load_sealed = counted
    stored_marks.STORE_AFTER = store_after if sealing else 10**9
    runs: list[tuple[int, float, int]] = []
    try:
        # No-op steps: what grows with the instance is its chain, not its variables.
        key = f"bench.resumed_{steps}_{next(_versions)}"
        definition = definition_publish(document=noops_document(key, steps, "No-op steps"))
        instance = instance_start(definition=definition, variables={})
        with override_settings(GOVFLOW_MAX_STEPS_PER_RUN=per_run):
            while True:
                before, cpu = len(read), time.process_time()
                report = instance_run(instance_id=instance.pk)
                cpu = (time.process_time() - cpu) * 1000
                runs.append((report.steps, cpu, sum(read[before:])))
                if report.status != InstanceStatus.RUNNING:
                    break
        assert report.status == InstanceStatus.COMPLETED, report.status
    finally:
        chain.load_sealed, stored_marks.STORE_AFTER = load_sealed, store_after
    return runs


def span(runs: list[tuple[int, float, int]]) -> tuple[float, float]:
    """CPU ms per step and checkpoints read per run over ``runs``."""
    steps = sum(r[0] for r in runs) or 1
    return sum(r[1] for r in runs) / steps, sum(r[2] for r in runs) / len(runs)


def bench(args: argparse.Namespace) -> list[Target]:
    from django.db import connection

    from recovery.services.stored_marks import STORE_AFTER

    say(f"One instance of {args.steps} steps, {args.per_run} steps per run, run in-process")
    say(f"load average before: {os.getloadavg()[0]:.2f}")
    resumed(5, 1, sealing=True)  # warm: imports, definitions, prepared statements
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    figures = {}
    for sealing in (True, False):
        runs = resumed(args.steps, args.per_run, sealing=sealing)
        tenth = max(len(runs) // 10, 1)
        figures[sealing] = (span(runs[1 : 1 + tenth]), span(runs[-tenth - 1 : -1]), len(runs))
    rows = []
    for sealing, ((cpu0, read0), (cpu1, read1), count) in figures.items():
        rows.append(
            (
                "sealed marks" if sealing else "sealing off (before ADR 0066)",
                str(count),
                f"{cpu0:.2f}",
                f"{cpu1:.2f}",
                f"{cpu1 / cpu0:.2f}x",
                f"{read0:.0f}",
                f"{read1:.0f}",
            )
        )
    say(
        table(
            ("", "runs", "CPU ms/step first", "last", "growth", "read first", "read last"),
            rows,
            {1, 2, 3, 4, 5, 6},
        )
    )
    say(f"load average after: {os.getloadavg()[0]:.2f}")
    (cpu0, read0), (cpu1, read1), _ = figures[True]
    growth = cpu1 / cpu0
    limit = 2 * STORE_AFTER
    targets = [
        Target(
            f"resumed {args.steps}-step instance: client CPU per step, last runs / first",
            f"{growth:.2f}x",
            f"<= {TARGET_GROWTH}x",
            growth <= TARGET_GROWTH,
        ),
        Target(
            "resumed instance: checkpoints a late run's first dispatch reads",
            f"{read1:.0f}",
            f"<= {limit}",
            read1 <= limit,
        ),
    ]
    (_, _), (off_cpu, off_read), _ = figures[False]
    notes = [("sealing off: last runs' CPU ms/step, checkpoints read", f"{off_cpu:.2f}",
              f"{off_read:.0f}", "reference")]  # fmt: skip
    say()
    say(verdicts(targets, notes))
    return targets


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    say("GovFlow benchmark: a long instance resumed many times, on PostgreSQL")

    def body() -> list[Target]:
        with (
            postgres_server() as server,
            django_test_db(server, "govflow_bench_resumes", "bench.engine.settings"),
        ):
            from django.test.utils import setup_test_environment

            setup_test_environment()
            return bench(args)

    return run_bench(args.targets_json, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
