"""The tail call's packed values (``recovery.services.lone.json_text``): the same JSON text
as the standard encoder writes, which the server parses (migration 0025)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from recovery.services.lone import json_text

ENCODE = json.JSONEncoder(separators=(",", ":")).encode


@given(st.lists(st.text()))
def test_any_texts_are_written_as_the_standard_encoder_writes_them(texts):
    assert json_text(texts) == ENCODE(texts)
    assert json.loads(json_text(texts)) == texts


def test_a_string_enum_member_is_written_as_its_value():
    from recovery.states import OperationState

    assert json_text([OperationState.DISPATCHED, "x"]) == '["dispatched","x"]'
