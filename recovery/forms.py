"""Forms of the recovery admin's incident page. Validation of substance is the services'."""

from __future__ import annotations

from django import forms

from .services.resolutions import MAX_TEXT


class MultipleFileInput(forms.FileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    """Several uploaded files; cleans to a list (empty when none was chosen)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("widget", MultipleFileInput())
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        single = super().clean
        if isinstance(data, (list, tuple)):
            return [single(item, initial) for item in data]
        return [single(data, initial)] if data else []


class ResolutionRequestForm(forms.Form):
    rationale = forms.CharField(
        label="What was repaired, and how",
        max_length=MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text="For example: which rows were restored from which backup, who checked "
        "them against what. It is recorded with your name.",
    )
    watermark = forms.IntegerField(
        label="Revision last seen (optional)",
        required=False,
        min_value=0,
        help_text="The subject's revision you know it reached before the incident, for "
        "example from an earlier verification. Verification then also demands at least "
        "that many checkpoints. Required when the chain is empty (give 0 if the subject "
        "never had one).",
    )
    evidence = MultipleFileField(
        label="Evidence files (optional)",
        required=False,
        help_text="What the repair rests on (a restore log, a comparison, a signed note): "
        "PDF, PNG, JPEG, TXT, CSV, JSON, EML or LOG. Their BLAKE3 fingerprints are recorded "
        "on the incident's trail; the approver can open them.",
    )


class ResolutionRejectForm(forms.Form):
    note = forms.CharField(
        label="Why it is rejected",
        max_length=MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="The requester reads this: say what is missing or wrong.",
    )
