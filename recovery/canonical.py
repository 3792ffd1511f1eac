"""Canonical bytes, BLAKE3 fingerprints, and the input guard in front of both.

Canonical bytes are JSON with sorted keys, no insignificant whitespace, UTF-8 and no NaN
or infinity: the same value always gives the same bytes, whatever the key order it was
built with. Fingerprints are hex BLAKE3 over a domain-separation prefix and the bytes, so
an input and a preview with equal bytes still have different fingerprints.

:func:`input_guard` is the one door for values that come from outside (forms, files,
services called by integrations): on top of the canonical rules it refuses values that are
too large or too deep, text with U+0000, and integers a JSON reader in another language
would round. Both walk the value with an explicit stack, never by recursion, so a hostile
value cannot exhaust the interpreter's stack; and both refuse depth before ``json.dumps``
(which is recursive) ever sees the value.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from blake3 import blake3

from .errors import CanonicalError
from .json_paths import format_path

__all__ = [
    "ENCODER_MAX_DEPTH",
    "SAFE_INTEGER",
    "FingerprintKind",
    "canonical_bytes",
    "canonical_object",
    "fingerprint",
    "fingerprint_hasher",
    "fingerprint_value",
    "format_path",
    "input_guard",
    "input_max_depth",
]

# The deepest nesting canonical_bytes encodes. json.dumps recurses once per level and
# counts against the interpreter's recursion limit (1,000 by default) together with the
# caller's own frames, so the limit is well under it. Values admitted by input_guard are
# shallower still (RECOVERY_INPUT_MAX_DEPTH): what the engine builds from them (variables
# holding a step's output under a dotted path) keeps room to grow.
ENCODER_MAX_DEPTH = 128
# Integers every JSON reader keeps exactly (IEEE 754 doubles: JavaScript, many others).
SAFE_INTEGER = 2**53 - 1
DEFAULT_INPUT_MAX_DEPTH = 64
# Integers longer than Python's own int→str limit cannot be written (ValueError).
_INT_BITS_WITHOUT_CHECK = 14_000


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


def input_max_depth() -> int:
    """``RECOVERY_INPUT_MAX_DEPTH`` (default 64, kept until a setting changes), never above
    the encoder's."""
    from .kept import kept_setting

    depth = int(kept_setting("RECOVERY_INPUT_MAX_DEPTH", DEFAULT_INPUT_MAX_DEPTH))
    return max(1, min(depth, ENCODER_MAX_DEPTH))


# -- paths ------------------------------------------------------------------------------

# A path is built only when an error needs it: the walk keeps (parent, label) pairs.
Path = tuple[Any, "str | int"] | None


def _path(node: Path) -> str:
    labels = []
    while node is not None:
        node, label = node
        labels.append(label)
    labels.reverse()
    return format_path(labels)


# -- the walk ---------------------------------------------------------------------------


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _string_problem(text: str, strict: bool) -> str | None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"string is not valid Unicode (lone surrogate U+{ord(text[exc.start]):04X} "
                f"at character {exc.start})"
            )
    if strict and "\x00" in text:
        return f"string contains U+0000 (NUL) at character {text.index(chr(0))}"
    return None


_STRING_ADVICE = (
    "Send well-formed text: U+0000 and unpaired surrogates cannot be stored, so they are "
    "refused wherever they appear, in keys as in values."
)


def _node(parent: Path, label: str | int | None) -> Path:
    """The path node of a child labelled ``label`` (``None``: the walked value itself)."""
    return None if label is None else (parent, label)


