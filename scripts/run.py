"""``make run``: the embedded GovFlow on this machine.

Migrates the SQLite database, creates two demo operator logins (a requester and an
approver, because decisions need a second person), starts the development web server and
a django-q2 worker cluster, prints the URL and the credentials, and stops both on Ctrl-C.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
CREDENTIALS = VAR / "demo-credentials.txt"
HOST = os.environ.get("GOVFLOW_HOST", "127.0.0.1")
PORT = os.environ.get("GOVFLOW_PORT", "8000")


def manage(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True, **kwargs)


def demo_password() -> str:
    """One random password per checkout, kept in var/ (never in the repository)."""
    VAR.mkdir(exist_ok=True)
    if not CREDENTIALS.exists():
        CREDENTIALS.write_text(secrets.token_urlsafe(12) + "\n")
        CREDENTIALS.chmod(0o600)
    return CREDENTIALS.read_text().strip()


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "govflow.settings.dev")
    manage("migrate", "--noinput", "-v", "0")
    password = demo_password()
    manage("demo_setup", "--password", password)
    procs = [
        subprocess.Popen([sys.executable, "manage.py", "runserver", f"{HOST}:{PORT}",
                          "--noreload"], cwd=ROOT, start_new_session=True),
        subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT,
                         start_new_session=True),
    ]
    time.sleep(2)
    print(
        "\n"
        f"  GovFlow is running at http://{HOST}:{PORT}/admin/\n"
        f"  Operator login:  operator / {password}\n"
        f"  Approver login:  approver / {password}   (decisions need a second person)\n"
        "  A django-q2 worker cluster is running beside the web server.\n"
        "  Press Ctrl-C to stop both.\n",
        flush=True,
    )

    def stop(*_):
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while all(proc.poll() is None for proc in procs):
        time.sleep(1)
    print("A GovFlow process exited; stopping the other.", file=sys.stderr)
    stop()
    return 1


if __name__ == "__main__":
    sys.exit(main())
