"""The definition document: its header fields, its nodes and transitions, its ``Spec``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recovery.api import CanonicalError, canonical_bytes

from ..contracts import pinned_fingerprint
from ..registry import ActionRegistry
from .case import check_case_fields
from .graph import check_graph
from .limits import KEY, MAX_KEY, MAX_NODES, MAX_TITLE, MAX_TRANSITIONS, MAX_VERSION
from .nodes import check_condition, check_node
from .schemas import schema_problem

FIELDS = {
    "key",
    "version",
    "title",
    "nodes",
    "transitions",
    "variables",
    "description",
    "case_fields",
}


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
        """The actions whose contracts are pinned: module actions and linked runs' starts."""
        return {n["action"] for n in self.nodes.values() if n["type"] == "action"} | {
            n["run_provider"] for n in self.nodes.values() if n["type"] == "linked_run"
        }


def definition_fingerprint(document: Mapping[str, Any], *, contracts: Mapping[str, Any]) -> str:
    """The fingerprint of ``document`` published with its action ``contracts`` pinned."""
    return pinned_fingerprint(document, contracts)


def parse_definition(document: Any, *, registry: ActionRegistry | None = None) -> Spec:
    """Validate ``document`` and return its :class:`Spec`, or raise :class:`DefinitionInvalid`.

    With ``registry``, every action must be registered and gated actions must pin their
    reference; without it (loading history), only the structure is checked.
    """
    if not isinstance(document, dict):
        raise DefinitionInvalid(
            ["A definition is a JSON object with key, version, title, nodes and transitions."]
        )
    try:
        canonical_bytes(document)
    except CanonicalError as exc:
        raise DefinitionInvalid([str(exc)]) from None
    problems = _header_problems(document)
    nodes, unusable = _collect_nodes(document.get("nodes"), problems, registry)
    outgoing, incoming = _collect_transitions(
        document.get("transitions"), nodes, unusable, problems
    )
    if not unusable:
        check_graph(nodes, outgoing, incoming, problems)
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


def _header_problems(document: dict[str, Any]) -> list[str]:
    problems = [
        f"{extra[:80]!r} is not a field of a definition."
        for extra in sorted(set(document) - FIELDS)
    ]
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
    if "variables" in document and not isinstance(document["variables"], dict):
        problems.append(
            "'variables' must be a JSON Schema object (the start variables are an object); "
            "leave it out to accept any variables."
        )
    elif "variables" in document:
        problem = schema_problem(document["variables"])
        if problem:
            problems.append(f"'variables' is not a valid JSON Schema: {problem}")
    if "case_fields" in document:
        check_case_fields(document["case_fields"], problems)
    return problems


def _collect_nodes(raw_nodes: Any, problems: list[str], registry: ActionRegistry | None):
    """The usable nodes by id, and the ids of nodes whose type is unknown.

    Those are already reported, so transitions touching them are not called dangling and
    the graph is not judged (it would only repeat the same problem).
    """
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
    unusable: set[str] = set()
    for index, node in enumerate(raw_nodes):
        node_id = check_node(node, index, problems, registry)
        if node_id is None:
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                unusable.add(node["id"])
            continue
        if node_id in nodes:
            problems.append(f"node '{node_id}': the id is used twice.")
        nodes[node_id] = node
    return nodes, unusable


def _collect_transitions(raw: Any, nodes, unusable: set[str], problems: list[str]):
    outgoing: dict[str, list[Transition]] = defaultdict(list)
    incoming: dict[str, list[Transition]] = defaultdict(list)
    if not isinstance(raw, list):
        problems.append('\'transitions\' must be a list of {"from", "to"} objects.')
        raw = []
    elif len(raw) > MAX_TRANSITIONS:
        problems.append(
            f"'transitions' has {len(raw)} transitions; a definition may have "
            f"at most {MAX_TRANSITIONS}."
        )
        raise DefinitionInvalid(problems)
    for index, item in enumerate(raw):
        transition = _transition(f"transitions[{index}]", item, nodes, unusable, problems)
        if transition is not None:
            outgoing[transition.source].append(transition)
            incoming[transition.target].append(transition)
    return outgoing, incoming


def _transition(where: str, item: Any, nodes, unusable: set[str], problems: list[str]):
    if (
        not isinstance(item, dict)
        or not {"from", "to"} <= set(item)
        or not set(item) <= {"from", "to", "when", "default"}
    ):
        problems.append(
            f'{where}: a transition is {{"from", "to"}} with an optional '
            "'when' condition or 'default': true."
        )
        return None
    source, target = item["from"], item["to"]
    if "default" in item and not isinstance(item["default"], bool):
        problems.append(f"{where}: 'default' must be true or false, not {item['default']!r}.")
    for end, name in (("from", source), ("to", target)):
        if not (isinstance(name, str) and (name in nodes or name in unusable)):
            problems.append(
                f"{where}: '{end}' names {name!r}, which is not a node (dangling transition)."
            )
    if not (isinstance(source, str) and isinstance(target, str)):
        return None
    if source not in nodes or target not in nodes:
        return None
    transition = Transition(source, target, item.get("when"), item.get("default") is True)
    if transition.when is not None:
        check_condition(f"{where} ({source} → {target})", transition.when, problems)
    return transition
