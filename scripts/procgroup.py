"""A command in a process group of its own, stopped with SIGKILL to the whole group.

Shared by the process tests (``tests/process/support.py``: real ``qcluster`` workers) and
the engine benchmark (``bench/engine/procs.py``: qclusters, DBOS workers, a sweeper).
Plain standard library, no Django: both import it with the project root on ``sys.path``.

The command runs in its own session, so its main process and everything it forks share
one process group, and ``os.killpg`` stops all of them at once: killing only a qcluster's
main process can leave its sentinel running, and killing one idle worker can wedge the
cluster (DESIGN.md §7). :meth:`ProcessGroup.kill` waits until every member is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def stat_fields(pid: int, path: str = "") -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None if the
    process is gone. ``path``: another file of that layout instead, such as a thread's
    ``/proc/PID/task/TID/stat``."""
    try:
        raw = Path(path or f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def group_pids(pgid: int) -> set[int]:
    """Processes of group ``pgid`` that are still running (zombies do not count)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields and int(fields[2]) == pgid and fields[0] != "Z":
                pids.add(int(entry))
    return pids


class ProcessGroup:
    """One command started in a session of its own, its output appended to ``log``."""

    def __init__(
        self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path
    ) -> None:
        self.name = name
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115  (closed in kill())
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pgid = self.proc.pid  # a session leader's pid is its group id
        self.killed = False

    def pids(self) -> set[int]:
        return group_pids(self.pgid)

    def stopped(self) -> bool:
        """Whether every member is stopped (SIGSTOP delivered: state ``T``). A signal sent
        to the group is only queued when ``os.killpg`` returns; a member running on another
        CPU may go on for a moment."""
        states = [stat_fields(pid) for pid in self.pids()]
        return bool(states) and all(fields is None or fields[0] == "T" for fields in states)

    def kill(self, timeout: float) -> set[int]:
        """SIGKILL the whole group and wait until every member is gone: up to ``timeout``
        seconds for the main process, then as long again for the rest. Returns the members
        still running after that (empty: all gone); does nothing if already killed."""
        if self.killed:
            return set()
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while (left := self.pids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._log.close()
        return left

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])
