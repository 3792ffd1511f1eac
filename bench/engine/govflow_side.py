"""GovFlow's side: real ``manage.py qcluster`` process groups on a scenario database.

The driver (this process) sets Django up with :mod:`bench.engine.settings`; it starts
instances and reads progress through :mod:`bench.engine.govflow_db`. Every scenario runs
the production shape (ADR 0005): one qcluster whose N workers run the steps and whose main
process runs the sweeper thread.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.pgserver import ROOT, Server

from .govflow_db import holder_pid, sweeper_holder
from .procs import Group, WorkerDied, cpu_seconds, pids_cpu

SETTINGS = "bench.engine.settings"
STEPS = 5
DEFINITION = "bench.five_noops"
TIMER_DEFINITION = "bench.timer_wait"
CARRIED = re.compile(r" govflow-advance-\d+\+(\d+)-")
"""The further runs a claimed ``advance`` task's name says it carries (ADR 0069)."""


def noops_document(key: str, steps: int, title: str, *, before: tuple[dict, ...] = ()) -> dict:
    """A definition of ``steps`` no-op steps (``s1``…), after the nodes ``before``."""
    actions = [f"s{i}" for i in range(1, steps + 1)]
    chain = ["start", *(node["id"] for node in before), *actions, "end"]
    return {
        "key": key,
        "version": 1,
        "title": title,
        "nodes": [
            {"id": "start", "type": "start", "title": "Start"},
            *before,
            *(
                {"id": s, "type": "action", "title": s, "action": "bench.noop", "input": {}}
                for s in actions
            ),
            {"id": "end", "type": "end", "title": "End"},
        ],
        "transitions": [{"from": a, "to": b} for a, b in itertools.pairwise(chain)],
    }


def five_noops_document() -> dict:
    return noops_document(DEFINITION, STEPS, "Five no-op steps")


def gated_document(steps: int) -> dict:
    """``steps`` no-op steps behind a timer: instances wait (parked on the timer, see
    :func:`govflow_db.create_waiting_timers`) until the driver makes their timers due."""
    wait = {"id": "wait", "type": "timer", "title": "Wait", "at": "2099-01-01T00:00:00+00:00"}
    return noops_document(
        f"bench.gated_{steps}", steps, f"{steps} no-op steps behind a timer", before=(wait,)
    )


def timer_document() -> dict:
    return {
        "key": TIMER_DEFINITION,
        "version": 1,
        "title": "Wait for one timer",
        "nodes": [
            {"id": "start", "type": "start", "title": "Start"},
            {"id": "wait", "type": "timer", "title": "Wait", "at": "2099-01-01T00:00:00+00:00"},
            {"id": "end", "type": "end", "title": "End"},
        ],
        "transitions": [{"from": "start", "to": "wait"}, {"from": "wait", "to": "end"}],
    }


@functools.cache
def _anchors() -> str:
    """This process's folder of anchor files, made at first use and removed at its exit."""
    path = tempfile.mkdtemp(prefix="govflow-bench-anchors-")
    atexit.register(shutil.rmtree, path, True)
    return path


def django_env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE=SETTINGS, DATABASE_URL=url, PYTHONPATH=str(ROOT))
    # Each throwaway database gets its own anchor file: anchors kept from an earlier run
    # (or another scenario's database) would rightly read as a restored database.
    database = url.rsplit("/", 1)[-1].split("?", 1)[0]
    env["GOVFLOW_ANCHOR_PATH"] = os.path.join(_anchors(), f"{database}.anchors")
    env["GOVFLOW_LOG_LEVEL"] = "INFO"  # the production default; the driver logs less
    return env


def setup_django(server: Server, template: str, log_dir: Path) -> str:
    """Migrate a template database and set this process's Django up on it."""
    url = server.create_database(template)
    migrated = _manage(["migrate", "--verbosity", "0"], url, log_dir / "migrate.log")
    if migrated != 0:
        raise RuntimeError(f"manage.py migrate failed; see {log_dir / 'migrate.log'}")
    # The driver logs warnings only; the clusters it starts log at INFO to their own files
    # (``django_env``). Set here, not when a bench module is imported: an import must not
    # change the environment of whoever imports it (a test's subprocesses inherit it).
    os.environ.update({**django_env(url), "GOVFLOW_LOG_LEVEL": "WARNING"})
    import logging

    import django

    django.setup()
    logging.getLogger("django-q").setLevel(logging.WARNING)  # the driver's enqueues
    return url


def _manage(args: list[str], url: str, log: Path) -> int:
    import subprocess

    with open(log, "ab") as out:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=django_env(url),
            stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode


