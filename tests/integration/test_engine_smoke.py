import pytest

from govflow.engine.models import TokenState
from recovery import api
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


def test_two_step_instance_completes_with_a_verified_chain():
    instance = start(linear(action("a"), action("b", name="alpha.note")))
    instance = drive(instance)
    assert instance.status == "completed", instance.reason
    assert instance.variables["a"]["stored"] == "v1"
    assert set(instance.tokens.values_list("state", flat=True)) == {TokenState.COMPLETED}
    assert api.chain_verify(api.Subject("govflow.instance", str(instance.pk))).ok
    assert len(effects.effects("alpha.write")) == 1
