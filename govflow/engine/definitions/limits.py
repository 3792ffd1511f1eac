"""The patterns and bounds a definition is checked against."""

from __future__ import annotations

import datetime as dt
import re

KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+\Z")
NODE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,99}\Z")
# Django's columns: an app label and a codename of at most 100 characters each.
PERMISSION = re.compile(r"^[a-z_][a-z0-9_]{0,99}\.[a-z_][a-z0-9_]{0,99}\Z")
VAR_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z0-9_]{1,100}){0,31}\Z")
# An external task's topic: what a worker fetches, and the API scope ``tasks:<topic>``.
TOPIC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
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
# How often an external task may fail transiently before it is dead-lettered.
MAX_TASK_RETRIES = 100
DEFAULT_TASK_RETRIES = 3

# When a compensation runs (an action node's "compensate_on"): any of the first two, or
# only by an operator.
COMPENSATE_ON = ("cancel", "failure", "operator")

# What a linked run's failure does: the step fails (the instance with it), or it completes
# with {"state": "failed", "reason_code": …} for a gateway after it to route on.
LINKED_ON_FAILURE = ("fail", "continue")

# Node type → (required fields, optional fields), besides "id", "type" and "title".
NODE_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "start": (set(), set()),
    "end": (set(), set()),
    "action": ({"action"}, {"input", "output", "backup_ref", "approval_ref", "compensate_on"}),
    "external": ({"topic"}, {"input", "output"}),
    "external_task": ({"topic"}, {"input", "output", "output_schema", "retries"}),
    "timer": (set(), {"duration", "at"}),
    "trigger": ({"message", "correlation"}, {"output"}),
    "approval": ({"permission"}, {"output"}),
    "linked_run": ({"run_provider"}, {"input", "output", "on_failure"}),
    "exclusive": (set(), set()),
    "parallel_split": (set(), set()),
    "parallel_join": (set(), set()),
}
CONTROL = {"start", "end", "exclusive", "parallel_split", "parallel_join"}
# Nodes a token passes straight through (the router follows them at once).
PASS_THROUGH = {"exclusive", "parallel_split", "parallel_join"}
