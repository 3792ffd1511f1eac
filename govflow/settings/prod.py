"""Production settings. Every secret and host comes from the environment.

Required: ``DJANGO_SECRET_KEY``, ``DJANGO_ALLOWED_HOSTS``, ``DATABASE_URL`` and
``GOVFLOW_CHAIN_KEYS``. Starting without one of them fails with the variable's name.
"""

import os

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import database_from_env
from .environ import env_int


def _required(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(
            f"{name} is not set. Production settings read it from the environment; "
            "see docs/deployment.md for what each variable holds."
        )
    return value


DEBUG = False
SECRET_KEY = _required("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = [h.strip() for h in _required("DJANGO_ALLOWED_HOSTS").split(",") if h.strip()]
DATABASES = {"default": database_from_env(_required("DATABASE_URL"))}
RECOVERY_CHAIN_KEYS = _required("GOVFLOW_CHAIN_KEYS")

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = os.environ.get("GOVFLOW_SSL_REDIRECT", "1") == "1"
SECURE_HSTS_SECONDS = env_int("GOVFLOW_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# A session ends when the browser closes; privileged ones also after
# GOVFLOW_PRIVILEGED_IDLE_SECONDS without a request (base settings, docs/security.md).
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
SESSION_COOKIE_AGE = env_int("GOVFLOW_SESSION_SECONDS", 8 * 3600)
