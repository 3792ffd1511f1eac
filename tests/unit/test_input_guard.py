"""The input guard and the strict JSON parser: every way in refuses hostile values the same way.

No database here: the guard is pure, and its depth limit is a setting read when asked.
"""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.api import CanonicalError, canonical_bytes, input_guard, parse_json
from recovery.canonical import ENCODER_MAX_DEPTH, SAFE_INTEGER, format_path

BIG = 10 * 1024 * 1024

# Values the guard admits: JSON without U+0000, without lone surrogates, safe integers.
clean_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
admitted = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-SAFE_INTEGER, SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | clean_text,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(clean_text, children, max_size=5)
    ),
    max_leaves=25,
)


def nested(depth: int, *, leaf=1, kind: str = "mixed"):
    """A value ``depth`` objects/arrays deep, built with a loop (never by recursion)."""
    value = leaf
    for level in range(depth):
        as_list = kind == "list" or (kind == "mixed" and level % 2)
        value = [value] if as_list else {"a": value}
    return value


def refused(value, **kwargs) -> CanonicalError:
    kwargs.setdefault("max_bytes", BIG)
    with pytest.raises(CanonicalError) as caught:
        input_guard(value, **kwargs)
    message = str(caught.value)
    message.encode("utf-8")  # always printable: no lone surrogate leaks into a message
    assert message.startswith(caught.value.path + ": ")
    return caught.value


def in_a_deep_stack(frames: int, call):
    """Run ``call`` under ``frames`` Python frames, as deep inside a request as it gets."""
    if frames:
        return in_a_deep_stack(frames - 1, call)
    return call()


# -- what is admitted -------------------------------------------------------------------


@settings(deadline=None, max_examples=60)
@given(admitted)
def test_admitted_values_give_exactly_their_canonical_bytes(value):
    # Existing fingerprints depend on these bytes: the guard may refuse, never re-encode.
    assert input_guard(value, max_bytes=BIG) == canonical_bytes(value)


def test_the_limits_themselves_are_admitted():
    assert input_guard(nested(64), max_bytes=BIG) == canonical_bytes(nested(64))
    assert input_guard([SAFE_INTEGER, -SAFE_INTEGER], max_bytes=BIG)
    text = "é" * 10
    exact = len(canonical_bytes({"a": text}))
    assert input_guard({"a": text}, max_bytes=exact) == canonical_bytes({"a": text})


# -- depth ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["list", "dict", "mixed"])
@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_deep_nesting_is_refused_without_recursion(depth, kind):
    value = nested(depth, kind=kind)
    # 900 frames deep already: a recursive check or json.dumps would fail here.
    error = in_a_deep_stack(900, lambda: refused(value))
    assert "nested deeper than 64 levels" in error.problem
    assert "Flatten the structure" in str(error)
    assert "levels)…" in error.path  # a long path shows its ends, not 64 steps
    if depth > ENCODER_MAX_DEPTH:
        with pytest.raises(CanonicalError, match=f"deeper than {ENCODER_MAX_DEPTH} levels"):
            in_a_deep_stack(800, lambda: canonical_bytes(value))
    else:  # deeper than an input may be, but still a value the engine can fingerprint
        assert in_a_deep_stack(800, lambda: canonical_bytes(value))


def test_depth_is_a_setting_read_when_asked(settings):
    settings.RECOVERY_INPUT_MAX_DEPTH = 3
    assert input_guard(nested(3), max_bytes=BIG)
    assert refused(nested(4)).path == "$[0].a[0]"
    assert input_guard(nested(10), max_bytes=BIG, max_depth=10)
    # Never above what the encoder can write, whatever the setting says.
    settings.RECOVERY_INPUT_MAX_DEPTH = 10**6
    assert f"deeper than {ENCODER_MAX_DEPTH} levels" in refused(nested(200)).problem


def test_a_value_that_contains_itself_is_refused_not_looped_over():
    loop: list = []
    loop.append(loop)
    assert "nested deeper than" in refused(loop).problem
    with pytest.raises(CanonicalError):
        canonical_bytes(loop)


