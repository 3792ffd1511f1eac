"""Who holds a lease, and whether that process still exists.

A lease holder is named ``host:pid:thread``, where *host* is the host name and, on Linux,
the inode of the process's PID namespace (``/proc/self/ns/pid``): two containers that
share a host name but not a PID namespace are different hosts here. A holder on *this*
host whose process no longer exists is dead for certain — its lease can be expired at
once instead of waited out (``recovery.api.lease_expire``). Anything else (another host,
a process that exists, a name in another form) is presumed alive: the lease's expiry
decides, as always. A reused pid only makes a dead holder look alive, never the reverse.
"""

from __future__ import annotations

import os
import socket
import threading
from functools import cache


@cache
def host_id() -> str:
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}/{namespace}"


def worker_name() -> str:
    """This thread's name as a lease holder."""
    return f"{host_id()}:{os.getpid()}:{threading.get_ident()}"


def holder_is_dead(holder: str) -> bool:
    """True only when ``holder`` names a process of this host that no longer exists."""
    host, sep, rest = holder.rpartition(":")[0].rpartition(":")
    if not sep or host != host_id():
        return False
    try:
        pid = int(rest)
    except ValueError:
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, under another user
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet: it runs nothing any more."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            raw = stat.read()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].startswith("Z")
