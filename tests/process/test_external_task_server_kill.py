"""The web server SIGKILLed while an instance waits on a locked external task.

A real ``manage.py runserver`` (in its own process group) serves the API and a real
``qcluster`` advances the instance. Worker 1 locks the task over HTTP; the server is
killed with SIGKILL and started again. The lock is in the database, so after the restart
the task stays locked to worker 1 until its expiry (database clock): worker 2 gets
nothing. Once it has expired, worker 2 gets it with a higher fence; worker 1's late
report is refused and kept, worker 2's completion finishes the instance, and the task's
history holds exactly one applied completion.
"""

from __future__ import annotations

import socket
import sys

import pytest
import requests

from govflow.api.models import ApiKey
from govflow.engine.models import ExternalTask, Instance, TaskState
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from scripts.procgroup import ProcessGroup
from tests.dbclock import db_now
from tests.flows import linear

from .support import BASE_DIR, wait_for, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "process.check"
LOCK = 20.0  # long enough for the restart, even on a busy machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server(ProcessGroup):
    def __init__(self, ws, port: int, name: str) -> None:
        super().__init__(
            name,
            [
                sys.executable,
                str(BASE_DIR / "manage.py"),
                "runserver",
                "--noreload",
                f"127.0.0.1:{port}",
            ],
            env=ws.env(),
            cwd=BASE_DIR,
            log=ws.tmp_path / f"{name}.log",
        )
        self.url = f"http://127.0.0.1:{port}"

    def up(self) -> bool:
        try:
            return requests.get(f"{self.url}/api/v1/problems/", timeout=1).status_code == 200
        except requests.ConnectionError:
            return False


def post(server: Server, key: str, path: str, body: dict) -> requests.Response:
    return requests.post(
        f"{server.url}/api/v1/tasks/{path}",
        json=body,
        headers={"Authorization": f"Api-Key {key}"},
        timeout=10,
    )


def fetch(server: Server, key: str, worker: str) -> list[dict]:
    body = {"worker_id": worker, "topics": [TOPIC], "lock_duration": LOCK, "max_tasks": 5}
    response = post(server, key, "fetch-and-lock/", body)
    assert response.status_code == 200, response.text
    return response.json()["tasks"]


def test_a_locked_task_survives_a_server_kill_until_expiry_then_is_redelivered(workspace):
    definition = definition_publish(
        document=linear(
            {"id": "check", "type": "external_task", "topic": TOPIC, "output": {"ok": "ok"}},
            key="tests.process_task",
        )
    )
    _, key = ApiKey.objects.create_key(name="proc", tenant="north", scopes=[f"tasks:{TOPIC}"])
    workspace.start_cluster()
    instance = instance_start(definition=definition, variables={}, tenant="north")
    workspace.watch(instance.pk)
    wait_status(workspace, instance.pk, "waiting")

    port = free_port()
    first = Server(workspace, port, "server-1")
    try:
        wait_for(first.up, timeout=60, what="the first server to answer")
        [task] = fetch(first, key, "w1")
        assert task["fence"] == 1
    finally:
        first.kill(15)  # SIGKILL of the whole server process group
    assert not first.up()

    second = Server(workspace, port, "server-2")
    try:
        wait_for(second.up, timeout=60, what="the restarted server to answer")
        stored = ExternalTask.objects.get(pk=task["id"])
        assert (stored.state, stored.worker, stored.fence) == (TaskState.LOCKED, "w1", 1)
        assert db_now() < stored.lock_expires_at, "the restart took longer than the lock"
        assert fetch(second, key, "w2") == []  # still w1's: no redelivery while valid
        assert db_now() < stored.lock_expires_at
        wait_for(
            lambda: db_now() > stored.lock_expires_at,
            timeout=LOCK + 10,
            what="the lock to expire by the database clock",
        )
        [again] = fetch(second, key, "w2")
        assert (again["id"], again["fence"]) == (task["id"], 2)
        late = post(
            second,
            key,
            f"{task['id']}/complete/",
            {"worker_id": "w1", "fence": 1, "variables": {"ok": "w1"}},
        )
        assert late.status_code == 409 and late.json()["code"] == "task-fence-stale"
        done = post(
            second,
            key,
            f"{task['id']}/complete/",
            {"worker_id": "w2", "fence": 2, "variables": {"ok": "w2"}},
        )
        assert done.status_code == 200, done.text
        wait_status(workspace, instance.pk, "completed")
    finally:
        second.kill(15)
    assert Instance.objects.get(pk=instance.pk).variables["ok"] == "w2"
    reports = list(
        ExternalTask.objects.get(pk=task["id"]).reports.values_list("kind", "worker", "refusal")
    )
    assert reports == [("complete", "w1", "stale_fence"), ("complete", "w2", "")]
