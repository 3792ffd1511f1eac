"""Definitions: validation an author can act on, frozen versions, pinned fingerprints."""

from __future__ import annotations

import copy
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from govflow.engine.contracts import stored_fingerprint
from govflow.engine.definitions import DefinitionInvalid, definition_fingerprint
from govflow.engine.errors import DefinitionConflict, InvalidRequest
from govflow.engine.models import Definition, Instance, InstanceStatus
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from tests.engine_helpers import graph, node, user_with
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db


def problems_of(document) -> list[str]:
    with pytest.raises(DefinitionInvalid) as caught:
        definition_publish(document=document)
    assert Definition.objects.count() == 0, "an invalid definition must not be stored"
    return caught.value.problems


def one_problem(document) -> str:
    problems = problems_of(document)
    assert len(problems) == 1, problems
    return problems[0]


def test_unknown_node_type_names_the_node_and_the_allowed_types():
    doc = linear(node("x", "script", code="1+1"))
    # One problem: the transitions into and out of 'x' are not also called dangling.
    problem = one_problem(doc)
    assert problem.startswith("node 'x': unknown node type 'script'; use one of action, ")
    assert "timer" in problem


def test_a_node_type_that_is_not_a_string_is_reported_not_crashed():
    doc = linear(node("x", ["action"]))
    assert "node 'x': unknown node type ['action']" in one_problem(doc)


def test_dangling_transition_names_the_missing_node():
    doc = linear(action("a"))
    doc["transitions"].append({"from": "a", "to": "nowhere"})
    problems = problems_of(doc)
    assert any("'to' names 'nowhere'" in p and "dangling transition" in p for p in problems)


def test_a_transition_endpoint_that_is_not_a_string_is_reported_not_crashed():
    doc = linear(action("a"))
    doc["transitions"][0]["from"] = ["start"]
    assert any("'from' names ['start']" in p for p in problems_of(doc))


def test_unreachable_node_is_reported():
    doc = linear(action("a"))
    doc["nodes"].append(action("orphan"))
    doc["transitions"].append({"from": "orphan", "to": "end"})
    assert one_problem(doc) == "node 'orphan' is unreachable from the start node."


def test_join_without_its_split_is_reported():
    doc = graph(
        [
            node("s", "start"),
            node("g", "exclusive"),
            action("a"),
            action("b"),
            node("j", "parallel_join"),
            node("e", "end"),
        ],
        [
            ("s", "g"),
            ("g", "a", {"var": "x", "op": "truthy"}),
            ("g", "b", "default"),
            ("a", "j"),
            ("b", "j"),
            ("j", "e"),
        ],
    )
    assert "a parallel join without its parallel split" in one_problem(doc)


def test_a_loop_of_gateways_without_a_step_is_reported():
    doc = graph(
        [
            node("s", "start"),
            node("g1", "exclusive"),
            node("g2", "exclusive"),
            action("a"),
            node("e", "end"),
        ],
        [
            ("s", "g1"),
            ("g1", "a", {"var": "x", "op": "truthy"}),
            ("g1", "g2", "default"),
            ("g2", "g1", {"var": "y", "op": "truthy"}),
            ("g2", "e", "default"),
            ("a", "e"),
        ],
    )
    assert one_problem(doc) == (
        "nodes g1 → g2 → g1 form a loop of gateways with no step, "
        "timer or wait in between; an instance would go round it "
        "forever."
    )


def test_a_loop_through_a_step_is_allowed():
    doc = graph(
        [node("s", "start"), action("a"), node("g", "exclusive"), node("e", "end")],
        [
            ("s", "a"),
            ("a", "g"),
            ("g", "a", {"var": "again", "op": "truthy"}),
            ("g", "e", "default"),
        ],
    )
    assert definition_publish(document=doc)


def test_action_no_provider_registers_is_reported_with_what_to_do():
    problem = one_problem(linear(action("a", name="gamma.launch")))
    assert problem == (
        "node 'a': no installed provider registers action 'gamma.launch'. "
        "Install its module or fix the name."
    )


