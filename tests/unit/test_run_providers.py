"""Run providers (linked runs): refused at registration and at definition parse, clearly."""

from __future__ import annotations

import dataclasses

import pytest

from govflow.demo.dataflow.provider import PUBLICATION
from govflow.engine.definitions import DefinitionInvalid, parse_definition
from govflow.engine.linked import RunDescriptor, run_providers, validate_run_provider
from govflow.engine.provider import RegistryError, RegistryFrozen, registry
from tests.engine_helpers import graph, node


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"name": "Publication"}, "namespaced lowercase words"),
        ({"describe": None}, "describe must be callable"),
        ({"find": "yes"}, "find must be callable or None"),
        ({"poll_backoff": 0}, "poll_backoff must be in (0, 3600]"),
        ({"poll_max_delay": 1.0}, "poll_max_delay must be from poll_backoff"),
        ({"poll_budget": 0}, "poll_budget must be an integer from 1 to 10000"),
        ({"checks": ()}, "needs at least one verification check"),
    ],
)
def test_a_malformed_run_provider_is_refused(changes, says):
    with pytest.raises(RegistryError) as refused:
        validate_run_provider(dataclasses.replace(PUBLICATION, **changes))
    assert says in str(refused.value)


def test_registration_after_ready_and_duplicates_are_refused():
    with pytest.raises(RegistryFrozen):
        run_providers.register(dataclasses.replace(PUBLICATION, name="tests.late"))
    with run_providers.override():
        with pytest.raises(RegistryError, match="already registered"):
            run_providers.register(PUBLICATION)
        taken = dataclasses.replace(PUBLICATION, name=registry.all()[0].name)
        with pytest.raises(RegistryError, match="already registered"):
            run_providers.register(taken)


def test_the_start_is_a_non_atomic_action_whose_success_is_the_run_reference():
    start = run_providers.start_of("dataflow.publication")
    assert (start.name, start.recovery_mode) == ("dataflow.publication", "non_atomic")
    assert start.output_schema["required"] == ["run"]
    assert start.reconcile_settles  # the module's lookup by key is its own authority


def test_what_a_descriptor_is_compared_by():
    assert RunDescriptor("succeeded", outputs={"a": 1}, note="x").fact() == {
        "state": "succeeded",
        "outputs": {"a": 1},
    }
    assert RunDescriptor("failed", reason_code="r").fact() == {
        "state": "failed",
        "reason_code": "r",
    }
    assert RunDescriptor("unknown_publication", note="lost").fact() == {
        "state": "unknown_publication"
    }


def test_every_problem_of_a_linked_run_node_is_listed():
    document = graph(
        [
            node("start", "start"),
            node("a", "linked_run", run_provider="", on_failure="skip", action="x.y"),
            node("b", "linked_run"),
            node("end", "end"),
        ],
        [("start", "a"), ("a", "b"), ("b", "end")],
    )
    with pytest.raises(DefinitionInvalid) as invalid:
        parse_definition(document, registry=registry)
    problems = invalid.value.problems
    assert any(
        "node 'a': 'run_provider' must be the name of a registered run provider" in p
        for p in problems
    ), problems
    assert any("node 'a': 'action' is not a field of a linked_run node." in p for p in problems)
    assert any("node 'a': 'on_failure' must be" in p for p in problems)
    assert any("node 'b': a linked_run node needs 'run_provider'." in p for p in problems)
