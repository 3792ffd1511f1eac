"""Second factors for tests: real django-otp devices and verified sessions, never a bypass.

``verified_login`` logs a test client in as django-otp's login form would after a correct
code: the session names a confirmed device of the user. ``fixture_code`` gives the browser
tests a fresh one-time recovery code to type on the login page.
"""

from __future__ import annotations

from django.test import Client
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice


def totp_device(user) -> TOTPDevice:
    """The user's confirmed authenticator-app device (made on first use)."""
    device = TOTPDevice.objects.filter(user=user, confirmed=True).first()
    return device or TOTPDevice.objects.create(user=user, name="Test app", confirmed=True)


def totp_now(device: TOTPDevice, *, step_offset: int = 0) -> str:
    """The code ``device`` shows now, as an authenticator app computes it."""
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = totp.time + step_offset * device.step
    return f"{totp.token():0{device.digits}d}"


def verified_login(client: Client, user) -> Client:
    """Log ``client`` in as ``user`` with a second factor verified in this login."""
    client.force_login(user)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = totp_device(user).persistent_id
    session.save()
    return client


def fixture_code(username: str) -> str:
    """A fresh recovery code for a privileged ``username``, "" for anyone else.

    A privileged user (who needs a second factor) gets a recovery-code device on first use;
    the code is typed on the login page like any other. Others log in with a password.
    """
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        return ""
    from govflow.identity.policy import is_privileged

    if not is_privileged(user):
        return ""
    device, _ = StaticDevice.objects.get_or_create(
        user=user, name="Fixture recovery codes", defaults={"confirmed": True}
    )
    token = StaticToken.random_token()
    StaticToken.objects.create(device=device, token=token)
    return token
