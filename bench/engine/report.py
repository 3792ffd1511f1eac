"""Printing the side-by-side comparison and the targets."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import growth

TARGET_SPEEDUP = 2.0
# Issue 12: commits per step at the server, counting every transaction, <= 1.2. The same
# bound is printed for the engine's own and the writing ones (stricter readings come last).
TARGET_COMMITS = 1.2
STEPS = 5
COMMITS_FLOOR = (
    f"(The ledger's own floor for this workload: a {STEPS}-step instance of non-atomic "
    f"actions commits its start, then before each of its {STEPS} calls the operation that "
    f"records it (with the previous step's result), then the last result: {STEPS + 2} "
    f"commits, {(STEPS + 2) / STEPS:.2f} per step, before any claim, queue or read-only "
    "transaction. Every commit above it is overhead; going below it would take the start "
    "and the first call's record in one commit, by whoever starts the instance.)"
)
TARGET_RECOVERY = 0.5
TARGET_TIMER_P99 = 2.0


def _f(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _row(label: str, left: str, right: str, extra: str = "") -> str:
    return f"  {label:<40} {left:>14} {right:>14}  {extra}".rstrip()


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("MET" if ok else "NOT MET")


def print_report(r: dict[str, Any], out: Callable[[str], None] = print) -> None:
    env = r["environment"]
    out("")
    out("GovFlow engine vs DBOS Transact: 5-step workflows of no-op steps")
    out("=" * 100)
    for line in env["lines"]:
        out(line)
    out("")
    if r.get("govflow_tput"):
        _print_throughput(r, out)
    if r.get("govflow_growth"):
        growth.print_report(r["govflow_growth"], out)
        out("")
    if r.get("govflow_recovery"):
        _print_recovery(r, out)
    if r.get("govflow_timers"):
        _print_timers(r, out)
    pause = r.get("govflow_pause")
    if pause:
        out(
            f"Pause (GovFlow): {pause['instances']} workflows on cluster a (workers="
            f"{pause['workers']}), cluster b started beside it on the same host; SIGSTOP of "
            f"cluster a's process group; GOVFLOW_LEASE_TTL={pause['lease_ttl']:g}"
        )
        took = pause["takeover_seconds"]
        released = pause.get("released_by_holder", 0)
        when = (
            f"all taken over {_f(took, 2)} s after the SIGSTOP"
            if took is not None
            else f"{pause['taken_over']} taken over within {pause['pause_limit']:g} s, then "
            "the paused cluster was resumed"
        )
        if released:
            when += (
                f" ({released} released by the paused cluster itself, a commit sent before "
                "the stop: nothing to take over)"
            )
        out(
            f"  takeover: {pause['held_at_stop']} instance lease(s) held by the paused "
            f"cluster, {when}; then both drained: {_statuses(pause['statuses'])}; advance "
            f"tasks run (claims) per workflow {pause['runs_per_instance']:.2f}"
        )
        out("")

    out("Targets")
    targets = evaluate(r)
    width = max(len(figure) for figure, *_ in targets)
    for figure, value, target, ok in targets:
        out(f"  {figure:<{width}} {value:<34} {target:<24} {_met(ok)}")
    if any(figure.startswith("commits per") for figure, *_ in targets):
        out(f"  {COMMITS_FLOOR}")
    out("")
    out(f"Total benchmark time {r['elapsed']:.0f} s; logs in {r['log_dir']}")


def evaluate(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(figure, value, target, met) of every target whose scenario ran; met is None when
    there is no figure."""
    targets = _throughput_targets(r) if r.get("govflow_tput") else []
    if r.get("govflow_recovery"):
        g, d = r["govflow_recovery"], r["dbos_recovery"]
        targets.append(
            (
                "recovery: restart -> every workflow settled",
                f"{g['seconds']:.1f} s vs {d['seconds']:.1f} s",
                f"<= {TARGET_RECOVERY:g} x DBOS's time",
                g["seconds"] <= TARGET_RECOVERY * d["seconds"],
            )
        )
    pause = r.get("govflow_pause")
    if pause:
        limit, took = pause["lease_ttl"] + 2, pause["takeover_seconds"]
        targets.append(
            (
                "takeover after a SIGSTOP pause",
                f"{took:.2f} s" if took is not None else f"> {pause['pause_limit']:g} s",
                f"<= lease ttl + 2 s ({limit:g} s)",
                took is not None and took <= limit,
            )
        )
    if r.get("govflow_growth"):
        targets += growth.evaluate(r["govflow_growth"])
    runs = [
        (f"throughput, {_who(gfr)}", gfr["runs_per_instance"]) for gfr in r.get("govflow_tput", [])
    ]
    if pause:
        runs.append(("pause", pause["runs_per_instance"]))
    if r.get("govflow_growth"):
        runs += growth.claims_over_needed(r["govflow_growth"])
    if runs:
        run, worst = max(runs, key=lambda pair: pair[1])
        targets.append(
            (
                "tasks/claims per instance, over its runs",
                f"{worst:.2f} (worst: {run})",
                "<= 1.2",
                worst <= 1.2,
            )
        )
    if r.get("govflow_timers"):
        p99 = r["govflow_timers"]["lag"]["p99"]
        targets.append(
            (
                "timer fire lag p99",
                f"{p99:.2f} s" if p99 is not None else "n/a",
                f"<= {TARGET_TIMER_P99:g} s",
                None if p99 is None else p99 <= TARGET_TIMER_P99,
            )
        )
    return targets