def _walk(value: Any, *, max_depth: int, strict: bool, max_bytes: int | None) -> None:
    """Check every node of ``value`` with an explicit stack, never by recursion.

    Raises :class:`CanonicalError` at the first offending path found, depth first and in
    order (an object's keys are checked when the object is reached, before its values).
    With ``strict`` also the input rules: no U+0000, integers within ±``SAFE_INTEGER``,
    and a running lower bound of the encoded size against ``max_bytes``.

    The stack holds one iterator per open object or array, not one entry per value: a
    scalar is checked where its container's loop meets it, and its path is built only
    for an error (canonical bytes are made for every fact and fingerprint of every step).
    """
    limit = sys.maxsize if max_bytes is None else max_bytes
    size = 0
    # Frames: (the (label, child) pairs of one object or array still to check, its
    # depth, its path node). The value itself is the one child of a frame of depth 0.
    stack: list[tuple[Any, int, Path]] = [(iter(((None, value),)), 0, None)]
    while stack:
        items, depth, parent = stack[-1]
        for label, item in items:
            kind = type(item)
            if kind is str:
                if strict or not item.isascii():
                    problem = _string_problem(item, strict)
                    if problem is not None:
                        raise CanonicalError(_path(_node(parent, label)), problem, _STRING_ADVICE)
                size += len(item) + 2  # at least one byte a character, and the quotes
            elif kind is int:
                size += 1
                if strict and not -SAFE_INTEGER <= item <= SAFE_INTEGER:
                    raise _unsafe_integer(_path(_node(parent, label)), item)
                if item.bit_length() > _INT_BITS_WITHOUT_CHECK:
                    _require_writable(item, _node(parent, label))
            elif item is None or kind is bool:
                size += 4
            elif kind is float:
                size += 1
                if not math.isfinite(item):
                    raise CanonicalError(
                        _path(_node(parent, label)), f"{item!r} is not a finite number"
                    )
            elif kind is dict or kind is list or kind is tuple:
                node = _node(parent, label)
                size = _open(item, kind, node, depth + 1, max_depth, strict, size)
                if size > limit:
                    raise _too_large(_path(node), limit)
                stack.append(
                    (iter(item.items()) if kind is dict else enumerate(item), depth + 1, node)
                )
                break
            else:
                raise CanonicalError(
                    _path(_node(parent, label)), f"a {kind.__name__} is not a JSON value"
                )
            if size > limit:
                raise _too_large(_path(_node(parent, label)), limit)
        else:
            stack.pop()


def _open(
    item: Any, kind: type, node: Path, depth: int, max_depth: int, strict: bool, size: int
) -> int:
    """Check an object or array as the walk reaches it (its depth, an object's keys);
    return the running size with its brackets and keys counted."""
    if depth > max_depth:
        raise too_deep(_path(node), max_depth)
    size += 2
    if kind is dict:
        for key in item:
            if type(key) is not str:
                raise _key_not_string(_path(node), key)
            if strict or not key.isascii():
                problem = _string_problem(key, strict)
                if problem is not None:
                    raise CanonicalError(_path((node, key)), problem, _STRING_ADVICE)
            size += len(key) + 3
    return size


# The walk's rarer refusals, built outside its loop.


def _unsafe_integer(path: str, item: int) -> CanonicalError:
    shown = item if item.bit_length() <= 64 else f"of {item.bit_length()} bits"
    return CanonicalError(
        path,
        f"the integer {shown} is outside ±(2**53 - 1), the range every JSON reader keeps exactly",
        "Write large numbers such as identifiers as strings.",
    )


def _require_writable(item: int, node: Path) -> None:
    """Refuse an integer longer than Python's int→str limit lets ``json.dumps`` write."""
    try:
        str(item)
    except ValueError:
        raise CanonicalError(
            _path(node),
            f"an integer of {item.bit_length()} bits has too many digits to write",
        ) from None


def _key_not_string(path: str, key: Any) -> CanonicalError:
    return CanonicalError(
        path, f"object key {_short_repr(key)} is a {type(key).__name__}, not a string"
    )


def too_deep(path: str, max_depth: int) -> CanonicalError:
    return CanonicalError(
        path,
        f"objects and arrays are nested deeper than {max_depth} levels here",
        f"Flatten the structure: at most {max_depth} levels of nesting are accepted.",
    )


def _too_large(path: str, max_bytes: int, actual: int | None = None) -> CanonicalError:
    return CanonicalError(
        path,
        f"the value is {actual} bytes of JSON, more than the {max_bytes} accepted"
        if actual is not None
        else f"the value grows past the {max_bytes} bytes of JSON accepted here",
        "Send less: keep large data elsewhere and pass a reference to it.",
    )


# What json.dumps(value, **these options) builds anew on every call, built once: the
# encoder keeps no state between calls, so one serves every thread.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
# The C encoder JSONEncoder.encode makes at every call, made once. Without the circular
# check (markers None): every value encoded here was walked first (a cycle is refused as
# too deep) or came from json.loads (which makes none), and with no markers the encoder
# keeps no state between calls, so one serves every thread.
_C_ENCODE = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, False
    )
)


