"""Anchor stores: where anchor records live, append-only, one line each.

The default is a file of JSON lines (:class:`FileAnchorStore`); ``RECOVERY_ANCHOR_STORE``
names another (:func:`anchor_store`). A store knows lines, not records: signing and
verifying them is ``records.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from django.conf import settings
from django.utils.module_loading import import_string

from ..errors import AnchorStoreError

__all__ = ["AnchorStore", "AnchorWriter", "FileAnchorStore", "anchor_store"]

DEFAULT_STORE = "recovery.anchors.FileAnchorStore"


@runtime_checkable
class AnchorWriter(Protocol):
    """An exclusive hold on a store, from reading its last line to appending the next."""

    def last(self) -> bytes | None:
        """The last line (without its newline), or ``None`` while the store is empty."""

    def append(self, line: bytes) -> None:
        """Append one line (without its newline); durable when this returns."""


@runtime_checkable
class AnchorStore(Protocol):
    """Where anchor records live: append-only lines, one record each.

    A store for write-once storage implements the same four methods: ``writer`` must
    exclude every other writer from ``last()`` to ``append()`` (a lock, or a conditional
    put of object ``n`` that fails when ``n`` exists), and nothing may change or remove a
    line once appended. Name a factory for it (no arguments) in ``RECOVERY_ANCHOR_STORE``.
    """

    def __str__(self) -> str:
        """Where the records are, for messages (a path or a URL, never a secret)."""

    def writer(self, *, wait: bool = True) -> contextlib.AbstractContextManager[Any]:
        """Hold the store exclusively; yield an :class:`AnchorWriter`, or ``None`` when
        ``wait`` is false and another writer holds it."""

    def lines(self) -> Iterator[bytes]:
        """Every line, oldest first, each with its newline (a last line without one was
        cut off or edited)."""

    def problems(self) -> list[str]:
        """Why appending would fail now (for the system check), without writing."""


def _unusable(path: Path, doing: str, exc: OSError) -> AnchorStoreError:
    # The OS's words ("File exists" for a folder that is a file) can mislead: say what
    # is wrong with the path when we can tell.
    reasons = _path_problems(path)
    reason = reasons[0] if reasons else (exc.strerror or str(exc))
    return AnchorStoreError(
        f"Cannot {doing} the anchor file {path}: {reason}. GovFlow appends chain anchors "
        "there to detect a truncated chain or a restored old database; until it can, "
        "nothing is anchored. Make the file and its folder writable by every GovFlow "
        "process, or set GOVFLOW_ANCHOR_PATH (RECOVERY_ANCHOR_PATH) to a writable place."
    )


def _path_problems(path: Path) -> list[str]:
    """Why a file at ``path`` could not be created or appended to, as far as we can tell."""
    if path.exists():
        if not stat.S_ISREG(path.stat().st_mode):
            return ["it exists but is not a regular file"]
        if not os.access(path, os.R_OK | os.W_OK):
            return ["this process may not read and write it"]
        return []
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return [f"{parent} is not a folder"]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"this process may not create files in {parent}"]
    return []


class _FileWriter:
    """The open, exclusively locked anchor file."""

    def __init__(self, store: FileAnchorStore, fd: int) -> None:
        self.store, self.fd = store, fd

    def _key(self) -> tuple[int, int, int, int]:
        info = os.fstat(self.fd)
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def last(self) -> bytes | None:
        # The sweeper asks every few seconds: an unchanged file is not read again.
        try:
            key = self._key()
            cached = FileAnchorStore._last.get(str(self.store.path))
            if cached is not None and cached[0] == key:
                return cached[1]
            line = _last_line(self.fd, key[2], self.store.path)
        except OSError as exc:
            raise _unusable(self.store.path, "read", exc) from exc
        FileAnchorStore._last[str(self.store.path)] = (key, line)
        return line

    def append(self, line: bytes) -> None:
        if b"\n" in line:
            raise ValueError("An anchor record is one line.")
        data = line + b"\n"
        try:
            while data:  # O_APPEND: every write goes to the end, whatever the offset
                data = data[os.write(self.fd, data) :]
            os.fsync(self.fd)
            FileAnchorStore._last[str(self.store.path)] = (self._key(), line)
        except OSError as exc:
            raise _unusable(self.store.path, "append to", exc) from exc


def _last_line(fd: int, size: int, path: Path) -> bytes | None:
    if size == 0:
        return None
    if os.pread(fd, 1, size - 1) != b"\n":
        raise AnchorStoreError(
            f"The anchor file {path} ends with an incomplete line: a write was cut off "
            "(a crash before its fsync) or the file was edited. Nothing is appended after "
            "it. Look at the last line, keep a copy of the file, and remove only that "
            "incomplete line; then run manage.py recovery_verify."
        )
    # Walk back from the final newline to the one before it, 64 KiB at a time.
    chunks: list[bytes] = []
    pos = size - 1
    while pos > 0:
        start = max(0, pos - 65536)
        chunk = os.pread(fd, pos - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            chunks.append(chunk[cut + 1 :])
            break
        chunks.append(chunk)
        pos = start
    return b"".join(reversed(chunks))


class FileAnchorStore:
    """JSON lines in one file (``RECOVERY_ANCHOR_PATH``), appended under ``flock``.

    The file is opened with ``O_APPEND`` and synced after every record; its directory is
    created when missing. ``flock`` excludes other processes on this host (and, on NFS
    version 4, on other hosts); with several hosts, put the file on shared storage or use
    a store of your own. On Linux, ``chattr +a`` makes the file append-only for everyone,
    root's processes included, until the attribute is removed.
    """

    _last: dict[str, tuple[tuple[int, int, int, int], bytes | None]] = {}

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        path = path if path is not None else getattr(settings, "RECOVERY_ANCHOR_PATH", "")
        if not path:
            raise AnchorStoreError(
                "RECOVERY_ANCHOR_PATH is not set, so the anchor file has no place. Set it "
                "(GovFlow: GOVFLOW_ANCHOR_PATH), or set RECOVERY_ANCHOR_STORE = None to run "
                "without anchors (truncation and rollback then go unnoticed)."
            )
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def writer(self, *, wait: bool = True) -> Iterator[_FileWriter | None]:
        created = not self.path.exists()
        try:
            self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            raise _unusable(self.path, "open", exc) from exc
        try:
            try:
                if created:  # the new directory entry must survive a crash too
                    _fsync_dir(self.path.parent)
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield None
                return
            except OSError as exc:
                raise _unusable(self.path, "lock", exc) from exc
            yield _FileWriter(self, fd)
        finally:
            os.close(fd)  # releases the lock

    def lines(self) -> Iterator[bytes]:
        try:
            with open(self.path, "rb") as handle:
                yield from handle
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _unusable(self.path, "read", exc) from exc

    def problems(self) -> list[str]:
        return [
            f"Anchors cannot be appended to {self.path}: {reason}."
            for reason in _path_problems(self.path)
        ]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=8)
def _factory(dotted: str):
    return import_string(dotted)


def anchor_store() -> AnchorStore | None:
    """The configured store (read lazily), or ``None`` when anchors are turned off.

    ``RECOVERY_ANCHOR_STORE`` names a factory taking no arguments (default: the file
    store at ``RECOVERY_ANCHOR_PATH``); ``None`` or ``""`` turns anchoring off.
    """
    dotted = getattr(settings, "RECOVERY_ANCHOR_STORE", DEFAULT_STORE)
    if not dotted:
        return None
    try:
        factory = _factory(dotted)
    except ImportError as exc:
        raise AnchorStoreError(
            f"RECOVERY_ANCHOR_STORE names {dotted!r}, which cannot be imported ({exc}). "
            "Name a class or function that returns an anchor store."
        ) from exc
    return factory()
