"""Forms of bulk triage: the terms of a batch (which steps, which decision, why, the checks).

The evidence of each row is read from the submission itself (``reference_<step>`` and
``evidence_<step>``, and ``shared`` for files about every row): the rows are only known
once the preview is made. Forms parse; the services decide (``services.batches``).
"""

from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from recovery.api import DecisionKind

from .batches import BATCH_KINDS
from .forms import CHECK_PREFIX


class StepIdsField(forms.Field):
    """Step ids (``steps`` repeated); which of them the user may decide is the service's
    question, so a refusal names them instead of a bare "not a valid choice"."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> list[int]:
        values = value if isinstance(value, (list, tuple)) else [value] if value else []
        ids = [int(v) if _is_id(v) else None for v in values]
        if None in ids:
            raise forms.ValidationError(_("The selection is malformed; select again."))
        return ids


ID_MAX = 2**63 - 1
"""The largest id a row can have (a signed 64-bit key on PostgreSQL and SQLite)."""


def _is_id(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return (
        isinstance(value, str) and value.isascii() and value.isdigit() and 0 < int(value) <= ID_MAX
    )


class BatchTermsForm(forms.Form):
    """What every decision of the batch records: the kind, the rationale, the check answers."""

    action = forms.RegexField(regex=r"^[\w.:-]{1,200}$", widget=forms.HiddenInput)
    steps = StepIdsField(
        label=_("Steps"),
        error_messages={"required": _("Select at least one step whose outcome is unknown.")},
    )
    kind = forms.ChoiceField(
        label=_("Decision for every selected step"),
        choices=[(k.value, k.label) for k in BATCH_KINDS],
        widget=forms.RadioSelect,
        help_text=_(
            "Each needs its own evidence, added after the preview. A timeout, a restart or an "
            "empty local result is not evidence of absence."
        ),
    )
    rationale = forms.CharField(
        label=_("Rationale"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_("What you checked and what it showed; recorded on every decision."),
    )
    required_css_class = "required"

    def __init__(self, *args, checks=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.check_ids = []
        for check in checks:
            self.fields[CHECK_PREFIX + check.id] = forms.CharField(
                label=check.instruction,
                max_length=2000,
                widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
                help_text=_("Your finding for check '%(id)s', for every selected step.")
                % {"id": check.id},
                error_messages={
                    "required": _("Answer the provider's verification check %(id)s.")
                    % {"id": check.id}
                },
            )
            self.check_ids.append(check.id)

    def clean_rationale(self) -> str:
        return one_newline(self.cleaned_data["rationale"])

    def check_answers(self) -> dict[str, str]:
        return {c: one_newline(self.cleaned_data[CHECK_PREFIX + c]) for c in self.check_ids}

    def kind_label(self) -> str:
        return DecisionKind(self.cleaned_data["kind"]).label


def one_newline(text: str) -> str:
    """``text`` with every line break a line feed, stripped: the text typed in the form and
    its hidden copy in the preview give the same fingerprint whatever line breaks a client
    sends (browsers send CR LF; a script may send LF alone)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()
