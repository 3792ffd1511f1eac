"""Process groups the benchmark starts, and how it stops them (SIGKILL to the group).

Every worker (a ``qcluster`` or a DBOS worker) runs in its own session, so its main
process and everything it forked share one process group, and ``os.killpg`` stops all of
them at once: killing only a qcluster's main process can leave its sentinel running
(DESIGN.md §7). Every group started here is remembered, and :func:`kill_all` (called on
exit, also on error or Ctrl-C) kills those still alive, by their own group ids only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar


class WorkerDied(RuntimeError):
    """A worker process exited by itself while the benchmark needed it."""


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def group_pids(pgid: int) -> set[int]:
    """Live (non-zombie) processes of group ``pgid``."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat and stat[1] == pgid and stat[0] != "Z":
                pids.add(int(entry))
    return pids


class Group:
    """One command started in its own session, logging to a file."""

    alive_groups: ClassVar[list[Group]] = []

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path):
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
        self.pgid = self.proc.pid
        self.killed = False
        Group.alive_groups.append(self)

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None and not self.killed:
            raise WorkerDied(f"{self.name} exited by itself (status {code}):\n{self.tail()}")

    def pids(self) -> set[int]:
        return group_pids(self.pgid)

    def kill(self, timeout: float = 20) -> None:
        """SIGKILL the whole group and wait until every member is gone."""
        if self.killed:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._log.close()
        if self in Group.alive_groups:
            Group.alive_groups.remove(self)

    def wait_for_line(self, text: str, timeout: float) -> None:
        """Wait until the log contains ``text`` (e.g. a READY line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            if text in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise WorkerDied(f"{self.name} did not print {text!r} within {timeout:g} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def kill_all() -> None:
    for group in list(Group.alive_groups):
        group.kill()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own CPU time, CPU time of the children it reaped) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0.0, 0.0
    fields = [int(f) for f in raw[raw.rfind(")") + 2 :].split()[11:15]]
    return (fields[0] + fields[1]) / CLOCK_TICKS, (fields[2] + fields[3]) / CLOCK_TICKS


def pids_cpu(pids) -> float:
    """Own and reaped children's CPU time of ``pids``."""
    return sum(sum(cpu_seconds(pid)) for pid in pids)


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, groups=(), interval=0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for group in groups:
            group.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
