"""How a place inside a JSON value is named in an error message: ``$.a[1]["odd key"]``."""

from __future__ import annotations

__all__ = ["format_path"]

_PLAIN_KEY_STOP = frozenset(".[]\"\\' ")
_KEY_SHOWN = 60


def _show_key(key: str) -> str:
    """A key as it appears in a path: ``.name``, or ``["…"]`` when that would mislead.

    Keys with separators, spaces, control characters or lone surrogates are quoted with
    JSON-style escapes, so a message can always be printed and shown on a web page.
    """
    short = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "…"
    if key and short.isprintable() and not _PLAIN_KEY_STOP.intersection(short):
        return f".{short}"
    escaped = "".join(
        c
        if c.isprintable() and c not in '"\\'
        else {'"': '\\"', "\\": "\\\\"}.get(c, f"\\u{ord(c):04x}")
        for c in short
    )
    return f'["{escaped}"]'


_PATH_SHOWN = 16


def format_path(labels) -> str:
    """``$`` followed by ``.key``/``["key"]`` and ``[index]`` for each label in order.

    A path longer than 16 steps shows its first and last eight, with the number left out.
    """
    labels = list(labels)
    parts = [f"[{label}]" if type(label) is int else _show_key(label) for label in labels]
    if len(parts) > _PATH_SHOWN:
        half = _PATH_SHOWN // 2
        parts[half:-half] = [f"…({len(parts) - 2 * half} levels)…"]
    return "$" + "".join(parts)