# -- strings ----------------------------------------------------------------------------


def test_nul_is_refused_in_values_and_keys_naming_the_place():
    error = refused({"applicant": {"names": ["Ada", "Lo\x00velace"]}})
    assert error.path == "$.applicant.names[1]"
    assert "U+0000 (NUL) at character 2" in error.problem
    key = refused({"applicant": {"na\x00me": "Ada"}})
    assert key.path == '$.applicant["na\\u0000me"]'
    # canonical_bytes itself writes NUL (existing fingerprints); only the door refuses it.
    assert canonical_bytes({"a": "\x00"}) == b'{"a":"\\u0000"}'


@pytest.mark.parametrize("bad", ["\ud800", "x\udfff", "\udbff\udbff"])
def test_lone_surrogates_are_refused_with_a_printable_path(bad):
    error = refused({"notes": [bad]})
    assert error.path == "$.notes[0]"
    assert "lone surrogate" in error.problem
    key = refused({bad: 1})
    assert key.path.startswith('$["') and "\\ud" in key.path


def test_a_huge_string_is_refused_before_it_is_encoded():
    huge = "x" * (20 * 1024 * 1024)
    error = refused({"small": "ok", "blob": huge}, max_bytes=256 * 1024)
    assert error.path == "$.blob"
    assert "262144 bytes" in error.problem
    assert "pass a reference" in str(error)


def test_the_size_limit_counts_canonical_bytes():
    value = {"a": "é" * 100}  # 2 bytes a character in UTF-8
    size = len(canonical_bytes(value))
    assert input_guard(value, max_bytes=size)
    error = refused(value, max_bytes=size - 1)
    assert error.path == "$"
    assert f"is {size} bytes of JSON, more than the {size - 1} accepted" in error.problem


# -- numbers and types ------------------------------------------------------------------


@pytest.mark.parametrize(
    "number",
    [SAFE_INTEGER + 1, -SAFE_INTEGER - 1, 2**64, 10**5000],
    ids=["2**53", "-2**53", "2**64", "10**5000"],
)
def test_integers_a_json_reader_would_round_are_refused(number):
    error = refused({"ids": [1, number]})
    assert error.path == "$.ids[1]"
    assert "outside ±(2**53 - 1)" in error.problem
    assert "as strings" in str(error)


def test_canonical_bytes_refuse_an_unwritable_integer_as_a_canonical_error():
    with pytest.raises(CanonicalError) as caught:
        canonical_bytes({"n": [10**5000]})
    assert caught.value.path == "$.n[0]" and "too many digits" in caught.value.problem
    assert canonical_bytes(2**64) == b"18446744073709551616"  # still written, as before


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({"x": [float("nan")]}, "$.x[0]", "nan is not a finite number"),
        ({"x": float("-inf")}, "$.x", "-inf is not a finite number"),
        ({"x": {1: "one"}}, "$.x", "object key 1 is a int, not a string"),
        ({"x": {None: 1}}, "$.x", "object key None is a NoneType"),
        ({"x": {("a", "b"): 1}}, "$.x", "object key ('a', 'b') is a tuple"),
        ({"x": b"bytes"}, "$.x", "a bytes is not a JSON value"),
        ({"x": {1, 2}}, "$.x", "a set is not a JSON value"),
    ],
)
def test_non_json_values_are_refused_naming_the_path(value, path, problem):
    error = refused(value)
    assert (error.path, problem in error.problem) == (path, True)


# -- paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "shown"),
    [
        ([], "$"),
        (["a", 3, "b"], "$.a[3].b"),
        (["größe"], "$.größe"),
        (["a.b"], '$["a.b"]'),
        (["with space", 'q"uote'], '$["with space"]["q\\"uote"]'),
        ([""], '$[""]'),
        (["line\nbreak"], '$["line\\u000abreak"]'),
        (["k" * 100], "$." + "k" * 60 + "…"),
    ],
)
def test_paths_are_unambiguous_and_printable(labels, shown):
    assert format_path(labels) == shown


