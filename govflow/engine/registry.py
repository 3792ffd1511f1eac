"""The provider registry: module actions that providers register from their own apps.

Like ``AdminSite.register``: a registration is validated when it is made and fails
loudly; duplicates are refused; once every app is ready the registry is frozen, so what a
worker runs is exactly what ``manage.py check`` audited. Tests swap actions in and out
with :meth:`ActionRegistry.override`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from django.apps import apps

from recovery.api import RecoveryMode, schema_pattern_problem

from .outputs import check_output_schema
from .results import ActionContext, Result

__all__ = [
    "ActionDefinition",
    "ActionRegistry",
    "Compensate",
    "RegistryError",
    "RegistryFrozen",
    "VerificationCheck",
    "registry",
]

NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+\Z")
CHECK_ID = re.compile(r"^[a-z][a-z0-9_-]{0,63}\Z")


class RegistryError(ValueError):
    """A malformed or duplicate action registration."""


class RegistryFrozen(RegistryError):
    """An action was registered after all apps were ready."""


@dataclass(frozen=True)
class VerificationCheck:
    """A step an operator follows to find out whether an uncertain effect happened.

    ``automatic``, when given, is called with the :class:`ActionContext` (phase
    ``reconcile``) whenever the engine asks the provider about an uncertain step, and
    returns a short finding, kept as evidence and shown beside the instruction; it never
    decides on its own.
    """

    id: str
    instruction: str
    automatic: Callable[[ActionContext], str] | None = None


COMPENSATION_APPROVALS = ("automatic", "operator")
SOURCE = re.compile(r"^(input|output)(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")


@dataclass(frozen=True)
class Compensate:
    """How to undo a succeeded effect of an action: another registered action.

    ``input`` maps each input field of the compensating ``action`` to a dotted path into
    the original's ``input`` or ``output`` (``"output.payment_reference"``), or to
    ``{"value": literal}``. ``approval`` is ``"automatic"`` (it runs as soon as the
    definition's trigger asks) or ``"operator"`` (one person requests it, another
    approves it). The compensating action must be ``non_atomic`` (docs/compensation.md).
    A compensating action that answers ``Pending`` is polled like any action, at most
    ``poll_budget`` times; past it the compensation's outcome is unknown (a handoff).
    """

    action: str
    input: Mapping[str, Any]
    approval: str = "automatic"
    poll_budget: int = 20


@dataclass(frozen=True)
class ActionDefinition:
    """One module action, as a provider declares it.

    ``name`` is namespaced (``demo.register_application``) and persisted: never rename or
    reuse one. ``execute`` returns a :class:`~govflow.engine.results.Result`; ``poll``
    answers a pending provider; ``reconcile`` looks the effect up by idempotency key and
    returns a conclusive result or :class:`~govflow.engine.results.Unknown`.

    ``output_schema`` (optional) is the JSON Schema of the output a success returns: a
    success whose output fails it is an unknown outcome (the effect happened, the answer
    cannot be used), and an operator confirming an uncertain effect supplies the values
    it describes (``govflow.engine.outputs``).
    """

    name: str
    recovery_mode: str
    title: str
    input_schema: Mapping[str, Any]
    preview: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    execute: Callable[[ActionContext], Result]
    checks: tuple[VerificationCheck, ...] = ()
    poll: Callable[[ActionContext], Result] | None = None
    reconcile: Callable[[ActionContext], Result] | None = None
    retry_budget: int = 3
    retry_backoff: float = 2.0
    output_schema: Mapping[str, Any] | None = None
    reconcile_settles: bool = False
    """Whether ``reconcile``'s conclusive answer settles an ``outcome_unknown`` step by
    itself (the provider's authority, recorded as such). False: it is kept as a finding
    that pre-fills the operator's decision, which a second person approves."""
    reconcile_budget: int = 5
    """How many times the engine asks ``reconcile`` (and the automatic checks) by itself."""
    reconcile_backoff: float = 5.0
    """Seconds before the second ask; each later ask waits twice as long."""
    compensate: Compensate | None = None
    """The action that undoes a succeeded effect of this one, if any (docs/compensation.md)."""
    module: str = field(default="", compare=False)

    @property
    def asks_provider(self) -> bool:
        """Whether an uncertain step of this action is put to its provider first."""
        return self.reconcile is not None or any(c.automatic for c in self.checks)

    @property
    def gated_by(self) -> str | None:
        """The node field an action of this mode must pin, if any (invariant I6)."""
        return {
            RecoveryMode.SNAPSHOT_RESTORE: "backup_ref",
            RecoveryMode.IRREVERSIBLE: "approval_ref",
        }.get(self.recovery_mode)


def validate_action(action: ActionDefinition) -> None:
    where = f"Action {action.name!r}"
    if not isinstance(action.name, str) or not NAME.match(action.name):
        raise RegistryError(
            f"Action name {action.name!r} must be namespaced lowercase words separated by "
            "dots, e.g. 'permits.register_application'."
        )
    if action.recovery_mode not in RecoveryMode.values:
        raise RegistryError(
            f"{where}: recovery_mode must be one of "
            f"{', '.join(RecoveryMode.values)}, not {action.recovery_mode!r}."
        )
    if not action.title or not isinstance(action.title, str):
        raise RegistryError(f"{where}: give it a title an operator can read.")
    for attr in ("preview", "execute"):
        if not callable(getattr(action, attr)):
            raise RegistryError(f"{where}: {attr} must be callable.")
    for attr in ("poll", "reconcile"):
        value = getattr(action, attr)
        if value is not None and not callable(value):
            raise RegistryError(f"{where}: {attr} must be callable or None.")
    if not isinstance(action.input_schema, Mapping):
        raise RegistryError(f"{where}: input_schema must be a JSON Schema object.")
    try:
        jsonschema.Draft202012Validator.check_schema(action.input_schema)
    except jsonschema.SchemaError as exc:
        raise RegistryError(
            f"{where}: input_schema is not a valid JSON Schema: {exc.message}"
        ) from None
    patterns = schema_pattern_problem(action.input_schema)
    if patterns:
        raise RegistryError(f"{where}: input_schema: {patterns}")
    if action.output_schema is not None:
        problem = check_output_schema(action.output_schema)
        if problem:
            raise RegistryError(f"{where}: {problem}")
    _validate_checks(action, where)
    if not isinstance(action.retry_budget, int) or not 0 <= action.retry_budget <= 100:
        raise RegistryError(f"{where}: retry_budget must be an integer from 0 to 100.")
    if not 0 < float(action.retry_backoff) <= 3600:
        raise RegistryError(f"{where}: retry_backoff must be in (0, 3600] seconds.")
    _validate_reconcile(action, where)
    _validate_compensate(action, where)


def _validate_compensate(action: ActionDefinition, where: str) -> None:
    """The declaration's own shape; whether its action is registered (and non-atomic) is
    checked by ``manage.py check`` and when a definition naming it is parsed."""
    spec = action.compensate
    if spec is None:
        return
    if not isinstance(spec, Compensate):
        raise RegistryError(f"{where}: compensate must be a Compensate(action=..., input=...).")
    if not isinstance(spec.action, str) or not NAME.match(spec.action):
        raise RegistryError(
            f"{where}: compensate.action {spec.action!r} must name another action, "
            "e.g. 'permits.refund_fee'."
        )
    if spec.action == action.name:
        raise RegistryError(f"{where}: an action cannot compensate itself.")
    if spec.approval not in COMPENSATION_APPROVALS:
        raise RegistryError(
            f"{where}: compensate.approval must be 'automatic' or 'operator', "
            f"not {spec.approval!r}."
        )
    if not isinstance(spec.poll_budget, int) or not 0 <= spec.poll_budget <= 1000:
        raise RegistryError(f"{where}: compensate.poll_budget must be an integer from 0 to 1000.")
    if not isinstance(spec.input, Mapping) or not spec.input:
        raise RegistryError(
            f"{where}: compensate.input maps the compensating action's input fields to "
            "'input.<field>' or 'output.<field>' of the original (or {'value': literal})."
        )
    for name, source in spec.input.items():
        literal = isinstance(source, Mapping) and set(source) == {"value"}
        if not literal and not (isinstance(source, str) and SOURCE.match(source)):
            raise RegistryError(
                f"{where}: compensate.input {name!r} must be 'input.<field>' or "
                f"'output.<field>' of the original, or {{'value': literal}}; not {source!r}."
            )


def compensation_problem(action: ActionDefinition, lookup) -> str:
    """Why ``action``'s compensation cannot run with the actions ``lookup`` finds, or ""."""
    spec = action.compensate
    if spec is None:
        return f"action {action.name!r} declares no compensating action (compensate=...)"
    target = lookup(spec.action)
    if target is None:
        return (
            f"action {action.name!r} is compensated by {spec.action!r}, which no installed "
            "provider registers"
        )
    if target.recovery_mode != RecoveryMode.NON_ATOMIC:
        return (
            f"action {action.name!r} is compensated by {spec.action!r}, which is "
            f"{target.recovery_mode}; a compensating action must be non_atomic"
        )
    return ""


def _validate_checks(action: ActionDefinition, where: str) -> None:
    seen: set[str] = set()
    for check in action.checks:
        if not isinstance(check, VerificationCheck) or not CHECK_ID.match(check.id):
            raise RegistryError(
                f"{where}: each check is a VerificationCheck with an id of "
                "lowercase letters, digits, '-' or '_'."
            )
        if check.id in seen:
            raise RegistryError(f"{where}: check id {check.id!r} appears twice.")
        if not check.instruction.strip():
            raise RegistryError(f"{where}: check {check.id!r} needs an instruction.")
        seen.add(check.id)
    if action.recovery_mode != RecoveryMode.ATOMIC and not action.checks:
        raise RegistryError(
            f"{where}: a {action.recovery_mode} action needs at least one verification check, "
            "so an operator can find out whether an uncertain effect happened."
        )


def _validate_reconcile(action: ActionDefinition, where: str) -> None:
    if not isinstance(action.reconcile_settles, bool):
        raise RegistryError(f"{where}: reconcile_settles must be True or False.")
    if action.reconcile_settles and action.reconcile is None:
        raise RegistryError(
            f"{where}: reconcile_settles=True needs a reconcile hook whose answer can settle."
        )
    if not isinstance(action.reconcile_budget, int) or not 0 <= action.reconcile_budget <= 50:
        raise RegistryError(f"{where}: reconcile_budget must be an integer from 0 to 50.")
    if not 0 < float(action.reconcile_backoff) <= 3600:
        raise RegistryError(f"{where}: reconcile_backoff must be in (0, 3600] seconds.")
    for check in action.checks:
        if check.automatic is not None and not callable(check.automatic):
            raise RegistryError(f"{where}: check {check.id!r}'s automatic must be callable.")


class ActionRegistry:
    def __init__(self) -> None:
        self._actions: dict[str, ActionDefinition] = {}
        self._lock = threading.Lock()
        self._overriding = 0
        self.generation = 0
        """Changes with every registration or override: results derived from the set of
        registered actions (e.g. whether a definition resolves) are cached by it."""

    def register(self, action: ActionDefinition) -> ActionDefinition:
        """Validate and add ``action``; call it from your app's ``AppConfig.ready()``."""
        validate_action(action)
        with self._lock:
            if apps.ready and not self._overriding:
                raise RegistryFrozen(
                    f"Action {action.name!r} was registered after all apps were ready. "
                    "Register actions in your app's AppConfig.ready()."
                )
            existing = self._actions.get(action.name)
            if existing is not None:
                raise RegistryError(
                    f"Action {action.name!r} is already registered"
                    f" by {existing.module or 'another app'}. Action names are global and "
                    "never reused: choose another namespace."
                )
            self._actions[action.name] = action
            self.generation += 1
        return action

    def get(self, name: str) -> ActionDefinition | None:
        return self._actions.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._actions

    def all(self) -> list[ActionDefinition]:
        return sorted(self._actions.values(), key=lambda a: a.name)

    @contextlib.contextmanager
    def override(self, *actions: ActionDefinition, remove: tuple[str, ...] = ()) -> Iterator[None]:
        """Temporarily register ``actions`` and hide ``remove`` (for tests)."""
        with self._lock:
            saved = dict(self._actions)
            self._overriding += 1
        try:
            for name in remove:
                self._actions.pop(name, None)
            self.generation += 1
            for action in actions:
                self._actions.pop(action.name, None)
                self.register(action)
            yield
        finally:
            with self._lock:
                self._actions = saved
                self._overriding -= 1
                self.generation += 1


registry = ActionRegistry()
