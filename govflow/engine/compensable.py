"""What a compensation is built from: a compensable effect's input and output, kept.

When a step whose action declares ``compensate=`` completes, its input and output are kept
beside the instance (the engine's rows hold raw values, like its variables; the ledger
holds only their fingerprints). A compensation's input is built from them by the
declaration's mapping, and only after both are proved to be exactly what the ledger
recorded for the original (its ``input_fp`` and ``result_fp``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from django.db import models
from django.db.models.functions import Now

from recovery.api import FingerprintKind, fingerprint_value

from .registry import Compensate, registry
from .variables import MissingVariable, build_input, lookup

__all__ = ["CompensableEffect", "compensable_keep", "compensation_input", "source_problem"]


class CompensableEffect(models.Model):
    """The input and output of one succeeded step whose action can be compensated."""

    instance = models.ForeignKey(
        "engine.Instance", on_delete=models.CASCADE, related_name="compensable_effects"
    )
    operation_key = models.CharField(max_length=80, unique=True)
    step_id = models.CharField(max_length=200)
    input = models.JSONField()
    output = models.JSONField()
    recorded_at = models.DateTimeField()

    class Meta:
        db_table = "engine_compensable_effect"

    def __str__(self) -> str:
        return f"{self.step_id} ({self.operation_key[:15]}…)"


def compensable_keep(
    run, token, node: Mapping[str, Any], output: Mapping[str, Any], *, key: str | None = None
) -> None:
    """Keep a completing step's input and output if its action can be compensated.

    Needs the caller's commit, and runs before the output reaches the variables (so the
    input is rebuilt from the variables the step was dispatched with). ``key`` is the
    operation that succeeded when the token does not carry it yet (an atomic step).
    """
    action = registry.get(node.get("action", ""))
    key = key or token.operation_key
    if action is None or action.compensate is None or not key:
        return
    try:
        input_value = build_input(node.get("input", {}), run.variables)
    except MissingVariable:
        return  # it could not have been dispatched with this input; nothing to keep
    CompensableEffect.objects.update_or_create(
        operation_key=key,
        defaults={
            "instance_id": run.instance.pk,
            "step_id": token.node_id,
            "input": input_value,
            "output": dict(output),
            "recorded_at": Now(),
        },
    )


def source_problem(effect: CompensableEffect | None, original) -> str:
    """Why the kept input and output are not provably the original's, or "" (reads)."""
    if effect is None:
        return "its input and output were not kept when it completed"
    if fingerprint_value(FingerprintKind.INPUT, effect.input) != original.input_fp:
        return "the kept input is not the input the ledger recorded for it"
    result_fp = getattr(original, "result_fp", "")
    if result_fp and fingerprint_value(FingerprintKind.RESULT, effect.output) != result_fp:
        return "the kept output is not the result the ledger recorded for it"
    return ""


def compensation_input(spec: Compensate, effect: CompensableEffect) -> dict[str, Any]:
    """The compensating action's input, built by ``spec``'s mapping (pure).

    Raises :class:`MissingVariable` naming the path the original lacks.
    """
    source = {"input": effect.input, "output": effect.output}
    result: dict[str, Any] = {}
    for name, path in spec.input.items():
        value = path["value"] if isinstance(path, Mapping) else lookup(source, path)
        result[name] = copy.deepcopy(value)
    return result
