"""Who holds a lease, and whether that process still exists.

A lease holder is named ``host:pid:thread``, where *host* is the host name and, on Linux,
the inode of the process's PID namespace (``/proc/self/ns/pid``): two containers that
share a host name but not a PID namespace are different hosts here. ``GOVFLOW_HOST_ID``,
when set, names the host instead (each host of a deployment must then have its own).

Two ways to know a holder is dead (ADR 0022):

1. **Same host:** a holder on *this* host whose process no longer exists is dead for
   certain.
2. **Any host, PostgreSQL:** a process started by GovFlow's ``qcluster`` holds a
   session-level advisory lock for its whole life, on a connection of its own
   (:func:`liveness_lock_hold`), and says so in its holder name: the thread part ends in
   ``+pg``. The server releases a session lock only when the session ends, which happens
   when the process dies (the kernel closes its socket). So a sweeper on any host that
   can take the lock of a ``+pg`` holder (:func:`holder_lock_free`) knows that process's
   session is gone.

Either proof lets the sweeper expire the holder's leases at once instead of waiting them
out (``recovery.api.lease_expire``). Anything else (another host without the lock, a
process that exists, a paused process that still holds its lock, a name in another form)
is presumed alive: the lease's expiry decides, as always, and the fence refuses a late
writer. Every error of judgement here goes the safe way: a reused pid or a colliding lock
key only makes a dead holder look alive; a worker that lost its lock connection while
alive may have its leases expired early, and then its next write is refused by its fence
(a lost lease, as after any expiry).

**The lock key** is PostgreSQL's two-int form ``(classid, objid)``: ``classid`` is
:data:`LOCK_CLASS` (the bytes ``GFLV``, GovFlow liveness), ``objid`` the first four bytes
of BLAKE2b(``host:pid``) as a signed 32-bit integer. The two-int form never meets a
one-bigint advisory lock of another application (PostgreSQL keeps the two apart), and no
other GovFlow code takes advisory locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from functools import cache

log = logging.getLogger("govflow.engine.liveness")

LOCK_CLASS = int.from_bytes(b"GFLV", "big")
"""The advisory lock class of GovFlow's liveness locks (``pg_locks.classid``)."""

LOCK_MARK = "+pg"
"""Ends the thread part of the name of a holder that holds its liveness lock."""

CHECK_EVERY = 5.0
"""Seconds between checks that the liveness lock's connection is still open."""


@cache
def host_id() -> str:
    configured = os.environ.get("GOVFLOW_HOST_ID", "").strip()
    if configured:
        return configured
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}/{namespace}"


def worker_name() -> str:
    """This thread's name as a lease holder (marked when its process holds its lock)."""
    mark = LOCK_MARK if liveness_lock_hold() else ""
    return f"{host_id()}:{os.getpid()}:{threading.get_ident()}{mark}"


def _process_of(holder: str) -> tuple[str, str, bool]:
    """``(host, pid, marked)`` of a holder name; host '' when it has another form."""
    process, sep, thread = holder.rpartition(":")
    host, sep2, pid = process.rpartition(":")
    if not sep or not sep2:
        return "", "", False
    return host, pid, thread.endswith(LOCK_MARK)


def lock_key(host: str, pid: int | str) -> tuple[int, int]:
    """The advisory lock ``(classid, objid)`` of the process ``pid`` of ``host``."""
    digest = hashlib.blake2b(f"{host}:{pid}".encode(), digest_size=4).digest()
    return LOCK_CLASS, int.from_bytes(digest, "big", signed=True)


def holder_is_dead(holder: str) -> bool:
    """True only when ``holder`` is known to be gone: a process of this host that no
    longer exists, or a ``+pg`` holder whose liveness lock is free (PostgreSQL; one
    statement on the caller's connection)."""
    return holder_process_gone(holder) or holder_lock_free(holder)


def holder_process_gone(holder: str) -> bool:
    """True only when ``holder`` names a process of this host that no longer exists."""
    host, rest, _ = _process_of(holder)
    if not host or host != host_id():
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


# -- the advisory lock (PostgreSQL) -----------------------------------------------------


def holder_lock_free(holder: str, connection=None) -> bool:
    """True when ``holder`` held its liveness lock and nobody holds it now: its session,
    and so its process, is gone. One statement on ``connection`` (the default one unless
    given); False on SQLite, for an unmarked holder and for this process."""
    from django.db import connection as default

    connection = connection or default
    host, pid, marked = _process_of(holder)
    if not marked or connection.vendor != "postgresql":
        return False
    if host == host_id() and pid == str(os.getpid()):
        return False
    # A transaction-level try-lock: taken only if no session holds the key, and released
    # by the end of the statement's transaction, so the probe never keeps it.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(lock_key(host, pid)))
        return bool(cursor.fetchone()[0])


