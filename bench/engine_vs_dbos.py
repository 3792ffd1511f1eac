"""GovFlow's engine against DBOS Transact on one durable PostgreSQL server.

    make bench                        # runs this after the ledger benchmark (bench/run.py)
    .venv/bin/python bench/engine_vs_dbos.py [--quick] [--n N] [--recovery-n N] [--timers N]
        [--workers 1,2,4] [--in-flight 100,1000,10000] [--lengths 5,200] [--growth-steps N]
        [--only throughput,growth,recovery,pause,timers]

Measures, in one run: steps/s of 5-step no-op workflows with 1, 2 and 4 worker processes
(GovFlow through one real ``manage.py qcluster`` with N workers and its main process
sweeping, as in production; DBOS through N queue worker processes), commits and SQL
statements per GovFlow step, cost growth (GovFlow's steps/s and CPU per step with 100,
1,000 and 10,000 instances in flight, and in instances of 5 and of 200 steps:
:mod:`bench.engine.growth`), the time to settle 1,000 in-flight workflows after a SIGKILL
of every worker (and where that time goes), and the fire lag of 10,000 GovFlow timers due
at one instant. Prints the figures side by side and the targets, met or not (``--only``
runs the chosen scenarios alone and prints only their sections and targets). Exits 0
whether or not the targets are met, non-zero if the benchmark itself fails. Every process
group it started and a throwaway server it started are stopped at the end, also on error
or Ctrl-C.

Targets (issue 12), each measured in this run on this server: steps/s >= 2x DBOS's with
1, 2 and 4 worker processes; commits per step <= 1.2 (engine's own, writing, all);
recovery <= 0.5x DBOS's time; takeover after a pause <= lease TTL + 2 s; advance runs
(claims) per instance <= 1.2x the runs it needs (one per ``GOVFLOW_MAX_STEPS_PER_RUN``
steps), in every throughput, growth and pause run; timer fire lag p99 <= 2 s; and cost growth:

- steps/s with 10,000 in flight >= 0.8x steps/s with 100, and client CPU per step <= 1.25x.
  A hundred times the rows may cost an index level and some cache, not more: a step whose
  cost grows with the backlog (a claim or sweep that scans it) loses far more than 20%.
  The smallest backlog runs with the most tail (workers idle at the end of each wave), so
  the ratio leans, if anything, in the large backlog's favour.
- steps/s in 200-step instances >= 0.9x steps/s in 5-step ones, and client CPU per step
  <= 1.1x. A long instance shares its per-instance costs (start, timer, end, claim) over
  more steps, so flat per-step cost gives a ratio of 1 or more; 10% is the run-to-run
  spread of one run on a quiet machine. A per-step cost that grows with the chain (a
  whole-chain read or verification per step) is quadratic in the length and shows as a
  ratio far below it.

Throughput is measured in pairs: per worker count, GovFlow's run and DBOS's run back to
back, three times (``--pairs``); the pair whose ratio is the median is reported and every
pair's ratio printed beside it. On a shared machine one pair's ratio moved by a third
between identical runs.

Duration on a quiet 2-core machine: about 25 minutes in full (the growth runs' 67,000
steps are a third of it, most of them the 10,000 in flight), about 4 minutes with
``--quick`` (60 workflows per throughput run; growth with 100 and 1,000 in flight and 5-
and 50-step instances of 1,000 steps each: about 1.5 minutes of it). Under load, longer:
the figures then measure the load as much as the engine; the CPU-per-step and per-step
counters suffer least from it.

DBOS is installed only into ``bench/.venv-dbos`` (created on first use). The server is
chosen by :func:`bench.pgserver.postgres_server`: ``make bench``'s, ``DATABASE_URL``
(PostgreSQL, user with CREATEDB), or a throwaway one started here.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine import dbos_side, growth, procs, report, scenarios  # noqa: E402
from bench.engine import govflow_side as gf  # noqa: E402
from bench.pgserver import BenchSetupError, postgres_server  # noqa: E402
from bench.report import save_targets  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        type=scenarios.scenario_list,
        default=scenarios.SCENARIOS,
        metavar="NAME,NAME,…",
        help="run only these scenarios and print only their sections and targets ("
        + ",".join(scenarios.SCENARIOS)
        + ")",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (about 4 minutes)")
    parser.add_argument("--n", type=int, help="workflows per throughput run (default 500)")
    parser.add_argument(
        "--pairs",
        type=int,
        help="GovFlow and DBOS throughput runs back to back per worker count; the pair of "
        "median ratio is reported, all ratios printed (default 3; quick 1)",
    )
    parser.add_argument("--recovery-n", type=int, help="workflows in flight (default 1000)")
    parser.add_argument("--timers", type=int, help="timers due at once (default 10000)")
    parser.add_argument(
        "--workers", default="1,2,4", help="worker processes per throughput run (default 1,2,4)"
    )
    parser.add_argument(
        "--runs",
        metavar="K,K,…",
        help="GOVFLOW_WORKER_RUNS (runs at once per worker process) of the throughput runs: "
        "GovFlow is measured at each K for every worker count, back to back, DBOS once "
        "(default: the engine's default)",
    )
    parser.add_argument(
        "--in-flight",
        metavar="N,N,…",
        help="instances in flight per growth run (default 100,1000,10000; quick 100,1000)",
    )
    parser.add_argument(
        "--lengths",
        metavar="N,N,…",
        help="steps per instance of the length runs (default 5,200; quick 5,50)",
    )
    parser.add_argument(
        "--growth-steps",
        type=int,
        metavar="N",
        help="steps per length run, and at least per in-flight run (default 4000; quick 1000)",
    )
    parser.add_argument("--kill-at", type=float, default=0.2, help="fraction of steps done")
    parser.add_argument("--lease-ttl", default="5", help="GOVFLOW_LEASE_TTL for recovery (s)")
    parser.add_argument(
        "--profile",
        type=int,
        default=100,
        metavar="N",
        help="cProfile instance_run in-process over N instances (0: skip; default 100)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="after the 1-worker run, py-spy samples its worker process over N more "
        "instances (0: skip; default 1000, quick 200)",
    )
    parser.add_argument("--dbos-concurrency", type=int, default=10)
    parser.add_argument("--dbos-poll", type=float, default=0.05)
    parser.add_argument(
        "--targets-json", metavar="PATH", help="also write the targets to PATH (for bench/run.py)"
    )
    args = parser.parse_args(argv)
    runs = [k.strip() for k in (args.runs or "").split(",") if k.strip()]
    if not all(k.isdigit() and int(k) > 0 for k in runs):
        parser.error(f"--runs takes positive whole numbers separated by commas, not {args.runs!r}")
    repeated = sorted({k for k in runs if runs.count(k) > 1}, key=int)
    if repeated:
        # Each K's run has its own database and logs, named by K: a second run of the same K
        # would take over the first one's, and its anchors would read as a restored database.
        parser.error(
            f"--runs lists K={', '.join(repeated)} more than once; give each K once "
            "and use --pairs N to measure every K N times"
        )
    return args


def config(args: argparse.Namespace, log_dir: Path) -> scenarios.Config:
    quick = args.quick
    return scenarios.Config(
        throughput_n=args.n or (60 if quick else 500),
        throughput_workers=tuple(int(w) for w in args.workers.split(",") if w.strip()),
        throughput_runs=tuple(int(k) for k in (args.runs or "").split(",") if k.strip()) or (None,),
        throughput_pairs=max(1, args.pairs or (1 if quick else 3)),
        growth=growth.plan(
            quick=quick, in_flight=args.in_flight, lengths=args.lengths, steps=args.growth_steps
        ),
        warmup_per_worker=5 if quick else 20,
        recovery_n=args.recovery_n or (200 if quick else 1000),
        kill_fraction=args.kill_at,
        timers=args.timers or (2000 if quick else 10000),
        govflow_enqueue_threads=4,
        dbos=dbos_side.DbosSettings(
            worker_concurrency=args.dbos_concurrency,
            polling_interval_sec=args.dbos_poll,
            enqueue_threads=4,
        ),
        recovery_overrides={"GOVFLOW_LEASE_TTL": args.lease_ttl},
        log_dir=log_dir,
        profile=min(args.profile, 30) if quick else args.profile,
        sample=(200 if quick else 1000) if args.sample is None else args.sample,
    )


class Progress:
    def __init__(self) -> None:
        self.began = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.began:6.1f} s] {message}", file=sys.stderr, flush=True)


def environment(server, cfg: scenarios.Config, dbos_version: str) -> list[str]:
    import django
    from django.conf import settings

    from govflow.engine.services.sweep import Sweeper

    q = settings.Q_CLUSTER
    engine = {
        name: getattr(settings, name) for name in ("GOVFLOW_LEASE_TTL", "GOVFLOW_MAX_STEPS_PER_RUN")
    }
    sweeper = Sweeper()  # the values the cluster's sweeper thread reads from the settings
    runs = [k for k in cfg.throughput_runs if k]
    defaults = ", ".join(f"{gf.default_worker_runs(n)} at N={n}" for n in cfg.throughput_workers)
    engine.update(
        GOVFLOW_SWEEP_LEASE_TTL=sweeper.ttl,
        GOVFLOW_SWEEP_TICK=sweeper.tick,
        GOVFLOW_SWEEP_FULL_EVERY=sweeper.full_every,
        GOVFLOW_SWEEP_TIMER_BATCH=sweeper.batch,
    )
    with server.connect() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        durable = ", ".join(
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("fsync", "synchronous_commit", "wal_sync_method")
        )
    load = os.getloadavg()
    lines = [
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, load average "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start (other work on this machine "
        "shares the CPUs and disk)",
        f"server: PostgreSQL {version}, {server.origin}; {durable}; statements counted by "
        f"{'pg_stat_statements' if server.statements else 'nobody (see notes)'}",
        *(f"  note: {note}" for note in server.notes),
        f"GovFlow: Django {django.get_version()}, django-q2 ORM broker, Python "
        f"{platform.python_version()}; action 'bench.noop' (non_atomic, returns Succeeded({{}}))",
        "  every scenario in the production shape (ADR 0005): one `manage.py qcluster` with "
        f"Q_CLUSTER workers=N (poll {q['poll']}, save_limit {q['save_limit']}); its N worker "
        "processes run the advance tasks, its main process runs the sweeper thread under the "
        "govflow:sweeper lease (timers, orphans; the scheduled fallback sweep task finds it "
        "alive and returns at once); pusher, monitor and sentinel as django-q2 has them",
        f"  N = {', '.join(map(str, cfg.throughput_workers))} for throughput, 2 for growth, "
        "recovery and timers; a cluster counts as ready "
        "once its main process holds the sweeper lease",
        "  K = claimed runs at once per worker process, each in a thread (ADR 0041); by "
        "default GOVFLOW_CLUSTER_RUNS (24) divided among the N worker processes, at least 8 "
        "(ADR 0067): "
        + (
            f"{', '.join(map(str, runs))} for throughput (GOVFLOW_WORKER_RUNS"
            f"{', measured back to back for each N' if len(runs) > 1 else ''})"
            if runs
            else f"{defaults} for throughput"
        )
        + f", {gf.default_worker_runs(2)} (N=2) for the others",
        "  engine settings: " + ", ".join(f"{k}={v:g}" for k, v in engine.items()),
        f"  recovery run only: {', '.join(f'{k}={v}' for k, v in cfg.recovery_overrides.items())}",
        f"  instances started with instance_start from {cfg.govflow_enqueue_threads} threads",
        f"DBOS Transact {dbos_version} (bench/.venv-dbos, Python {dbos_side.python_version()}): "
        "@DBOS.workflow of 5 @DBOS.step no-ops",
        f"  {cfg.dbos.describe()}; N worker processes for N GovFlow workers",
    ]
    return lines


def run(args: argparse.Namespace) -> dict:
    log_dir = Path(tempfile.mkdtemp(prefix="govflow-engine-bench-logs-"))
    cfg = config(args, log_dir)
    say = Progress()
    say(f"DBOS environment (bench/.venv-dbos); logs in {log_dir}")
    dbos_version = dbos_side.ensure_venv(log_dir / "dbos-venv.log")
    results: dict = {"log_dir": str(log_dir), "throughput_n": cfg.throughput_n}
    with postgres_server(statements=True) as server:
        try:
            say(f"server: {server.origin}; migrating GovFlow's template database")
            gf.setup_django(server, "gf_template", log_dir)
            results["environment"] = {"lines": environment(server, cfg, dbos_version)}
            _run_scenarios(server, cfg, args.only, results, say)
            results["kill_fraction"] = cfg.kill_fraction
            load = os.getloadavg()
            results["environment"]["lines"].append(
                f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
            )
        finally:
            procs.kill_all()
            from django.apps import apps

            if apps.ready:
                from django.db import connections

                connections.close_all()
    results["elapsed"] = time.monotonic() - say.began
    return results


def _run_scenarios(server, cfg: scenarios.Config, only, results: dict, say: Progress) -> None:
    """Run the chosen scenarios in ``results``; a section not run is absent from it."""
    if "throughput" in only:
        results["govflow_tput"], results["dbos_tput"] = [], []
        first = True
        for workers in cfg.throughput_workers:
            pairs: list[tuple[list[dict], dict]] = []
            for pair in range(1, cfg.throughput_pairs + 1):
                of = f", pair {pair} of {cfg.throughput_pairs}" if cfg.throughput_pairs > 1 else ""
                ours = []
                for runs in cfg.throughput_runs:
                    k = runs or "default"
                    say(f"GovFlow throughput, {workers} worker process(es), K={k}{of}")
                    ours.append(
                        scenarios.govflow_throughput(
                            server,
                            cfg,
                            workers,
                            detail=first and workers == 1,
                            worker_runs=runs,
                            pair=pair,
                        )
                    )
                    first = False
                say(f"DBOS throughput, {workers} worker process(es){of}")
                pairs.append((ours, scenarios.dbos_throughput(server, cfg, workers, pair)))
            # One DBOS figure per worker count and pair, beside each K of GovFlow's.
            for index in range(len(cfg.throughput_runs)):
                gfr, dbr = _median_pair([(ours[index], dbos) for ours, dbos in pairs])
                results["govflow_tput"].append(gfr)
                results["dbos_tput"].append(dbr)
    if "growth" in only:
        results["govflow_growth"] = growth.run(server, cfg, cfg.growth, say)
    if "recovery" in only:
        say(f"GovFlow recovery of {cfg.recovery_n} workflows")
        results["govflow_recovery"] = scenarios.govflow_recovery(server, cfg)
        say(f"DBOS recovery of {cfg.recovery_n} workflows")
        results["dbos_recovery"] = scenarios.dbos_recovery(server, cfg)
    if "pause" in only:
        say(f"GovFlow pause: SIGSTOP of a working cluster, {cfg.recovery_n} workflows")
        results["govflow_pause"] = scenarios.govflow_pause(server, cfg)
    if "timers" in only:
        say(f"GovFlow timers: {cfg.timers} due at once")
        results["govflow_timers"] = scenarios.govflow_timers(server, cfg)


def _median_pair(pairs: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """The pair (GovFlow's run, DBOS's run) whose steps/s ratio is the median; every
    pair's ratio is kept in GovFlow's run (``pair_ratios``, in the order run). A pair ran
    back to back on the same host, so its ratio holds the host's load still better than
    a median of each side's figures taken apart."""
    ratios = [gfr["steps_per_s"] / dbr["steps_per_s"] for gfr, dbr in pairs]
    median = sorted(range(len(pairs)), key=ratios.__getitem__)[(len(pairs) - 1) // 2]
    gfr, dbr = pairs[median]
    # What only the first run measured (the in-process instance, the profile) stays.
    detail = {key: value for key, value in pairs[0][0].items() if key not in gfr}
    return {**detail, **gfr, "pair_ratios": ratios, "pair_kept": median}, dbr


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        results = run(args)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        procs.kill_all()
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        if isinstance(exc, BenchSetupError):
            print(f"\nThe engine benchmark could not set itself up: {exc}", file=sys.stderr)
            return 2
        traceback.print_exc()
        print(f"\nThe benchmark failed: {exc}", file=sys.stderr)
        return 1
    report.print_report(results)
    if args.targets_json:
        save_targets(args.targets_json, report.evaluate(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
