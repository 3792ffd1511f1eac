"""Forms of the operator's pages of instances: start, cancel, approve, decide, migrate.

Forms only parse what an operator typed or uploaded into the values a service takes; the
services decide what is allowed and say why not.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.template.defaultfilters import filesizeformat
from django.utils.translation import gettext as _

from govflow.engine.limits import payload_max_bytes, variables_max_bytes
from govflow.engine.models import Definition
from govflow.engine.outputs import ResultField
from govflow.engine.selectors import definitions_published
from recovery.api import (
    BINARY_TYPES,
    TEXT_TYPES,
    CanonicalError,
    DecisionKind,
    MultipleFileField,
    evidence_max_bytes,
    evidence_max_total_bytes,
    parse_json,
)


class DefinitionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Definition) -> str:
        return f"{obj.key} v{obj.version} — {obj.title}"


class InstanceStartForm(forms.Form):
    definition = DefinitionChoiceField(
        queryset=definitions_published(),
        label="Definition",
        empty_label="Choose a published definition",
    )
    tenant = forms.CharField(
        label="Tenant",
        max_length=100,
        initial="default",
        help_text="The organisation or office this instance runs for.",
    )
    variables = forms.CharField(
        label="Variables",
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "spellcheck": "false"}),
        help_text='A JSON object, for example {"applicant": "A. Smith"}. Leave empty for none.',
    )

    def clean_variables(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("variables") or "").strip()
        if not text:
            return {}
        limit = variables_max_bytes()
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            raise forms.ValidationError(f"Variables may be at most {limit} bytes of JSON.")
        try:
            value = parse_json(text, max_bytes=limit)
        except CanonicalError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("Variables must be a JSON object mapping names to values.")
        return value


class CancelForm(forms.Form):
    reason = forms.CharField(
        label="Reason for cancelling",
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded on the instance. Cancelling undoes nothing outside the engine: "
        "a step whose outcome is unknown stays open until someone records what happened.",
    )


class DecisionApproveForm(forms.Form):
    """Approving a decision approves the result the approver was shown: its fingerprint
    travels with the approval, and the service refuses a decision that carries another."""

    result_fp = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)


class ApprovalForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", "Approve"), ("reject", "Reject")],
        widget=forms.RadioSelect,
        label="Decision",
    )
    note = forms.CharField(
        label="Note",
        required=False,
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
    )


CHECK_PREFIX = "check_"
RESULT_PREFIX = "result_"
CONFIRMED = DecisionKind.EFFECT_CONFIRMED
# What a decision on an uncertain step may say (a "compensate" decision approves running a
# compensation: the instance page's Compensations section asks for it, not this form).
STEP_DECISIONS = [c for c in DecisionKind.choices if c[0] != DecisionKind.COMPENSATE]
CONFIRM_REQUIRED = "Required to record effect confirmed."


def evidence_help() -> str:
    """The accepted types and the limits, as the settings set them now."""
    types = ", ".join(ext.lstrip(".").upper() for ext in {**BINARY_TYPES, **TEXT_TYPES})
    return _(
        "One or more files (choose several at once): %(types)s. At most %(one)s per file "
        "and %(all)s for all files together."
    ) % {
        "types": types,
        "one": filesizeformat(evidence_max_bytes()),
        "all": filesizeformat(evidence_max_total_bytes()),
    }


class HandoffRequestForm(forms.Form):
    """A decision on an uncertain step: kind, rationale, evidence, the provider's checks,
    and the step's result for *effect confirmed*.

    ``checks`` are the action's :class:`~govflow.engine.registry.VerificationCheck`\\ s;
    each becomes a text field labelled with its instruction. ``result_fields`` (from
    :func:`govflow.engine.outputs.result_fields`) become one field each, typed as the
    output schema types them; ``initial_result`` pre-fills them (for example with what the
    provider's reconcile found).
    """

    kind = forms.ChoiceField(
        label="Decision",
        choices=STEP_DECISIONS,
        widget=forms.RadioSelect,
        help_text="Effect confirmed and effect absent need evidence. A timeout, a restart or "
        "an empty local result is not evidence of absence. Effect confirmed also records "
        "what the effect returned (the result fields below).",
    )
    rationale = forms.CharField(
        label="Rationale",
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
        help_text="What you checked and what it showed.",
    )
    evidence = MultipleFileField(
        label="Evidence files",
        required=False,
        help_text="One or more files: PDF, PNG, JPEG, TXT, CSV, JSON, EML or LOG.",
    )
    required_css_class = "required"  # the admin's mark of a required field

    def __init__(
        self,
        *args,
        checks=(),
        allow_cancel: bool = True,
        result_fields=(),
        initial_result=None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["evidence"].help_text = evidence_help()
        if not allow_cancel:  # the instance is cancelled already: only what happened
            self.fields["kind"].choices = [c for c in STEP_DECISIONS if c[0] != DecisionKind.CANCEL]
        self.check_ids = []
        for check in checks:
            name = CHECK_PREFIX + check.id
            # Required for every kind: the desk service refuses a decision without them.
            self.fields[name] = forms.CharField(
                label=check.instruction,
                required=True,
                error_messages={
                    "required": f"Answer the provider's verification checks first: {check.id}."
                },
                max_length=2000,
                widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
                help_text=f"Your finding for check '{check.id}'.",
            )
            self.check_ids.append(check.id)
        self.result_fields = list(result_fields)
        for spec in self.result_fields:
            field = result_form_field(spec)
            if initial_result and spec.name in initial_result:
                field.initial = initial_value(spec, initial_result[spec.name])
            self.fields[RESULT_PREFIX + spec.name] = field

    def check_answers(self) -> dict[str, str]:
        return {cid: self.cleaned_data.get(CHECK_PREFIX + cid, "") for cid in self.check_ids}

    def result_values(self) -> dict[str, Any]:
        """The result fields that were filled in, by name."""
        values = {}
        for spec in self.result_fields:
            value = self.cleaned_data.get(RESULT_PREFIX + spec.name)
            if value is not None and value != "":
                values[spec.name] = value
        return values

    def result(self) -> dict[str, Any] | None:
        """The result to record: the values for effect confirmed, None for the others."""
        if self.cleaned_data.get("kind") == CONFIRMED:
            return self.result_values()
        return self.result_values() or None

    def clean(self):
        cleaned = super().clean()
        values = self.result_values()
        if cleaned.get("kind") == CONFIRMED:
            for spec in self.result_fields:
                if spec.required and spec.name not in values:
                    self.add_error(RESULT_PREFIX + spec.name, CONFIRM_REQUIRED)
        elif cleaned.get("kind") and values:
            self.add_error(
                "kind",
                "Only effect confirmed records a result: clear the result fields "
                f"({', '.join(values)}), or choose effect confirmed.",
            )
        return cleaned


def result_form_field(spec: ResultField) -> forms.Field:
    """A form field for one value of a step's result (never required by the form itself:
    it is required for effect confirmed only, which ``clean`` checks)."""
    help_text = " ".join(p for p in (spec.help, CONFIRM_REQUIRED if spec.required else "") if p)
    common = {"label": spec.label, "required": False, "help_text": help_text}
    if spec.type == "string":
        return forms.CharField(max_length=spec.max_length or 2000, **common)
    if spec.type in ("integer", "number"):
        bounds = {"min_value": spec.minimum, "max_value": spec.maximum}
        if spec.type == "integer":
            return forms.IntegerField(**bounds, **common)
        return forms.FloatField(**bounds, **common)
    if spec.type == "boolean":
        choices = [("", "—"), ("true", "Yes"), ("false", "No")]
        return forms.TypedChoiceField(
            choices=choices, coerce=lambda v: v == "true", empty_value=None, **common
        )
    if spec.type == "enum":
        choices = [("", "—")] + [(json.dumps(v), str(v)) for v in spec.enum]
        return forms.TypedChoiceField(
            choices=choices, coerce=json.loads, empty_value=None, **common
        )
    return JsonValueField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "spellcheck": "false"}), **common
    )


def initial_value(spec: ResultField, value: Any) -> Any:
    """How a field shows ``value`` before anyone types."""
    if spec.type == "boolean":
        return "true" if value is True else "false" if value is False else ""
    if spec.type in ("enum", "json"):
        return json.dumps(value, ensure_ascii=False)
    return value


class JsonValueField(forms.CharField):
    """A JSON value typed as text (a result value the form has no field type for)."""

    def to_python(self, value):
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            return parse_json(text, max_bytes=payload_max_bytes())
        except CanonicalError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None


class RejectDecisionForm(forms.Form):
    note = forms.CharField(
        label="Why reject it",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="The requester sees this and can request again.",
    )


class IncidentResolveForm(forms.Form):
    """The investigation that resolves an engine incident: what was found, with evidence."""

    rationale = forms.CharField(
        label="What you investigated and found",
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded with your name on the incident and on the instance's chain.",
    )
    evidence = MultipleFileField(
        label="Evidence files (optional)",
        required=False,
        help_text="PDF, PNG, JPEG, TXT, CSV, JSON, EML or LOG.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["evidence"].help_text = evidence_help()


class MigrationRequestForm(forms.Form):
    action = forms.ChoiceField(label="Action", widget=forms.HiddenInput)
    rationale = forms.CharField(
        label="Why the instance may go on under the new contract",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="What you checked and with whom. A second person approves it before "
        "anything runs.",
    )

    def __init__(self, *args, actions: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["action"].choices = [(name, name) for name in actions]


class MigrationRejectForm(forms.Form):
    note = forms.CharField(
        label="Why reject it",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="The instance stays blocked; the requester sees this and can request again.",
    )
