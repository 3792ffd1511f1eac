"""The four measurements, each on fresh databases of the shared server.

Every function returns a plain dict of figures for :mod:`bench.engine.report`. They raise
on a benchmark failure (a worker that died by itself, a timeout); the caller's cleanup
kills every process group either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.pgserver import Server

from . import dbos_side as dbos
from . import govflow_db as gdb
from . import govflow_side as gf
from . import sampling
from .counters import Counters, counters, machine_ticks, steal_share, top_statements
from .procs import pids_cpu, wait_until

SETTLE_TIMEOUT = 900
PAUSE_LIMIT = 60.0
"""Seconds the pause scenario waits for the takeover before it resumes the paused one."""
TIMER_WATCH = 20.0
"""Seconds after the timers' due time during which their instances' completions count."""


SCENARIOS = ("throughput", "growth", "recovery", "pause", "timers")
"""What ``--only`` may choose, in the order a full run measures them (``recovery`` runs
GovFlow's and DBOS's recovery: its target is a ratio of the two)."""


def scenario_list(text: str) -> tuple[str, ...]:
    """The scenarios named in ``--only`` (comma-separated), in the order they run."""
    chosen = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(chosen - set(SCENARIOS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown) or '(none given)'}: choose from "
            f"{','.join(SCENARIOS)}, e.g. --only pause,recovery"
        )
    return tuple(name for name in SCENARIOS if name in chosen)


@dataclass
class Config:
    throughput_n: int
    warmup_per_worker: int
    recovery_n: int
    kill_fraction: float
    timers: int
    govflow_enqueue_threads: int
    dbos: dbos.DbosSettings
    recovery_overrides: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path(".")
    profile: int = 0
    """Instances to run in-process under cProfile after the 1-worker run (0: none)."""
    sample: int = 0
    """Instances the 1-worker run's worker runs after its measured ones, sampled by py-spy
    (0: none)."""
    throughput_workers: tuple[int, ...] = (1, 2, 4)
    throughput_runs: tuple[int | None, ...] = (None,)
    """GOVFLOW_WORKER_RUNS of the throughput runs, each measured per worker count (None:
    the engine's default, not set)."""
    throughput_pairs: int = 1
    """Runs of GovFlow and DBOS, one after the other, per worker count: the pair whose
    ratio is the median is reported, every pair's ratio printed beside it."""
    growth: Any = None
    """The cost-growth runs (:class:`bench.engine.growth.Plan`)."""


def _cpu_per_step(before: dict, after: dict, steps: int) -> dict[str, float]:
    """CPU milliseconds per step by role, from two {role: CPU seconds} readings."""
    return {role: (after[role] - before.get(role, 0.0)) / steps * 1000 for role in after}


def _per_step(before: Counters, after: Counters, steps: int, driver_queries: int) -> dict:
    """Server counters per step; the driver's own polling queries are taken out."""
    commits = after.xact_commit - before.xact_commit - driver_queries
    statements = after.statements - before.statements - driver_queries
    return {
        "commits": commits / steps,
        "write_commits": (after.xid - before.xid) / steps,
        "wal_syncs": (after.wal_sync - before.wal_sync) / steps,
        "wal_bytes": (after.wal_bytes - before.wal_bytes) / steps,
        "statements": statements / steps if after.statements else None,
        "server_ms": (after.exec_ms - before.exec_ms) / steps if after.statements else None,
        "server_cpu_ms": (after.server_cpu - before.server_cpu) / steps * 1000
        if after.server_cpu
        else None,
        "begin_commit": (after.begin_commit - before.begin_commit) / steps
        if after.statements
        else None,
    }


def _nth(pair: int) -> str:
    """The suffix of a throughput run's database and logs: none for the first pair."""
    return f"_p{pair}" if pair > 1 else ""


# -- GovFlow -------------------------------------------------------------------------------


def govflow_throughput(
    server: Server,
    cfg: Config,
    workers: int,
    *,
    detail: bool,
    worker_runs: int | None = None,
    pair: int = 1,
) -> dict:
    """One throughput run; ``pair`` > 1 names its database and logs apart (``--pairs``)."""
    name = f"gf_tput_{workers}" + (f"_k{worker_runs}" if worker_runs else "") + _nth(pair)
    url = server.create_database(name, template="gf_template")
    gf.use_database(name)
    definition = gf.publish(gf.five_noops_document())
    # Production shape: N workers run the steps, the main process sweeps (ADR 0005); each
    # worker runs GOVFLOW_WORKER_RUNS claimed instances at once (ADR 0041).
    overrides = {"GOVFLOW_WORKER_RUNS": str(worker_runs)} if worker_runs else {}
    cluster = gf.Cluster.start(
        name=f"{name}-qcluster", url=url, workers=workers, overrides=overrides, log_dir=cfg.log_dir
    )
    cluster.wait_ready()
    groups = [cluster.group]
    poller = gdb.Poller()
    warm, _ = gdb.start_instances(
        definition, cfg.warmup_per_worker * workers, cfg.govflow_enqueue_threads
    )
    gdb.wait_settled(poller, warm, timeout=SETTLE_TIMEOUT, groups=groups)
    tasks_before = gdb.tasks_enqueued()
    runs_before = cluster.advance_tasks_run()

    server.reset_statements(name)
    before = counters(server, name)
    cpu_before = cluster.cpu_by_role()  # read before the processes are killed
    ticks_before = machine_ticks()
    poller.queries = 0
    ids, enqueue_seconds = gdb.start_instances(
        definition, cfg.throughput_n, cfg.govflow_enqueue_threads
    )
    statuses = gdb.wait_settled(poller, ids, timeout=SETTLE_TIMEOUT, groups=groups)
    cpu_after = cluster.cpu_by_role()
    steal = steal_share(ticks_before, machine_ticks())
    runs = cluster.advance_tasks_run() - runs_before
    cluster.kill()
    time.sleep(1.5)  # backends of the killed processes flush their statistics
    after = counters(server, name)
    first, last = gdb.span(ids)
    seconds = (last - first).total_seconds()
    steps = len(ids) * gdb.STEPS
    result = {
        "workers": workers,
        "worker_runs": worker_runs or gf.default_worker_runs(workers),
        "instances": len(ids),
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "enqueue_seconds": enqueue_seconds,
        "statuses": statuses,
        "tasks_per_instance": (gdb.tasks_enqueued() - tasks_before) / len(ids),
        "runs_per_instance": runs / len(ids),
        "per_step": _per_step(before, after, steps, poller.queries),
        "cpu": _cpu_per_step(cpu_before, cpu_after, steps),
        "steal": steal,
    }
    if detail:
        result["top_statements"] = [
            (calls / steps, plans / calls if calls else 0.0, ms / steps, text)
            for calls, plans, ms, text in top_statements(server, name, 14)
        ]
        result["one_instance"] = gdb.statements_one_instance(definition)
        if cfg.sample:
            result["sampled"] = _sampled(name, url, definition, cfg, overrides)
        if cfg.profile:
            result["profile"] = gdb.profile_in_process(
                definition, cfg.profile, cfg.log_dir / "govflow-instance_run.pstats"
            )
    return result


def _sampled(name: str, url: str, definition, cfg: Config, overrides: dict) -> dict:
    """A cluster of one worker process on the run's database, once its figures are read,
    runs ``cfg.sample`` instances after a warm-up while py-spy samples the worker: where
    its Python time goes (``sampling.py``), and its threads' CPU time per step."""
    cluster = gf.Cluster.start(
        name=f"{name}-sampled", url=url, workers=1, overrides=overrides, log_dir=cfg.log_dir
    )
    try:
        cluster.wait_ready()
        poller = gdb.Poller()
        warm, _ = gdb.start_instances(definition, cfg.warmup_per_worker, 1)
        gdb.wait_settled(poller, warm, timeout=SETTLE_TIMEOUT, groups=[cluster.group])
        workers = sorted(cluster.pids_by_role()["qcluster workers"] & cluster.group.pids())
        if len(workers) != 1:
            return {"why_not": f"{len(workers)} worker processes alive; one is sampled"}
        pid = workers[0]
        sampler = sampling.Sampler(pid, cfg.log_dir / "govflow-worker.pyspy")
        ids, _ = gdb.start_instances(definition, cfg.sample, cfg.govflow_enqueue_threads)
        gdb.wait_settled(poller, ids, timeout=SETTLE_TIMEOUT, groups=[cluster.group])
        ticks = sampler.stop()
    finally:
        cluster.kill()
    steps = len(ids) * gdb.STEPS
    result = {
        "instances": len(ids),
        "file": str(sampler.out),
        "loop_ms": sampling.seconds(ticks.get(pid, 0)) / steps * 1000,
        "threads_ms": sampling.seconds(sum(t for tid, t in ticks.items() if tid != pid))
        / steps
        * 1000,
    }
    if sampler.why_not:
        return result | {"why_not": sampler.why_not}
    return result | sampling.summary(sampler.out)


def govflow_recovery(server: Server, cfg: Config, workers: int = 2) -> dict:
    """SIGKILL a cluster mid-run, restart it at once, and time the way back.

    Besides the totals, where the time after the restart goes (database clock): until the
    first step completed, until the restarted cluster's sweeper took the lease over, until
    it took over (wrote again) the last stranded instance, and until that instance settled.
    """
    name = "gf_recovery"
    url = server.create_database(name, template="gf_template")
    gf.use_database(name)
    definition = gf.publish(gf.five_noops_document())

    def start() -> gf.Cluster:
        return gf.Cluster.start(
            name=f"{name}-qcluster",
            url=url,
            workers=workers,
            overrides=cfg.recovery_overrides,
            log_dir=cfg.log_dir,
        )

    cluster = start()
    cluster.wait_ready()
    poller = gdb.Poller()
    warm, _ = gdb.start_instances(definition, 5 * workers, cfg.govflow_enqueue_threads)
    gdb.wait_settled(poller, warm, timeout=SETTLE_TIMEOUT, groups=[cluster.group])
    # The run's instances are all started while no cluster runs, then a cluster starts on
    # them: starting 1,000 takes seconds, and a cluster running meanwhile could be far
    # past the kill point before the wait for it began (as DBOS's workers, below).
    cluster.kill()
    ids, _ = gdb.start_instances(definition, cfg.recovery_n, cfg.govflow_enqueue_threads)
    cluster = start()
    target = int(cfg.kill_fraction * len(ids) * gdb.STEPS)
    wait_until(
        lambda: poller.steps_done(ids[0], ids[-1]) >= target,
        timeout=SETTLE_TIMEOUT,
        what=f"{target} steps before the kill",
        groups=[cluster.group],
        interval=0.05,
    )
    cluster.kill()
    steps_at_kill = poller.steps_done(ids[0], ids[-1])
    at_kill = poller.status_counts(ids[0], ids[-1])
    left = gdb.in_flight(ids)
    stranded = left["executing"] | left["leased"] | left["claimed"]
    log_offset = cluster.group.log_path.stat().st_size
    restarted = gdb.db_now()
    cluster = start()
    startup_cpu = _startup_cpu(cluster, log_offset)
    statuses = gdb.wait_settled(poller, ids, timeout=SETTLE_TIMEOUT, groups=[cluster.group])
    sweeper_since = gdb.sweeper_acquired_since(cluster.group.pgid, restarted)
    steps_after = poller.steps_done(ids[0], ids[-1]) - steps_at_kill
    cluster.kill()
    _, last = gdb.span(ids)
    requeued, requeued_seconds = gdb.taken_over_since(stranded, restarted)
    return {
        "workers": workers,
        "instances": len(ids),
        "steps_at_kill": steps_at_kill,
        "completed_at_kill": at_kill.get("completed", 0),
        "executing_at_kill": len(left["executing"]),
        "claimed_at_kill": len(left["claimed"]),
        "stranded": len(stranded),
        "seconds": (last - restarted).total_seconds(),
        "stranded_seconds": gdb.settled_times(stranded, restarted),
        "sweeper_seconds": sweeper_since,
        "first_step_seconds": gdb.first_step_since(ids, restarted),
        "startup": {**_startup_marks(cluster, log_offset, restarted), **startup_cpu},
        "steps_after": steps_after,
        "requeued": requeued,
        "requeued_seconds": requeued_seconds,
        "statuses": statuses,
        "tokens_not_completed": gdb.blocked_breakdown(ids),
    }


FIRST_RUN = "'govflow.engine.tasks.advance'"
"""In django-q2's log line of a task a worker starts: the first one after a restart is the
first claimed run (ADR 0026)."""

STARTUP_MARKS = {
    "setup_seconds": " starting.",
    "workers_seconds": " running.",
    "first_claim_seconds": FIRST_RUN,
}
"""Where a restarted ``qcluster`` is, by its INFO log: ``starting.`` once Django is set up,
the checks have run and the sentinel is forked; ``running.`` once the sentinel has forked
the workers, monitor and pusher; the first ``advance`` a worker starts: the first claim
delivered (ADR 0048)."""


def _startup_cpu(cluster: gf.Cluster, log_offset: int, timeout: float = 120) -> dict:
    """CPU seconds the restarted cluster spent until its first claimed run started: its
    main process (Python, ``django.setup()``, the checks, the forks) and all of its
    processes together. Less noisy than wall time on a shared machine. Read from /proc
    when the log first shows a run (polled every 20 ms); nothing if it shows none in time."""
    try:
        wait_until(
            lambda: FIRST_RUN in _log_since(cluster, log_offset),
            timeout=timeout,
            what="the restarted cluster's first claimed run",
            groups=[cluster.group],
            interval=0.02,
        )
    except TimeoutError:
        return {}
    return {
        "main_cpu_seconds": pids_cpu({cluster.group.pgid}),
        "cpu_seconds": pids_cpu(cluster.group.pids()),
    }


def _log_since(cluster: gf.Cluster, offset: int) -> str:
    with open(cluster.group.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def _startup_marks(cluster: gf.Cluster, log_offset: int, restarted: dt.datetime) -> dict:
    """Seconds from ``restarted`` (database clock; the cluster logs in UTC on the same
    machine) to each of :data:`STARTUP_MARKS` in the restarted cluster's log."""
    lines = _log_since(cluster, log_offset).splitlines()
    marks: dict[str, float | None] = {}
    for name, text in STARTUP_MARKS.items():
        line = next((line for line in lines if text in line), None)
        marks[name] = None
        if line is not None:
            logged = dt.datetime.strptime(line[:23] + "+0000", "%Y-%m-%d %H:%M:%S,%f%z")
            marks[name] = (logged - restarted).total_seconds()
    return marks


def govflow_timers(server: Server, cfg: Config, workers: int = 2) -> dict:
    name = "gf_timers"
    url = server.create_database(name, template="gf_template")
    gf.use_database(name)
    definition = gf.publish(gf.timer_document())
    began = time.monotonic()
    ids = gdb.create_waiting_timers(definition, cfg.timers)
    setup_seconds = time.monotonic() - began
    cluster = gf.Cluster.start(
        name=f"{name}-qcluster", url=url, workers=workers, overrides={}, log_dir=cfg.log_dir
    )
    cluster.wait_ready()
    tasks_before = gdb.tasks_enqueued()
    lead = 3.0
    due = gdb.make_timers_due(ids, lead)
    due_monotonic = time.monotonic() + lead
    wait_until(
        lambda: gdb.timer_progress(ids)[0] == len(ids),
        timeout=SETTLE_TIMEOUT,
        what=f"{len(ids)} timers to fire",
        groups=[cluster.group],
        interval=0.25,
    )
    # The instances then each need a run (timer -> end). Watch that backlog for a while,
    # not to the end: with one free worker it takes minutes.
    time.sleep(max(0.0, due_monotonic + TIMER_WATCH - time.monotonic()))
    completed = gdb.completed_by(ids, due + dt.timedelta(seconds=TIMER_WATCH))
    tasks = gdb.tasks_enqueued() - tasks_before
    runs = cluster.advance_tasks_run()
    cluster.kill()
    return {
        "timers": len(ids),
        "workers": workers,
        "setup_seconds": setup_seconds,
        "lag": gdb.timer_lags(ids),
        "watch_seconds": TIMER_WATCH,
        "completed_in_watch": completed,
        "tasks_per_instance": tasks / len(ids),
        "runs_per_instance": runs / len(ids),
    }


def govflow_pause(server: Server, cfg: Config, workers: int = 2) -> dict:
    """SIGSTOP a working cluster past its lease while a second one runs: the takeover.

    Clusters A and B (same host: the paused processes still exist and hold their
    liveness locks, so only the lease's expiry may free their instances) both run, B's
    sweeper standing by behind A's, before the backlog is started: started before B was
    up, a backlog could be drained by A alone before there was anyone to pause it for. A
    is stopped at a moment it holds instance leases; the time from the SIGSTOP until every
    instance lease A held has a greater fence (taken over) is the takeover, against the
    target of the lease ttl + 2 s. Then A resumes (its stale writes are refused by their
    fences) and both drain the rest.
    """
    import os
    import signal

    name = "gf_pause"
    url = server.create_database(name, template="gf_template")
    gf.use_database(name)
    definition = gf.publish(gf.five_noops_document())
    overrides = dict(cfg.recovery_overrides)

    def start(tag: str) -> gf.Cluster:
        return gf.Cluster.start(
            name=f"{name}-{tag}",
            url=url,
            workers=workers,
            overrides=overrides,
            log_dir=cfg.log_dir,
        )

    first = start("a")
    first.wait_ready()
    poller = gdb.Poller()
    second = start("b")
    wait_until(  # b's sweeper stands by behind a's: b's cluster is up
        lambda: "standing by" in second.group.log_path.read_text(errors="replace"),
        timeout=SETTLE_TIMEOUT,
        what="cluster b to start",
        groups=[first.group, second.group],
        interval=0.1,
    )
    ids, _ = gdb.start_instances(definition, cfg.recovery_n, cfg.govflow_enqueue_threads)
    stopped, held = _stop_holding(first, ids, poller)
    took = None  # not taken over within PAUSE_LIMIT (a paused holder's row lock, say)
    taken: set[str] = set()
    released: set[str] = set()
    try:
        while time.monotonic() - stopped < PAUSE_LIMIT:
            second.group.check()
            taken, released = gdb.takeover_progress(held)
            if len(taken | released) == len(held):
                took = time.monotonic() - stopped
                break
            time.sleep(0.05)
    finally:
        os.killpg(first.group.pgid, signal.SIGCONT)
    statuses = gdb.wait_settled(
        poller, ids, timeout=SETTLE_TIMEOUT, groups=[first.group, second.group]
    )
    runs = first.advance_tasks_run() + second.advance_tasks_run()
    first.kill()
    second.kill()
    return {
        "workers": workers,
        "instances": len(ids),
        "held_at_stop": len(held),
        "taken_over": len(taken),
        "released_by_holder": len(released),
        "takeover_seconds": took,
        "pause_limit": PAUSE_LIMIT,
        "lease_ttl": float(overrides.get("GOVFLOW_LEASE_TTL", 30)),
        "runs_per_instance": runs / len(ids),
        "statuses": statuses,
    }


def _stop_holding(cluster, ids: list[int], poller) -> tuple[float, dict[str, int]]:
    """SIGSTOP ``cluster`` at a moment it holds instance leases; (when, {key: fence}) of
    the leases its own processes hold (not another cluster's). Raises at once when every
    instance settled first: there is nothing left to pause the cluster with."""
    import os
    import signal

    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        cluster.group.check()
        counts = poller.status_counts(ids[0], ids[-1])
        if sum(counts.get(s, 0) for s in gdb.SETTLED) >= len(ids):
            raise RuntimeError(
                f"all {len(ids)} instances settled before the cluster was seen holding a "
                "lease: start more (--recovery-n) so that the pause meets work in flight"
            )
        pids = cluster.group.pids()
        if gdb.held_leases(ids, pids):
            os.killpg(cluster.group.pgid, signal.SIGSTOP)
            stopped = time.monotonic()
            held = gdb.held_leases(ids, pids)  # what the paused cluster holds now
            if held:
                return stopped, held
            os.killpg(cluster.group.pgid, signal.SIGCONT)
        time.sleep(0.01)
    raise TimeoutError("the cluster never held an instance lease to be paused with")


# -- DBOS ----------------------------------------------------------------------------------


def dbos_throughput(server: Server, cfg: Config, workers: int, pair: int = 1) -> dict:
    name = f"dbos_tput_{workers}{_nth(pair)}"
    url = server.create_database(name)
    tag = f"tput{workers}{_nth(pair)}"  # a worker's log is its readiness: one per run
    pool = dbos.Workers(url=url, count=workers, settings=cfg.dbos, tag=tag, log_dir=cfg.log_dir)
    pool.wait_ready()
    progress = dbos.Progress(url)
    try:
        enqueue_log = cfg.log_dir / f"dbos-{tag}-enqueue.log"
        warm = cfg.warmup_per_worker * workers
        dbos.enqueue(url, "warm", warm, cfg.dbos.enqueue_threads, enqueue_log)
        progress.wait_done("warm", warm, timeout=SETTLE_TIMEOUT, groups=pool.groups)

        def cpu() -> dict[str, float]:
            return {"workers": pids_cpu(p for g in pool.groups for p in g.pids())}

        server.reset_statements(name)
        before = counters(server, name)
        cpu_before = cpu()
        ticks_before = machine_ticks()
        progress.queries = 0
        n = cfg.throughput_n
        enqueue_seconds = dbos.enqueue(url, "run", n, cfg.dbos.enqueue_threads, enqueue_log)
        statuses = progress.wait_done("run", n, timeout=SETTLE_TIMEOUT, groups=pool.groups)
        cpu_after = cpu()
        steal = steal_share(ticks_before, machine_ticks())
        pool.kill()
        time.sleep(1.5)
        after = counters(server, name)
        first, last = progress.span("run")
    finally:
        pool.kill()
        progress.close()
    steps = n * dbos.STEPS
    seconds = last - first
    return {
        "workers": workers,
        "instances": n,
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "enqueue_seconds": enqueue_seconds,
        "statuses": statuses,
        "per_step": _per_step(before, after, steps, progress.queries),
        "cpu": _cpu_per_step(cpu_before, cpu_after, steps),
        "steal": steal,
    }


def dbos_recovery(server: Server, cfg: Config, workers: int = 2) -> dict:
    name = "dbos_recovery"
    url = server.create_database(name)
    log = cfg.log_dir / "dbos-recovery-enqueue.log"
    pool = dbos.Workers(url=url, count=workers, settings=cfg.dbos, tag="rec", log_dir=cfg.log_dir)
    pool.wait_ready()
    progress = dbos.Progress(url)
    try:
        dbos.enqueue(url, "warm", 5 * workers, cfg.dbos.enqueue_threads, log)
        progress.wait_done("warm", 5 * workers, timeout=SETTLE_TIMEOUT, groups=pool.groups)
        n = cfg.recovery_n
        # Enqueued while no worker runs, as GovFlow's instances are started (above).
        pool.kill()
        dbos.enqueue(url, "run", n, cfg.dbos.enqueue_threads, log)
        pool = dbos.Workers(
            url=url, count=workers, settings=cfg.dbos, tag="rec1", log_dir=cfg.log_dir
        )
        target = int(cfg.kill_fraction * n * dbos.STEPS)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while progress.steps_done("run") < target:
            if time.monotonic() > deadline:
                raise TimeoutError("DBOS never reached the kill point")
            time.sleep(0.05)
        pool.kill()
        steps_at_kill = progress.steps_done("run")
        at_kill = progress.statuses("run")
        stranded = progress.pending("run")
        restarted = progress.now()
        pool = dbos.Workers(
            url=url, count=workers, settings=cfg.dbos, tag="rec2", log_dir=cfg.log_dir
        )
        statuses = progress.wait_done("run", n, timeout=SETTLE_TIMEOUT, groups=pool.groups)
        pool.kill()
        _, last = progress.span("run")
        stranded_last = progress.last_completed(stranded)
        first_step = progress.first_step_since("run", restarted)
        steps_after = progress.steps_done("run") - steps_at_kill
    finally:
        pool.kill()
        progress.close()
    return {
        "workers": workers,
        "instances": n,
        "steps_at_kill": steps_at_kill,
        "completed_at_kill": at_kill.get("SUCCESS", 0),
        "stranded": len(stranded),
        "seconds": last - restarted,
        "stranded_seconds": (stranded_last - restarted) if stranded_last else None,
        "first_step_seconds": (first_step - restarted) if first_step else None,
        "steps_after": steps_after,
        "statuses": statuses,
    }
