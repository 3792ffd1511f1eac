"""Evidence uploads: validated, fingerprinted, stored by content outside the web root.

Files are never held in memory whole. Each is streamed in chunks into a temporary file
beside the evidence store while it is hashed (BLAKE3) and checked, and moved to its
content-addressed place only once every file of the request is valid and the decision is
being recorded. A file that fails validation leaves nothing behind.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import filetype
from django.conf import settings
from django.core.exceptions import SuspiciousFileOperation
from django.core.files import File
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


def _receive(upload, directory: str, budget: int, total_limit: int) -> ValidatedEvidence:
    """Stream one upload into a temporary file in ``directory``, checking as it goes.

    ``budget`` is what is left of the request's total. Raises :class:`EvidenceRejected`
    (the temporary file removed) saying what is wrong and what is accepted.
    """
    raw_name = getattr(upload, "name", "") or ""
    name = sanitise_name(raw_name)
    ext = os.path.splitext(name)[1]
    if ext not in BINARY_TYPES and ext not in TEXT_TYPES:
        accepted = ", ".join(sorted({*BINARY_TYPES, *TEXT_TYPES}))
        raise EvidenceRejected(
            f"{raw_name!r}: files of type {ext or '(no extension)'} are not accepted as "
            f"evidence. Accepted: {accepted}."
        )
    limit = max_bytes()
    size = getattr(upload, "size", None)
    if size is not None and size > limit:
        raise EvidenceRejected(
            f"{raw_name!r} is {size} bytes; evidence files may be at most "
            f"{limit} bytes. Upload a smaller extract."
        )
    text = ext in TEXT_TYPES
    decoder = codecs.getincrementaldecoder("utf-8")() if text else None
    hasher = fingerprint_hasher(FingerprintKind.EVIDENCE)
    head = b""
    received = 0
    fd, temp_path = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in _chunks(upload):
                received += len(chunk)
                if received > limit:
                    raise EvidenceRejected(
                        f"{raw_name!r} is larger than {limit} bytes; upload a smaller extract."
                    )
                if received > budget:
                    raise _too_large_total(total_limit)
                if len(head) < SIGNATURE_BYTES:
                    head += chunk[: SIGNATURE_BYTES - len(head)]
                if decoder is not None:
                    try:
                        decoder.decode(chunk)
                    except UnicodeDecodeError:
                        raise EvidenceRejected(
                            f"{raw_name!r} is named {ext} but is not UTF-8 text."
                        ) from None
                    if b"\x00" in chunk:
                        raise EvidenceRejected(
                            f"{raw_name!r} is named {ext} but contains binary data."
                        )
                hasher.update(chunk)
                out.write(chunk)
        if not received:
            raise EvidenceRejected(f"{raw_name!r} is empty; evidence must show something.")
        if decoder is not None:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise EvidenceRejected(
                    f"{raw_name!r} is named {ext} but is not UTF-8 text."
                ) from None
            content_type = TEXT_TYPES[ext]
        else:
            content_type = BINARY_TYPES[ext]
            kind = filetype.guess(head)
            if kind is None or kind.mime != content_type:
                raise EvidenceRejected(
                    f"{raw_name!r} is named {ext} but its content is "
                    f"{kind.mime if kind else 'not a recognised file type'}. "
                    "Upload the real file."
                )
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp_path)
        raise
    return ValidatedEvidence(
        name=name,
        content_type=content_type,
        size=received,
        fingerprint=hasher.hexdigest(),
        temp_path=temp_path,
    )


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
            ...  # write the rows, naming storage_path(item.fingerprint) for each item
            batch.store()  # last: move the files into their content-addressed places

    Leaving the block removes every temporary file that was not stored, whatever happened.
    """

    def __init__(self, uploads: Iterable, *, storage) -> None:
        self.uploads = list(uploads)
        self.storage = storage
        self.files: list[ValidatedEvidence] = []

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
        self._discard()

    def store(self) -> dict[str, str]:
        """Move each file to its content-addressed place (kept if already there).

        Returns fingerprint → the name the storage holds it under.
        """
        stored: dict[str, str] = {}
        for item in self.files:
            path = storage_path(item.fingerprint)
            if item.fingerprint in stored:
                continue
            if self.storage.exists(path):
                stored[item.fingerprint] = path
                continue
            with _TemporaryFile(item.temp_path) as content:
                stored[item.fingerprint] = self.storage.save(path, content)
        return stored

    def _discard(self) -> None:
        for item in self.files:
            with contextlib.suppress(FileNotFoundError):
                os.remove(item.temp_path)
