"""Enrolment of an authenticator app and of recovery codes, on the admin site.

Both are pages of :class:`govflow.admin_site.GovFlowAdminSite` in the admin's look. A new
app device is unconfirmed until the user types a code from it, so a scanned-wrong QR code
never locks anyone out.
"""

from __future__ import annotations

import segno
from django.contrib import messages
from django.db import transaction
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django_otp import login as otp_login
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from .policy import is_privileged, is_verified

RECOVERY_CODES = 10


def _context(admin_site, request, title: str, **extra) -> dict:
    return {**admin_site.each_context(request), "title": title, **extra}


def _pending_device(user) -> TOTPDevice:
    device = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("pk").first()
    return device or TOTPDevice.objects.create(user=user, name="Authenticator app", confirmed=False)


def enrol_view(admin_site, request):
    """Show the QR code of a new app device; confirm it with the first code it shows."""
    user = request.user
    confirmed = TOTPDevice.objects.filter(user=user, confirmed=True).exists()
    device = None if confirmed else _pending_device(user)
    error = ""
    if device is not None and request.method == "POST":
        token = request.POST.get("otp_token", "").strip().replace(" ", "")
        with transaction.atomic():
            verified = device.verify_token(token)
            if verified:
                device.confirmed = True
                device.save(update_fields=["confirmed"])
        if verified:
            otp_login(request, device)  # this login now counts as verified
            messages.success(
                request,
                "Your authenticator app is set up and verified for this login. Keep your "
                "recovery codes (below) somewhere safe.",
            )
            return redirect("admin:identity_recovery_codes")
        error = "That code does not match. Check the time on your phone and try the current code."
    uri = device.config_url if device is not None else ""
    return TemplateResponse(
        request,
        "identity/enrol.html",
        _context(
            admin_site,
            request,
            "Second factor",
            device=device,
            confirmed=confirmed,
            otpauth_uri=uri,
            secret=_base32(device) if device is not None else "",
            qr_svg=segno.make(uri, error="m").svg_inline(scale=4) if uri else "",
            error=error,
            privileged=is_privileged(user),
            verified=is_verified(user),
        ),
    )


def recovery_codes_view(admin_site, request):
    """Make a new set of recovery codes (the old ones stop working) and show them once."""
    user = request.user
    codes: list[str] = []
    if request.method == "POST":
        with transaction.atomic():
            device, _ = StaticDevice.objects.get_or_create(
                user=user, name="Recovery codes", defaults={"confirmed": True}
            )
            device.token_set.all().delete()
            codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
            StaticToken.objects.bulk_create(StaticToken(device=device, token=c) for c in codes)
    remaining = StaticToken.objects.filter(device__user=user, device__confirmed=True).count()
    return TemplateResponse(
        request,
        "identity/recovery_codes.html",
        _context(admin_site, request, "Recovery codes", codes=codes, remaining=remaining),
    )


def _base32(device: TOTPDevice) -> str:
    import base64

    return base64.b32encode(device.bin_key).decode()
