"""Run providers: modules whose runs a workflow starts and then watches (linked runs).

A ``linked_run`` node starts a run in another module and waits for it to conclude. The
other module keeps its own recovery boundary: GovFlow records a ledger operation for the
start only (the normal dispatch protocol, with the provider's idempotency key) and then
asks for the run's descriptor, never deciding its outcome. A provider registers a
:class:`RunProvider` from its ``AppConfig.ready()`` like an action
(``govflow.engine.provider.register_run_provider``); ``docs/linked-runs.md`` says what
each part means.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps

from recovery.api import RecoveryMode

from .registry import (
    NAME,
    ActionDefinition,
    RegistryError,
    RegistryFrozen,
    VerificationCheck,
    validate_action,
)
from .registry import registry as action_registry
from .results import ActionContext, Succeeded, Unknown

__all__ = [
    "CONCLUSIVE",
    "RunDescriptor",
    "RunProvider",
    "RunProviderRegistry",
    "resolve_action",
    "run_providers",
    "start_action",
    "step_action",
]

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
UNKNOWN_PUBLICATION = "unknown_publication"
STATES = (RUNNING, SUCCEEDED, FAILED, UNKNOWN_PUBLICATION)
CONCLUSIVE = (SUCCEEDED, FAILED)

RUN_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "run": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "title": "Run reference",
            "description": "The reference the other module gave the run, as it shows it.",
        }
    },
    "required": ["run"],
}
"""What a started run returns: its reference (and what an operator confirming an
uncertain start enters)."""


@dataclass(frozen=True)
class RunDescriptor:
    """What the other module says about one run.

    ``state`` is ``running``, ``succeeded`` (with ``outputs``, JSON), ``failed`` (with a
    short ``reason_code``) or ``unknown_publication`` (the module itself does not know
    whether its effect happened; it settles that by its own reconcile). ``note`` is a
    short text for operators.
    """

    state: str
    outputs: Mapping[str, Any] = field(default_factory=dict)
    reason_code: str = ""
    note: str = ""

    @property
    def conclusive(self) -> bool:
        return self.state in CONCLUSIVE

    def fact(self) -> dict[str, Any]:
        """The descriptor as compared and fingerprinted: what makes it conclusive."""
        if self.state == SUCCEEDED:
            return {"state": self.state, "outputs": dict(self.outputs)}
        if self.state == FAILED:
            return {"state": self.state, "reason_code": self.reason_code}
        return {"state": self.state}


@dataclass(frozen=True)
class RunProvider:
    """A module whose runs a ``linked_run`` node starts.

    ``start(context)`` starts a run for ``context.idempotency_key`` (the same key again
    returns the same run) and returns its reference. ``describe(run)`` returns a
    :class:`RunDescriptor` and must not change anything. ``cancel(run)`` asks the module to
    stop the run (its answer is its own). ``find(context)``, optional, looks a run up by
    idempotency key after an uncertain start: a reference, or None when it cannot tell —
    the module's answer settles the start (it is authoritative about its own runs).
    """

    name: str
    title: str
    input_schema: Mapping[str, Any]
    preview: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    start: Callable[[ActionContext], str]
    describe: Callable[[str], RunDescriptor]
    cancel: Callable[[str], Any]
    checks: tuple[VerificationCheck, ...] = ()
    find: Callable[[ActionContext], str | None] | None = None
    poll_backoff: float = 5.0
    """Seconds before the first look at the run; each later one waits twice as long."""
    poll_max_delay: float = 900.0
    """The longest wait between two looks."""
    poll_budget: int = 200
    """How many looks before the step stops and asks a person (an engine incident)."""
    module: str = field(default="", compare=False)


def validate_run_provider(provider: RunProvider) -> None:
    where = f"Run provider {provider.name!r}"
    if not isinstance(provider.name, str) or not NAME.match(provider.name):
        raise RegistryError(
            f"Run provider name {provider.name!r} must be namespaced lowercase words "
            "separated by dots, e.g. 'dataflow.publication'."
        )
    for attr in ("preview", "start", "describe", "cancel"):
        if not callable(getattr(provider, attr)):
            raise RegistryError(f"{where}: {attr} must be callable.")
    if provider.find is not None and not callable(provider.find):
        raise RegistryError(f"{where}: find must be callable or None.")
    if not 0 < float(provider.poll_backoff) <= 3600:
        raise RegistryError(f"{where}: poll_backoff must be in (0, 3600] seconds.")
    if not float(provider.poll_backoff) <= float(provider.poll_max_delay) <= 86400:
        raise RegistryError(f"{where}: poll_max_delay must be from poll_backoff to 86400 s.")
    if not isinstance(provider.poll_budget, int) or not 1 <= provider.poll_budget <= 10000:
        raise RegistryError(f"{where}: poll_budget must be an integer from 1 to 10000.")
    # The start is an effect like an action's: the same checks apply to it.
    validate_action(start_action(provider))


def start_action(provider: RunProvider) -> ActionDefinition:
    """The start of ``provider``'s runs as the engine dispatches it: a non-atomic action
    named like the provider, whose success is the run's reference."""

    def execute(context: ActionContext):
        return Succeeded({"run": str(provider.start(context))})

    def reconcile(context: ActionContext):
        found = provider.find(context) if provider.find else None
        if not found:
            return Unknown("the other module finds no run for this idempotency key")
        return Succeeded({"run": str(found)})

    return ActionDefinition(
        name=provider.name,
        recovery_mode=RecoveryMode.NON_ATOMIC,
        title=f"Start: {provider.title}",
        input_schema=provider.input_schema,
        preview=provider.preview,
        execute=execute,
        checks=provider.checks,
        reconcile=reconcile if provider.find else None,
        reconcile_settles=provider.find is not None,
        retry_budget=3,
        output_schema=RUN_OUTPUT_SCHEMA,
        module=provider.module,
    )


