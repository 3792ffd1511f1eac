"""``make run``: the embedded GovFlow on this machine.

Migrates the SQLite database, creates the demo logins (an operator and two approvers,
because decisions need a second person), publishes the demo workflows and makes a
demo API key for the demo tenant (kept in var/ like the password), starts
the development web server and a django-q2 worker cluster (each in its own process group),
waits until the server answers and the cluster runs, then prints — last, between two rules —
the URL, the credentials and how to start a demo instance, and stops both within 5 s on
Ctrl-C (SIGTERM to each process group, SIGKILL after a grace of 2.5 s).
``GOVFLOW_VAR_DIR`` moves the database, the credentials and the demo registry elsewhere
(``var/`` by default).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("GOVFLOW_VAR_DIR") or ROOT / "var")
CREDENTIALS = VAR / "demo-credentials.txt"
API_KEY_FILE = VAR / "demo-api-key.txt"
HOST = os.environ.get("GOVFLOW_HOST", "127.0.0.1")
PORT = os.environ.get("GOVFLOW_PORT", "8000")


def manage(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True, **kwargs)


def demo_password() -> str:
    """One random password per checkout, kept in var/ (never in the repository)."""
    VAR.mkdir(parents=True, exist_ok=True)
    if not CREDENTIALS.exists():
        CREDENTIALS.write_text(secrets.token_urlsafe(12) + "\n")
        CREDENTIALS.chmod(0o600)
    return CREDENTIALS.read_text().strip()


def demo_manage_command() -> str:
    """How to call manage.py from another terminal, with the same var/ folder and port."""
    python = (
        os.path.relpath(sys.executable, ROOT)
        if sys.executable.startswith(str(ROOT))
        else sys.executable
    )
    prefix = "".join(
        f"{name}={shlex.quote(os.environ[name])} "
        for name in ("GOVFLOW_VAR_DIR", "GOVFLOW_PORT")
        if os.environ.get(name)
    )
    return f"{prefix}{python} manage.py"


def demo_totp_keys() -> str:
    """Give the demo logins an authenticator-app key (made once, kept) and list the keys."""
    lines = manage("demo_second_factors", capture_output=True, text=True).stdout.splitlines()
    return "".join(f"    {ln.split()[0]:<10} {ln.split()[1]}\n" for ln in lines if ln.strip())


STOP_GRACE = 2.5
"""Seconds the children get to stop on SIGTERM before their process groups are killed:
Ctrl-C ends ``make run`` within 5 s even when a worker is in the middle of a task (the
engine's steps are durable: an interrupted one is recovered by the next run)."""


class Child:
    """A command in a process group of its own, its output forwarded line by line to ours
    (held back while the banner is being printed, so the banner is never cut in two)."""

    def __init__(self, name: str, argv: list[str], lock: threading.Lock) -> None:
        self.name = name
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._lock = lock
        threading.Thread(target=self._forward, daemon=True).start()

    def _forward(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                sys.stdout.write(line)
                sys.stdout.flush()
                # Seen by ``said`` only once written: a banner printed because of this
                # line then comes after it, not before.
                self.lines.append(line)

    def said(self, *words: str) -> bool:
        return any(all(w in line for w in words) for line in list(self.lines))


def wait_until(condition, procs: list[Child], timeout: float) -> bool:
    """Wait until ``condition()`` holds (False when a child exits or time runs out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if any(child.proc.poll() is not None for child in procs):
            return False
        time.sleep(0.1)
    return condition()


def server_answers() -> bool:
    """The web server answers an HTTP request (not just accepts a connection)."""
    with contextlib.suppress(OSError), socket.create_connection((HOST, int(PORT)), timeout=1) as s:
        s.sendall(f"HEAD /admin/login/ HTTP/1.0\r\nHost: {HOST}\r\n\r\n".encode())
        return s.recv(12).startswith(b"HTTP/")
    return False


def stop_all(procs: list[Child]) -> None:
    """Stop each child by its process group: SIGTERM, then SIGKILL after ``STOP_GRACE``."""
    print("Stopping GovFlow…", flush=True)
    for child in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for child in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in procs:  # the group, not only its leader: qcluster's workers too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait()
    print("GovFlow stopped.", flush=True)


def banner(password: str, api_key: str, totp_keys: str) -> str:
    manage_cmd = demo_manage_command()
    rule = "=" * 78
    return (
        f"\n{rule}\n"
        f"  GovFlow is running at http://{HOST}:{PORT}/admin/\n"
        f"  Operator login:  operator / {password}\n"
        f"  Approver logins: approver / {password}  and  approver2 / {password}\n"
        "    (decisions need a second person: one approver requests, the other approves)\n"
        f"  Auditor login:   auditor / {password}\n"
        "  Second factor (TOTP keys for an authenticator app; development only):\n"
        f"{totp_keys}"
        f"    or print the current codes: {manage_cmd} demo_second_factors --codes\n"
        f"  REST API key (tenant demo-municipality, every scope; development only):\n"
        f"    {api_key}\n"
        f"    curl -H 'Authorization: Api-Key {api_key}' http://{HOST}:{PORT}/api/v1/me/\n"
        f"  API docs: http://{HOST}:{PORT}/api/v1/docs/  (docs/integrations.md)\n"
        "  A django-q2 worker cluster is running beside the web server.\n"
        "\n"
        "  Try the demo (in another terminal):\n"
        f"    {manage_cmd} demo_start          # a building-permit application\n"
        f"    {manage_cmd} demo_status ID      # where it is\n"
        f"    {manage_cmd} demo_inspect ID     # after the objection period\n"
        f"    {manage_cmd} demo_approve ID     # as the approver\n"
        "  Press Ctrl-C to stop both.\n"
        f"{rule}\n"
    )


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "govflow.settings.dev")
    manage("migrate", "--noinput", "-v", "0")
    password = demo_password()
    # "--password=…" in one word: a random password may begin with "-", which argparse
    # would take for an option of its own.
    manage("demo_setup", f"--password={password}", f"--api-key-file={API_KEY_FILE}")
    api_key = API_KEY_FILE.read_text().strip()
    totp_keys = demo_totp_keys()
    lock = threading.Lock()
    manage_py = [sys.executable, "manage.py"]
    procs = [
        Child("web", [*manage_py, "runserver", f"{HOST}:{PORT}", "--noreload"], lock),
        Child("worker", [*manage_py, "qcluster"], lock),
    ]

    def stop(*_):
        stop_all(procs)
        sys.exit(0)

    # Installed before the wait, so Ctrl-C never leaves the children running.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # The banner comes last: after the server answers and the cluster said it runs.
    if not wait_until(server_answers, procs, 60):
        print("The web server did not come up; stopping.", file=sys.stderr)
        stop_all(procs)
        return 1
    if logging.getLevelName(os.environ.get("GOVFLOW_LOG_LEVEL", "INFO").upper()) in (10, 20):
        # django-q2 says so at INFO; with a quieter GOVFLOW_LOG_LEVEL nothing would come.
        wait_until(lambda: procs[1].said("running"), procs, 30)
    with lock:
        print(banner(password, api_key, totp_keys), flush=True)
    while all(child.proc.poll() is None for child in procs):
        time.sleep(0.2)
    print("A GovFlow process exited; stopping the other.", file=sys.stderr)
    stop_all(procs)
    return 1


if __name__ == "__main__":
    sys.exit(main())
