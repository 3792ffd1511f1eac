"""Where a running worker process's Python time goes: py-spy samples, read from outside.

The in-process profile (``govflow_db.profile_in_process``) runs under cProfile, which
charges every Python call its own bookkeeping: a function that does little and is called
often looks many times costlier than it is (a psycopg autocommit switch measured 1 µs
alone and far more under cProfile). py-spy reads a process's stacks from outside, without
stopping it (``--nonblocking``), a fixed number of times a second; with ``--gil`` it keeps
only the thread that holds the interpreter lock, the one running Python. A function's
share of the samples is then its share of the process's Python time, and the process's
CPU time over the same window (``/proc``, every thread) turns shares into milliseconds per
step. Work in C (BLAKE3, the JSON encoder, libpq) is charged to the Python function that
called it.

Needs the ``py-spy`` command (a development dependency) and the right to read another
process's memory (ptrace: root, or ``kernel.yama.ptrace_scope`` 0 for the same user).
Without either, the benchmark prints why and goes on.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from scripts.procgroup import stat_fields

from .procs import CLOCK_TICKS

RATE = 200
"""Samples a second."""

GROUPS = (
    ("govflow/", "engine (govflow)"),
    ("recovery/", "ledger (recovery): chain, canonical bytes, BLAKE3 calls"),
    ("psycopg/", "psycopg (driver)"),
    ("django/db/", "django.db (connections, cursors, transactions, ORM)"),
    ("django_q/", "django-q2 (its worker loop)"),
    ("django/", "django (other)"),
    ("asgiref/", "asgiref (Django's per-thread connection look-up)"),
    ("json/", "json (stdlib)"),
    ("threading.py", "threads, locks, queues (stdlib)"),
    ("queue.py", "threads, locks, queues (stdlib)"),
    ("multiprocessing/", "threads, locks, queues (stdlib)"),
)
OTHER = "other (stdlib, builtins, packages)"

_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*):\d+\)$")


def py_spy() -> str | None:
    """The ``py-spy`` command: beside this interpreter (the project's environment), or on
    the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """py-spy recording one process until :meth:`stop`; ``why_not`` says what failed."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid = pid
        self.out = out
        self.log = out.with_suffix(".log")
        self.why_not = ""
        self.ticks_before = thread_ticks(pid)
        command = py_spy()
        if command is None:
            self.why_not = "py-spy is not installed (make .venv/.installed installs it)"
            self.proc = None
            return
        argv = [command, "record", "--pid", str(pid), "--gil", "--nonblocking"]
        argv += ["--rate", str(RATE), "--format", "raw", "--output", str(out)]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> dict[int, int]:
        """Stop recording (py-spy writes its file on SIGINT); the CPU clock ticks each
        thread of the process used meanwhile."""
        ticks_after = thread_ticks(self.pid)
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if not self.out.exists():
                tail = self.log.read_text(errors="replace").strip().splitlines()[:1]
                self.why_not = f"py-spy wrote nothing: {tail[0] if tail else 'no output'}"
        return {tid: ticks - self.ticks_before.get(tid, 0) for tid, ticks in ticks_after.items()}


def thread_ticks(pid: int) -> dict[int, int]:
    """CPU clock ticks (user + system) of each live thread of ``pid``."""
    ticks = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tids:
        fields = stat_fields(pid, f"/proc/{pid}/task/{tid}/stat")
        if fields:  # utime and stime: fields 14 and 15 of stat(5), 12 and 13 here
            ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def stacks(path: Path) -> Iterable[tuple[list[tuple[str, str]], int]]:
    """py-spy's raw lines: each stack as (function, file) frames, outermost first, and its
    sample count."""
    for line in path.read_text(errors="replace").splitlines():
        text, _, count = line.rpartition(" ")
        if not text or not count.isdigit():
            continue
        frames = []
        for frame in text.split(";"):
            match = _FRAME.match(frame)
            frames.append((match["name"], match["file"]) if match else (frame, ""))
        yield frames, int(count)


def group_of(file: str) -> str:
    for marker, name in GROUPS:
        if file.startswith(marker) or f"/{marker}" in file:
            return name
    return OTHER


def summary(path: Path, *, top: int = 20) -> dict:
    """Shares of the samples: by group of the function running (the innermost frame), by
    the engine's and ledger's functions with everything they call (each counted once per
    stack), and the functions running most."""
    total = 0
    groups: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    running: Counter[str] = Counter()
    for frames, count in stacks(path):
        total += count
        name, file = frames[-1]
        groups[group_of(file)] += count
        running[f"{name} ({file})"] += count
        seen = set()
        for name, file in frames:
            key = f"{name} ({file})"
            if group_of(file) in (GROUPS[0][1], GROUPS[1][1]) and key not in seen:
                seen.add(key)
                inclusive[key] += count
    if not total:
        return {"samples": 0}

    def shares(counter: Counter[str], n: int | None = None) -> list[tuple[float, str]]:
        return [(count / total, name) for name, count in counter.most_common(n)]

    return {
        "samples": total,
        "groups": shares(groups),
        "inclusive": shares(inclusive, top),
        "running": shares(running, top),
    }


def seconds(ticks: int) -> float:
    return ticks / CLOCK_TICKS
