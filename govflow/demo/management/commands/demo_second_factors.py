"""Give the demo logins an authenticator-app (TOTP) device and print its key.

Development only: the demo app is never installed by the production settings. Each login
keeps its key across runs (the device is made once); ``--codes`` prints the codes the
keys give right now, for logging in without a phone.
"""

from __future__ import annotations

import base64

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from .demo_setup import LOGINS


def _code(device: TOTPDevice) -> str:
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


class Command(BaseCommand):
    help = (
        "Give the demo logins a TOTP device (made once, kept) and print each key and its "
        "otpauth:// link; --codes prints the current six-digit codes instead."
    )

    def add_arguments(self, parser):
        parser.add_argument("--codes", action="store_true", help="Print the current codes.")

    def handle(self, *args, codes: bool, **options):
        users = get_user_model().objects.filter(username__in=[name for name, *_ in LOGINS])
        for user in users.order_by("username"):
            device = TOTPDevice.objects.filter(user=user, confirmed=True).order_by("pk").first()
            if device is None:
                device = TOTPDevice.objects.create(user=user, name="Demo app", confirmed=True)
            if codes:
                self.stdout.write(f"{user.username}: {_code(device)}")
            else:
                secret = base64.b32encode(device.bin_key).decode()
                self.stdout.write(f"{user.username} {secret} {device.config_url}")
