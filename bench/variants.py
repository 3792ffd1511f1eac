"""The timed variants and their interleaved rounds.

Each round runs every variant once, in a fixed order, so a change in the machine's load
during the benchmark (other processes, disk) weighs on all variants alike instead of on
whichever ran last; each variant's figure is the median of its rounds.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import process_time
from typing import Any

import baseline
import workload
from django.db import connection
from report import say


def _nothing() -> None:
    return None


@dataclass
class Variant:
    """One way of running lifecycles, measured in every round."""

    name: str
    tag: str
    count: int
    make: Callable[[str], Sequence]
    execute: Callable[[Sequence], float]
    probe: Callable[[], tuple[int, int]]
    server_cpu: Callable[[], float | None]
    enter: Callable[[], None] = _nothing
    leave: Callable[[], None] = _nothing
    overhead: int = 0
    """Transactions a run commits besides its lifecycles and the probes' own."""
    plans: list[tuple[int, int, str]] = field(default_factory=list)
    """Generic and custom plans of its prepared ledger statements after its last run."""
    runs: list[dict[str, Any]] = field(default_factory=list)

    def measure(self, number: int) -> dict[str, Any]:
        """One timed run of fresh work: wall time, CPU on both sides, commits at the database."""
        work = self.make(f"{self.tag}{number}")
        # On a connection that prepares statements, the probe's autocommit statement is
        # prepared at its second use, and a Parse outside a transaction block commits an
        # implicit transaction of its own: use the probe until it is prepared first.
        self.probe()
        self.probe()
        before, server = self.probe(), self.server_cpu()
        cpu = process_time()
        seconds = self.execute(work)
        cpu = process_time() - cpu
        after = self.probe()
        server_after = self.server_cpu()
        workload.check(f"{self.tag}{number}", work)
        n = len(work)
        run = {
            "number": number,
            "lifecycles": n,
            "seconds": seconds,
            "rate": n / seconds,
            "client_cpu": cpu * 1e6 / n,
            "server_cpu": None
            if server is None or server_after is None
            else (server_after - server) * 1e6 / n,
            "commits": after[0] - before[0] - workload.PROBE_OVERHEAD - self.overhead,
            "autovacuum": after[1] - before[1],
        }
        self.runs.append(run)
        return run

    def summary(self) -> dict[str, Any]:
        servers = [r["server_cpu"] for r in self.runs if r["server_cpu"] is not None]
        return {
            "median": statistics.median(r["rate"] for r in self.runs),
            "rates": [r["rate"] for r in self.runs],
            "commits": sum(r["commits"] for r in self.runs)
            / sum(r["lifecycles"] for r in self.runs),
            "autovacuum": sum(r["autovacuum"] for r in self.runs),
            "client_cpu": statistics.median(r["client_cpu"] for r in self.runs),
            "server_cpu": statistics.median(servers) if servers else None,
        }

    def rows(self) -> list[tuple]:
        return [
            (
                r["number"],
                f"{r['lifecycles']:,}",
                f"{r['seconds']:.2f}",
                f"{r['rate']:,.0f}",
                f"{r['client_cpu']:,.0f}",
                "n/a" if r["server_cpu"] is None else f"{r['server_cpu']:,.0f}",
                f"{r['commits']:,}",
                f"{r['commits'] / r['lifecycles']:.3f}",
                r["autovacuum"],
            )
            for r in self.runs
        ]


def run_rounds(variants: list[Variant], rounds: int) -> None:
    """Run every variant once per round, printing one progress line per round."""
    for number in range(1, rounds + 1):
        figures = []
        for variant in variants:
            variant.enter()
            try:
                run = variant.measure(number)
            finally:
                variant.leave()
            figures.append(f"{variant.tag} {run['rate']:,.0f}/s")
        say(f"  round {number}/{rounds}: " + ", ".join(figures))


def django_server_cpu(local: bool) -> Callable[[], float | None]:
    return workload.backend_cpu_seconds if local else lambda: None


