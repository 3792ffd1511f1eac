"""Cost growth: GovFlow's steps/s and CPU per step as the backlog and the instances grow.

Two questions, each answered by drain runs on fresh databases of the shared server, with
one ``qcluster`` (``Plan.workers`` worker processes, its main process sweeping):

- **In flight**: does a step cost more when 100, 1,000 or 10,000 instances are runnable
  at once? (The claim statement, the sweeper's passes and the indexes all see the backlog.)
- **Length**: does a step cost more in an instance of 200 steps than in one of 5? (Chain
  verification and every other per-step read must be incremental, never the whole chain.)

How a run goes: the instances are written parked on a timer (in bulk, as the engine's
first run leaves them: :func:`govflow_db.create_waiting_timers`) before the cluster starts,
so neither the start-up nor the driver's instance starts share the CPUs with the run. A
warm-up wave runs first; then the CPU clocks and the server counters are read, and the
measured instances are released in waves of N (their timers made due at one instant: N
runnable at once), each wave drained before the next is released. An in-flight run has as
many waves as it takes to reach ``Plan.steps`` steps (at least one); a length run is one
wave of ``Plan.steps`` steps. A wave's time runs from its first action step's completion to
its last instance's (database clock), so the timer's firing is not counted; the run's
steps/s is its steps over the sum of its waves' times. Within a wave the in-flight count
falls from N to 0; the tail, where a worker has no instance left to claim, is at most one
instance per worker and weighs most in the smallest N.

Figures per run: steps/s, CPU per step of the cluster's processes ("client CPU", from
/proc; all roles, and the workers alone), commits and statements per step at the server,
``advance`` runs (claims) and django-q2 tasks per instance.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from bench.pgserver import Server

from . import govflow_db as gdb
from . import govflow_side as gf
from .counters import counters
from .scenarios import _cpu_per_step, _per_step

SETTLE_TIMEOUT = 900
"""Seconds a wave may take at the least (more for a long wave, see :func:`_wave_timeout`)."""
TARGET_IN_FLIGHT = 0.8
TARGET_IN_FLIGHT_CPU = 1.25
TARGET_LENGTH = 0.9
TARGET_LENGTH_CPU = 1.1


@dataclass(frozen=True)
class Plan:
    in_flight: tuple[int, ...]
    """The in-flight counts, smallest first (instances of ``base_steps`` steps)."""
    lengths: tuple[int, ...]
    """Steps per instance of the length runs, shortest first."""
    steps: int
    """Steps per length run, and at least that many per in-flight run."""
    base_steps: int = 5
    workers: int = 2

    def waves(self, in_flight: int) -> int:
        """Waves of ``in_flight`` instances an in-flight run releases."""
        return max(1, math.ceil(self.steps / (in_flight * self.base_steps)))

    def instances(self, length: int) -> int:
        """Instances of ``length`` steps in a length run (``steps`` steps in all)."""
        return max(self.workers, math.ceil(self.steps / length))


def plan(*, quick: bool, in_flight: str | None, lengths: str | None, steps: int | None) -> Plan:
    """The runs: ``--quick`` scales them down; the options override either."""

    def numbers(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
        if not text:
            return default
        return tuple(sorted(int(part) for part in text.split(",") if part.strip()))

    return Plan(
        in_flight=numbers(in_flight, (100, 1000) if quick else (100, 1000, 10000)),
        lengths=numbers(lengths, (5, 50) if quick else (5, 200)),
        steps=steps or (1000 if quick else 4000),
    )


def run(server: Server, cfg, growth: Plan, say) -> dict[str, Any]:
    """Every run of ``growth``; ``cfg`` is the benchmark's :class:`scenarios.Config`."""
    from django.conf import settings

    per_run = settings.GOVFLOW_MAX_STEPS_PER_RUN
    results: dict[str, Any] = {"workers": growth.workers, "in_flight": [], "lengths": []}
    for n in growth.in_flight:
        say(f"GovFlow cost growth: {n:,} instances in flight, {growth.waves(n)} wave(s)")
        result = drain(
            server,
            cfg,
            tag=f"if{n}",
            length=growth.base_steps,
            wave=n,
            waves=growth.waves(n),
            workers=growth.workers,
        )
        results["in_flight"].append(
            result | {"runs_needed": math.ceil(growth.base_steps / per_run)}
        )
    for length in growth.lengths:
        count = growth.instances(length)
        say(f"GovFlow cost growth: {count} instances of {length} steps")
        result = drain(
            server,
            cfg,
            tag=f"len{length}",
            length=length,
            wave=count,
            waves=1,
            workers=growth.workers,
        )
        results["lengths"].append(result | {"runs_needed": math.ceil(length / per_run)})
    return results