class _LivenessLock:
    """This process's liveness lock and the connection that holds it."""

    def __init__(self) -> None:
        self.enabled = False
        self.mutex = threading.Lock()
        self.owner = 0  # the pid that opened ``wrapper``
        self.wrapper = None
        self.checked = 0.0
        self.inherited: list[object] = []  # a parent's connection after a fork: kept, unused

    def hold(self) -> bool:
        if not self.enabled:
            return False
        with self.mutex:
            if self.wrapper is not None and self.owner != os.getpid():
                # Forked: the socket is the parent's. Closing it here would end the
                # parent's session (and its lock), so it is only set aside.
                self.inherited.append(self.wrapper)
                self.wrapper = None
            if self.wrapper is not None and time.monotonic() - self.checked < CHECK_EVERY:
                return True
            try:
                return self._take_or_check()
            except Exception:
                log.warning(
                    "could not hold this process's liveness lock; its leases are only "
                    "expired by their ttl until it can",
                    exc_info=True,
                )
                self._drop()
                return False

    def _take_or_check(self) -> bool:
        from django.db import connections

        if self.wrapper is not None:
            try:
                with self.wrapper.cursor() as cursor:
                    cursor.execute("SELECT 1")
                self.checked = time.monotonic()
                return True
            except Exception:
                # The session ended (the server restarted, an operator ended it): the
                # lock went with it. Take it again on a new connection.
                log.warning("the liveness lock's connection was lost; taking it again")
                self._drop()
        default = connections["default"]
        if default.vendor != "postgresql":
            self.enabled = False
            return False
        wrapper = type(default)(dict(default.settings_dict), alias="govflow_liveness")
        wrapper.inc_thread_sharing()
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", list(self.key()))
            taken = bool(cursor.fetchone()[0])
        if not taken:
            wrapper.close()
            log.warning(
                "the liveness lock %s of this process is held by another session (a key "
                "collision): this process's leases are only expired by their ttl",
                self.key(),
            )
            return False
        self.wrapper, self.owner, self.checked = wrapper, os.getpid(), time.monotonic()
        return True

    def key(self) -> tuple[int, int]:
        return lock_key(host_id(), os.getpid())

    def _drop(self) -> None:
        if self.wrapper is not None and self.owner == os.getpid():
            with contextlib.suppress(Exception):  # already gone
                self.wrapper.close()
        self.wrapper = None

    def release(self) -> None:
        with self.mutex:
            self._drop()


_LOCK = _LivenessLock()


def liveness_lock_enable() -> None:
    """Hold a liveness lock in this process and the processes forked from it (called by
    ``qcluster`` before the cluster starts; taken when a holder is first named)."""
    _LOCK.enabled = True


def liveness_lock_hold() -> bool:
    """Whether this process holds its liveness lock, taking it first if enabled and on
    PostgreSQL (its own connection, kept for the process's life; checked every
    :data:`CHECK_EVERY` seconds and taken again if that connection was lost)."""
    return _LOCK.hold()


def liveness_lock_disable() -> None:
    """Give the lock up and take none again in this process (the cluster has stopped)."""
    _LOCK.enabled = False
    _LOCK.release()


def liveness_lock_release() -> None:
    """Close this process's lock connection, releasing the lock (tests, shutdown)."""
    _LOCK.release()


STALLED_SQL = """
SELECT a.pid, a.application_name, pg_terminate_backend(a.pid)
FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
AND a.application_name LIKE %s AND a.state = 'active' AND a.wait_event = 'ClientRead'
AND a.backend_xid IS NOT NULL
AND a.state_change < clock_timestamp() - make_interval(secs => %s)
AND pg_has_role(a.usesysid, 'MEMBER')
AND (NOT r.rolsuper OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user))
"""
"""The sessions :func:`stalled_sessions_end` ends: only those of roles this one may signal
(its own, one it is a member of; a superuser's only as a superuser), so the statement
never fails for want of a permission."""


def stalled_sessions_end(*, after: float) -> int:
    """End the sessions of GovFlow's processes stalled inside a statement batch for longer
    than ``after`` seconds (PostgreSQL; one statement); how many were ended.

    ``idle_in_transaction_session_timeout`` (ADR 0035) ends a stopped worker's session
    only once it is idle in a transaction: when the server has answered a ``Sync``. A
    worker stopped while it sends a pipeline of several statements before one ``Sync``
    (a shared commit, ADR 0062) leaves its session *active*, reading the rest of the
    batch (``ClientRead``), with the row locks of the statements it has run already and no
    timeout at all: its instances could not be taken over until it resumed (ADR 0063).
    Such a session, named by a ``qcluster`` process (``govflow <role>``) and holding a
    transaction id, is ended here: its transaction rolls back, and whatever its worker
    sends after it resumes finds its connection gone, as after the idle timeout. A
    session of a role this one may not signal is left to its own role's sweeper.
    """
    from django.db import connection

    from .db import APPLICATION

    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(STALLED_SQL, [f"{APPLICATION} %", after])
        ended = [(pid, name) for pid, name, done in cursor.fetchall() if done]
    for pid, name in ended:
        log.warning(
            "ended the session of %s (server process %s): stalled for over %g s inside a "
            "batch of statements, with rows locked (a worker stopped while it sent them)",
            name,
            pid,
            after,
        )
    return len(ended)
