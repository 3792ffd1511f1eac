"""The admin login form: password, then a code for users who have a second factor."""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django_otp import devices_for_user
from django_otp.forms import OTPAuthenticationFormMixin
from django_otp.plugins.otp_static.models import StaticDevice
from django_otp.plugins.otp_totp.models import TOTPDevice


def _device_for(user, token: str):
    """The device a code belongs to: six digits are the app's, anything else a recovery code."""
    model = TOTPDevice if token.isascii() and token.isdigit() and len(token) == 6 else StaticDevice
    return model.objects.filter(user=user, confirmed=True).order_by("pk").first()


class LoginForm(OTPAuthenticationFormMixin, AdminAuthenticationForm):
    """Django's admin login plus django-otp's code check for users with a confirmed device.

    Users without a device log in with their password alone; the actions that need a
    second factor then refuse them with a message that says how to enrol
    (:mod:`govflow.identity.middleware`).
    """

    otp_token = forms.CharField(
        required=False,
        label="Authentication code",
        help_text="From your authenticator app, or one of your recovery codes.",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code"}),
    )
    otp_error_messages = dict(
        OTPAuthenticationFormMixin.otp_error_messages,
        token_required=(
            "Your account has a second factor: enter the code from your authenticator app "
            "(or a recovery code)."
        ),
        invalid_token="That code is not valid (or was already used). Enter the current code.",
    )

    def clean(self):
        cleaned = super().clean()
        user = self.get_user()
        if user is not None and any(devices_for_user(user, confirmed=True)):
            self.clean_otp(user)
        return cleaned

    def _chosen_device(self, user):
        token = (self.cleaned_data.get("otp_token") or "").strip().replace(" ", "")
        self.cleaned_data["otp_token"] = token
        return _device_for(user, token)

    def _update_form(self, user) -> None:
        """django-otp fills a device list here; this form picks the device by the code."""
