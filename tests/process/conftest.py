"""Fixtures for process tests: real ``qcluster`` process groups on PostgreSQL.

Each test gets a ``workspace``: a fresh effect store and pause folder under ``tmp_path``
and ``start_cluster()``. Every cluster it starts is SIGKILLed (by process group) when the
test ends, before pytest-django flushes the database. When a test fails, the instances
it registered with ``watch`` are dumped (tokens, ledger, chain) with each cluster's log.

Run them on PostgreSQL (they skip on SQLite), e.g.
``DATABASE_URL=postgres://…/proctests pytest tests/process -x -s``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.db import connection

from tests.providers.alpha.effects import store_create

from .support import FAST, Cluster, database_url, dump


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


class Workspace:
    """The folders, environment and clusters of one process test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.store = tmp_path / "alpha-effects.sqlite3"
        store_create(self.store)
        self.pause_dir = tmp_path / "pause"
        self.pause_dir.mkdir()
        self.clusters: list[Cluster] = []
        self.watched: list[int] = []

    def env(self, **overrides: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(FAST)
        env.update(
            {
                "DATABASE_URL": database_url(),
                "DJANGO_SETTINGS_MODULE": "tests.settings_process",
                "ALPHA_STORE": str(self.store),
                "ALPHA_PAUSE_DIR": str(self.pause_dir),
                "GOVFLOW_VAR_DIR": str(self.tmp_path / "var"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update({k: str(v) for k, v in overrides.items()})
        return env

    def start_cluster(self, **overrides: str) -> Cluster:
        name = f"c{len(self.clusters) + 1}"
        cluster = Cluster(name, self.env(**overrides), self.tmp_path / f"cluster-{name}.log")
        self.clusters.append(cluster)
        return cluster

    def pause(self, point: str) -> None:
        (self.pause_dir / point).touch()

    def unpause(self, point: str) -> None:
        (self.pause_dir / point).unlink(missing_ok=True)
        (self.pause_dir / f"{point}.reached").unlink(missing_ok=True)

    def reached(self, point: str) -> bool:
        return (self.pause_dir / f"{point}.reached").exists()

    def parked(self, point: str) -> int:
        """How many calls parked at ``point`` since it was paused."""
        reached = self.pause_dir / f"{point}.reached"
        return len(reached.read_text().splitlines()) if reached.exists() else 0

    def watch(self, *instance_ids: int) -> None:
        self.watched.extend(instance_ids)

    def kill_all(self) -> None:
        errors = []
        for cluster in self.clusters:
            try:
                cluster.kill()
            except Exception as exc:  # kill the others all the same
                errors.append(exc)
        if errors:
            raise errors[0]

    def report(self, limit: int = 5) -> str:
        parts = []
        for instance_id in self.watched[:limit]:
            try:
                parts.append(dump(instance_id))
            except Exception as exc:  # the dump must never hide the real failure
                parts.append(f"(could not dump instance {instance_id}: {exc!r})")
        for cluster in self.clusters:
            parts.append(f"===== log of cluster {cluster.name} (tail) =====\n{cluster.log_tail()}")
        return "\n".join(parts)


@pytest.fixture
def workspace(transactional_db, tmp_path, monkeypatch, request):
    """A process-test workspace; requests ``transactional_db`` so its teardown (killing
    the clusters) runs before pytest-django flushes the tables they use."""
    if connection.vendor != "postgresql":
        pytest.skip(
            "needs PostgreSQL: the qcluster processes must share the test database "
            "(pytest-django's SQLite one is in memory), and SQLite serialises all "
            "writers, so there is no race"
        )
    request.getfixturevalue("on_postgres")
    ws = Workspace(tmp_path)
    # The test process reads the same effect store the workers write.
    monkeypatch.setenv("ALPHA_STORE", str(ws.store))
    monkeypatch.delenv("ALPHA_PAUSE_DIR", raising=False)
    try:
        yield ws
    finally:
        try:
            ws.kill_all()
        finally:
            call = getattr(request.node, "rep_call", None)
            if call is not None and call.failed:
                print("\n" + ws.report())
