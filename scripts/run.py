"""``make run``: the embedded GovFlow on this machine.

Migrates the SQLite database, creates the demo logins (an operator and two approvers,
because decisions need a second person), publishes the demo workflows and makes a
demo API key for the demo tenant (kept in var/ like the password), starts
the development web server and a django-q2 worker cluster (each in its own process group),
waits until the server answers, prints the URL, the credentials and how to start a demo
instance, and stops both on Ctrl-C. ``GOVFLOW_VAR_DIR`` moves the database, the
credentials and the demo registry elsewhere (``var/`` by default).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
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


def wait_for_server(proc: subprocess.Popen, timeout: float = 60) -> bool:
    """Wait until the web server accepts connections (or has exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection((HOST, int(PORT)), timeout=1):
            return True
        time.sleep(0.3)
    return False


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop each child by its process group (django-q2 leaves a sentinel otherwise)."""
    print("Stopping GovFlow (a worker may take up to 15 s to finish its task)…", flush=True)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "govflow.settings.dev")
    manage("migrate", "--noinput", "-v", "0")
    password = demo_password()
    manage("demo_setup", "--password", password, "--api-key-file", str(API_KEY_FILE))
    api_key = API_KEY_FILE.read_text().strip()
    totp_keys = demo_totp_keys()
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"{HOST}:{PORT}", "--noreload"],
            cwd=ROOT,
            start_new_session=True,
        ),
        subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"], cwd=ROOT, start_new_session=True
        ),
    ]

    def stop(*_):
        stop_all(procs)
        sys.exit(0)

    # Installed before the wait, so Ctrl-C never leaves the children running.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if not wait_for_server(procs[0]):
        print("The web server did not come up; stopping.", file=sys.stderr)
        stop_all(procs)
        return 1
    manage_cmd = demo_manage_command()
    print(
        "\n"
        f"  GovFlow is running at http://{HOST}:{PORT}/admin/\n"
        f"  Operator login:  operator / {password}\n"
        f"  Approver logins: approver / {password}  and  approver2 / {password}\n"
        "    (decisions need a second person: one approver requests, the other approves)\n"
        "  Second factor (TOTP keys for an authenticator app; development only):\n"
        f"{totp_keys}"
        f"    or print the current codes: {demo_manage_command()} demo_second_factors --codes\n"
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
        "  Press Ctrl-C to stop both.\n",
        flush=True,
    )
    while all(proc.poll() is None for proc in procs):
        time.sleep(1)
    print("A GovFlow process exited; stopping the other.", file=sys.stderr)
    stop_all(procs)
    return 1


if __name__ == "__main__":
    sys.exit(main())
