"""``make chaos``: the engine under faults, and every promise counted afterwards.

    make chaos                                    # 1,000 instances, 12 SIGKILLs
    make chaos ARGS="--n 300 --kills 4 --seed 7"  # shorter; the same seed, the same faults

Two ``manage.py qcluster`` process groups on two "hosts" (``GOVFLOW_HOST_ID``) run N
instances of five steps on one durable PostgreSQL server. Each step makes an effect that
can be counted: a row written by the provider on its own connection, outside the engine's
transactions (``bench.effect``; its reconcile looks the row up and settles on its word).
While they run, a seeded random schedule of faults, each struck after a seeded share of
the work still to do (effects made), so a faster or slower engine meets them at the same
points of its work:

- ``--kills`` SIGKILLs of a whole cluster's process group, each restarted at once;
- halfway, one SIGSTOP of a cluster for longer than the lease (``--lease-ttl``): the time
  until another holder has taken over each lease the paused one held is its *takeover*
  (a lease whose row the paused worker holds locked inside a transaction cannot be);
  then SIGCONT, and the resumed workers must change nothing;
- then one ``pg_terminate_backend`` of every engine connection.

After the last fault it waits for every instance to settle (completed, or stopped for a
person) and counts, each of which must be 0: lost instances, duplicate transitions (a step
or ledger operation completed twice), duplicate effects (two rows for one idempotency
key), phantom successes (a completed step with no effect row), unknown outcomes without a
handoff (an ``outcome_unknown`` step whose instance is not blocked), chain failures
(``chain_verify`` of every instance). It prints how many of the paused leases another holder
took over and the slowest takeover (target: all, within lease TTL + 2 s),
the instance runs (``advance`` tasks: claims) that every cluster started began, from their
logs, per run the instances needed — one each, and one more for each run a fault cut short
(the instance leases a killed cluster held, and the paused ones taken over) — (target:
<= 1.2: no claim wasted on work already claimed), and the drain time after the last
fault.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import run_bench  # noqa: E402  (bench/ itself is the script's folder)
from pgserver import postgres_server  # noqa: E402
from report import Target, say, table, verdicts  # noqa: E402

from bench.engine import govflow_db as gdb  # noqa: E402
from bench.engine import govflow_side as gf  # noqa: E402
from bench.engine.procs import kill_all  # noqa: E402

STEPS = [f"s{i}" for i in range(1, 6)]
DEFINITION = "bench.chaos_effects"
SETTLE_TIMEOUT = 900.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make chaos ARGS=…", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="instances (default 1000)")
    parser.add_argument("--kills", type=int, default=12, help="cluster SIGKILLs (default 12)")
    parser.add_argument("--seed", type=int, default=2026, help="the fault schedule's seed")
    parser.add_argument("--workers", type=int, default=2, help="workers per cluster")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="GOVFLOW_LEASE_TTL, s")
    parser.add_argument("--quick", action="store_true", help="300 instances, 4 kills")
    parser.add_argument("--targets-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.kills = 300, 4
    return args


def document() -> dict:
    chain = ["start", *STEPS, "end"]
    return {
        "key": DEFINITION,
        "version": 1,
        "title": "Five countable effects",
        "nodes": [
            {"id": "start", "type": "start", "title": "Start"},
            *(
                {"id": s, "type": "action", "title": s, "action": "bench.effect", "input": {}}
                for s in STEPS
            ),
            {"id": "end", "type": "end", "title": "End"},
        ],
        "transitions": [{"from": a, "to": b} for a, b in itertools.pairwise(chain)],
    }


def sql(query: str, *params) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


class Clusters:
    """Two clusters on two host names, restarted under the same name after a kill."""

    def __init__(self, url: str, args: argparse.Namespace, log_dir: Path) -> None:
        self.url, self.args, self.log_dir = url, args, log_dir
        self.running = {host: self._start(host, 0) for host in ("host-a", "host-b")}
        self.started = list(self.running.values())
        self.starts = {host: 0 for host in self.running}
        self.paused: dict = {"held": 0, "taken": {}}
        self.cut = 0

    def _start(self, host: str, number: int) -> gf.Cluster:
        overrides = {
            "GOVFLOW_HOST_ID": host,
            "GOVFLOW_LEASE_TTL": str(self.args.lease_ttl),
            "GOVFLOW_SWEEP_LEASE_TTL": str(self.args.lease_ttl),
        }
        return gf.Cluster.start(
            name=f"chaos-{host}-{number}",
            url=self.url,
            workers=self.args.workers,
            overrides=overrides,
            log_dir=self.log_dir,
        )

    def kill_and_restart(self, host: str) -> None:
        # The runs in flight in the cluster (the instance leases it holds) are cut short:
        # each instance needs a run more.
        self.cut += len(held_leases(self.running[host].group.pids()))
        self.running[host].kill()
        self.starts[host] += 1
        self.running[host] = self._start(host, self.starts[host])
        self.started.append(self.running[host])

    def runs(self) -> int:
        """Instance runs (``advance`` tasks: claims) every cluster ever started began."""
        return sum(cluster.advance_tasks_run() for cluster in self.started)

    def groups(self) -> list:
        return [c.group for c in self.running.values()]

    def stop(self) -> None:
        for cluster in self.running.values():
            cluster.kill()


def held_leases(pids: set[int]) -> dict[str, int]:
    """The unexpired instance leases held by processes ``pids``: {key: fence}."""
    rows = sql(
        "SELECT key, holder, fence FROM recovery_lease "
        "WHERE key LIKE 'instance:%%' AND expires_at > clock_timestamp()"
    )
    return {key: fence for key, holder, fence in rows if gdb.holder_pid(holder) in pids}


def busiest(clusters: Clusters, patience: float = 10.0) -> str:
    """The host whose cluster holds the most instance leases now (waiting up to
    ``patience`` seconds for one to hold any), so the pause strands work in flight."""
    deadline = time.monotonic() + patience
    while True:
        held = {h: len(held_leases(c.group.pids())) for h, c in clusters.running.items()}
        host = max(sorted(held), key=held.get)
        if held[host] or time.monotonic() > deadline:
            return host
        time.sleep(0.05)


def pause(clusters: Clusters, host: str, ttl: float) -> dict[str, float]:
    """SIGSTOP ``host``'s cluster past its lease (up to TTL + 30 s); for each lease it held,
    the seconds until another holder took it over (a newer fence), {key: seconds}. A lease
    not taken over within the pause is missing from the answer; ``held`` says how many."""
    group = clusters.running[host].group
    held = held_leases(group.pids())
    os.killpg(group.pgid, signal.SIGSTOP)
    stopped = time.monotonic()
    taken: dict[str, float] = {}
    # A lease the paused cluster released itself (its instance ended or waits), between
    # the read of what it held and the stop or by a commit in flight at the stop, needs
    # no takeover (govflow_db.takeover_progress).
    released: set[str] = set()
    try:
        while time.monotonic() - stopped < ttl + 30 and len(taken) + len(released) < len(held):
            now_taken, released = gdb.takeover_progress(held)
            for key in now_taken - set(taken):
                taken[key] = time.monotonic() - stopped
            time.sleep(0.1)
    finally:
        os.killpg(group.pgid, signal.SIGCONT)
    clusters.paused = {"held": len(held) - len(released), "taken": taken}
    return taken


def terminate_backends() -> int:
    """``pg_terminate_backend`` every other connection to this database; how many."""
    rows = sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return sum(1 for (done,) in rows if done)


def faults(clusters: Clusters, args: argparse.Namespace, ids: list[int]) -> dict:
    """The seeded schedule. Each fault waits for a share of the work to be done (effects
    made), not for a time: the same seed strikes at the same points of the work on a
    faster or a slower engine, so versions are compared under the same faults. All the
    instances are started before the clusters, so the work starts with the schedule."""
    rng = random.Random(args.seed)
    hosts = sorted(clusters.running)
    terminated, log = 0, []
    # Each fault strikes after a seeded share of the work still to do, spread over two
    # thirds of it, so the work outlives the faults (the pause's own progress included).
    total = len(ids) * len(STEPS)
    for round_ in range(args.kills):
        now = _effects_made()
        gap = rng.uniform(0.5, 1.0) * (total - now) * 2 / 3 / (args.kills - round_)
        made = _wait_for_effects(now + round(gap), clusters)
        host = rng.choice(hosts)
        clusters.kill_and_restart(host)
        log.append(f"SIGKILL {host} @{made}")
        if round_ == args.kills // 2:
            host = busiest(clusters)
            pause(clusters, host, args.lease_ttl)
            log.append(f"SIGSTOP {host} ({clusters.paused['held']} leases) > lease, SIGCONT")
            terminated = terminate_backends()
            log.append(f"pg_terminate_backend x{terminated}")
    say("faults: " + ", ".join(log))
    return {**clusters.paused, "terminated": terminated}


PROGRESS_PATIENCE = 20.0
"""Seconds a fault waits for its share of the work before it strikes anyway (stalled)."""


def _wait_for_effects(target: int, clusters: Clusters) -> str:
    """Let the clusters run until ``target`` effects are made in all (the schedule's
    point), checking they live; after :data:`PROGRESS_PATIENCE` seconds, go on. Says how
    many effects were made by then (and "stalled" when the patience ran out)."""
    deadline = time.monotonic() + PROGRESS_PATIENCE
    while (made := _effects_made()) < target:
        if time.monotonic() > deadline:
            return f"{made:,} effects, stalled"
        if not _unsettled():
            return f"{made:,} effects, all settled"
        for group in clusters.groups():
            group.check()
        time.sleep(0.05)
    return f"{made:,} effects"


def _effects_made() -> int:
    return sql(f"SELECT count(*) FROM {gdb.EFFECTS_TABLE}")[0][0]


def _unsettled() -> int:
    """Instances not yet settled (blocked ones wait for a person: no effect will come)."""
    settled = list(gdb.SETTLED)
    return sql("SELECT count(*) FROM engine_instance WHERE NOT status = ANY(%s)", settled)[0][0]


def blocked_reasons(ids: list[int]) -> list[tuple[str, int]]:
    """Why the blocked instances wait for a person, the instance numbers taken out of the
    reasons so that equal causes count together, most frequent first."""
    rows = sql(
        "SELECT reason FROM engine_instance WHERE status = 'blocked' AND id BETWEEN %s AND %s",
        ids[0],
        ids[-1],
    )
    counted = Counter(re.sub(r"\d+", "#", reason or "")[:140] for (reason,) in rows)
    return counted.most_common()


def counts(ids: list[int]) -> dict[str, int]:
    """Every promise, counted on the rows (each must be 0) and the statuses."""
    from recovery import api

    first, last = ids[0], ids[-1]
    span = (first, last)
    statuses = dict(
        sql(
            "SELECT status, count(*) FROM engine_instance WHERE id BETWEEN %s AND %s "
            "GROUP BY status",
            *span,
        )
    )
    settled = sum(statuses.get(s, 0) for s in gdb.SETTLED)
    one = "SELECT count(*) FROM ({}) t"
    dup_tokens = sql(
        one.format(
            "SELECT instance_id, node_id FROM engine_token WHERE state = 'completed' "
            "AND instance_id BETWEEN %s AND %s GROUP BY 1, 2 HAVING count(*) > 1"
        ),
        *span,
    )[0][0]
    dup_ops = sql(
        one.format(
            "SELECT subject_id, step_id FROM recovery_operation WHERE subject_type = "
            "'govflow.instance' AND state IN ('succeeded', 'effect_confirmed') "
            "GROUP BY 1, 2 HAVING count(*) > 1"
        )
    )[0][0]
    dup_effects = sql(
        one.format(f"SELECT key FROM {gdb.EFFECTS_TABLE} GROUP BY key HAVING count(*) > 1")
    )[0][0]
    phantoms = sql(
        "SELECT count(*) FROM engine_token t WHERE t.state = 'completed' AND t.node_id = ANY(%s) "
        "AND t.instance_id BETWEEN %s AND %s AND NOT EXISTS (SELECT 1 FROM "
        f"{gdb.EFFECTS_TABLE} e WHERE e.instance_id = t.instance_id AND e.step_id = t.node_id)",
        STEPS,
        *span,
    )[0][0]
    if phantoms:
        _explain_phantoms(span)
    unhanded = sql(
        "SELECT count(*) FROM engine_token t JOIN engine_instance i ON i.id = t.instance_id "
        "WHERE t.state = 'outcome_unknown' AND i.status <> 'blocked' "
        "AND i.id BETWEEN %s AND %s",
        *span,
    )[0][0]
    broken = sum(
        1 for pk in ids if not api.chain_verify(api.Subject("govflow.instance", str(pk))).ok
    )
    return {
        "statuses": statuses,
        "lost": len(ids) - settled,
        "duplicate transitions": dup_tokens + dup_ops,
        "duplicate effects": dup_effects,
        "phantom successes": phantoms,
        "unknown without handoff": unhanded,
        "chain failures": broken,
    }


def _explain_phantoms(span: tuple[int, int]) -> None:
    """Print what the ledger holds for each completed step without its effect (at most 5)."""
    rows = sql(
        "SELECT t.instance_id, t.node_id, t.attempt, t.poll, t.operation_key FROM engine_token t "
        "WHERE t.state = 'completed' AND t.node_id = ANY(%s) AND t.instance_id BETWEEN %s AND "
        f"%s AND NOT EXISTS (SELECT 1 FROM {gdb.EFFECTS_TABLE} e WHERE e.instance_id = "
        "t.instance_id AND e.step_id = t.node_id) ORDER BY 1, 2 LIMIT 5",
        STEPS,
        *span,
    )
    for instance_id, node, attempt, poll, key in rows:
        ops = sql(
            "SELECT key, state, revision, fence, lease_key, ordinal FROM recovery_operation "
            "WHERE subject_id = %s AND step_id = %s ORDER BY id",
            str(instance_id),
            node,
        )
        effects = sql(
            f"SELECT key, step_id FROM {gdb.EFFECTS_TABLE} WHERE instance_id = %s", instance_id
        )
        facts = sql(
            "SELECT seq, kind, fact FROM recovery_checkpoint WHERE subject_id = %s ORDER BY seq",
            str(instance_id),
        )
        say(f"phantom: instance {instance_id} step {node} attempt {attempt} poll {poll} op {key}")
        say(f"  operations: {ops}")
        say(f"  effects of the instance: {effects}")
        for seq, kind, fact in facts:
            say(f"  #{seq} {kind} {fact[:230]}")


def bench(args: argparse.Namespace) -> list[Target]:
    log_dir = Path(tempfile.mkdtemp(prefix="govflow-chaos-"))
    say(f"logs: {log_dir}")
    with postgres_server() as server:
        url = gf.setup_django(server, "chaos", log_dir)
        sql(
            f"CREATE TABLE {gdb.EFFECTS_TABLE} (id bigserial PRIMARY KEY, key text NOT NULL, "
            "instance_id bigint NOT NULL, step_id text NOT NULL)"
        )
        definition = gf.publish(document())
        # Every instance is started before any cluster runs, so the schedule's points (a
        # share of all effects) are met from the first effect on.
        ids, _ = gdb.start_instances(definition, args.n, 4)
        clusters = Clusters(url, args, log_dir)
        try:
            say(f"{len(ids):,} instances started; faults from seed {args.seed}")
            fault = faults(clusters, args, ids)
            last_fault = time.monotonic()
            poller = gdb.Poller()
            try:
                gdb.wait_settled(poller, ids, timeout=SETTLE_TIMEOUT, groups=clusters.groups())
            except TimeoutError as exc:
                say(f"not settled: {exc}")
            drain = time.monotonic() - last_fault
        finally:
            clusters.stop()
            kill_all()
        fault["runs"] = clusters.runs()
        fault["cut"] = clusters.cut + fault["held"]  # the paused runs were taken over
        fault["leases"] = sql(
            "SELECT coalesce(sum(fence), 0) FROM recovery_lease WHERE key LIKE 'instance:%%'"
        )[0][0]
        found = counts(ids)
        found["blocked"] = blocked_reasons(ids)
    return report(args, fault, drain, found)


def report(args, fault: dict, drain: float, found: dict) -> list[Target]:
    say()
    say("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(found["statuses"].items())))
    for reason, count in found["blocked"]:
        say(f"  blocked {count:>4}: {reason}")
    zero = ("lost", "duplicate transitions", "duplicate effects", "phantom successes")
    zero += ("unknown without handoff", "chain failures")
    targets = [Target(name, str(found[name]), "0", found[name] == 0) for name in zero]
    limit = args.lease_ttl + 2
    held, taken = fault["held"], fault["taken"]
    slowest = max(taken.values(), default=None)
    targets.append(
        Target(
            f"leases taken over after a pause (TTL {args.lease_ttl:g} s)",
            f"{len(taken)} of {held}" + (f", slowest {slowest:.1f} s" if taken else ""),
            f"all, <= {limit:g} s",
            None if not held else len(taken) == held and slowest <= limit,
        )
    )
    needed = args.n + fault["cut"]
    claims = fault["runs"] / needed
    targets.append(
        Target(
            "advance runs (claims) per run needed",
            f"{claims:.2f} ({fault['runs']:,} for {args.n:,} + {fault['cut']:,} cut short)",
            "<= 1.2 (one per instance, and one more for each run a fault cut short)",
            claims <= 1.2,
        )
    )
    leases = fault["leases"] / args.n
    notes = [
        ("advance runs per instance", f"{fault['runs'] / args.n:.2f}", "", "reference"),
        # Each claimed run takes the lease twice (the claim, then the handover to the
        # worker that runs it, ADR 0042): a cross-check of the claims counted in the logs.
        ("lease fences per instance (2 per run)", f"{leases:.2f}", "", "reference"),
        ("drain after the last fault", f"{drain:.1f} s", "", "reference"),
        ("engine connections terminated", str(fault["terminated"]), "", "reference"),
    ]
    say(table(("setting", "value"), [("instances", args.n), ("kills", args.kills)], {1}))
    say()
    say(verdicts(targets, notes))
    return targets


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    say(f"GovFlow chaos: {args.n:,} instances, {args.kills} SIGKILLs, a pause, a backend kill")
    return run_bench(args.targets_json, lambda: bench(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
