"""``make run``'s launcher: the banner comes last, after the servers are up, and Ctrl-C
stops everything within 5 s. Runs the real launcher (its own SQLite in a temporary var/
folder, on a free port); no database of the test run is used."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scripts.procgroup import group_pids, stat_fields

ROOT = Path(__file__).resolve().parents[2]
BANNER_END = "Press Ctrl-C to stop both."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Output:
    """The launcher's output, read by a thread so that waiting never blocks on a pipe."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.closed = threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)
        self.closed.set()

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            if self.closed.is_set():
                return False
            time.sleep(0.05)
        return False


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        fields = stat_fields(int(entry)) if entry.isdigit() else None
        if fields and int(fields[1]) == pid:
            found.add(int(entry))
    return found


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def launcher(tmp_path):
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(GOVFLOW_VAR_DIR=str(tmp_path / "var"), GOVFLOW_PORT=str(port), PYTHONUNBUFFERED="1")
    env["GOVFLOW_LOG_LEVEL"] = "INFO"  # make run's default: the lines asserted below are INFO
    proc = subprocess.Popen(
        [sys.executable, "scripts/run.py"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # as a terminal's foreground group: Ctrl-C goes to it
    )
    yield proc, Output(proc.stdout), port
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_banner_comes_last_and_ctrl_c_stops_everything_within_5_s(launcher):
    proc, output, port = launcher
    assert output.wait_for(BANNER_END, timeout=240), "".join(output.lines[-40:])
    text = "".join(output.lines)
    banner = text[text.rindex("=" * 78, 0, text.index(BANNER_END)) :]
    assert f"GovFlow is running at http://127.0.0.1:{port}/admin/" in banner
    assert "Operator login:  operator / " in banner and "Api-Key " in banner
    # Up when announced: the web server answers, the worker cluster runs.
    assert port_open(port)
    before = text[: text.index(banner)]
    assert "Starting development server" in before  # the servers' start-up lines come first
    assert "Q Cluster" in before and "running" in before, text

    # The web server and the cluster, each the leader of its own process group.
    children = children_of(proc.pid)
    assert len(children) == 2
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
    proc.wait(timeout=5)
    assert time.monotonic() - started < 5
    assert "GovFlow stopped." in "".join(output.lines)
    deadline = time.monotonic() + 2
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not port_open(port)
    assert not [pid for pid in children if group_pids(pid)]  # their workers too
