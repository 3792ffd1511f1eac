"""Small readings of engine values for a person: titles for node ids, variables as rows,
times as the desk writes them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import dateformat, timezone
from django.utils.formats import get_format

MAX_ROWS = 500  # a variables table longer than this is cut, and says so


def node_titles(spec) -> dict[str, str]:
    """Each node's title from the definition, falling back to its id."""
    return {
        node_id: str(node.get("title") or node_id) if isinstance(node, Mapping) else node_id
        for node_id, node in spec.nodes.items()
    }


def choice_labels(choices) -> dict[str, str]:
    """Each value of ``choices`` (a ``TextChoices``) with its label, translated once: a
    table of 200 rows asked the model for each row's label (``get_state_display``)."""
    return {value: str(label) for value, label in choices.choices}


def flatten(value: Any, path: str = "") -> list[tuple[str, str]]:
    """``value`` as (path, shown value) rows: nested objects and lists by their path
    (``applicant.name``, ``parcels[0]``); an empty object or list is a row of its own."""
    rows: list[tuple[str, str]] = []
    _flatten(value, path, rows)
    return rows


def _flatten(value: Any, path: str, rows: list) -> None:
    if len(rows) >= MAX_ROWS:
        return
    if isinstance(value, Mapping) and value:
        for key in sorted(value, key=str):
            _flatten(value[key], f"{path}.{key}" if path else str(key), rows)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            _flatten(item, f"{path}[{index}]", rows)
    else:
        rows.append((path or "—", shown(value)))


def shown(value: Any) -> str:
    """A scalar as a person reads it (strings without quotes, the rest as JSON)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


# Django's date format letters that strftime writes the same way (numbers, the zone name).
_STRFTIME = {"Y": "%Y", "m": "%m", "d": "%d", "H": "%H", "i": "%M", "s": "%S", "T": "%Z"}


def _strftime_of(django_format: str) -> str | None:
    """``django_format`` as a strftime format, or None if it has a letter strftime would
    write differently (month names, escapes: those go through Django's formatter)."""
    parts = []
    for char in django_format:
        if char in _STRFTIME:
            parts.append(_STRFTIME[char])
        elif char.isalpha() or char == "\\":
            return None
        else:
            parts.append(char.replace("%", "%%"))
    return "".join(parts)


class Times:
    """Date-times as the desk shows them, in the current language's formats and time zone:
    the formats are looked up once, and a plain numeric one is written by strftime. A page
    of a thousand times spent a fifth of its time in the template's ``date`` filter."""

    def __init__(self) -> None:
        self.zone = timezone.get_current_timezone()
        self._formats: dict[str, tuple[str, str | None]] = {}

    def format(self, value: datetime | None, name: str = "DATETIME_FORMAT") -> str:
        """``value`` in the format ``name`` ("" for None), as ``|date:name`` would write it."""
        if value is None:
            return ""
        if name not in self._formats:
            django_format = get_format(name)
            self._formats[name] = (django_format, _strftime_of(django_format))
        django_format, strftime = self._formats[name]
        local = timezone.localtime(value, self.zone) if timezone.is_aware(value) else value
        return local.strftime(strftime) if strftime else dateformat.format(local, django_format)

    def short(self, value: datetime | None) -> str:
        return self.format(value, "SHORT_DATETIME_FORMAT")
