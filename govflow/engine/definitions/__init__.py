"""Workflow definitions: parse and validate the JSON document (no database here).

A definition is ``{"key", "version", "title", "nodes", "transitions"}`` plus an optional
``variables`` JSON Schema for the variables an instance starts with. Validation collects
every problem, each naming the node or transition and what to fix, so an author fixes a
file in one pass. ``docs/definitions.md`` describes the format.

The package's parts: ``limits`` (patterns and bounds), ``schemas`` (JSON Schema checks),
``nodes`` (one node's fields, per type), ``graph`` (the graph as a whole) and
``document`` (the document, and :func:`parse_definition`). Import from the package.
"""

from __future__ import annotations

from .case import case_text, case_values
from .document import DefinitionInvalid, Spec, Transition, definition_fingerprint, parse_definition
from .limits import (
    KEY,
    MAX_GATEWAY_CHAIN,
    MAX_KEY,
    MAX_NODES,
    MAX_TIMER,
    MAX_TITLE,
    MAX_TRANSITIONS,
    MAX_VERSION,
    NODE_FIELDS,
    NODE_ID,
    TOPIC,
)
from .schemas import schema_errors, schema_problem

__all__ = [
    "KEY",
    "MAX_GATEWAY_CHAIN",
    "MAX_KEY",
    "MAX_NODES",
    "MAX_TIMER",
    "MAX_TITLE",
    "MAX_TRANSITIONS",
    "MAX_VERSION",
    "NODE_FIELDS",
    "NODE_ID",
    "TOPIC",
    "DefinitionInvalid",
    "Spec",
    "Transition",
    "case_text",
    "case_values",
    "definition_fingerprint",
    "parse_definition",
    "schema_errors",
    "schema_problem",
]