def test_a_long_path_shows_its_first_and_last_steps():
    assert format_path(list(range(40))) == (
        "$[0][1][2][3][4][5][6][7]…(24 levels)…[32][33][34][35][36][37][38][39]"
    )


# -- the strict parser ------------------------------------------------------------------


def parse_refused(text, **kwargs) -> CanonicalError:
    kwargs.setdefault("max_bytes", BIG)
    with pytest.raises(CanonicalError) as caught:
        parse_json(text, **kwargs)
    str(caught.value).encode("utf-8")
    return caught.value


@settings(deadline=None, max_examples=60)
@given(admitted, st.sampled_from([None, 2]))
def test_the_parser_reads_valid_json_as_json_loads_does(value, indent):
    text = json.dumps(value, indent=indent, ensure_ascii=bool(indent))
    parsed = parse_json(text, max_bytes=BIG, max_depth=ENCODER_MAX_DEPTH)
    assert canonical_bytes(parsed) == canonical_bytes(json.loads(text))


@pytest.mark.parametrize("depth", [65, 10_000, 1_000_000])
def test_deep_text_is_refused_without_recursion(depth):
    error = in_a_deep_stack(900, lambda: parse_refused("[" * depth + "]" * depth))
    assert "nested deeper than 64 levels" in error.problem
    assert error.path.startswith("$[0][0][0]")
    objects = parse_refused('{"a":' * depth + "1" + "}" * depth)
    assert objects.path.startswith("$.a.a.a.a")


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = json.dumps({"text": "[" * 1000 + '{"' * 1000, "k[{": ["]}"]})
    assert parse_json(text, max_bytes=BIG)["k[{"] == ["]}"]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('{"a": 1, "a": 2}', "$.a"),
        ('{"outer": [{"x": 1}, {"k": 1, "y": 2, "k": 3}]}', "$.outer[1].k"),
        ('{"a": 1, "\\u0061": 2}', "$.a"),  # the same key, written differently
    ],
)
def test_duplicate_keys_are_refused_naming_the_path(text, path):
    error = parse_refused(text)
    assert error.path == path
    assert "appears twice in one object" in error.problem


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused_naming_the_path(constant):
    error = parse_refused(f'{{"fees": [1, {constant}]}}')
    assert error.path == "$.fees[1]"
    assert f"{constant} is not a JSON number" in error.problem


def test_numbers_json_reads_as_infinity_are_left_to_the_guard():
    value = parse_json('{"fee": 1e400}', max_bytes=BIG)
    assert refused(value).path == "$.fee"


def test_an_integer_too_long_to_read_is_refused_naming_the_path():
    error = parse_refused('{"id": ' + "7" * 5000 + "}")
    assert error.path == "$.id" and "5000 digits" in error.problem
    assert "set_int_max_str_digits" not in str(error)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON: Expecting property name enclosed in double quotes at line 1"),
        ('{"a": 1}\n{"b": 2}', "not JSON: Extra data at line 2 column 1"),
        (b'{"a": "caf\xe9"}', "the text is not UTF-8 (byte 10 is invalid)"),
        ("", "not JSON: Expecting value"),
    ],
)
def test_text_that_is_not_json_says_where(text, says):
    assert says in parse_refused(text).problem


def test_text_over_the_limit_is_refused_before_parsing():
    assert "more than the 10 accepted" in parse_refused('{"a": "0123456789"}', max_bytes=10).problem
    assert "more than the 10 accepted" in parse_refused(b'{"a": "0123"}', max_bytes=10).problem


def test_the_interpreter_limit_is_far_above_the_guard():
    # The reason for the numbers: what the guard lets through can always be encoded and
    # parsed, with room for the caller's own frames.
    assert sys.getrecursionlimit() > ENCODER_MAX_DEPTH * 4
