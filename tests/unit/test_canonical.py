"""Canonical bytes and fingerprints: one value, one byte string, one fingerprint per kind."""

from __future__ import annotations

import datetime
import enum
import itertools
import json
import math
import random
import re
from decimal import Decimal

import pytest
from blake3 import blake3
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from recovery.api import (
    CanonicalError,
    FingerprintKind,
    RecoveryValidationError,
    canonical_bytes,
    fingerprint,
    fingerprint_value,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def same_json(a: object, b: object) -> bool:
    """Equality as JSON sees it: 1, 1.0 and True differ, and so do 0.0 and -0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return a == b


def rebuilt(value: object, order) -> object:
    """A deep copy of ``value`` whose dicts were built in the key order ``order`` picks."""
    if isinstance(value, dict):
        keys = order(list(value))
        return {key: rebuilt(value[key], order) for key in keys}
    if isinstance(value, list):
        return [rebuilt(item, order) for item in value]
    return value


# --- properties ------------------------------------------------------------------------


# No deadline: a slow, loaded CI machine is not a canonical-bytes bug.
@settings(deadline=None)
@given(json_values, st.randoms(use_true_random=False))
def test_key_insertion_order_never_changes_the_bytes(value, rnd: random.Random):
    def shuffled(keys):
        rnd.shuffle(keys)
        return keys

    expected = canonical_bytes(value)
    assert canonical_bytes(rebuilt(value, lambda keys: keys[::-1])) == expected
    assert canonical_bytes(rebuilt(value, shuffled)) == expected
    assert fingerprint_value(FingerprintKind.INPUT, rebuilt(value, shuffled)) == (
        fingerprint_value(FingerprintKind.INPUT, value)
    )


@settings(deadline=None)
@given(json_values)
def test_canonical_bytes_are_json_that_round_trips_to_the_same_value(value):
    data = canonical_bytes(value)
    assert same_json(json.loads(data.decode("utf-8")), value)


@settings(deadline=None)
@given(json_values)
def test_canonical_bytes_have_no_insignificant_whitespace_and_sorted_keys(value):
    data = canonical_bytes(value)
    # Re-encoding the decoded value compactly with sorted keys gives the same bytes back.
    again = json.dumps(
        json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    assert data == again


@settings(deadline=None)
@given(json_values, json_values)
def test_different_values_give_different_bytes(first, second):
    assume(not same_json(first, second))
    assert canonical_bytes(first) != canonical_bytes(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (1, 1.0),
        (1, True),
        (0, False),
        (0.0, -0.0),
        (None, "null"),
        ("1", 1),
        (["a"], "a"),
        ({"a": 1}, [["a", 1]]),
        ({"a": None}, {}),
    ],
    ids=lambda v: repr(v),
)
def test_values_python_calls_equal_but_json_does_not_get_different_bytes(first, second):
    assert canonical_bytes(first) != canonical_bytes(second)


def test_known_value_has_the_documented_bytes():
    value = {"b": [1, 2.5, None, True, False], "a": "é ü", "c": {"z": {}, "y": []}}
    assert canonical_bytes(value) == (
        '{"a":"é ü","b":[1,2.5,null,true,false],"c":{"y":[],"z":{}}}'.encode()
    )


def test_a_tuple_is_encoded_as_the_array_it_stands_for():
    assert canonical_bytes({"ids": (1, 2)}) == canonical_bytes({"ids": [1, 2]})


# --- rejections ------------------------------------------------------------------------


class Colour(enum.StrEnum):
    RED = "red"


REJECTED = [
    pytest.param(float("nan"), "not a finite number", id="nan"),
    pytest.param(float("inf"), "not a finite number", id="inf"),
    pytest.param(float("-inf"), "not a finite number", id="-inf"),
    pytest.param(b"bytes", "bytes is not a JSON value", id="bytes"),
    pytest.param(bytearray(b"x"), "bytearray is not a JSON value", id="bytearray"),
    pytest.param({1, 2}, "set is not a JSON value", id="set"),
    pytest.param(frozenset({1}), "frozenset is not a JSON value", id="frozenset"),
    pytest.param(Decimal("1.10"), "Decimal is not a JSON value", id="decimal"),
    pytest.param(
        datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
        "datetime is not a JSON value",
        id="datetime",
    ),
    pytest.param(datetime.date(2024, 1, 2), "date is not a JSON value", id="date"),
    pytest.param("bad \ud800 text", "lone surrogate", id="lone-surrogate"),
    pytest.param(Colour.RED, "Colour is not a JSON value", id="str-subclass"),
    pytest.param(object(), "object is not a JSON value", id="object"),
]


@pytest.mark.parametrize(("bad", "problem"), REJECTED)
def test_a_non_json_value_is_rejected_with_the_path_to_it(bad, problem):
    value = {"a": [0, {"b": bad, "c": 1}], "z": "fine"}
    with pytest.raises(CanonicalError) as caught:
        canonical_bytes(value)
    assert caught.value.path == "$.a[1].b"
    assert problem in caught.value.problem
    assert str(caught.value).startswith("$.a[1].b: ")
    with pytest.raises(CanonicalError):
        fingerprint_value(FingerprintKind.INPUT, value)


@pytest.mark.parametrize(("bad", "problem"), REJECTED)
def test_a_non_json_value_at_the_top_is_rejected_at_the_root_path(bad, problem):
    with pytest.raises(CanonicalError) as caught:
        canonical_bytes(bad)
    assert caught.value.path == "$"
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    "key", [1, 1.5, None, True, ("a", "b")], ids=["int", "float", "none", "bool", "tuple"]
)
def test_a_non_string_object_key_is_rejected_naming_the_object(key):
    # json.dumps would quietly turn 1 into "1"; canonical bytes refuse instead, so that
    # {1: x} and {"1": x} cannot silently share a fingerprint.
    with pytest.raises(CanonicalError) as caught:
        canonical_bytes({"a": [0, {"ok": 1, key: "x"}]})
    assert caught.value.path == "$.a[1]"
    assert f"object key {key!r}" in caught.value.problem
    assert "not a string" in caught.value.problem


def test_the_first_offence_in_document_order_is_the_one_reported():
    # Depth first, in the order the value was built: what is inside a[1] comes before the
    # later sibling c; an object's keys are checked as it is reached, before its values.
    nan, inf = float("nan"), float("inf")
    cases = [
        ({"a": [1, {"b": nan}], "c": inf}, "$.a[1].b"),
        ({"c": inf, "a": [1, {"b": nan}]}, "$.c"),
        ({"a": {"x": [nan], 1: "k"}}, "$.a"),
        ([[[], [nan]], nan], "$[0][1][0]"),
    ]
    for value, path in cases:
        with pytest.raises(CanonicalError) as caught:
            canonical_bytes(value)
        assert caught.value.path == path


def test_a_lone_surrogate_in_a_key_is_rejected_at_that_key():
    with pytest.raises(CanonicalError) as caught:
        canonical_bytes({"a": {"k\udfff": 1}})
    # The key is escaped in the path: a message with a lone surrogate in it could not be
    # printed or shown on a page (it would fail again, as a server error).
    assert caught.value.path == '$.a["k\\udfff"]'
    str(caught.value).encode("utf-8")
    assert "lone surrogate" in caught.value.problem


def test_the_error_message_says_what_a_canonical_value_may_contain():
    with pytest.raises(CanonicalError, match="Canonical values are JSON: objects with string"):
        canonical_bytes({"when": datetime.date(2024, 1, 1)})


def test_canonical_error_is_a_validation_error_and_a_value_error():
    with pytest.raises(RecoveryValidationError):
        canonical_bytes(float("nan"))
    with pytest.raises(ValueError):
        canonical_bytes(float("nan"))


# --- fingerprints ----------------------------------------------------------------------

HEX64 = re.compile(r"^[0-9a-f]{64}$")


@settings(deadline=None)
@given(json_values)
def test_a_fingerprint_is_64_lowercase_hex_characters(value):
    for kind in FingerprintKind:
        assert HEX64.match(fingerprint_value(kind, value))


def test_every_kind_gives_a_different_fingerprint_for_the_same_bytes():
    data = canonical_bytes({"parcel": "A-1"})
    prints = {kind: fingerprint(kind, data) for kind in FingerprintKind}
    assert len(set(prints.values())) == len(FingerprintKind)
    for first, second in itertools.combinations(FingerprintKind, 2):
        assert prints[first] != prints[second], (first, second)


def test_fingerprint_value_is_the_fingerprint_of_the_canonical_bytes():
    value = {"b": 2, "a": 1}
    assert fingerprint_value(FingerprintKind.PREVIEW, value) == fingerprint(
        FingerprintKind.PREVIEW, b'{"a":1,"b":2}'
    )


def test_fingerprint_format_is_pinned():
    # Pinned literals: persisted fingerprints must never change meaning. If this fails,
    # the canonical format or the domain prefix changed and every stored hash is orphaned.
    value = {"b": [1, 2.5, None, True], "a": "é"}
    assert fingerprint_value(FingerprintKind.INPUT, value) == (
        "564d84a587537e3a901fc69671e2f9942f5bb0038a5496d012e7e46cd763cf41"
    )
    assert fingerprint(FingerprintKind.INPUT, b"") == (
        "25e3f71675d740e017603bf843808a794d83e192a3b6a76e187836a7d9360710"
    )
    # The documented construction: BLAKE3 over "recovery:v1:<kind>\0" and the bytes.
    assert (
        fingerprint(FingerprintKind.EVIDENCE, b"file")
        == blake3(b"recovery:v1:evidence\x00file").hexdigest()
    )


def test_persisted_fingerprint_kind_names_are_stable():
    assert [kind.value for kind in FingerprintKind] == [
        "definition",
        "input",
        "preview",
        "access-context",
        "idempotency-key",
        "evidence",
        "operation-key",
        "result",
        "checkpoint-fact",
        "projection",
    ]


def test_chain_links_hash_exactly_the_canonical_bytes_of_their_parts():
    """compute_link writes its JSON directly for speed; it must be the canonical form."""
    from blake3 import blake3

    from recovery.chain import compute_link
    from recovery.subjects import Subject

    key = bytes(range(32))
    for subject, seq, kind in (
        (Subject("govflow.instance", "42"), 1, "operation.recorded"),
        (Subject("t", 'ünïcode "quoted" \\ id'), 12345678901, "k/ä"),
    ):
        parts = [subject.type, subject.id, seq, kind, "ab" * 32, "0" * 64]
        expected = blake3(canonical_bytes(parts), key=key).hexdigest()
        assert compute_link(key, subject, seq, kind, "ab" * 32, "0" * 64) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"b":1,"a":[1.5,true,null,"x"]}',
        '{"a":{"z":"ünï","y":-0.0,"x":12345678901234567890}}',
        '["\\ud83d\\ude00",{"k":"v"}]',
        '{"a":NaN}',
        '{"a":Infinity}',
        '["\\ud800"]',
        "[1e400]",
    ],
)
def test_the_parsed_fast_path_agrees_with_canonical_bytes(text):
    """Chain replay checks facts with canonical_bytes_of_parsed: same bytes, same refusals."""
    from recovery.canonical import canonical_bytes_of_parsed

    parsed = json.loads(text)
    try:
        expected = canonical_bytes(parsed)
    except CanonicalError:
        with pytest.raises(ValueError):
            canonical_bytes_of_parsed(parsed)
    else:
        assert canonical_bytes_of_parsed(parsed) == expected


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ('{"a":1,"b":[true,null]}', {"a": 1, "b": [True, None]}),
        ('{"b":1,"a":2}', None),  # keys out of order: not as canonical bytes write it
        ('{"a": 1}', None),  # insignificant whitespace
        ("[1,2]", None),  # canonical, but not an object
        ('{"a":NaN}', None),
        ('{"a":"\\ud800"}', None),  # a lone surrogate
        ('{"a":', None),  # not JSON
        ("[" * 5000 + "]" * 5000, None),  # nested past reason
    ],
)
def test_a_stored_record_reads_back_only_as_the_canonical_object_it_was_written_as(text, read):
    """Checkpoint facts and anchor records are read with canonical_object, from text or bytes."""
    from recovery.canonical import canonical_object

    data = text.encode()
    assert canonical_object(text, data) == read
    assert canonical_object(data, data) == read


@given(json_values)
def test_an_admitted_value_has_the_same_bytes_without_the_walk(value):
    assert canonical_bytes(value, admitted=True) == canonical_bytes(value)


@pytest.mark.parametrize(("bad", "problem"), [p for p in REJECTED if p.id != "str-subclass"])
def test_an_admitted_value_that_is_not_json_is_refused_with_the_same_error(bad, problem):
    value = {"a": [0, {"b": bad, "c": 1}], "z": "fine"}
    with pytest.raises(CanonicalError) as caught:
        canonical_bytes(value, admitted=True)
    assert caught.value.path == "$.a[1].b"
    assert problem in caught.value.problem


def test_an_admitted_value_is_written_as_the_database_would_store_it():
    # What only the walk refuses: a key that is not a string, a subclass of str.
    assert canonical_bytes({1: Colour.RED}, admitted=True) == b'{"1":"red"}'
    assert canonical_bytes({"1": "red"}) == b'{"1":"red"}'