class RunProviderRegistry:
    """Run providers by name: validated, no duplicates, frozen once apps are ready."""

    def __init__(self) -> None:
        self._providers: dict[str, RunProvider] = {}
        self._starts: dict[str, ActionDefinition] = {}
        self._lock = threading.Lock()
        self._overriding = 0

    def register(self, provider: RunProvider) -> RunProvider:
        """Validate and add ``provider``; call it from your app's ``AppConfig.ready()``."""
        validate_run_provider(provider)
        with self._lock:
            if apps.ready and not self._overriding:
                raise RegistryFrozen(
                    f"Run provider {provider.name!r} was registered after all apps were "
                    "ready. Register it in your app's AppConfig.ready()."
                )
            if provider.name in self._providers or provider.name in action_registry:
                raise RegistryError(
                    f"{provider.name!r} is already registered (as a run provider or an "
                    "action). Names are global and never reused: choose another."
                )
            self._providers[provider.name] = provider
            self._starts[provider.name] = start_action(provider)
            # Whether a definition resolves is cached by the set of registrations.
            action_registry.generation += 1
        return provider

    def get(self, name: str) -> RunProvider | None:
        return self._providers.get(name)

    def start_of(self, name: str) -> ActionDefinition | None:
        return self._starts.get(name)

    def all(self) -> list[RunProvider]:
        return sorted(self._providers.values(), key=lambda p: p.name)

    @contextlib.contextmanager
    def override(self, *providers: RunProvider) -> Iterator[None]:
        """Temporarily register ``providers`` (for tests)."""
        with self._lock:
            saved = (dict(self._providers), dict(self._starts))
            self._overriding += 1
        try:
            for provider in providers:
                self._providers.pop(provider.name, None)
                self._starts.pop(provider.name, None)
                self.register(provider)
            yield
        finally:
            with self._lock:
                self._providers, self._starts = saved
                self._overriding -= 1
                action_registry.generation += 1


run_providers = RunProviderRegistry()


def resolve_action(name: str) -> ActionDefinition | None:
    """A module action, or a run provider's start, by the name a definition pins."""
    return action_registry.get(name) or run_providers.start_of(name)


def step_action(node: Mapping[str, Any]) -> ActionDefinition | None:
    """The action a node's step dispatches: a module action, or a linked run's start."""
    if node.get("type") == "linked_run":
        return run_providers.start_of(str(node.get("run_provider", "")))
    return action_registry.get(str(node.get("action", "")))
