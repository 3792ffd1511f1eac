"""Strict JSON text: what a file or form field holds, parsed without surprises.

``json.loads`` alone is not safe to point at hostile text: it recurses once per level of
nesting (a few thousand ``[`` raise ``RecursionError`` from wherever it is called), keeps
the last of duplicate keys without a word, and reads ``NaN`` and ``Infinity``. So
:func:`parse_json` first scans the text's structure with a loop — depth, duplicate keys,
non-numbers and unwritable integers, each reported at its path — and only then lets
``json.loads`` build the value. What the value may contain is the input guard's business
(:func:`recovery.canonical.input_guard`); callers run it on the result, usually through a
service.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .canonical import input_max_depth, too_deep
from .errors import CanonicalError
from .json_paths import format_path

__all__ = ["parse_json"]

# Strings (escapes included), punctuation, and runs of anything else (numbers, literals).
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+', re.S)
_NOT_NUMBERS = {"NaN", "Infinity", "-Infinity"}
# Python refuses to read integers longer than this (sys.get_int_max_str_digits()).
_MAX_INT_DIGITS = 4300
_INTEGER = re.compile(r"-?[0-9]+")
_JSON_ADVICE = "Check that the text is JSON (RFC 8259), saved as UTF-8."
_TWICE_ADVICE = (
    "Give each key of an object once: a reader would keep only one of the values, and which "
    "one differs between readers."
)


def _labels(frames: list[list]) -> list[str | int]:
    return [frame[1] for frame in frames if frame[1] is not None]


def _scan(text: str, max_depth: int) -> None:
    """Refuse deep nesting, duplicate keys, NaN/Infinity and huge integers, by path.

    A frame is ``[keys seen (None in an array), label of the current member, expecting
    a key]``. The scan trusts nothing: on text that is not JSON it may stop early or find
    nothing, and ``json.loads`` then says what is wrong.
    """
    frames: list[list] = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first == "{" or first == "[":
            if len(frames) >= max_depth:
                raise too_deep(format_path(_labels(frames)), max_depth)
            frames.append([set(), None, True] if first == "{" else [None, 0, False])
        elif first == "}" or first == "]":
            if frames:
                frames.pop()
        elif first == ",":
            if frames:
                frame = frames[-1]
                if frame[0] is None:
                    frame[1] += 1
                else:
                    frame[2] = True
        elif first == ":":
            if frames:
                frames[-1][2] = False
        elif first == '"':
            if frames and frames[-1][2]:
                frame = frames[-1]
                try:
                    key = json.loads(token)
                except ValueError:
                    return  # a broken escape: json.loads reports it
                frame[1] = key
                if key in frame[0]:
                    raise _refused(
                        frames, f"the key {key!r} appears twice in one object", _TWICE_ADVICE
                    )
                frame[0].add(key)
                frame[2] = False
        elif token in _NOT_NUMBERS:
            raise _refused(frames, f"{token} is not a JSON number; use a finite number or null")
        elif (
            len(token) > _MAX_INT_DIGITS
            and _INTEGER.fullmatch(token)
            and (len(token.lstrip("-")) > _MAX_INT_DIGITS)
        ):
            raise _refused(
                frames,
                f"an integer of {len(token.lstrip('-'))} digits is too long to read",
                "Write long numbers such as identifiers as strings.",
            )


def _refused(frames: list[list], problem: str, advice: str = _JSON_ADVICE) -> CanonicalError:
    """The scan's refusal of ``problem``, at the path its frames have reached."""
    return CanonicalError(format_path(_labels(frames)), problem, advice)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # The scan already refused duplicates with their path; this is the backstop.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise CanonicalError("$", f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise CanonicalError("$", f"{name} is not a JSON number; use a finite number or null")


def parse_json(text: str | bytes, *, max_bytes: int, max_depth: int | None = None) -> Any:
    """Parse strict JSON text into a value, or raise :class:`CanonicalError`.

    Refused: more than ``max_bytes`` bytes of text, bytes that are not UTF-8, nesting
    deeper than ``max_depth`` (default ``RECOVERY_INPUT_MAX_DEPTH``), a key that appears
    twice in one object, ``NaN``/``Infinity``, and anything that is not JSON. Never
    recurses deeper than ``max_depth``. Run :func:`~recovery.canonical.input_guard` on the
    result before storing it.
    """
    depth = input_max_depth() if max_depth is None else max_depth
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise _too_long(len(text), max_bytes)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CanonicalError(
                "$", f"the text is not UTF-8 (byte {exc.start} is invalid)", _JSON_ADVICE
            ) from None
    elif len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise _too_long(len(text.encode("utf-8", "surrogatepass")), max_bytes)
    _scan(text, depth)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise CanonicalError(
            "$", f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", _JSON_ADVICE
        ) from None
    except RecursionError:  # the scan makes this unreachable; never let it escape
        raise CanonicalError("$", "nested too deeply to read") from None
    except CanonicalError:
        raise
    except ValueError as exc:  # e.g. an integer longer than Python reads
        raise CanonicalError("$", f"not readable JSON: {exc}", _JSON_ADVICE) from None


def _too_long(size: int, max_bytes: int) -> CanonicalError:
    return CanonicalError(
        "$",
        f"the text is {size} bytes, more than the {max_bytes} accepted",
        "Send less: keep large data elsewhere and pass a reference to it.",
    )