def django_variant(args: argparse.Namespace, *, experiment: bool = False) -> Variant:
    """Django + recovery.api: as configured, or with server-side binding (experiment).

    Switching between the two reconnects, and a fresh connection is warmed up (untimed)
    before it is measured.
    """
    options = connection.settings_dict["OPTIONS"]
    configured = dict(options)
    warm = max(args.steps, min(args.warmup, 100))

    def enter() -> None:
        wanted = (
            {**configured, "server_side_binding": True, "prepare_threshold": 1}
            if experiment
            else configured
        )
        if options != wanted or connection.connection is None:
            connection.close()
            options.clear()
            options.update(wanted)
            workload.run(
                workload.plan(f"{'sw' if experiment else 'dw'}{len(v.runs)}-", warm, args.steps)
            )

    def leave() -> None:
        if experiment:
            connection.close()
            options.clear()
            options.update(configured)
        else:  # before another variant reconnects
            v.plans = workload.plan_counts()

    v = Variant(
        name="Django + recovery.api" + (", server_side_binding" if experiment else ""),
        tag="exp" if experiment else "django",
        count=args.reference if experiment else args.lifecycles,
        make=lambda tag: workload.plan(
            tag, args.reference if experiment else args.lifecycles, args.steps
        ),
        execute=workload.run,
        probe=workload.xact_commit,
        server_cpu=django_server_cpu(args.local),
        enter=enter,
        leave=leave,
    )
    return v


@contextmanager
def baseline_variants(
    args: argparse.Namespace, sql: list[str], captured: list
) -> Iterator[list[Variant]]:
    """The two raw-psycopg variants, connected, shape-checked and warmed up."""
    conns = []
    try:
        variants = []
        for server_side in (False, True):
            conn = baseline.connect(server_side=server_side)
            conns.append(conn)
            warm = baseline.prepare(
                workload.plan(
                    f"bw{int(server_side)}-", max(args.steps, min(args.warmup, 100)), args.steps
                )
            )
            replayed: list = []
            baseline.lifecycle_runner(conn, sql, replayed)(warm[0])
            baseline.check_shapes(captured, sql, replayed)
            one = baseline.lifecycle_runner(conn, sql)
            baseline.run(one, warm[1:])
            baseline.xact_commit(conn)  # report the warm-up's commits now, not in a window
            variants.append(
                Variant(
                    name=(
                        "raw psycopg, server-side binding, prepared after 1st use"
                        if server_side
                        else "raw psycopg, client-side binding (as Django's cursor)"
                    ),
                    tag="prepared" if server_side else "raw",
                    count=args.reference,
                    make=lambda tag: baseline.prepare(
                        workload.plan(tag, args.reference, args.steps)
                    ),
                    execute=lambda work, one=one: baseline.run(one, work),
                    probe=lambda conn=conn: baseline.xact_commit(conn),
                    server_cpu=lambda conn=conn: (
                        workload.process_cpu_seconds(conn.info.backend_pid) if args.local else None
                    ),
                )
            )
        yield variants
    finally:
        for conn in conns:
            conn.close()


@contextmanager
def threads_variant(args: argparse.Namespace) -> Iterator[Variant | None]:
    """Django + recovery.api from ``args.threads`` threads of this process at once (a second
    figure beside the one-thread figure, never instead of it: ``threaded.py``, ADR 0045);
    None with ``--threads 0``."""
    if args.threads < 1:
        yield None
        return
    from threaded import Threads

    pool = Threads(args.threads, args.steps)
    try:
        yield Variant(
            name=f"Django + recovery.api, {args.threads} threads of one process at once",
            tag=f"threads{args.threads}",
            count=args.lifecycles,
            make=lambda tag: workload.plan(tag, args.lifecycles, args.steps),
            execute=pool.run,
            probe=workload.xact_commit,
            server_cpu=pool.server_cpu if args.local else lambda: None,
            overhead=pool.overhead,
        )
    finally:
        pool.close()
