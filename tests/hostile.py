"""Hypothesis strategies for hostile input: JSON values and texts built to break a server.

A :class:`Poison` is one hostile thing (nesting 10,000 deep, U+0000, a lone surrogate, a
string over the limit, NaN, an integer JSON readers round, a duplicate key, a key that is
not a string); :func:`planted` hides it at a random path inside an otherwise ordinary
object, and says at which path an error must point. Deep values are built with loops:
neither building nor serialising them may recurse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from recovery.canonical import SAFE_INTEGER, format_path

PLACEHOLDER = "@@poison@@"


@dataclass(frozen=True)
class Poison:
    kind: str
    value: Any = None  # the Python value; None when only text can carry it
    text: str | None = None  # its JSON text; None when only Python can carry it
    inner: tuple = ()  # labels inside it where the error points (a duplicate key's name)
    says: str = ""  # a fragment of the problem the error states
    deep: bool = False  # the error points somewhere below the planted path

    def __repr__(self) -> str:  # a deep value must not make a failure report recurse
        shown = self.text if self.text is not None and len(self.text) < 60 else "…"
        return f"Poison({self.kind!r}, text={shown!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


def _nested_text(depth: int, as_list: bool) -> str:
    return "[" * depth + "]" * depth if as_list else '{"a":' * depth + "1" + "}" * depth


def _nested_value(depth: int, as_list: bool) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if as_list else {"a": value}
    return value


clean = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
surrogates = st.integers(0xD800, 0xDFFF).map(chr)


@st.composite
def _deep(draw) -> Poison:
    depth = draw(st.sampled_from([65, 66, 300, 1_000, 3_000, 10_000, 50_000]))
    as_list = draw(st.booleans())
    return Poison(
        "deep",
        _nested_value(depth, as_list),
        _nested_text(depth, as_list),
        says="nested deeper than",
        deep=True,
    )


@st.composite
def _bad_text(draw) -> Poison:
    bad = draw(st.sampled_from(["\x00"]) | surrogates)
    text = draw(st.text(clean, max_size=5)) + bad + draw(st.text(clean, max_size=5))
    says = "U+0000" if bad == "\x00" else "lone surrogate"
    if draw(st.booleans()):  # in a key
        value = {text: "value"}
        return Poison("bad-key", value, json.dumps(value), inner=(text,), says=says)
    return Poison("bad-string", text, json.dumps(text), says=says)


@st.composite
def _huge(draw, limit: int) -> Poison:
    text = "x" * (limit + draw(st.integers(1, 2 * limit)))
    return Poison("huge", text, json.dumps(text), says="bytes")


def _not_a_number() -> st.SearchStrategy[Poison]:
    return st.sampled_from(
        [
            Poison("nan", float("nan"), "NaN", says="number"),
            Poison("inf", float("inf"), "Infinity", says="number"),
            Poison("-inf", float("-inf"), "-Infinity", says="number"),
            Poison("1e400", float("inf"), "1e400", says="number"),
        ]
    )


def _unsafe_integer() -> st.SearchStrategy[Poison]:
    big = st.integers(SAFE_INTEGER + 1, 2**80) | st.integers(-(2**80), -SAFE_INTEGER - 1)
    return big.map(lambda n: Poison("big-int", n, str(n), says="integer")) | st.just(
        Poison("huge-int", 10**5000, "1" + "0" * 5000, says="integer")
    )


def _duplicate_key() -> st.SearchStrategy[Poison]:
    return st.sampled_from(["k", "key", "a.b", "\u00fc"]).map(
        lambda k: Poison(
            "duplicate-key",
            None,
            f'{{"{k}": 1, "other": [], "{k}": 2}}',
            inner=(k,),
            says="appears twice",
        )
    )


def _not_json() -> st.SearchStrategy[Poison]:
    return st.sampled_from(
        [
            Poison("int-key", {1: "one"}, says="not a string"),
            Poison("none-key", {None: 1}, says="not a string"),
            Poison("tuple-key", {("a", "b"): 1}, says="not a string"),
            Poison("set", {1, 2}, says="not a JSON value"),
            Poison("bytes", b"raw", says="not a JSON value"),
        ]
    )


def poisons(*, limit: int, text: bool) -> st.SearchStrategy[Poison]:
    """Every kind of poison; ``text`` keeps those JSON text can carry, else Python's."""
    common = _deep() | _bad_text() | _huge(limit) | _not_a_number() | _unsafe_integer()
    return common | (_duplicate_key() if text else _not_json())


labels = st.lists(
    st.text("abcdefgh", min_size=1, max_size=6)
    | st.sampled_from(["a.b", "with space", "größe"])
    | st.integers(0, 3),
    max_size=3,
)


@dataclass(frozen=True)
class Planted:
    value: Any  # the Python value (None if the poison is text-only)
    text: str | None  # the JSON text (None if the poison is Python-only)
    path: str  # where the error must point (for deep poisons: where it starts)
    poison: Poison

    def __repr__(self) -> str:
        return f"Planted({self.poison!r} at {self.path!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


def _wrap(inner: Any, path: list) -> Any:
    for label in reversed(path):
        if isinstance(label, int):
            inner = ["ok"] * label + [inner]
        else:
            inner = {"_benign": [1, "two", None], label: inner}
    return inner


def planted(poison: Poison, path: list, *, base: dict | None = None, at: tuple = ()) -> Planted:
    """``poison`` at ``at + path`` inside ``base`` (a copy; ``at`` names keys that exist)."""

    def build(inner):
        wrapped = _wrap(inner, path)
        if not at:
            return wrapped
        document = json.loads(json.dumps(base))
        target = document
        for label in at[:-1]:
            target = target[label]
        target[at[-1]] = wrapped
        return document

    value = build(poison.value) if poison.value is not None else None
    text = None
    if poison.text is not None:
        text = json.dumps(build(PLACEHOLDER)).replace(json.dumps(PLACEHOLDER), poison.text)
    return Planted(value, text, format_path([*at, *path, *poison.inner]), poison)


def hostile(*, limit: int, text: bool, at: tuple = (), base: dict | None = None, top_key=True):
    """Planted poisons; with ``top_key`` the planted value is always an object at the top."""
    first = (
        st.text("abcdefgh", min_size=1, max_size=6).map(lambda k: [k]) if top_key else st.just([])
    )
    return st.builds(
        lambda poison, head, rest: planted(poison, [*head, *rest], base=base, at=at),
        poisons(limit=limit, text=text),
        first,
        labels,
    )