def test_action_name_that_is_not_a_string_is_reported():
    problem = one_problem(linear(node("a", "action", action=5)))
    assert "node 'a': 'action' must be the name of a registered action" in problem


@pytest.mark.parametrize(
    ("name", "field"), [("alpha.restore", "backup_ref"), ("alpha.publish", "approval_ref")]
)
def test_gated_action_without_its_pinned_reference_is_reported(name, field):
    problem = one_problem(linear(action("a", name=name)))
    assert f"action '{name}'" in problem and f"needs a pinned '{field}'" in problem
    # With the reference pinned, the same definition publishes.
    assert definition_publish(document=linear(action("a", name=name, **{field: "ref-1"})))


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ({"var": "fee", "op": "around", "value": 1}, "unknown operator 'around'"),
        ({"var": "fee", "op": ["gt"], "value": 1}, "unknown operator ['gt']"),
        ({"var": "fee", "op": "gt"}, "operator 'gt' needs a 'value'"),
        ({"var": "fee bill", "op": "truthy"}, "'fee bill' is not a variable path"),
        ({"op": "truthy"}, "needs 'var' and 'op'"),
        ({"all": []}, "'all'/'any' takes a non-empty list"),
        ("fee > 100", "a condition is an object"),
    ],
)
def test_malformed_condition_is_reported_on_its_transition(when, expected):
    doc = graph(
        [node("s", "start"), node("g", "exclusive"), node("e", "end")],
        [("s", "g"), ("g", "e", when)],
    )
    problem = one_problem(doc)
    assert problem.startswith("transitions[1] (g → e): ") and expected in problem


def test_default_that_is_not_a_boolean_is_reported():
    doc = graph(
        [node("s", "start"), node("g", "exclusive"), node("e", "end")], [("s", "g"), ("g", "e")]
    )
    doc["transitions"][1]["default"] = "yes"
    assert any("'default' must be true or false, not 'yes'" in p for p in problems_of(doc))


@pytest.mark.parametrize("duration", ["10 minutes", "P", "PT", "P1DT", "-PT5S", "P1Y", 30])
def test_bad_timer_duration_is_reported(duration):
    problem = one_problem(linear(node("t", "timer", duration=duration)))
    assert problem == (
        f"node 't': duration {duration!r} is not an ISO 8601 duration such as PT30S or P2D."
    )


def test_absurdly_long_timer_is_reported():
    assert "longer than 100 years" in one_problem(linear(node("t", "timer", duration="P99999999D")))


def test_timer_needs_exactly_one_of_duration_and_at():
    assert "exactly one of 'duration'" in one_problem(linear(node("t", "timer")))
    problem = one_problem(linear(node("t", "timer", at="2027-01-31T09:00:00")))
    assert "must be an ISO 8601 date-time with a UTC offset" in problem


def test_every_problem_is_listed_at_once():
    doc = linear(
        node("x", "script"), action("a", name="gamma.launch"), node("t", "timer", duration="soon")
    )
    doc["version"] = 0
    problems = problems_of(doc)
    assert len(problems) >= 4
    assert any("'version' must be a positive integer" in p for p in problems)


def test_publishing_the_same_bytes_again_returns_the_same_row():
    doc = linear(action("a"), key="tests.frozen", version=1)
    first = definition_publish(document=doc)
    reordered = json.loads(json.dumps(doc, sort_keys=True))  # same content, other key order
    again = definition_publish(document=reordered)
    assert again.pk == first.pk
    assert first.fingerprint == definition_fingerprint(doc, contracts=json.loads(first.contracts))
    assert Definition.objects.filter(key="tests.frozen").count() == 1


def test_different_bytes_under_a_published_version_are_refused_naming_the_next_version():
    doc = linear(action("a"), key="tests.frozen", version=1)
    definition_publish(document=doc)
    definition_publish(document=linear(action("a"), key="tests.frozen", version=2))
    changed = copy.deepcopy(doc)
    changed["title"] = "Edited after publishing"
    with pytest.raises(DefinitionConflict) as caught:
        definition_publish(document=changed)
    assert "publish it as version 3" in str(caught.value)
    stored = Definition.objects.get(key="tests.frozen", version=1)
    assert json.loads(stored.document)["title"] == "Test flow"


