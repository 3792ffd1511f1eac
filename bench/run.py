"""``make bench``: every benchmark in one run, on one durable PostgreSQL server.

    make bench                                    # full run
    make bench ARGS=--quick                       # a short run of each
    make bench ARGS="--only tasks"                # one of: ledger, engine, tasks, desk,
                                                  # instructions, resumes
    make bench ARGS="--ledger-args='--lifecycles 5000' --engine-args='--n 1000'"

1. ``bench/ledger.py``: one non-atomic ledger lifecycle (record, then a verified success):
   lifecycles/s, statements and commits per lifecycle.
2. ``bench/engine_vs_dbos.py``: GovFlow's engine (real ``manage.py qcluster`` workers)
   against DBOS Transact (installed only into ``bench/.venv-dbos``, created on first use):
   steps/s with 1, 2 and 4 worker processes, commits per step, cost growth (steps/s and
   CPU per step with 100 to 10,000 instances in flight and 5- to 200-step instances),
   recovery after SIGKILL, timer fire lag.
3. ``bench/tasks.py``: fetch-and-lock of external tasks by 8 concurrent workers: claims/s
   through the service, duplicate claims, redelivery after expiry; API requests/s beside.
4. ``bench/desk.py``: the operator's desk with 10,000 instances (1,000 blocked): page
   times (median, 95th percentile) and queries of the work queue, the instance list and
   an instance page of 200 steps.
5. ``bench/instructions.py``: instructions per step of the client and of the server,
   counted by valgrind's callgrind, not timed: the same for the same code whatever else
   the machine does. It starts a server of its own under callgrind.
6. ``bench/resumes.py``: one long instance run a few steps per run, as an instance that
   waits and resumes many times: client CPU per step and checkpoints read by a run's first
   dispatch, first runs against last, with sealed marks and without (ADR 0066).

All run on the same server: a throwaway durable one (``scripts/pg-server start DIR
durable``, see ``pgserver.py``) started here and stopped at the end, also on error or
Ctrl-C, unless ``DATABASE_URL`` names one. Each benchmark runs in a process of its own (each
sets Django up with its own settings), the ledger first: the engine benchmark then
restarts the server with ``pg_stat_statements`` preloaded, which the ledger's figures are
taken without. Each prints its own report; at the end one Targets table lists them all.

Exit status: 0 when every benchmark ran, whether or not its targets were met (benchmarks
report, tests assert); 1 when a benchmark itself failed; 2 when there was no server.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from pgserver import BenchSetupError, postgres_server, shared_env
from report import Target, load_targets, say, table

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Part:
    name: str
    script: str
    title: str


PARTS = (
    Part("ledger", "bench/ledger.py", "ledger lifecycle on PostgreSQL"),
    Part("engine", "bench/engine_vs_dbos.py", "GovFlow engine vs DBOS Transact"),
    Part("tasks", "bench/tasks.py", "external tasks: fetch-and-lock claims"),
    Part("desk", "bench/desk.py", "the operator's desk with 10,000 instances"),
    Part("instructions", "bench/instructions.py", "instructions per step, client and server"),
    Part("resumes", "bench/resumes.py", "a long instance resumed many times"),
)


@dataclass
class Outcome:
    part: Part
    status: int
    seconds: float
    targets: list[Target]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="make bench ARGS=…",
        description="Every benchmark in one run, on one durable PostgreSQL server.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run of each benchmark (5-6 minutes)"
    )
    parser.add_argument(
        "--only", choices=[p.name for p in PARTS], help="run one benchmark only (default: all)"
    )
    parser.add_argument(
        "--ledger-args",
        default="",
        metavar="ARGS",
        help="more options for bench/ledger.py, e.g. '--lifecycles 5000 --profile'",
    )
    parser.add_argument(
        "--tasks-args",
        default="",
        metavar="ARGS",
        help="more options for bench/tasks.py, e.g. '--tasks 100000 --batch 20'",
    )
    parser.add_argument(
        "--desk-args",
        default="",
        metavar="ARGS",
        help="more options for bench/desk.py, e.g. '--instances 50000 --repeat 50'",
    )
    parser.add_argument(
        "--instructions-args",
        default="",
        metavar="ARGS",
        help="more options for bench/instructions.py, e.g. '--instances 40 --top 30'",
    )
    parser.add_argument(
        "--resumes-args",
        default="",
        metavar="ARGS",
        help="more options for bench/resumes.py, e.g. '--steps 400 --per-run 1'",
    )
    parser.add_argument(
        "--engine-args",
        default="",
        metavar="ARGS",
        help="more options for bench/engine_vs_dbos.py, e.g. '--n 1000 --timers 20000'",
    )
    return parser.parse_args(argv)


class Child:
    """The benchmark process running now, so SIGTERM can stop it before the server."""

    proc: subprocess.Popen | None = None


def run_part(part: Part, args: list[str], env: dict[str, str], scratch: str) -> Outcome:
    targets_path = os.path.join(scratch, f"{part.name}-targets.json")
    started = perf_counter()
    Child.proc = subprocess.Popen(
        [sys.executable, str(ROOT / part.script), *args, "--targets-json", targets_path],
        cwd=ROOT,
        env=env,
    )
    try:
        status = Child.proc.wait()
    finally:  # interrupted: let the benchmark stop its own workers, then stop the server
        if Child.proc.poll() is None:
            Child.proc.terminate()
            try:
                Child.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                Child.proc.kill()
                Child.proc.wait()
        Child.proc = None
    seconds = perf_counter() - started
    targets = load_targets(targets_path) if status == 0 and os.path.exists(targets_path) else []
    return Outcome(part, status, seconds, targets)


def show_targets(outcomes: list[Outcome], total: float) -> None:
    say("=" * 100)
    say("Targets (make bench: every benchmark of this run)")
    rows = [
        (o.part.name, t.figure, t.value, t.target, t.status) for o in outcomes for t in o.targets
    ]
    if rows:
        say(table(("benchmark", "figure", "value", "target", "status"), rows, set()))
    targets = [t for o in outcomes for t in o.targets]
    met = sum(1 for t in targets if t.met)
    say()
    for o in outcomes:
        if o.status != 0:
            say(f"  {o.part.name}: the benchmark FAILED (exit status {o.status}); no targets")
    say(f"SUMMARY: {met} of {len(targets)} targets met.")
    times = ", ".join(f"{o.part.name} {o.seconds:.0f} s" for o in outcomes)
    say(f"(make bench took {total:.0f} s: {times}, the rest starting and stopping the server)")


def main(argv: list[str]) -> int:
    args = parse_args(argv)

    def stop(signum, frame):
        raise SystemExit(128 + signum)  # unwinds: the running benchmark, then the server

    signal.signal(signal.SIGTERM, stop)
    parts = [p for p in PARTS if args.only in (None, p.name)]
    extra = {
        "ledger": shlex.split(args.ledger_args),
        "engine": shlex.split(args.engine_args),
        "tasks": shlex.split(args.tasks_args),
        "desk": shlex.split(args.desk_args),
        "instructions": shlex.split(args.instructions_args),
        "resumes": shlex.split(args.resumes_args),
    }
    quick = ["--quick"] if args.quick else []
    started = perf_counter()
    outcomes: list[Outcome] = []
    say(
        f"make bench: {' then '.join(p.name for p in parts)}"
        f"{' (--quick)' if args.quick else ''}, on one durable PostgreSQL server"
    )
    try:
        with (
            postgres_server() as server,
            tempfile.TemporaryDirectory(prefix="govflow-bench-run-") as scratch,
        ):
            say(f"server: {server.origin}")
            env = shared_env(server)
            for number, part in enumerate(parts, 1):
                say()
                say("=" * 100)
                say(f"make bench {number}/{len(parts)}: {part.title} ({part.script})")
                say("=" * 100)
                outcomes.append(run_part(part, [*quick, *extra[part.name]], env, scratch))
    except BenchSetupError as exc:
        say(f"\nmake bench could not set itself up: {exc}")
        return 2
    except KeyboardInterrupt:
        say("\nmake bench was interrupted; the server is stopped.")
        return 130
    say()
    show_targets(outcomes, perf_counter() - started)
    failed = [o for o in outcomes if o.status != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
