"""GovFlow's side: real ``manage.py qcluster`` process groups on a scenario database.

The driver (this process) sets Django up with :mod:`bench.engine.settings`; it starts
instances and reads progress through :mod:`bench.engine.govflow_db`. Every step runs in
a qcluster worker process; the dedicated sweeper (:mod:`bench.engine.sweeper`) is used
where the scenario says so.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.pgserver import ROOT, Server

from .procs import Group, WorkerDied, cpu_seconds, pids_cpu, wait_until

SETTINGS = "bench.engine.settings"
STEPS = 5
DEFINITION = "bench.five_noops"
TIMER_DEFINITION = "bench.timer_wait"
SWEEPER = "govflow:sweeper"


def five_noops_document() -> dict:
    steps = [f"s{i}" for i in range(1, STEPS + 1)]
    chain = ["start", *steps, "end"]
    return {
        "key": DEFINITION,
        "version": 1,
        "title": "Five no-op steps",
        "nodes": [
            {"id": "start", "type": "start", "title": "Start"},
            *(
                {"id": s, "type": "action", "title": s, "action": "bench.noop", "input": {}}
                for s in steps
            ),
            {"id": "end", "type": "end", "title": "End"},
        ],
        "transitions": [{"from": a, "to": b} for a, b in itertools.pairwise(chain)],
    }


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


def django_env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE=SETTINGS, DATABASE_URL=url, PYTHONPATH=str(ROOT))
    env["GOVFLOW_LOG_LEVEL"] = "INFO"  # the production default; the driver logs less
    return env


def setup_django(server: Server, template: str, log_dir: Path) -> str:
    """Migrate a template database and set this process's Django up on it."""
    url = server.create_database(template)
    migrated = _manage(["migrate", "--verbosity", "0"], url, log_dir / "migrate.log")
    if migrated != 0:
        raise RuntimeError(f"manage.py migrate failed; see {log_dir / 'migrate.log'}")
    os.environ.update(django_env(url))
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
        """Wait until a worker of this cluster holds the sweeper lease; return seconds."""
        from django.db.models.functions import Now

        from recovery.models import Lease

        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            self.group.check()
            holder = (
                Lease.objects.filter(key=SWEEPER, holder__isnull=False, expires_at__gt=Now())
                .values_list("holder", flat=True)
                .first()
            )
            if holder:
                try:
                    pid = int(holder.rsplit(":", 2)[1])
                except (IndexError, ValueError):
                    pid = -1
                if pid in self.group.pids():
                    return time.monotonic() - started
            time.sleep(0.1)
        raise WorkerDied(f"{self.group.name} did not start sweeping:\n{self.group.tail()}")

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds of this cluster's processes by role (pids from django-q2's log).

        A worker django-q2 recycled (``recycle``, 500 tasks) or replaced is reaped by the
        sentinel: its time is in the sentinel's children time, counted as the workers'.
        """
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
        alive = self.group.pids()
        named = set().union(*roles.values())
        seconds = {role: pids_cpu(pids & alive) for role, pids in roles.items()}
        own = reaped = 0.0
        for pid in alive - named:
            mine, children = cpu_seconds(pid)
            own += mine
            if pid != self.group.pgid:  # the main process reaps only the sentinel
                reaped += children
        seconds["qcluster workers"] += reaped
        seconds["main + sentinel"] = own
        return seconds

    def kill(self) -> None:
        self.group.kill()


class Sweeper:
    """The dedicated sweeper process (:mod:`bench.engine.sweeper`) in its own group."""

    def __init__(self, *, name: str, url: str, overrides: dict[str, str], log_dir: Path):
        env = django_env(url)
        env.update(overrides)
        self.group = Group(
            name,
            [sys.executable, str(Path(__file__).resolve().parent / "sweeper.py")],
            env=env,
            cwd=ROOT,
            log=log_dir / f"{name}.log",
        )

    def wait_sweeping(self, timeout: float = 60) -> None:
        from django.db.models.functions import Now

        from recovery.models import Lease

        def holds() -> bool:
            holder = (
                Lease.objects.filter(key=SWEEPER, holder__isnull=False, expires_at__gt=Now())
                .values_list("holder", flat=True)
                .first()
            )
            return bool(holder) and f":{self.group.pgid}:" in holder

        wait_until(
            holds, timeout=timeout, what="the sweeper to hold its lease", groups=[self.group]
        )

    def kill(self) -> None:
        self.group.kill()
