"""One node of a definition: its fields, checked per node type (no database here)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.utils.dateparse import parse_datetime, parse_duration

from ..linked import run_providers
from ..registry import ActionRegistry, compensation_problem
from ..waitkeys import MESSAGE_MAX
from .limits import (
    COMPENSATE_ON,
    LINKED_ON_FAILURE,
    MAX_TASK_RETRIES,
    MAX_TIMER,
    NODE_FIELDS,
    NODE_ID,
    OPS,
    PERMISSION,
    TOPIC,
    VAR_PATH,
)
from .schemas import schema_problem

Problems = list[str]


def check_node(node: Any, index: int, problems: Problems, registry: ActionRegistry | None):
    """Check one node; return its id, or None when it is unusable (already reported)."""
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
    _check_fields(where, kind, node, problems)
    check = _KIND_CHECKS.get(kind)
    if check is not None:
        check(where, node, problems, registry)
    return node_id


def _check_fields(where: str, kind: str, node: dict[str, Any], problems: Problems) -> None:
    required, optional = NODE_FIELDS[kind]
    present = set(node) - {"id", "type", "title"}
    for missing in sorted(required - present):
        problems.append(f"{where}: a {kind} node needs '{missing}'.")
    for extra in sorted(present - required - optional):
        problems.append(f"{where}: '{extra}' is not a field of a {kind} node.")
    for name in ("input", "output"):
        if name in node:
            _check_mapping(where, name, node[name], problems)


def _check_mapping(where: str, name: str, value: Any, problems: Problems) -> None:
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


def _check_action(where: str, node: dict, problems: Problems, registry) -> None:
    name = node.get("action")
    if "action" in node and not (isinstance(name, str) and name):
        problems.append(
            f"{where}: 'action' must be the name of a registered action, such as "
            "'permits.register_application'."
        )
    if "compensate_on" in node:
        _check_compensate_on(where, node["compensate_on"], problems)
    if not isinstance(name, str) or registry is None:
        return
    action = registry.get(name)
    if action is None:
        problems.append(
            f"{where}: no installed provider registers action "
            f"{name!r}. Install its module or fix the name."
        )
    elif action.gated_by and not (
        isinstance(node.get(action.gated_by), str) and node[action.gated_by].strip()
    ):
        problems.append(
            f"{where}: action {action.name!r} is {action.recovery_mode} and "
            f"needs a pinned '{action.gated_by}' on the node."
        )
    if action is not None and "compensate_on" in node:
        problem = compensation_problem(action, registry.get)
        if problem:
            problems.append(f"{where}: 'compensate_on' is set, but {problem}.")


def _check_compensate_on(where: str, value: Any, problems: Problems) -> None:
    """``compensate_on``: a list of "cancel" and/or "failure", or ["operator"] alone."""
    if (
        not isinstance(value, list)
        or not value
        or len(set(map(str, value))) != len(value)
        or any(item not in COMPENSATE_ON for item in value)
        or ("operator" in value and len(value) > 1)
    ):
        problems.append(
            f'{where}: \'compensate_on\' must be a list of "cancel" and/or "failure" (when '
            'the compensation runs by itself), or ["operator"] (only an operator starts it); '
            f"not {value!r}."
        )


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


def _check_timer(where: str, node: dict, problems: Problems, registry) -> None:
    has = [f for f in ("duration", "at") if f in node]
    if len(has) != 1:
        problems.append(
            f"{where}: a timer needs exactly one of 'duration' (ISO 8601, e.g. "
            "PT10M) or 'at' (ISO 8601 date-time with a UTC offset)."
        )
    elif has == ["duration"]:
        _check_duration(where, node["duration"], problems)
    else:
        moment = _moment(node["at"])
        if moment is None or moment.tzinfo is None:
            problems.append(
                f"{where}: 'at' {node['at']!r} must be an ISO 8601 date-time "
                "with a UTC offset, e.g. 2027-01-31T09:00:00+01:00."
            )


def _check_duration(where: str, duration: Any, problems: Problems) -> None:
    parsed = _duration(duration)
    # parse_duration also takes "P" and "PT" (zero) and non-ISO forms: refuse them.
    if (
        parsed is None
        or not str(duration).startswith("P")
        or str(duration)[-1] in "PT"
        or parsed.total_seconds() < 0
    ):
        problems.append(
            f"{where}: duration {duration!r} is not an ISO 8601 duration such as PT30S or P2D."
        )
    elif parsed > MAX_TIMER:
        problems.append(
            f"{where}: duration {duration!r} is longer than 100 "
            "years; use an 'at' date-time if you really mean it."
        )


def _check_trigger(where: str, node: dict, problems: Problems, registry) -> None:
    message = node.get("message")
    if (
        not isinstance(message, str)
        or not message.strip()
        or len(message) > MESSAGE_MAX
        or not message.isprintable()
    ):
        problems.append(
            f"{where}: 'message' must be a message name of 1 to {MESSAGE_MAX} printable "
            "characters (a delivery carries at most that many)."
        )
    if not isinstance(node.get("correlation"), str) or not VAR_PATH.match(
        node.get("correlation") or ""
    ):
        problems.append(
            f"{where}: 'correlation' must be the variable path whose value "
            "identifies the awaited message."
        )


def _check_external(where: str, node: dict, problems: Problems, registry) -> None:
    if not isinstance(node.get("topic"), str) or not node["topic"]:
        problems.append(f"{where}: 'topic' must be a non-empty topic name.")


def _check_external_task(where: str, node: dict, problems: Problems, registry) -> None:
    topic = node.get("topic")
    if "topic" in node and not (isinstance(topic, str) and TOPIC.match(topic)):
        problems.append(
            f"{where}: 'topic' must be 1 to 100 letters, digits, '.', '_' or '-', starting "
            f"with a letter or digit (workers fetch by it; a key needs 'tasks:<topic>')."
        )
    if "output_schema" in node:
        problem = schema_problem(node["output_schema"])
        if problem:
            problems.append(f"{where}: 'output_schema' is not a valid JSON Schema: {problem}")
    retries = node.get("retries", 0)
    if type(retries) is not int or not 0 <= retries <= MAX_TASK_RETRIES:
        problems.append(
            f"{where}: 'retries' must be a whole number from 0 to {MAX_TASK_RETRIES} (how "
            "often a worker may fail the task transiently before it is dead-lettered)."
        )


def _check_approval(where: str, node: dict, problems: Problems, registry) -> None:
    if not PERMISSION.match(str(node.get("permission", ""))):
        problems.append(
            f"{where}: 'permission' must be 'app_label.codename' (lowercase letters, digits "
            "and '_', each part at most 100 characters)."
        )


def _check_linked_run(where: str, node: dict, problems: Problems, registry) -> None:
    name = node.get("run_provider")
    if "run_provider" in node and not (isinstance(name, str) and name):
        problems.append(
            f"{where}: 'run_provider' must be the name of a registered run provider, such "
            "as 'dataflow.publication'."
        )
    elif isinstance(name, str) and registry is not None and run_providers.get(name) is None:
        known = ", ".join(p.name for p in run_providers.all()) or "none is installed"
        problems.append(
            f"{where}: no installed module registers the run provider {name!r} (known: "
            f"{known}). Install the module that runs it, or fix the name."
        )
    if "on_failure" in node and node["on_failure"] not in LINKED_ON_FAILURE:
        problems.append(
            f"{where}: 'on_failure' must be \"fail\" (the step fails, and the instance "
            'with it) or "continue" (the step completes with {"state": "failed", '
            '"reason_code": …} for a gateway to route on); '
            f"not {node['on_failure']!r}."
        )


_KIND_CHECKS: dict[str, Callable[[str, dict, Problems, Any], None]] = {
    "action": _check_action,
    "timer": _check_timer,
    "trigger": _check_trigger,
    "external": _check_external,
    "external_task": _check_external_task,
    "approval": _check_approval,
    "linked_run": _check_linked_run,
}


def check_condition(where: str, cond: Any, problems: Problems) -> None:
    """Check a transition's ``when`` condition (data, never code)."""
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
            check_condition(where, item, problems)
        return
    if set(cond) == {"not"}:
        check_condition(where, cond["not"], problems)
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
