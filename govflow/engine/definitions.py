"""Workflow definitions: parse and validate the JSON document (no database here).

A definition is ``{"key", "version", "title", "nodes", "transitions"}`` plus an optional
``variables`` JSON Schema for the variables an instance starts with. Validation collects
every problem, each naming the node or transition and what to fix, so an author fixes a
file in one pass. ``docs/definitions.md`` describes the format.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from django.utils.dateparse import parse_datetime, parse_duration
from referencing.exceptions import Unresolvable

from recovery.api import CanonicalError, canonical_bytes

from .contracts import pinned_fingerprint
from .registry import ActionRegistry

KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
NODE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,99}$")
PERMISSION = re.compile(r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$")
VAR_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
OPS = {"eq", "ne", "gt", "ge", "lt", "le", "in", "not_in", "exists", "truthy"}
# A timer due beyond this is surely a typo, and would overflow date-times (year 9999).
MAX_TIMER = dt.timedelta(days=36525)
# The columns a published definition is stored in (Definition.key, .title, .version).
MAX_KEY = 120
MAX_TITLE = 200
MAX_VERSION = 2**31 - 1
# Gateways a token passes straight through, one after another. The router follows such a
# chain within one step, so a longer chain is refused here rather than at run time.
MAX_GATEWAY_CHAIN = 64
# Validation looks at the graph as a whole (reachability from every parallel split): the
# size of the graph is bounded so that publishing stays fast whatever the file holds.
MAX_NODES = 1000
MAX_TRANSITIONS = 4000

# Node type → (required fields, optional fields), besides "id", "type" and "title".
NODE_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "start": (set(), set()),
    "end": (set(), set()),
    "action": ({"action"}, {"input", "output", "backup_ref", "approval_ref"}),
    "external": ({"topic"}, {"input", "output"}),
    "timer": (set(), {"duration", "at"}),
    "trigger": ({"message", "correlation"}, {"output"}),
    "approval": ({"permission"}, {"output"}),
    "exclusive": (set(), set()),
    "parallel_split": (set(), set()),
    "parallel_join": (set(), set()),
}
CONTROL = {"start", "end", "exclusive", "parallel_split", "parallel_join"}


class DefinitionInvalid(ValueError):
    """A definition document has problems; ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("The definition is invalid:\n" + "\n".join(f"- {p}" for p in problems))


@dataclass(frozen=True)
class Transition:
    source: str
    target: str
    when: Any = None
    default: bool = False


@dataclass(frozen=True)
class Spec:
    """A validated definition, indexed for the runtime."""

    document: Mapping[str, Any]
    nodes: Mapping[str, Mapping[str, Any]]
    outgoing: Mapping[str, tuple[Transition, ...]]
    incoming: Mapping[str, tuple[Transition, ...]]
    start: str

    @property
    def key(self) -> str:
        return self.document["key"]

    @property
    def version(self) -> int:
        return self.document["version"]

    def actions(self) -> set[str]:
        return {n["action"] for n in self.nodes.values() if n["type"] == "action"}


def definition_fingerprint(document: Mapping[str, Any], *, contracts: Mapping[str, Any]) -> str:
    """The fingerprint of ``document`` published with its action ``contracts`` pinned."""
    return pinned_fingerprint(document, contracts)


def schema_errors(schema: Any, value: Any) -> list[jsonschema.ValidationError]:
    """Every way ``value`` breaks the JSON Schema ``schema`` (an empty list when none).

    Raises :class:`ValueError` saying why when the schema cannot be applied at all: a
    reference that does not resolve, or references that loop without end.
    """
    try:
        return list(jsonschema.Draft202012Validator(schema).iter_errors(value))
    except RecursionError:
        raise ValueError("its references loop without end") from None
    except Unresolvable as exc:
        raise ValueError(f"a reference does not resolve ({exc})") from None


