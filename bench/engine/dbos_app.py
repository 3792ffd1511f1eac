"""The DBOS side of the engine benchmark. Imports only ``dbos`` and the standard library.

Runs with ``bench/.venv-dbos/bin/python`` (DBOS Transact is installed there and nowhere
else). Two commands:

``worker URL EXECUTOR_ID CONCURRENCY POLL``
    Launch DBOS on the system database ``URL`` with a fixed ``executor_id`` (a restarted
    worker recovers the workflows its predecessor left pending), register the queue and
    run its workflows until killed. Prints ``READY`` once launched.

``enqueue URL PREFIX N THREADS``
    Enqueue ``N`` workflows with ids ``PREFIX-0`` … through one ``DBOSClient`` shared by
    ``THREADS`` threads, as an application outside the workers would. Prints
    ``ENQUEUED seconds``.

The workflow is five no-op ``@DBOS.step`` functions: DBOS records each step's output
(one commit per step) and the workflow's status around them.
"""

from __future__ import annotations

import sys
import threading
import time

from dbos import DBOS, DBOSClient, DBOSConfig

QUEUE = "bench_queue"
WORKFLOW = "five_noops"
APP = "govflow-bench"
VERSION = "bench-1"


@DBOS.step(name="noop_step")
def noop_step(index: int) -> int:
    return index


@DBOS.workflow(name=WORKFLOW)
def five_noops() -> int:
    total = 0
    for index in range(5):
        total += noop_step(index)
    return total


def config(url: str, executor_id: str) -> DBOSConfig:
    return {
        "name": APP,
        "system_database_url": url,
        "executor_id": executor_id,
        "application_version": VERSION,
        "log_level": "WARNING",
    }


def worker(url: str, executor_id: str, concurrency: int, poll: float) -> None:
    DBOS(config=config(url, executor_id))
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=poll,
        on_conflict="always_update",
    )
    print("READY", flush=True)
    threading.Event().wait()


def enqueue(url: str, prefix: str, count: int, threads: int) -> None:
    client = DBOSClient(system_database_url=url, application_name=APP)
    errors: list[BaseException] = []

    def run(part: int) -> None:
        try:
            for index in range(part, count, threads):
                client.enqueue(
                    {
                        "workflow_name": WORKFLOW,
                        "queue_name": QUEUE,
                        "workflow_id": f"{prefix}-{index}",
                        "app_version": VERSION,
                    }
                )
        except BaseException as exc:
            errors.append(exc)
            raise

    started = time.monotonic()
    workers = [threading.Thread(target=run, args=(part,)) for part in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    if errors:
        raise SystemExit(f"enqueue failed: {errors[0]!r}")
    print(f"ENQUEUED {time.monotonic() - started:.3f}", flush=True)
    client.destroy()


def main(argv: list[str]) -> None:
    command = argv[1]
    if command == "worker":
        worker(argv[2], argv[3], int(argv[4]), float(argv[5]))
    elif command == "enqueue":
        enqueue(argv[2], argv[3], int(argv[4]), int(argv[5]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv)