def _throughput_targets(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    targets = []
    # Several K per worker count (--runs): each K is a target row of its own.
    several = len({gfr["workers"] for gfr in r["govflow_tput"]}) < len(r["govflow_tput"])
    for gfr, dbr in zip(r["govflow_tput"], r["dbos_tput"], strict=True):
        ratio = gfr["steps_per_s"] / dbr["steps_per_s"]
        k = f", K={gfr['worker_runs']}" if several else ""
        targets.append(
            (
                f"steps/s vs DBOS, {gfr['workers']} worker process(es){k}",
                f"{ratio:.2f}x ({gfr['steps_per_s']:.1f} vs {dbr['steps_per_s']:.1f})",
                f">= {TARGET_SPEEDUP:g}x DBOS",
                ratio >= TARGET_SPEEDUP,
            )
        )
    # Three readings of "commits per non-atomic step", strictest last: the engine's own
    # commits (one instance in-process, lease included), the transactions at the server
    # that wrote anything (django-q2's queue and the sweeper included), and every
    # transaction at the server (read-only ones and django-q2's health checks included).
    one = r["govflow_tput"][0].get("one_instance")
    if one:
        engine = one["run_commits"] / 5
        targets.append(
            (
                "commits per non-atomic step, the engine's own",
                f"{engine:.2f} (one instance in-process)",
                f"<= {TARGET_COMMITS:g}",
                engine <= TARGET_COMMITS,
            )
        )
    wrote = max(gfr["per_step"]["write_commits"] for gfr in r["govflow_tput"])
    targets.append(
        (
            "commits per step at the server, writing ones",
            f"{wrote:.2f} (worst run)",
            f"<= {TARGET_COMMITS:g} (+0.05)",
            wrote <= TARGET_COMMITS + 0.05,
        )
    )
    worst = max(gfr["per_step"]["commits"] for gfr in r["govflow_tput"])
    targets.append(
        (
            "commits per step at the server, all (xact_commit)",
            f"{worst:.2f} (worst run)",
            f"<= {TARGET_COMMITS:g} (+0.05)",
            worst <= TARGET_COMMITS + 0.05,
        )
    )
    return targets


def _who(gfr: dict[str, Any]) -> str:
    """``N worker process(es)``, and the runs each ran at once (GOVFLOW_WORKER_RUNS)."""
    w = gfr["workers"]
    runs = f", K={gfr['worker_runs']}" if gfr.get("worker_runs") else ""
    return f"{w} worker process{'es' if w > 1 else ''}{runs}"


def _statuses(statuses: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(statuses.items()))


def _print_throughput(r: dict[str, Any], out: Callable[[str], None]) -> None:
    """Throughput and cost per step, side by side."""
    out(
        f"Throughput: {r['throughput_n']} workflows x 5 steps per run, after a warm-up; "
        "first enqueue to last completion (database clock)"
    )
    out(_row("", "GovFlow", "DBOS", "GovFlow / DBOS"))
    for gfr, dbr in zip(r["govflow_tput"], r["dbos_tput"], strict=True):
        label = f"{_who(gfr)}: steps/s"
        ratio = gfr["steps_per_s"] / dbr["steps_per_s"]
        out(_row(label, _f(gfr["steps_per_s"]), _f(dbr["steps_per_s"]), f"{ratio:.2f}x"))
        ratios = gfr.get("pair_ratios", [])
        if len(ratios) > 1:
            kept = gfr["pair_kept"]
            shown = ", ".join(
                f"[{r:.2f}x]" if i == kept else f"{r:.2f}x" for i, r in enumerate(ratios)
            )
            out(f"    pairs run back to back: {shown} (the median pair [in brackets] is shown)")
        out(_row("  run seconds", _f(gfr["seconds"]), _f(dbr["seconds"])))
        out(
            _row(
                "  enqueue time (client, overlaps)",
                _f(gfr["enqueue_seconds"]),
                _f(dbr["enqueue_seconds"]),
            )
        )
        out(_row("  outcome", _statuses(gfr["statuses"]), _statuses(dbr["statuses"])))
        out(
            _row(
                "  django-q2 tasks enqueued per workflow",
                _f(gfr["tasks_per_instance"], 2),
                "-",
                "(instance runs are claimed, not enqueued: ADR 0026)",
            )
        )
        out(
            _row(
                "  advance tasks run (claims) per workflow",
                _f(gfr["runs_per_instance"], 2),
                "-",
                "(from the cluster's log; 1.00 = one run each)",
            )
        )
    out("")

    out("Cost per step (server counters over the whole run, all processes; driver polls excluded)")
    out(_row("", "GovFlow", "DBOS"))
    for gfr, dbr in zip(r["govflow_tput"], r["dbos_tput"], strict=True):
        g, d = gfr["per_step"], dbr["per_step"]
        out(_row(f"{_who(gfr)}: commits (xact_commit)", _f(g["commits"], 2), _f(d["commits"], 2)))
        out(
            _row(
                "  of which wrote (transaction ids used)",
                _f(g["write_commits"], 2),
                _f(d["write_commits"], 2),
            )
        )
        out(
            _row(
                "  WAL flushes (pg_stat_wal.wal_sync)", _f(g["wal_syncs"], 2), _f(d["wal_syncs"], 2)
            )
        )
        out(
            _row(
                "  WAL bytes (pg_stat_wal.wal_bytes)",
                _f(g.get("wal_bytes"), 0),
                _f(d.get("wal_bytes"), 0),
            )
        )
        out(
            _row(
                "  SQL statements (pg_stat_statements)",
                _f(g["statements"], 1),
                _f(d["statements"], 1),
            )
        )
        out(
            _row(
                "    of which BEGIN/COMMIT/ROLLBACK",
                _f(g["begin_commit"], 1),
                _f(d["begin_commit"], 1),
            )
        )
    for gfr, dbr in zip(r["govflow_tput"], r["dbos_tput"], strict=True):
        g, d = gfr["cpu"], dbr["cpu"]
        out(
            _row(
                f"{_who(gfr)}: CPU ms, engine processes",
                _f(sum(g.values()), 2),
                _f(sum(d.values()), 2),
            )
        )
        for role, ms in g.items():
            out(_row(f"  GovFlow {role}", _f(ms, 2), ""))
        out(
            _row(
                "  PostgreSQL processes' CPU ms",
                _f(gfr["per_step"].get("server_cpu_ms"), 2),
                _f(dbr["per_step"].get("server_cpu_ms"), 2),
            )
        )
        g_server, d_server = (r_["per_step"].get("server_cpu_ms") for r_ in (gfr, dbr))
        if g_server is not None and d_server is not None:
            g_all, d_all = sum(g.values()) + g_server, sum(d.values()) + d_server
            out(_row("  CPU ms in all, engine and server", _f(g_all, 2), _f(d_all, 2), ""))
            out(
                _row(
                    "  cores busy (steps/s x CPU ms in all)",
                    _f(gfr["steps_per_s"] * g_all / 1000, 2),
                    _f(dbr["steps_per_s"] * d_all / 1000, 2),
                    f"of {os.cpu_count()}; DBOS / GovFlow CPU per step {d_all / g_all:.2f}x",
                )
            )
        out(
            _row(
                "  CPU stolen by the hypervisor, share of the machine's time",
                _share(gfr.get("steal")),
                _share(dbr.get("steal")),
            )
        )
        out(
            _row(
                "  PostgreSQL plan + execute ms (wall clock: waits included)",
                _f(gfr["per_step"]["server_ms"], 2),
                _f(dbr["per_step"]["server_ms"], 2),
            )
        )
    one = r["govflow_tput"][0].get("one_instance")
    if one:
        steps = 5
        out(
            f"  One GovFlow instance in-process (CaptureQueriesContext around instance_run): "
            f"{one['run_statements']} statements and {one['run_commits']} commits for "
            f"{steps} action steps (+ start node, lease acquire/release) = "
            f"{one['run_statements'] / steps:.1f} statements and "
            f"{one['run_commits'] / steps:.1f} commits per step; instance_start: "
            f"{one['start_statements']} statements"
        )
        kinds = ", ".join(f"{k} {n}" for k, n in one["kinds"][:14])
        out(f"    by kind: {kinds}")
    prof = r["govflow_tput"][0].get("profile")
    if prof:
        out(
            f"  Where a GovFlow worker's time goes: instance_run in-process over "
            f"{prof['instances']} instances, quiet database: {prof['wall_ms']:.1f} ms wall, "
            f"{prof['cpu_ms']:.1f} ms CPU per step (cProfile on the CPU clock; {prof['file']})"
        )
        out(
            "    own CPU time by package: "
            + ", ".join(f"{name} {share * 100:.0f}%" for share, name in prof["packages"][:8])
        )
        out("    own CPU time, top functions:")
        for share, name in prof["own"][:8]:
            out(f"      {share * 100:5.1f}%  {name[:100]}")
        out("    cumulative CPU time, engine and ledger functions:")
        for share, name in prof["cumulative"][:12]:
            out(f"      {share * 100:5.1f}%  {name[:100]}")
    _print_sampled(r["govflow_tput"][0].get("sampled"), out)
    top = r["govflow_tput"][0].get("top_statements")
    if top:
        out(
            "  GovFlow's costliest statements at the server, 1-worker run (calls per step, "
            "plans per call, plan + execute ms per step; plans 0 when planning is not tracked):"
        )
        for per_step, plans, ms, text in top:
            out(f"    {per_step:5.2f}  {plans:4.2f}  {ms:6.3f}  {text[:92]}")
    out("")


def _print_sampled(sampled: dict | None, out: Callable[[str], None]) -> None:
    """Where the 1-worker run's worker process spends its Python time (py-spy)."""
    if not sampled:
        return
    if "why_not" in sampled:
        why = sampled["why_not"]
        out(f"  Where a GovFlow worker's Python time goes (py-spy): not sampled, {why}")
        return
    cpu = sampled["loop_ms"] + sampled["threads_ms"]
    out(
        f"  Where a GovFlow worker's Python time goes: py-spy, {sampled['samples']:,} samples of "
        f"the thread holding the GIL while one worker process ran {sampled['instances']:,} "
        f"instances ({sampled['file']}); the process's CPU {cpu:.2f} ms per step: "
        f"{sampled['threads_ms']:.2f} its run threads and keepalive, {sampled['loop_ms']:.2f} "
        "django-q2's worker loop (its main thread). ms per step = share x the process's CPU"
    )
    out("    by what runs (the innermost Python function's package):")
    for share, name in sampled["groups"]:
        out(f"      {share * cpu:5.2f} ms  {share * 100:5.1f}%  {name}")
    out("    the engine's and ledger's functions, with all they call:")
    for share, name in sampled["inclusive"]:
        out(f"      {share * cpu:5.2f} ms  {share * 100:5.1f}%  {name[:100]}")
    out("    the functions running most (their own time):")
    for share, name in sampled["running"]:
        out(f"      {share * cpu:5.2f} ms  {share * 100:5.1f}%  {name[:100]}")


def _print_recovery(r: dict[str, Any], out: Callable[[str], None]) -> None:
    """Recovery after a SIGKILL, side by side, and where the time goes."""
    g, d = r["govflow_recovery"], r["dbos_recovery"]
    out(
        f"Recovery: {g['instances']} workflows started, SIGKILL of every worker process group "
        f"once {int(r['kill_fraction'] * 100)}% of the steps were done, restart at once; "
        f"{g['workers']} worker processes (GovFlow: one qcluster, its main process sweeping)"
    )
    out(_row("", "GovFlow", "DBOS", "GovFlow / DBOS"))
    out(_row("steps done at the kill", str(g["steps_at_kill"]), str(d["steps_at_kill"])))
    out(
        _row(
            "workflows completed at the kill",
            str(g["completed_at_kill"]),
            str(d["completed_at_kill"]),
        )
    )
    out(
        _row(
            "stranded (claimed/running by the dead)",
            str(g["stranded"]),
            str(d["stranded"]),
            f"GovFlow: {g['executing_at_kill']} mid-step, {g['claimed_at_kill']} tasks claimed",
        )
    )
    ratio = g["seconds"] / d["seconds"] if d["seconds"] else None
    out(
        _row(
            "restart -> every workflow settled (s)",
            _f(g["seconds"]),
            _f(d["seconds"]),
            f"{ratio:.2f}x" if ratio else "",
        )
    )
    out("  where the time goes, from the restart (database clock):")
    _print_startup(g.get("startup") or {}, out)
    out(
        _row(
            "  first step completed (s)",
            _f(g.get("first_step_seconds"), 2),
            _f(d.get("first_step_seconds"), 2),
        )
    )
    out(
        _row(
            "  new sweeper took over its lease (s)",
            _f(g.get("sweeper_seconds"), 2),
            "-",
            "(the restarted cluster's main process)",
        )
    )
    out(
        _row(
            "  last stranded one taken over (s)",
            _f(g.get("requeued_seconds"), 2),
            "-",
            f"GovFlow: {g.get('requeued', 0)} of {g['stranded']} stranded run again",
        )
    )
    out(
        _row(
            "  last stranded one settled (s)",
            _f(g["stranded_seconds"], 2),
            _f(d["stranded_seconds"], 2),
        )
    )
    out(
        _row(
            "  steps run after the restart, per s",
            _f(g["steps_after"] / g["seconds"] if g["seconds"] else None),
            _f(d["steps_after"] / d["seconds"] if d["seconds"] else None),
            f"({g['steps_after']} and {d['steps_after']} steps run after the restart)",
        )
    )
    out(_row("outcome", _statuses(g["statuses"]), _statuses(d["statuses"])))
    if g["tokens_not_completed"]:
        tokens = ", ".join(f"{k} {n}" for k, n in g["tokens_not_completed"].items())
        out(f"  GovFlow steps not completed: {tokens} (outcome_unknown = killed after dispatch)")
    out("")


def _print_startup(st: dict[str, Any], out: Callable[[str], None]) -> None:
    """The restarted qcluster's start, from its log (ADR 0048)."""
    for key, label, note in (
        ("setup_seconds", "  Django set up, checks run (s)", "(qcluster log: 'starting.')"),
        ("workers_seconds", "  workers forked (s)", "(log: 'running.')"),
        ("first_claim_seconds", "  first claimed run started (s)", "(log: first advance)"),
    ):
        if key in st:
            out(_row(label, _f(st[key], 2), "-", note))
    if "cpu_seconds" in st:
        out(
            _row(
                "  start-up CPU until then (s)",
                _f(st["cpu_seconds"], 2),
                "-",
                f"all its processes; main process {_f(st['main_cpu_seconds'], 2)}",
            )
        )


def _print_timers(r: dict[str, Any], out: Callable[[str], None]) -> None:
    """Timer fire lag."""
    t = r["govflow_timers"]
    lag = t["lag"]
    out(
        f"Timers (GovFlow): {t['timers']:,} instances waiting on timers due at one instant; "
        f"one qcluster, workers={t['workers']}, its main process sweeping"
    )
    out(
        f"  fire lag (fired_at - due_at): p50 {_f(lag['p50'], 2)} s, p99 {_f(lag['p99'], 2)} s, "
        f"max {_f(lag['max'], 2)} s, min {_f(lag['min'], 2)} s ({lag['fired']:,} fired)"
    )
    out(
        f"  fired in {lag['batches']} commits; longest pause between two firing commits "
        f"{_f(lag['longest_pause'], 1)} s (time in which due timers waited and none fired)"
    )
    out(
        f"  then: {t['completed_in_watch']:,} of the {t['timers']:,} instances completed within "
        f"{t['watch_seconds']:g} s of the due time; django-q2 tasks enqueued per instance by "
        f"then {t['tasks_per_instance']:.2f}, advance tasks run (claims) per instance "
        f"{t['runs_per_instance']:.2f}; setup (bulk rows) took {_f(t['setup_seconds'], 1)} s"
    )
    out("")


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"
