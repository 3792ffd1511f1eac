"""Canonical bytes and BLAKE3 fingerprints.

Canonical bytes are JSON with sorted keys, no insignificant whitespace, UTF-8 and no NaN
or infinity: the same value always gives the same bytes, whatever the key order it was
built with. Fingerprints are hex BLAKE3 over a domain-separation prefix and the bytes, so
an input and a preview with equal bytes still have different fingerprints.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any

from blake3 import blake3

from .errors import CanonicalError

__all__ = ["FingerprintKind", "canonical_bytes", "fingerprint", "fingerprint_value"]


class FingerprintKind(enum.StrEnum):
    """The kinds of fingerprint. Persisted: never rename or reuse a value."""

    DEFINITION = "definition"
    INPUT = "input"
    PREVIEW = "preview"
    ACCESS_CONTEXT = "access-context"
    IDEMPOTENCY_KEY = "idempotency-key"
    EVIDENCE = "evidence"
    OPERATION_KEY = "operation-key"
    RESULT = "result"
    FACT = "checkpoint-fact"
    PROJECTION = "projection"


_PREFIX = {kind: f"recovery:v1:{kind.value}\x00".encode() for kind in FingerprintKind}


def _check(value: Any, path: str) -> None:
    # Exact type checks: a bool is an int and a str subclass may serialise differently,
    # so only the built-in JSON types themselves are accepted.
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return
    if kind is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CanonicalError(path, "string is not valid Unicode (lone surrogate)") from exc
        return
    if kind is float:
        if not math.isfinite(value):
            raise CanonicalError(path, f"{value!r} is not a finite number")
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise CanonicalError(
                    path, f"object key {key!r} is a {type(key).__name__}, not a string"
                )
            _check(key, f"{path}.{key}")
            _check(item, f"{path}.{key}")
        return
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    raise CanonicalError(path, f"a {kind.__name__} is not a JSON value")


def canonical_bytes(value: Any) -> bytes:
    """Return the canonical JSON bytes of ``value``.

    Raises :class:`~recovery.errors.CanonicalError` naming the offending path for NaN,
    infinity, non-string keys, bytes, sets and every other non-JSON value.
    """
    _check(value, "$")
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_bytes_of_parsed(value: Any) -> bytes:
    """:func:`canonical_bytes` of a value that ``json.loads`` returned, without the walk.

    Such a value holds only JSON types with string keys, so the only things left to refuse
    are the ones ``json.loads`` lets through: NaN and infinity (``allow_nan=False`` raises)
    and lone surrogates (encoding raises). Raises :class:`ValueError` for those.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def fingerprint(kind: FingerprintKind, data: bytes) -> str:
    """Return the hex BLAKE3 fingerprint of ``data`` in the domain ``kind``."""
    hasher = blake3(_PREFIX[kind])
    hasher.update(data)
    return hasher.hexdigest()


def fingerprint_value(kind: FingerprintKind, value: Any) -> str:
    """Return the fingerprint of the canonical bytes of ``value``."""
    return fingerprint(kind, canonical_bytes(value))