def test_publishing_needs_the_publish_permission(django_user_model):
    nobody = user_with(django_user_model, "nobody")
    with pytest.raises(InvalidRequest, match=r"engine\.publish_definition"):
        definition_publish(document=linear(action("a")), actor=nobody)
    author = user_with(django_user_model, "author", "engine.publish_definition")
    assert definition_publish(document=linear(action("a")), actor=author).published_by == author


def test_an_instance_is_pinned_to_its_definitions_fingerprint():
    instance = start(linear(action("a"), key="tests.pinned", version=1))
    definition = instance.definition
    assert instance.definition_fp == definition.fingerprint
    assert definition.fingerprint == definition_fingerprint(
        json.loads(definition.document), contracts=json.loads(definition.contracts)
    )
    # A newer version does not move existing instances.
    definition_publish(document=linear(action("a"), action("b"), key="tests.pinned", version=2))
    instance.refresh_from_db()
    assert instance.definition_id == definition.pk
    assert instance.definition_fp == definition.fingerprint


def write(folder, name: str, document) -> str:
    path = folder / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def test_load_workflows_publishes_files_and_reloading_is_a_no_op(tmp_path, capsys):
    one = write(tmp_path, "one.json", linear(action("a"), key="tests.files", version=1))
    two = write(
        tmp_path, "two.json", linear(action("a"), action("b"), key="tests.files", version=2)
    )
    call_command("load_workflows", one, two)
    out = capsys.readouterr().out
    assert "tests.files v1" in out and "tests.files v2" in out and "from two.json" in out
    call_command("load_workflows", one, two)
    assert Definition.objects.filter(key="tests.files").count() == 2
    assert Definition.objects.get(key="tests.files", version=1).source == "one.json"


def test_load_workflows_reports_each_bad_file_and_still_loads_the_good_ones(tmp_path, capsys):
    good = write(tmp_path, "good.json", linear(action("a"), key="tests.good", version=1))
    broken = write(tmp_path, "broken.json", "{not json")
    invalid = write(tmp_path, "invalid.json", linear(action("a", name="gamma.launch")))
    with pytest.raises(CommandError, match="2 definition file"):
        call_command("load_workflows", broken, good, invalid)
    err = capsys.readouterr().err
    assert "broken.json: not readable JSON" in err
    assert "invalid.json: node 'a': no installed provider registers action 'gamma.launch'" in err
    assert Definition.objects.filter(key="tests.good").exists()


def test_load_workflows_refuses_a_changed_file_under_a_published_version(tmp_path, capsys):
    path = write(tmp_path, "flow.json", linear(action("a"), key="tests.changed", version=1))
    call_command("load_workflows", path)
    write(tmp_path, "flow.json", linear(action("a"), action("b"), key="tests.changed", version=1))
    with pytest.raises(CommandError):
        call_command("load_workflows", path)
    assert "publish it as version 2" in capsys.readouterr().err
    assert Definition.objects.filter(key="tests.changed").count() == 1


# -- hostile definitions: refused as problems, never a server error ----------------------


@pytest.mark.parametrize(
    "at",
    [
        "2027-02-30T09:00:00+00:00",  # well-formed, but no such day
        "2027-01-01T09:00:00+99:00",  # an offset no clock has
        "9999-12-31T23:59:59-01:00",  # the year 10000 in UTC
    ],
)
def test_an_impossible_timer_moment_is_a_problem_not_a_crash(at):
    problem = one_problem(linear(node("t", "timer", at=at)))
    assert problem.startswith(f"node 't': 'at' {at!r} must be an ISO 8601 date-time")