def use_database(name: str) -> None:
    """Point every connection of this process (all threads) at database ``name``."""
    from django.db import connections

    connections.close_all()
    connections.settings["default"]["NAME"] = name


def publish(document: dict):
    from govflow.engine.services.definitions import definition_publish

    return definition_publish(document=document)


@dataclass
class Cluster:
    """One ``qcluster`` process group and the settings it runs with."""

    group: Group
    env: dict[str, str]

    @classmethod
    def start(
        cls, *, name: str, url: str, workers: int, overrides: dict[str, str], log_dir: Path
    ) -> Cluster:
        env = django_env(url)
        env.update(overrides)
        env["GOVFLOW_Q_WORKERS"] = str(workers)
        group = Group(
            name,
            [sys.executable, str(ROOT / "manage.py"), "qcluster"],
            env=env,
            cwd=ROOT,
            log=log_dir / f"{name}.log",
        )
        return cls(group, env)

    def wait_ready(self, timeout: float = 60) -> float:
        """Wait until this cluster's main process holds the sweeper lease; return seconds.

        The holder is ``hostname:pid:thread`` (``worker_name``); the sweeper thread runs in
        the main process, the session leader of the group, so its pid is the group id. A
        cluster restarted after a SIGKILL may first stand by while the dead one's lease
        lasts.
        """
        started = time.monotonic()
        holder = None
        deadline = started + timeout
        while time.monotonic() < deadline:
            self.group.check()
            holder = sweeper_holder()
            if holder and holder_pid(holder) == self.group.pgid:
                return time.monotonic() - started
            time.sleep(0.1)
        raise WorkerDied(
            f"{self.group.name}'s main process (pid {self.group.pgid}) did not take the "
            f"sweeper lease within {timeout:g} s (holder: {holder}):\n{self.group.tail()}"
        )

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds of this cluster's processes by role (pids from django-q2's log).

        The main process (the group leader) runs the sweeper thread; its sentinel is the
        one other process django-q2 does not name in its log. A worker django-q2 recycled
        (``recycle``, 500 tasks) or replaced is reaped by the sentinel: its time is in the
        sentinel's children time, counted as the workers'.
        """
        roles = self.pids_by_role()
        alive = self.group.pids()
        named = set().union(*roles.values())
        seconds = {role: pids_cpu(pids & alive) for role, pids in roles.items()}
        # The main process reaps only the sentinel, so its children time is not counted.
        seconds["main process (sweeper thread)"] = cpu_seconds(self.group.pgid)[0]
        sentinel = reaped = 0.0
        for pid in alive - named - {self.group.pgid}:
            mine, children = cpu_seconds(pid)
            sentinel += mine
            reaped += children
        seconds["qcluster workers"] += reaped
        seconds["sentinel"] = sentinel
        return seconds

    def pids_by_role(self) -> dict[str, set[int]]:
        """The process ids django-q2's log names: its workers, monitor and pusher, every
        one started so far (alive or not)."""
        text = self.group.log_path.read_text(errors="replace")
        roles: dict[str, set[int]] = {"qcluster workers": set(), "monitor": set(), "pusher": set()}
        for line in text.splitlines():
            for marker, role in (
                ("ready for work at ", "qcluster workers"),
                ("monitoring at ", "monitor"),
                ("pushing tasks at ", "pusher"),
            ):
                if marker in line:
                    roles[role].add(int(line.split(marker, 1)[1].split()[0]))
        return roles

    def advance_tasks_run(self) -> int:
        """Instance runs this cluster's workers started, whether a queued task or a claim
        (ADR 0026) delivered them: django-q2 logs each ``advance`` task it starts, and a
        claimed task's name counts the runs it carries (``govflow-advance-<id>+<more>-…``,
        ADR 0069)."""
        text = self.group.log_path.read_text(errors="replace")
        return sum(
            _runs_carried(line)
            for line in text.splitlines()
            if " processing " in line and "'govflow.engine.tasks.advance'" in line
        )

    def kill(self) -> None:
        self.group.kill()


def _runs_carried(line: str) -> int:
    """Instance runs of the ``advance`` task a log line starts: 1, or 1 + its ``+N``."""
    found = CARRIED.search(line)
    return 1 + int(found.group(1)) if found else 1


def default_worker_runs(workers: int) -> int:
    """The engine's runs per worker process on PostgreSQL for ``workers`` worker processes
    when neither ``GOVFLOW_WORKER_RUNS`` nor ``GOVFLOW_CLUSTER_RUNS`` is given (ADR 0067)."""
    from govflow.engine.conf import CLUSTER_RUNS, runs_per_worker

    return runs_per_worker(int(CLUSTER_RUNS.default), workers)
