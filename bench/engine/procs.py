"""Process groups the benchmark starts, and how it stops them (SIGKILL to the group).

Every worker (a ``qcluster`` or a DBOS worker) runs in its own session, so its main
process and everything it forked share one process group, and ``os.killpg`` stops all of
them at once: killing only a qcluster's main process can leave its sentinel running
(DESIGN.md §7). Starting and killing a group is :mod:`scripts.procgroup`, shared with the
process tests. Every group started here is remembered, and :func:`kill_all` (called on
exit, also on error or Ctrl-C) kills those still alive, by their own group ids only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from scripts.procgroup import ProcessGroup, stat_fields


class WorkerDied(RuntimeError):
    """A worker process exited by itself while the benchmark needed it."""


class Group(ProcessGroup):
    """One command started in its own session, logging to a file."""

    alive_groups: ClassVar[list[Group]] = []

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path):
        super().__init__(name, argv, env=env, cwd=cwd, log=log)
        Group.alive_groups.append(self)

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None and not self.killed:
            raise WorkerDied(f"{self.name} exited by itself (status {code}):\n{self.tail()}")

    def kill(self, timeout: float = 20) -> None:
        """SIGKILL the whole group and wait until every member is gone."""
        if self.killed:
            return
        super().kill(timeout)
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


def kill_all() -> None:
    for group in list(Group.alive_groups):
        group.kill()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own CPU time, CPU time of the children it reaped) of a live process."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0, 0.0
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime) / CLOCK_TICKS, (cutime + cstime) / CLOCK_TICKS


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
