"""A step row made positionally (routing.new_row) is the row Django's keywords make."""

from __future__ import annotations

import pytest
from django.forms.models import model_to_dict

from govflow.engine.models import Token
from govflow.engine.services.routing import new_row


def test_a_row_made_positionally_equals_the_row_made_by_keywords():
    values = dict(instance_id=7, node_id="s1", state="waiting", ordinal=3, wait_key="k")
    fast, slow = new_row(Token, **values), Token(**values)
    assert model_to_dict(fast) == model_to_dict(slow)
    assert {f.attname: getattr(fast, f.attname) for f in Token._meta.concrete_fields} == {
        f.attname: getattr(slow, f.attname) for f in Token._meta.concrete_fields
    }
    assert fast._state.adding and fast.pk is None
    assert fast.payload is None and fast.attempt == 0 and fast.reason == ""


def test_a_name_that_is_not_a_field_is_refused():
    with pytest.raises(TypeError, match="no field named"):
        new_row(Token, instance_id=7, node_id="s1", state="ready", ordinal=1, colour="red")
