"""Forms of the operator's pages of instances: start, cancel, approve, decide, migrate.

Forms only parse what an operator typed or uploaded into the values a service takes; the
services decide what is allowed and say why not.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.template.defaultfilters import filesizeformat
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from govflow.engine.definitions import schema_errors
from govflow.engine.limits import variables_max_bytes
from govflow.engine.models import Definition
from govflow.engine.outputs import ResultField, schema_expressible, schema_fields
from govflow.engine.selectors import definition_variables_schema, definitions_published
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

from .schema_forms import JsonValueField, initial_value, nest, schema_form_field  # noqa: F401


class DefinitionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Definition) -> str:
        return f"{obj.title} ({obj.key} v{obj.version})"


class DefinitionPickForm(forms.Form):
    """The first step of starting an instance: which definition (a GET form)."""

    definition = DefinitionChoiceField(
        queryset=definitions_published(),
        label=_("Definition"),
        empty_label=_("Choose a published definition"),
    )


VAR_PREFIX = "var."


class InstanceStartForm(forms.Form):
    """Starting an instance of ``definition``: the tenant, and the variables its schema asks
    for — one field each, typed, required as the schema requires (:func:`schema_fields`),
    or, when the schema says more than a form can ask (``raw``), one JSON object."""

    tenant = forms.ChoiceField(
        label=_("Tenant"),
        help_text=_("The organisation or office this instance runs for."),
    )

    def __init__(self, *args, definition: Definition, tenants, raw: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.definition = definition
        self.schema = definition_variables_schema(definition)
        # The operator's own tenants only (tenant_choices). One is chosen for them; of
        # several, none is preselected: a case started for the wrong office is a real error.
        choices = [(t, t) for t in tenants]
        if len(tenants) == 1:
            self.fields["tenant"].initial = tenants[0]
        else:
            choices.insert(0, ("", _("Choose the tenant")))
        self.fields["tenant"].choices = choices
        self.raw = raw or not schema_expressible(self.schema)
        self.specs = [] if self.raw else schema_fields(self.schema)
        for spec in self.specs:
            self.fields[VAR_PREFIX + spec.name] = schema_form_field(
                spec, required=spec.required, help_text=spec.help
            )
        if self.raw:
            self.fields["variables"] = forms.CharField(
                label=_("Variables"),
                required=False,
                initial="{}",
                widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "spellcheck": "false"}),
                help_text=_("A JSON object matching the schema shown below. Leave empty for none."),
            )

    def clean_variables(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("variables") or "").strip()
        if not text:
            return {}
        limit = variables_max_bytes()
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            raise forms.ValidationError(
                _("Variables may be at most %(limit)s bytes of JSON.") % {"limit": limit}
            )
        try:
            value = parse_json(text, max_bytes=limit)
        except CanonicalError as exc:
            raise forms.ValidationError(_("Not valid JSON: %(error)s") % {"error": exc}) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(
                _("Variables must be a JSON object mapping names to values.")
            )
        return value

    def clean(self):
        cleaned = super().clean()
        if self.raw:
            variables = cleaned.get("variables", {})
        else:
            variables = nest({s.name: cleaned.get(VAR_PREFIX + s.name) for s in self.specs})
        cleaned["variables"] = variables
        if self.errors or not self.schema:
            return cleaned
        for error in schema_errors(self.schema, variables)[:10]:
            name = VAR_PREFIX + ".".join(map(str, error.path))
            self.add_error(name if name in self.fields else None, error.message)
        return cleaned


class CancelForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason for cancelling"),
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_(
            "Recorded on the instance. Cancelling undoes nothing outside the engine: "
            "a step whose outcome is unknown stays open until someone records what happened."
        ),
    )


class DecisionApproveForm(forms.Form):
    """Approving a decision approves the result the approver was shown: its fingerprint
    travels with the approval, and the service refuses a decision that carries another."""

    result_fp = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)


class ApprovalForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", _("Approve")), ("reject", _("Reject"))],
        widget=forms.RadioSelect,
        label=_("Decision"),
    )
    note = forms.CharField(
        label=_("Note"),
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
CONFIRM_REQUIRED = _("Required to record effect confirmed.")


def evidence_help() -> str:
    """The accepted types and the limits, as the settings set them now."""
    types = ", ".join(ext.lstrip(".").upper() for ext in {**BINARY_TYPES, **TEXT_TYPES})
    return gettext(
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
        label=_("Decision"),
        choices=STEP_DECISIONS,
        widget=forms.RadioSelect,
        help_text=_(
            "Effect confirmed and effect absent need evidence. A timeout, a restart or "
            "an empty local result is not evidence of absence. Effect confirmed also records "
            "what the effect returned (the result fields below)."
        ),
    )
    rationale = forms.CharField(
        label=_("Rationale"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
        help_text=_("What you checked and what it showed."),
    )
    evidence = MultipleFileField(
        label=_("Evidence files"),
        required=False,
        help_text=_("One or more files: PDF, PNG, JPEG, TXT, CSV, JSON, EML or LOG."),
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
                    "required": _("Answer the provider's verification checks first: %(check)s.")
                    % {"check": check.id}
                },
                max_length=2000,
                widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
                help_text=_("Your finding for check '%(check)s'.") % {"check": check.id},
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
    help_text = " ".join(
        p for p in (spec.help, str(CONFIRM_REQUIRED) if spec.required else "") if p
    )
    return schema_form_field(spec, required=False, help_text=help_text)


class RejectDecisionForm(forms.Form):
    note = forms.CharField(
        label=_("Why reject it"),
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=_("The requester sees this and can request again."),
    )


class IncidentResolveForm(forms.Form):
    """The investigation that resolves an engine incident: what was found, with evidence."""

    rationale = forms.CharField(
        label=_("What you investigated and found"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_("Recorded with your name on the incident and on the instance's chain."),
    )
    evidence = MultipleFileField(
        label=_("Evidence files (optional)"),
        required=False,
        help_text=_("PDF, PNG, JPEG, TXT, CSV, JSON, EML or LOG."),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["evidence"].help_text = evidence_help()


class MigrationRequestForm(forms.Form):
    action = forms.ChoiceField(label=_("Action"), widget=forms.HiddenInput)
    rationale = forms.CharField(
        label=_("Why the instance may go on under the new contract"),
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_(
            "What you checked and with whom. A second person approves it before anything runs."
        ),
    )

    def __init__(self, *args, actions: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["action"].choices = [(name, name) for name in actions]


class MigrationRejectForm(forms.Form):
    note = forms.CharField(
        label=_("Why reject it"),
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=_("The instance stays blocked; the requester sees this and can request again."),
    )