def drain(
    server: Server, cfg, *, tag: str, length: int, wave: int, waves: int, workers: int
) -> dict[str, Any]:
    """Release ``waves`` waves of ``wave`` instances of ``length`` steps; their figures."""
    name = f"gf_grow_{tag}"
    url = server.create_database(name, template="gf_template")
    gf.use_database(name)
    definition = gf.publish(gf.gated_document(length))
    warm = gdb.create_waiting_timers(definition, 5 * workers)
    ids = gdb.create_waiting_timers(definition, wave * waves)
    cluster = gf.Cluster.start(
        name=f"{name}-qcluster", url=url, workers=workers, overrides={}, log_dir=cfg.log_dir
    )
    cluster.wait_ready()
    poller = gdb.Poller()
    _release(poller, warm, cluster, length)
    runs_before = cluster.advance_tasks_run()
    tasks_before = gdb.tasks_enqueued()
    server.reset_statements(name)
    before = counters(server, name)
    cpu_before = cluster.cpu_by_role()
    poller.queries = 0
    chunks = [ids[i : i + wave] for i in range(0, len(ids), wave)]
    statuses: dict[str, int] = {}
    for chunk in chunks:
        for status, n in _release(poller, chunk, cluster, length).items():
            statuses[status] = statuses.get(status, 0) + n
    cpu_after = cluster.cpu_by_role()
    runs = cluster.advance_tasks_run() - runs_before
    tasks = gdb.tasks_enqueued() - tasks_before
    cluster.kill()
    time.sleep(1.5)  # backends of the killed processes flush their statistics
    after = counters(server, name)
    windows = [_window(chunk) for chunk in chunks]
    steps = sum(done for done, _ in windows)
    seconds = sum(span for _, span in windows)
    return {
        "length": length,
        "in_flight": wave,
        "waves": len(chunks),
        "instances": len(ids),
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds if seconds else None,
        "statuses": statuses,
        "runs_per_instance": runs / len(ids),
        "tasks_per_instance": tasks / len(ids),
        "per_step": _per_step(before, after, max(steps, 1), poller.queries),
        "cpu": _cpu_per_step(cpu_before, cpu_after, max(steps, 1)),
    }


def _wave_timeout(instances: int, length: int) -> float:
    """A wave's time limit: ``SETTLE_TIMEOUT``, or 20 steps/s if that is longer."""
    return max(SETTLE_TIMEOUT, instances * length / 20)


def _release(poller: gdb.Poller, ids: list[int], cluster, length: int) -> dict[str, int]:
    """Make the timers of ``ids`` due now and wait until their instances settle."""
    gdb.make_timers_due(ids, 0.0)
    poller.queries += 1
    return gdb.wait_settled(
        poller, ids, timeout=_wave_timeout(len(ids), length), groups=[cluster.group]
    )