def _schema_problem(schema: Any) -> str:
    """Why ``schema`` cannot check an instance's variables, or ''."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message
    pending = [schema]
    while pending:  # the guard has bounded its depth; no recursion all the same
        item = pending.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                    if not value.startswith("#"):
                        return (
                            f"the reference {value!r} points outside the schema; only "
                            "references within it ('#/$defs/…') are supported."
                        )
                else:
                    pending.append(value)
        elif isinstance(item, list):
            pending.extend(item)
    try:
        schema_errors(schema, {})
    except ValueError as exc:
        return f"it cannot be applied: {exc}."
    return ""


def _check_mapping(where: str, name: str, value: Any, problems: list[str]) -> None:
    if not isinstance(value, dict):
        problems.append(f"{where}: '{name}' must be an object mapping names to variables.")
        return
    for key, item in value.items():
        if name == "input" and isinstance(item, dict):
            if set(item) != {"value"}:
                problems.append(
                    f"{where}: input '{key}' must be a variable path or {{\"value\": literal}}."
                )
            continue
        if not isinstance(item, str) or not VAR_PATH.match(item):
            problems.append(
                f"{where}: {name} '{key}' must be a dotted variable path such as "
                f"'applicant.name', not {item!r}."
            )
        if name == "output" and not VAR_PATH.match(str(key)):
            problems.append(f"{where}: output variable name {key!r} is not a valid name.")


def _check_condition(where: str, cond: Any, problems: list[str]) -> None:
    if not isinstance(cond, dict) or not cond:
        problems.append(
            f'{where}: a condition is an object such as {{"var": "fee", "op": "gt", "value": 100}}.'
        )
        return
    if set(cond) in ({"all"}, {"any"}):
        items = next(iter(cond.values()))
        if not isinstance(items, list) or not items:
            problems.append(f"{where}: 'all'/'any' takes a non-empty list of conditions.")
            return
        for item in items:
            _check_condition(where, item, problems)
        return
    if set(cond) == {"not"}:
        _check_condition(where, cond["not"], problems)
        return
    if "var" not in cond or "op" not in cond or not set(cond) <= {"var", "op", "value"}:
        problems.append(f"{where}: condition {cond!r} needs 'var' and 'op' (and 'value').")
        return
    if not isinstance(cond["var"], str) or not VAR_PATH.match(cond["var"]):
        problems.append(f"{where}: condition variable {cond['var']!r} is not a variable path.")
    if not isinstance(cond["op"], str) or cond["op"] not in OPS:
        problems.append(
            f"{where}: unknown operator {cond['op']!r}; use one of {', '.join(sorted(OPS))}."
        )
    elif cond["op"] not in {"exists", "truthy"} and "value" not in cond:
        problems.append(f"{where}: operator {cond['op']!r} needs a 'value'.")


def _duration(value: Any) -> dt.timedelta | None:
    # Well-formed but absurd values ("P99999999999D") overflow instead of parsing.
    try:
        return parse_duration(value) if isinstance(value, str) else None
    except (ValueError, OverflowError):
        return None


def _moment(value: Any) -> dt.datetime | None:
    # parse_datetime raises for well-formed impossible dates (Feb 30, offset +99:00); a
    # moment that is not a date-time in UTC (year 10000) would overflow at run time.
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
        if moment is not None and moment.tzinfo is not None:
            moment.astimezone(dt.UTC)
    except (ValueError, OverflowError):
        return None
    return moment


def _check_node(node: Any, index: int, problems: list[str], registry: ActionRegistry | None):
    if not isinstance(node, dict):
        problems.append(f"nodes[{index}]: each node is an object with 'id' and 'type'.")
        return None
    node_id = node.get("id")
    if not isinstance(node_id, str) or not NODE_ID.match(node_id):
        problems.append(
            f"nodes[{index}]: id {node_id!r} must start with a letter and contain "
            "only letters, digits, '-' or '_'."
        )
        return None
    where = f"node '{node_id}'"
    kind = node.get("type")
    if not isinstance(kind, str) or kind not in NODE_FIELDS:
        problems.append(
            f"{where}: unknown node type {kind!r}; use one of {', '.join(sorted(NODE_FIELDS))}."
        )
        return None
    required, optional = NODE_FIELDS[kind]
    present = set(node) - {"id", "type", "title"}
    for missing in sorted(required - present):
        problems.append(f"{where}: a {kind} node needs '{missing}'.")
    for extra in sorted(present - required - optional):
        problems.append(f"{where}: '{extra}' is not a field of a {kind} node.")
    for name in ("input", "output"):
        if name in node:
            _check_mapping(where, name, node[name], problems)
    if (
        kind == "action"
        and "action" in node
        and not (isinstance(node["action"], str) and node["action"])
    ):
        problems.append(
            f"{where}: 'action' must be the name of a registered action, such as "
            "'permits.register_application'."
        )
    if kind == "action" and isinstance(node.get("action"), str) and registry is not None:
        action = registry.get(node["action"])
        if action is None:
            problems.append(
                f"{where}: no installed provider registers action "
                f"{node['action']!r}. Install its module or fix the name."
            )
        elif action.gated_by and not (
            isinstance(node.get(action.gated_by), str) and node[action.gated_by].strip()
        ):
            problems.append(
                f"{where}: action {action.name!r} is {action.recovery_mode} and "
                f"needs a pinned '{action.gated_by}' on the node."
            )
    if kind == "timer":
        has = [f for f in ("duration", "at") if f in node]
        if len(has) != 1:
            problems.append(
                f"{where}: a timer needs exactly one of 'duration' (ISO 8601, e.g. "
                "PT10M) or 'at' (ISO 8601 date-time with a UTC offset)."
            )
        elif has == ["duration"]:
            parsed = _duration(node["duration"])
            # parse_duration also takes "P" and "PT" (zero) and non-ISO forms: refuse them.
            if (
                parsed is None
                or not str(node["duration"]).startswith("P")
                or str(node["duration"])[-1] in "PT"
                or parsed.total_seconds() < 0
            ):
                problems.append(
                    f"{where}: duration {node['duration']!r} is not an ISO 8601 "
                    "duration such as PT30S or P2D."
                )
            elif parsed > MAX_TIMER:
                problems.append(
                    f"{where}: duration {node['duration']!r} is longer than 100 "
                    "years; use an 'at' date-time if you really mean it."
                )
        else:
            moment = _moment(node["at"])
            if moment is None or moment.tzinfo is None:
                problems.append(
                    f"{where}: 'at' {node['at']!r} must be an ISO 8601 date-time "
                    "with a UTC offset, e.g. 2027-01-31T09:00:00+01:00."
                )
    if kind == "trigger":
        if not isinstance(node.get("message"), str) or not node.get("message"):
            problems.append(f"{where}: 'message' must be a non-empty message name.")
        if not isinstance(node.get("correlation"), str) or not VAR_PATH.match(
            node.get("correlation") or ""
        ):
            problems.append(
                f"{where}: 'correlation' must be the variable path whose value "
                "identifies the awaited message."
            )
    if kind == "external" and (not isinstance(node.get("topic"), str) or not node["topic"]):
        problems.append(f"{where}: 'topic' must be a non-empty topic name.")
    if kind == "approval" and not PERMISSION.match(str(node.get("permission", ""))):
        problems.append(f"{where}: 'permission' must be 'app_label.codename'.")
    return node_id


def parse_definition(document: Any, *, registry: ActionRegistry | None = None) -> Spec:
    """Validate ``document`` and return its :class:`Spec`, or raise :class:`DefinitionInvalid`.

    With ``registry``, every action must be registered and gated actions must pin their
    reference; without it (loading history), only the structure is checked.
    """
    problems: list[str] = []
    if not isinstance(document, dict):
        raise DefinitionInvalid(
            ["A definition is a JSON object with key, version, title, nodes and transitions."]
        )
    try:
        canonical_bytes(document)
    except CanonicalError as exc:
        raise DefinitionInvalid([str(exc)]) from None
    for extra in sorted(
        set(document)
        - {"key", "version", "title", "nodes", "transitions", "variables", "description"}
    ):
        problems.append(f"{extra[:80]!r} is not a field of a definition.")
    key = document.get("key")
    if not isinstance(key, str) or not KEY.match(key) or len(key) > MAX_KEY:
        problems.append(
            "'key' must be namespaced lowercase words separated by dots, e.g. "
            f"'permits.building_permit', at most {MAX_KEY} characters."
        )
    version = document.get("version")
    if type(version) is not int or not 1 <= version <= MAX_VERSION:
        problems.append(f"'version' must be a positive integer (at most {MAX_VERSION}).")
    title = document.get("title")
    if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE:
        problems.append(f"'title' must be a non-empty string of at most {MAX_TITLE} characters.")
    if "variables" in document:
        problem = _schema_problem(document["variables"])
        if problem:
            problems.append(f"'variables' is not a valid JSON Schema: {problem}")
    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        problems.append("'nodes' must be a non-empty list.")
        raw_nodes = []
    elif len(raw_nodes) > MAX_NODES:
        problems.append(
            f"'nodes' has {len(raw_nodes)} nodes; a definition may have at most {MAX_NODES}. "
            "Split the procedure into several definitions."
        )
        raise DefinitionInvalid(problems)
    nodes: dict[str, dict[str, Any]] = {}
    # Nodes whose type is unknown: already reported, so transitions touching them are not
    # called dangling and the graph is not judged (it would only repeat the same problem).
    unusable: set[str] = set()
    for index, node in enumerate(raw_nodes):
        node_id = _check_node(node, index, problems, registry)
        if node_id is None:
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                unusable.add(node["id"])
            continue
        if node_id in nodes:
            problems.append(f"node '{node_id}': the id is used twice.")
        nodes[node_id] = node
    outgoing: dict[str, list[Transition]] = defaultdict(list)
    incoming: dict[str, list[Transition]] = defaultdict(list)
    raw_transitions = document.get("transitions")
    if not isinstance(raw_transitions, list):
        problems.append('\'transitions\' must be a list of {"from", "to"} objects.')
        raw_transitions = []
    elif len(raw_transitions) > MAX_TRANSITIONS:
        problems.append(
            f"'transitions' has {len(raw_transitions)} transitions; a definition may have "
            f"at most {MAX_TRANSITIONS}."
        )
        raise DefinitionInvalid(problems)
    for index, item in enumerate(raw_transitions):
        where = f"transitions[{index}]"
        if (
            not isinstance(item, dict)
            or not {"from", "to"} <= set(item)
            or not set(item) <= {"from", "to", "when", "default"}
        ):
            problems.append(
                f'{where}: a transition is {{"from", "to"}} with an optional '
                "'when' condition or 'default': true."
            )
            continue
        source, target = item["from"], item["to"]
        if "default" in item and not isinstance(item["default"], bool):
            problems.append(f"{where}: 'default' must be true or false, not {item['default']!r}.")
        for end, name in (("from", source), ("to", target)):
            if not (isinstance(name, str) and (name in nodes or name in unusable)):
                problems.append(
                    f"{where}: '{end}' names {name!r}, which is not a node (dangling transition)."
                )
        if (
            not isinstance(source, str)
            or not isinstance(target, str)
            or source not in nodes
            or target not in nodes
        ):
            continue
        transition = Transition(source, target, item.get("when"), item.get("default") is True)
        if transition.when is not None:
            _check_condition(f"{where} ({source} → {target})", transition.when, problems)
        outgoing[source].append(transition)
        incoming[target].append(transition)
    if not unusable:
        _check_graph(nodes, outgoing, incoming, problems)
    if problems:
        raise DefinitionInvalid(problems)
    start = next(n for n, node in nodes.items() if node["type"] == "start")
    return Spec(
        document=document,
        nodes=nodes,
        start=start,
        outgoing={n: tuple(outgoing.get(n, ())) for n in nodes},
        incoming={n: tuple(incoming.get(n, ())) for n in nodes},
    )


def _reachable(start: str, outgoing: Mapping[str, list[Transition]]) -> set[str]:
    seen, queue = {start}, deque([start])
    while queue:
        for t in outgoing.get(queue.popleft(), ()):
            if t.target not in seen:
                seen.add(t.target)
                queue.append(t.target)
    return seen


def _check_graph(nodes, outgoing, incoming, problems: list[str]) -> None:
    starts = [n for n, node in nodes.items() if node["type"] == "start"]
    if len(starts) != 1:
        problems.append(f"a definition has exactly one start node (found {len(starts)}).")
        return
    if not any(node["type"] == "end" for node in nodes.values()):
        problems.append("a definition needs at least one end node.")
    for node_id, node in nodes.items():
        kind, out, into = node["type"], outgoing.get(node_id, []), incoming.get(node_id, [])
        where = f"node '{node_id}'"
        if kind == "start" and into:
            problems.append(f"{where}: nothing may lead into the start node.")
        if kind == "end" and out:
            problems.append(f"{where}: an end node has no outgoing transitions.")
        if kind not in {"end", "exclusive", "parallel_split"} and len(out) != 1:
            problems.append(
                f"{where}: a {kind} node needs exactly one outgoing transition (found {len(out)})."
            )
        if kind != "exclusive" and any(t.when is not None or t.default for t in out):
            problems.append(f"{where}: only exclusive gateways have conditional transitions.")
        if kind == "exclusive":
            defaults = [t for t in out if t.default]
            if not out:
                problems.append(f"{where}: an exclusive gateway needs outgoing transitions.")
            if len(defaults) > 1:
                problems.append(f"{where}: at most one default transition.")
            for t in out:
                if not t.default and t.when is None:
                    problems.append(
                        f"{where}: transition to '{t.target}' needs a 'when' "
                        "condition or 'default': true."
                    )
        if kind == "parallel_split" and len(out) < 2:
            problems.append(f"{where}: a parallel split needs at least two branches.")
        if kind == "parallel_join" and len(into) < 2:
            problems.append(f"{where}: a parallel join needs at least two incoming branches.")
    reachable = _reachable(starts[0], outgoing)
    for node_id in nodes:
        if node_id not in reachable:
            problems.append(f"node '{node_id}' is unreachable from the start node.")
    splits = [n for n, node in nodes.items() if node["type"] == "parallel_split"]
    reach = functools.cache(lambda split: _reachable(split, outgoing))
    for node_id, node in nodes.items():
        if node["type"] != "parallel_join":
            continue
        sources = {t.source for t in incoming.get(node_id, [])}
        if not any(sources <= reach(split) for split in splits):
            problems.append(
                f"node '{node_id}': a parallel join without its parallel split "
                "(no split leads to every incoming branch)."
            )
    loop = _pass_through_loop(nodes, outgoing)
    if loop:
        problems.append(
            f"nodes {' → '.join(loop)} form a loop of gateways with no step, "
            "timer or wait in between; an instance would go round it forever."
        )
        return
    chain, first = _longest_pass_through_chain(nodes, outgoing)
    if chain > MAX_GATEWAY_CHAIN:
        problems.append(
            f"node '{first}' starts a chain of {chain} gateways with no step, timer or "
            f"wait in between; at most {MAX_GATEWAY_CHAIN} are followed in a row. Merge "
            "the conditions into fewer gateways."
        )


PASS_THROUGH = {"exclusive", "parallel_split", "parallel_join"}


def _pass_through_loop(nodes, outgoing) -> list[str]:
    """A cycle of nodes a token passes straight through (the router follows them at once).

    A depth-first search with an explicit stack: a definition's graph comes from outside,
    and a long chain of gateways must not exhaust the interpreter's stack here.
    """
    through = {n for n, node in nodes.items() if node["type"] in PASS_THROUGH}
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in sorted(through):
        if root in state:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(outgoing.get(root, ()))]
        while pending:
            for t in pending[-1]:
                if t.target not in through:
                    continue
                if state.get(t.target) == 1:
                    return [*path[path.index(t.target) :], t.target]
                if t.target not in state:
                    state[t.target] = 1
                    path.append(t.target)
                    pending.append(iter(outgoing.get(t.target, ())))
                    break
            else:
                state[path.pop()] = 2
                pending.pop()
    return []


def _longest_pass_through_chain(nodes, outgoing) -> tuple[int, str]:
    """The most gateways a token passes in a row, and the first of them (no loop assumed)."""
    through = {n for n, node in nodes.items() if node["type"] in PASS_THROUGH}
    length: dict[str, int] = {}
    for root in sorted(through):
        stack = [root]
        while stack:
            node_id = stack[-1]
            if node_id in length:
                stack.pop()
                continue
            after = [t.target for t in outgoing.get(node_id, ()) if t.target in through]
            todo = [n for n in after if n not in length]
            if todo:
                stack.extend(todo)
                continue
            length[node_id] = 1 + max((length[n] for n in after), default=0)
            stack.pop()
    if not length:
        return 0, ""
    first = max(sorted(length), key=lambda n: length[n])
    return length[first], first
