"""Forms of the engine's own admin pages (publishing definitions).

The forms of the operator's pages of instances are in ``govflow.handoffs.forms``. Forms
only parse what an operator typed or uploaded into the values a service takes; the
services decide what is allowed and say why not.
"""

from __future__ import annotations

import os

from django import forms

from recovery.api import CanonicalError, parse_json

from .limits import definition_max_bytes


class DefinitionUploadForm(forms.Form):
    """A definition file: UTF-8 JSON holding one object, at most a configured size."""

    file = forms.FileField(
        label="Definition file",
        help_text="A UTF-8 JSON file with key, version, title, nodes and transitions. "
        "Publishing never changes an existing version: give changes a new version.",
        widget=forms.FileInput(attrs={"accept": ".json,application/json"}),
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = definition_max_bytes()
        if upload.size > limit:
            raise forms.ValidationError(
                f"The file is {upload.size} bytes; a definition may be at most {limit} bytes."
            )
        data = upload.read(limit + 1)
        if len(data) > limit:
            raise forms.ValidationError(f"The file is larger than {limit} bytes.")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise forms.ValidationError(
                f"The file is not UTF-8 text (byte {exc.start} is invalid). Save it as UTF-8."
            ) from None
        try:
            # The same strict parser as ``load_workflows``: no duplicate keys, no NaN, and
            # no recursion deeper than the input depth limit, whatever the file holds.
            document = parse_json(text, max_bytes=limit)
        except CanonicalError as exc:
            raise forms.ValidationError(f"The file is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise forms.ValidationError(
                f"A definition is a JSON object, not {type(document).__name__}."
            )
        self.cleaned_data["document"] = document
        self.cleaned_data["source"] = os.path.basename(upload.name or "")[:300]
        return upload
