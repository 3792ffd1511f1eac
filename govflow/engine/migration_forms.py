"""Forms of the instance page for migrating an instance to an action's changed contract."""

from __future__ import annotations

from django import forms


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