def _encode(value: Any) -> bytes:
    if _C_ENCODE is None or type(value) is str:
        return _ENCODER.encode(value).encode("utf-8")
    return "".join(_C_ENCODE(value, 0)).encode("utf-8")


# -- public -----------------------------------------------------------------------------


def canonical_bytes(value: Any, *, admitted: bool = False) -> bytes:
    """Return the canonical JSON bytes of ``value``.

    Raises :class:`~recovery.errors.CanonicalError` naming the offending path for NaN,
    infinity, non-string keys, lone surrogates, bytes, sets and every other non-JSON
    value, and for nesting deeper than :data:`ENCODER_MAX_DEPTH`.

    ``admitted``: the value holds only what was admitted as JSON before (by
    :func:`input_guard`, or read back from JSON), so the walk that finds the offending
    path is made only if the encoding fails, to raise the same error. What the encoding
    alone lets through is then not refused: an object key that is an integer, a float, a
    bool or None, and a subclass of ``str``, ``int`` or ``float`` (an enum member), each
    written as ``json.dumps`` and the database write it.
    """
    if admitted:
        try:
            return _encode(value)
        except (TypeError, ValueError, RecursionError):
            pass
    _walk(value, max_depth=ENCODER_MAX_DEPTH, strict=False, max_bytes=None)
    return _encode(value)


def input_guard(value: Any, *, max_bytes: int, max_depth: int | None = None) -> bytes:
    """Admit a value that came from outside, and return its canonical bytes.

    On top of :func:`canonical_bytes`' rules it refuses, each with a
    :class:`~recovery.errors.CanonicalError` naming the path and what to do:

    - nesting deeper than ``max_depth`` objects and arrays (default
      ``RECOVERY_INPUT_MAX_DEPTH``, 64);
    - canonical bytes longer than ``max_bytes`` (the caller's limit for its kind of input);
    - U+0000 anywhere, in keys or values (PostgreSQL cannot store it);
    - integers outside ±(2**53 - 1), which JSON readers built on doubles round silently.

    Call it before anything is stored; store the value whose bytes it returned.
    """
    depth = input_max_depth() if max_depth is None else min(max_depth, ENCODER_MAX_DEPTH)
    _walk(value, max_depth=depth, strict=True, max_bytes=max_bytes)
    data = _encode(value)
    if len(data) > max_bytes:
        raise _too_large("$", max_bytes, len(data))
    return data


def canonical_bytes_of_parsed(value: Any) -> bytes:
    """:func:`canonical_bytes` of a value that ``json.loads`` returned, without the walk.

    Such a value holds only JSON types with string keys, so the only things left to refuse
    are the ones ``json.loads`` lets through: NaN and infinity (``allow_nan=False`` raises)
    and lone surrogates (encoding raises). Raises :class:`ValueError` for those.
    """
    return _encode(value)


def canonical_object(text: str | bytes, data: bytes) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, if ``data`` (its bytes) are its canonical bytes.

    For a stored record that must read back exactly as it was written (a checkpoint's fact,
    an anchor record): ``None`` when the text is not JSON, not an object, not written
    canonically, or holds what ``json.loads`` lets through but canonical bytes refuse (NaN,
    a lone surrogate), or is nested past reason.
    """
    try:
        parsed = json.loads(text)
        canonical = canonical_bytes_of_parsed(parsed) == data
    except (ValueError, RecursionError):
        return None
    return parsed if canonical and isinstance(parsed, dict) else None


def fingerprint(kind: FingerprintKind, data: bytes) -> str:
    """Return the hex BLAKE3 fingerprint of ``data`` in the domain ``kind``."""
    hasher = blake3(_PREFIX[kind])
    hasher.update(data)
    return hasher.hexdigest()


def fingerprint_hasher(kind: FingerprintKind) -> blake3:
    """A BLAKE3 hasher primed for ``kind``: ``update`` it chunk by chunk, then ``hexdigest``.

    Gives the same fingerprint as :func:`fingerprint` over the concatenated chunks.
    """
    return blake3(_PREFIX[kind])


def fingerprint_value(kind: FingerprintKind, value: Any, *, admitted: bool = False) -> str:
    """Return the fingerprint of the canonical bytes of ``value`` (``admitted``: as for
    :func:`canonical_bytes`)."""
    return fingerprint(kind, canonical_bytes(value, admitted=admitted))
