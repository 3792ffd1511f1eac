"""Evidence uploads: validated, fingerprinted, stored by content outside the web root."""

from __future__ import annotations

import os
from dataclasses import dataclass

import filetype
from django.conf import settings
from django.core.exceptions import SuspiciousFileOperation
from django.core.files.base import ContentFile
from django.utils.text import get_valid_filename

from .canonical import FingerprintKind, fingerprint
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


@dataclass(frozen=True)
class ValidatedEvidence:
    name: str
    content_type: str
    size: int
    fingerprint: str
    content: ContentFile


def max_bytes() -> int:
    return int(getattr(settings, "RECOVERY_EVIDENCE_MAX_BYTES", 20 * 1024 * 1024))


def sanitise_name(name: str) -> str:
    base = os.path.basename((name or "").replace("\\", "/")).strip()
    stem, ext = os.path.splitext(base)
    try:
        clean = get_valid_filename(stem[:100]) if stem.strip(". ") else "evidence"
    except SuspiciousFileOperation:
        clean = "evidence"
    return f"{clean}{ext.lower()[:10]}"


def validate_upload(upload) -> ValidatedEvidence:
    """Read one uploaded file, check its size and type, and fingerprint it.

    Raises :class:`EvidenceRejected` saying what is wrong and what is accepted.
    """
    raw_name = getattr(upload, "name", "") or ""
    name = sanitise_name(raw_name)
    ext = os.path.splitext(name)[1]
    accepted = ", ".join(sorted({*BINARY_TYPES, *TEXT_TYPES}))
    limit = max_bytes()
    size = getattr(upload, "size", None)
    if size is not None and size > limit:
        raise EvidenceRejected(
            f"{raw_name!r} is {size} bytes; evidence files may be at most "
            f"{limit} bytes. Upload a smaller extract."
        )
    data = upload.read(limit + 1)
    if len(data) > limit:
        raise EvidenceRejected(
            f"{raw_name!r} is larger than {limit} bytes; upload a smaller extract."
        )
    if not data:
        raise EvidenceRejected(f"{raw_name!r} is empty; evidence must show something.")
    if ext in BINARY_TYPES:
        content_type = BINARY_TYPES[ext]
        kind = filetype.guess(data)
        if kind is None or kind.mime != content_type:
            raise EvidenceRejected(
                f"{raw_name!r} is named {ext} but its content is "
                f"{kind.mime if kind else 'not a recognised file type'}. Upload the real file."
            )
    elif ext in TEXT_TYPES:
        content_type = TEXT_TYPES[ext]
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise EvidenceRejected(f"{raw_name!r} is named {ext} but is not UTF-8 text.") from None
        if b"\x00" in data:
            raise EvidenceRejected(f"{raw_name!r} is named {ext} but contains binary data.")
    else:
        raise EvidenceRejected(
            f"{raw_name!r}: files of type {ext or '(no extension)'} are not accepted as "
            f"evidence. Accepted: {accepted}."
        )
    fp = fingerprint(FingerprintKind.EVIDENCE, data)
    return ValidatedEvidence(
        name=name,
        content_type=content_type,
        size=len(data),
        fingerprint=fp,
        content=ContentFile(data),
    )


def storage_path(fp: str) -> str:
    return f"{fp[:2]}/{fp[2:4]}/{fp}"