@pytest.mark.parametrize(
    "duration", ["P99999999999D", "PT99999999999999999999S", "P1" + "0" * 400 + "D"]
)
def test_a_timer_duration_too_large_to_compute_is_a_problem_not_a_crash(duration):
    assert "is not an ISO 8601 duration" in one_problem(
        linear(node("t", "timer", duration=duration))
    )


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "https://schemas.example/applicant"}, "points outside the schema"),
        ({"$ref": "#/$defs/missing"}, "cannot be applied: a reference does not resolve"),
        ({"$ref": "#"}, "cannot be applied: its references loop without end"),
        ({"allOf": [{"$ref": "#"}]}, "its references loop without end"),
    ],
)
def test_a_variables_schema_that_cannot_be_applied_is_refused_at_publish(schema, says):
    problem = one_problem(linear(action("a"), variables_schema=schema))
    assert problem.startswith("'variables' is not a valid JSON Schema: ") and says in problem


@pytest.mark.parametrize(
    "nested",
    [{"$ref": "#/$defs/missing"}, {"$ref": "#/properties/applicant"}],
    ids=["unresolvable", "endless"],
)
def test_a_schema_that_fails_only_on_some_variables_refuses_the_start_not_crashes(nested):
    # Publishing tries the schema on {}; a reference under a property only bites when the
    # property is there. The start is then refused, and nothing is recorded.
    schema = {"type": "object", "properties": {"applicant": nested}}
    definition = definition_publish(document=linear(action("a"), variables_schema=schema))
    with pytest.raises(InvalidRequest, match="'variables' schema is unusable") as caught:
        instance_start(definition=definition, variables={"applicant": {"name": "Ada"}})
    assert "Publish a corrected version." in str(caught.value)
    assert not Instance.objects.exists()


def gateway_chain(length: int) -> dict:
    nodes = [node("s", "start")]
    nodes += [node(f"g{i}", "exclusive") for i in range(length)]
    nodes += [action("a"), node("e", "end")]
    transitions = [("s", "g0")]
    for i in range(length):
        after = f"g{i + 1}" if i + 1 < length else "a"
        transitions += [
            (f"g{i}", "e", {"var": f"v{i}", "op": "truthy"}),
            (f"g{i}", after, "default"),
        ]
    return graph(nodes, [*transitions, ("a", "e")])


def test_a_chain_of_gateways_too_long_to_follow_is_refused_without_recursion():
    # 900 gateways: the old loop search recursed once per gateway, and the router follows
    # a chain within one step: the definition is refused at publish instead.
    problem = one_problem(gateway_chain(900))
    assert problem.startswith("node 'g0' starts a chain of 900 gateways")
    assert "at most 64 are followed in a row" in problem


def test_a_chain_of_gateways_at_the_limit_publishes_and_runs():
    definition = definition_publish(document=gateway_chain(64))
    instance = drive(instance_start(definition=definition, variables={"value": "v"}))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason


def test_a_definition_with_too_many_nodes_is_refused_at_once():
    doc = linear(*[node(f"n{i}", "exclusive") for i in range(1001)])
    problem = one_problem(doc)
    assert problem == (
        "'nodes' has 1003 nodes; a definition may have at most 1000. Split the procedure "
        "into several definitions."
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("key", "tests." + "k" * 120, "at most 120 characters"),
        ("title", "T" * 201, "a non-empty string of at most 200 characters"),
        ("version", 2**31, "a positive integer (at most 2147483647)"),
    ],
)
def test_fields_longer_than_their_columns_are_problems(field, value, says):
    # PostgreSQL refused these with a DataError (a server error); SQLite stored them.
    doc = linear(action("a"))
    doc[field] = value
    assert says in one_problem(doc)


def test_a_stored_definition_nested_too_deeply_still_shows_its_page(django_user_model):
    # Published before the input guard: its page was a server error every time.
    body = '{"description":' + "[" * 5000 + "]" * 5000 + ',"key":"tests.deep","version":1}'
    definition = Definition.objects.create(
        key="tests.deep",
        version=1,
        title="Deep",
        document=body,
        fingerprint=stored_fingerprint(body, ""),  # as published, before contracts
        published_at=Now(),
    )
    client = Client()
    client.force_login(user_with(django_user_model, "vera", "engine.view_definition"))
    page = client.get(reverse("admin:engine_definition_change", args=[definition.pk]))
    assert page.status_code == 200
    assert "No: the stored document is nested too deeply to read" in page.content.decode()