def _window(ids: list[int]) -> tuple[int, float]:
    """(action steps completed, seconds from the first one to the last settled instance)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), min(updated_at) FROM engine_token WHERE instance_id BETWEEN %s "
            "AND %s AND state = 'completed' AND node_id NOT IN ('start', 'wait', 'end')",
            [ids[0], ids[-1]],
        )
        steps, first = cursor.fetchone()
        cursor.execute(
            "SELECT max(coalesce(completed_at, updated_at)) FROM engine_instance "
            "WHERE id BETWEEN %s AND %s",
            [ids[0], ids[-1]],
        )
        last = cursor.fetchone()[0]
    if not steps or first is None or last is None:
        return 0, 0.0
    return int(steps), (last - first).total_seconds()


# -- report --------------------------------------------------------------------------------


def cpu_ms(result: dict[str, Any]) -> float:
    """Client CPU milliseconds per step: every process of the cluster."""
    return sum(result["cpu"].values())


def print_report(r: dict[str, Any], out) -> None:
    from bench.report import table

    out(
        f"Cost growth (GovFlow): one qcluster, workers={r['workers']}, its main process "
        "sweeping; instances parked on a timer, released N at once (their timers due at one "
        "instant) and drained, wave after wave; steps/s from a wave's first step to its last "
        "completion (database clock); CPU of the cluster's processes per step"
    )
    rows = []
    for kind, result in [("in_flight", x) for x in r["in_flight"]] + [
        ("lengths", x) for x in r["lengths"]
    ]:
        label = (
            f"{result['in_flight']:,} in flight, {result['length']} steps"
            if kind == "in_flight"
            else f"{result['instances']:,} x {result['length']} steps"
        )
        per = result["per_step"]
        rows.append(
            (
                label,
                f"{result['waves']}",
                f"{result['steps']:,}",
                _f(result["steps_per_s"], 1),
                _f(cpu_ms(result), 2),
                _f(result["cpu"].get("qcluster workers"), 2),
                _f(per["commits"], 2),
                _f(per["statements"], 1),
                f"{result['runs_per_instance']:.2f} / {result['runs_needed']}",
                f"{result['tasks_per_instance']:.2f}",
                _statuses(result["statuses"]),
            )
        )
    header = (
        "run",
        "waves",
        "steps",
        "steps/s",
        "CPU ms/step",
        "workers' ms",
        "commits",
        "statements",
        "claims / runs needed",
        "q2 tasks",
        "outcome",
    )
    out(table(header, rows, {1, 2, 3, 4, 5, 6, 7, 8, 9}))
    out(
        "  (claims: advance runs per instance, from the cluster's log, over the runs it needs, "
        "one per GOVFLOW_MAX_STEPS_PER_RUN steps; q2 tasks: django-q2 tasks enqueued per "
        "instance, which instance runs are not)"
    )
    for figure, value, target, ok in evaluate(r):
        out(f"  {figure}: {value} (target {target}) {'MET' if ok else 'NOT MET'}")


def _ratio_targets(first: dict, last: dict, what: str, speed: float, cpu: float) -> list[tuple]:
    targets = []
    if first["steps_per_s"] and last["steps_per_s"]:
        ratio = last["steps_per_s"] / first["steps_per_s"]
        targets.append(
            (
                f"steps/s, {what}",
                f"{ratio:.2f}x ({last['steps_per_s']:.1f} vs {first['steps_per_s']:.1f})",
                f">= {speed:g}x",
                ratio >= speed,
            )
        )
    else:
        targets.append((f"steps/s, {what}", "n/a", f">= {speed:g}x", None))
    ratio = cpu_ms(last) / cpu_ms(first) if cpu_ms(first) else None
    targets.append(
        (
            f"client CPU per step, {what}",
            "n/a"
            if ratio is None
            else f"{ratio:.2f}x ({cpu_ms(last):.2f} vs {cpu_ms(first):.2f} ms)",
            f"<= {cpu:g}x",
            None if ratio is None else ratio <= cpu,
        )
    )
    return targets


def evaluate(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """The growth targets: the largest run against the smallest, in flight and in length."""
    targets = []
    flights = r["in_flight"]
    if len(flights) >= 2:
        first, last = flights[0], flights[-1]
        what = f"{last['in_flight']:,} vs {first['in_flight']:,} in flight"
        targets += _ratio_targets(first, last, what, TARGET_IN_FLIGHT, TARGET_IN_FLIGHT_CPU)
    lengths = r["lengths"]
    if len(lengths) >= 2:
        first, last = lengths[0], lengths[-1]
        what = f"{last['length']}-step vs {first['length']}-step instances"
        targets += _ratio_targets(first, last, what, TARGET_LENGTH, TARGET_LENGTH_CPU)
    return targets


def claims_over_needed(r: dict[str, Any]) -> list[tuple[str, float]]:
    """(run, claims per instance over the runs it needs) of every growth run."""
    return [
        (
            f"growth {x['in_flight']:,} x {x['length']} steps",
            x["runs_per_instance"] / x["runs_needed"],
        )
        for x in [*r["in_flight"], *r["lengths"]]
    ]


def _f(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _statuses(statuses: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(statuses.items()))
