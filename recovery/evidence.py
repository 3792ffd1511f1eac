"""Evidence uploads: validated, fingerprinted, stored by content outside the web root.

Files are never held in memory whole. Each is streamed in chunks into a temporary file
beside the evidence store while it is hashed (BLAKE3) and checked, and moved to its
content-addressed place only after the transaction that recorded it has committed. A file
that fails validation, or whose transaction rolls back, leaves nothing behind.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import filetype
from django.conf import settings
from django.core.exceptions import SuspiciousFileOperation
from django.core.files import File
from django.db import transaction
from django.utils.text import get_valid_filename

from .canonical import FingerprintKind, fingerprint_hasher
from .errors import EvidenceRejected

# Extension → content type. Binary types must also carry the matching magic bytes; text
# types must decode as UTF-8 and contain no NUL byte.
BINARY_TYPES = {
    ".pdf": "application/pdf",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
}
TEXT_TYPES = {
    ".txt": "text/plain",
    ".csv": "text/csv",
    ".json": "application/json",
    ".eml": "message/rfc822",
    ".log": "text/plain",
}
CHUNK_BYTES = 64 * 1024
# filetype recognises a type from a file's first 8 KiB.
SIGNATURE_BYTES = 8192
TEMP_PREFIX = ".incoming-"


@dataclass(frozen=True)
class ValidatedEvidence:
    """One accepted file; its bytes wait in ``temp_path`` until they are stored."""

    name: str
    content_type: str
    size: int
    fingerprint: str
    temp_path: str


# Types a browser may show inline, recognised by their content (never the name): shown
# with a sandboxing CSP and nosniff; everything else is a download.
INLINE_TYPES = ("image/png", "image/jpeg", "application/pdf")


def inline_type(head: bytes) -> str:
    """The content type to show ``head`` (a file's first bytes) inline as, or ""."""
    kind = filetype.guess(head[:SIGNATURE_BYTES])
    return kind.mime if kind is not None and kind.mime in INLINE_TYPES else ""


def max_bytes() -> int:
    """``RECOVERY_EVIDENCE_MAX_BYTES``: the largest evidence file (default 20 MiB)."""
    return int(getattr(settings, "RECOVERY_EVIDENCE_MAX_BYTES", 20 * 1024 * 1024))


def max_total_bytes() -> int:
    """``RECOVERY_EVIDENCE_MAX_TOTAL_BYTES``: all files of one request (default 50 MiB)."""
    return int(getattr(settings, "RECOVERY_EVIDENCE_MAX_TOTAL_BYTES", 50 * 1024 * 1024))


def sanitise_name(name: str) -> str:
    base = os.path.basename((name or "").replace("\\", "/")).strip()
    stem, ext = os.path.splitext(base)
    try:
        clean = get_valid_filename(stem[:100]) if stem.strip(". ") else "evidence"
    except SuspiciousFileOperation:
        clean = "evidence"
    return f"{clean}{ext.lower()[:10]}"


def storage_path(fp: str) -> str:
    return f"{fp[:2]}/{fp[2:4]}/{fp}"


def _chunks(upload) -> Iterator[bytes]:
    if hasattr(upload, "chunks"):
        yield from upload.chunks(CHUNK_BYTES)
        return
    while data := upload.read(CHUNK_BYTES):
        yield data


def _temp_dir(storage) -> str:
    """Beside the store when it is on this file system (the final move is a rename)."""
    try:
        location = storage.path("")
    except NotImplementedError:
        return tempfile.gettempdir()
    os.makedirs(location, exist_ok=True)
    return location


def _too_large_total(limit: int) -> EvidenceRejected:
    return EvidenceRejected(
        f"The evidence files of one decision may be at most {limit} bytes together. Upload "
        "smaller extracts (the pages that show the effect), not whole archives."
    )


def _admitted_name(upload) -> tuple[str, str, str]:
    """The upload's name as given, sanitised, and its extension; refused when not accepted."""
    raw_name = getattr(upload, "name", "") or ""
    name = sanitise_name(raw_name)
    ext = os.path.splitext(name)[1]
    if ext not in BINARY_TYPES and ext not in TEXT_TYPES:
        accepted = ", ".join(sorted({*BINARY_TYPES, *TEXT_TYPES}))
        raise EvidenceRejected(
            f"{raw_name!r}: files of type {ext or '(no extension)'} are not accepted as "
            f"evidence. Accepted: {accepted}."
        )
    size = getattr(upload, "size", None)
    if size is not None and size > max_bytes():
        raise EvidenceRejected(
            f"{raw_name!r} is {size} bytes; evidence files may be at most "
            f"{max_bytes()} bytes. Upload a smaller extract."
        )
    return raw_name, name, ext


class _Checker:
    """Checks one upload's bytes as they stream past: sizes, text, and its signature."""

    def __init__(self, raw_name: str, ext: str, budget: int, total_limit: int) -> None:
        self.raw_name, self.ext = raw_name, ext
        self.budget, self.total_limit, self.limit = budget, total_limit, max_bytes()
        self.text = ext in TEXT_TYPES
        self.decoder = codecs.getincrementaldecoder("utf-8")() if self.text else None
        self.hasher = fingerprint_hasher(FingerprintKind.EVIDENCE)
        self.head = b""
        self.received = 0

    def not_text(self) -> EvidenceRejected:
        return EvidenceRejected(f"{self.raw_name!r} is named {self.ext} but is not UTF-8 text.")

    def chunk(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > self.limit:
            raise EvidenceRejected(
                f"{self.raw_name!r} is larger than {self.limit} bytes; upload a smaller extract."
            )
        if self.received > self.budget:
            raise _too_large_total(self.total_limit)
        if len(self.head) < SIGNATURE_BYTES:
            self.head += data[: SIGNATURE_BYTES - len(self.head)]
        if self.decoder is not None:
            try:
                self.decoder.decode(data)
            except UnicodeDecodeError:
                raise self.not_text() from None
            if b"\x00" in data:
                raise EvidenceRejected(
                    f"{self.raw_name!r} is named {self.ext} but contains binary data."
                )
        self.hasher.update(data)

    def content_type(self) -> str:
        """Once every byte was seen: the content type, or why the file is refused."""
        if not self.received:
            raise EvidenceRejected(f"{self.raw_name!r} is empty; evidence must show something.")
        if self.decoder is not None:
            try:
                self.decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise self.not_text() from None
            return TEXT_TYPES[self.ext]
        expected = BINARY_TYPES[self.ext]
        kind = filetype.guess(self.head)
        if kind is None or kind.mime != expected:
            raise EvidenceRejected(
                f"{self.raw_name!r} is named {self.ext} but its content is "
                f"{kind.mime if kind else 'not a recognised file type'}. Upload the real file."
            )
        return expected


def _receive(upload, directory: str, budget: int, total_limit: int) -> ValidatedEvidence:
    """Stream one upload into a temporary file in ``directory``, checking as it goes.

    ``budget`` is what is left of the request's total. Raises :class:`EvidenceRejected`
    (the temporary file removed) saying what is wrong and what is accepted.
    """
    raw_name, name, ext = _admitted_name(upload)
    check = _Checker(raw_name, ext, budget, total_limit)
    fd, temp_path = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in _chunks(upload):
                check.chunk(chunk)
                out.write(chunk)
        content_type = check.content_type()
    except BaseException:
        _remove([temp_path])
        raise
    return ValidatedEvidence(
        name=name,
        content_type=content_type,
        size=check.received,
        fingerprint=check.hasher.hexdigest(),
        temp_path=temp_path,
    )


def _remove(paths: Iterable[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


class _TemporaryFile(File):
    """A received file for ``Storage.save``: a file-system storage renames it into place."""

    def __init__(self, path: str) -> None:
        super().__init__(open(path, "rb"), name=os.path.basename(path))  # noqa: SIM115
        self._path = path

    def temporary_file_path(self) -> str:
        return self._path


class EvidenceBatch:
    """The evidence files of one request, received and checked before anything is recorded.

    Use it as a context manager around the recording::

        with EvidenceBatch(uploads, storage=storage) as batch:  # streams and validates
            with transaction.atomic():
                ...  # write the rows, naming storage_path(item.fingerprint) for each item
                batch.store_after_commit()  # the files belong to the transaction now

    The files reach their content-addressed places only after the outermost transaction
    commits (``transaction.on_commit``); a rollback removes them. Leaving the block
    removes every temporary file not handed to a transaction, whatever happened.
    """

    def __init__(self, uploads: Iterable, *, storage) -> None:
        self.uploads = list(uploads)
        self.storage = storage
        self.files: list[ValidatedEvidence] = []
        self._handed_over = False

    def __enter__(self) -> EvidenceBatch:
        total_limit = max_total_bytes()
        declared = sum(getattr(upload, "size", None) or 0 for upload in self.uploads)
        if declared > total_limit:
            raise _too_large_total(total_limit)
        directory = _temp_dir(self.storage) if self.uploads else ""
        try:
            budget = total_limit
            for upload in self.uploads:
                item = _receive(upload, directory, budget, total_limit)
                self.files.append(item)
                budget -= item.size
        except BaseException:
            self._discard()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._handed_over:
            self._discard()

    def store_after_commit(self) -> None:
        """Hand the files to the open transaction (internal: inside one).

        After the outermost transaction commits, each file is moved to its
        content-addressed place (kept if already there). If it rolls back, Django drops
        the callback and the files are removed with it: a rolled-back request leaves no
        file behind.
        """
        if self.files:
            transaction.on_commit(_AfterCommit(self.files, self.storage), robust=True)
        self._handed_over = True

    def _discard(self) -> None:
        _remove(item.temp_path for item in self.files)


class _AfterCommit:
    """Moves received files into the store once their transaction has committed.

    Django keeps the callback until the commit, and drops it on a rollback; whenever it
    is dropped, the finaliser removes the temporary files that were not moved.
    """

    def __init__(self, files: list[ValidatedEvidence], storage) -> None:
        self.files = files
        self.storage = storage
        weakref.finalize(self, _remove, [item.temp_path for item in files])

    def __call__(self) -> None:
        done: set[str] = set()
        for item in self.files:
            if item.fingerprint in done:
                continue
            done.add(item.fingerprint)
            path = storage_path(item.fingerprint)
            if self.storage.exists(path):
                continue  # the same content, stored by another request
            with _TemporaryFile(item.temp_path) as content:
                saved = self.storage.save(path, content)
            if saved != path:  # another request stored the same content meanwhile
                self.storage.delete(saved)
        _remove(item.temp_path for item in self.files)
