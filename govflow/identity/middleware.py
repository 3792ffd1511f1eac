"""The web's second-factor gate and the idle timeout of privileged sessions.

Both sit after django-otp's ``OTPMiddleware`` (which sets ``request.user.otp_device``).
The REST API is not gated: an API key is its own credential (docs/security.md).
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.shortcuts import redirect

from .policy import ALWAYS_GATED_URL_NAMES, GATED_URL_NAMES, enrol_hint, is_privileged, is_verified

LAST_SEEN_KEY = "govflow_last_seen"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class SecondFactorGate:
    """Refuse a POST to a gated admin view unless a second factor was verified at login.

    Nothing is changed: the refusal leads to the enrolment page, with a message that says
    what was refused and how to go on.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        if request.method in SAFE_METHODS:
            return None
        match = request.resolver_match
        if match is None or match.url_name not in GATED_URL_NAMES:
            return None
        user = request.user
        if not user.is_authenticated or is_verified(user):
            return None
        # Someone without the rights is left to the view, which says which they lack.
        if not is_privileged(user) and match.url_name not in ALWAYS_GATED_URL_NAMES:
            return None
        messages.error(request, enrol_hint())
        return redirect("admin:identity_enrol")


class PrivilegedSessionIdle:
    """Log a privileged user out after ``GOVFLOW_PRIVILEGED_IDLE_SECONDS`` without a request.

    Others keep Django's ``SESSION_COOKIE_AGE``. The last request's time is kept in the
    session (server side), so a copied cookie does not outlive the timeout either.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and is_privileged(user):
            idle = float(getattr(settings, "GOVFLOW_PRIVILEGED_IDLE_SECONDS", 900))
            now = time.time()
            last = request.session.get(LAST_SEEN_KEY)
            if last is not None and now - float(last) > idle:
                logout(request)
                messages.warning(
                    request,
                    f"You were logged out after {int(idle // 60)} minutes without activity "
                    "(accounts that approve or change rights time out sooner). Log in again.",
                )
                return redirect(f"{settings.LOGIN_URL}?next={request.path}")
            request.session[LAST_SEEN_KEY] = now
            request.session.set_expiry(int(idle))
        return self.get_response(request)


class RightsActor:
    """Attribute the rights changes a request makes to its signed-in user (ADR 0025).

    The rights trail's model hooks read the author from here; the user is looked up only
    when a change is recorded. Without a request (a shell, a command) no one is named.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from .rights.trail import acting

        with acting(lambda: getattr(request, "user", None), via="web"):
            return self.get_response(request)
