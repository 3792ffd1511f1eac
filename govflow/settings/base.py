"""Settings shared by every environment.

Everything that differs between machines comes from the environment. Defaults here are
safe for development only; ``govflow.settings.prod`` refuses to start without the values
a production deployment must set.
"""

from __future__ import annotations

import os
from pathlib import Path

import csp.constants
import dj_database_url

from .environ import env_float, env_int

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("GOVFLOW_VAR_DIR", BASE_DIR / "var"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-secret-key-change-me")
DEBUG = False
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",") if h]

INSTALLED_APPS = [
    "govflow.apps.GovFlowAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Identity and access (docs/security.md): second factors, login throttling, the CSP.
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "axes",
    "csp",
    "govflow.identity",
    "rest_framework",
    "rest_framework_api_key",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "recovery",
    # The event outbox and webhooks (ADR 0032): below the engine, which writes its events.
    "govflow.events",
    # Before django_q: the engine's qcluster command (the sweeper in the cluster's main
    # process, ADR 0005) overrides django-q2's.
    "govflow.engine",
    # The operator's side, on top of the engine: instance pages, handoffs, decisions.
    "govflow.handoffs",
    "django_q",
    # After rest_framework_api_key: its admin registers a stock key model this app removes.
    "govflow.api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The desk's language: the one chosen with the switch (a cookie), else the browser's.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "govflow.identity.middleware.PrivilegedSessionIdle",
    "govflow.identity.middleware.SecondFactorGate",
    # Names the signed-in user as the author of rights changes made in this request.
    "govflow.identity.middleware.RightsActor",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a locked-out login into the lock-out page.
    "axes.middleware.AxesMiddleware",
]

# django-axes first: a locked-out user or address is refused before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "/admin/login/"

ROOT_URLCONF = "govflow.urls"
WSGI_APPLICATION = "govflow.wsgi.application"
ASGI_APPLICATION = "govflow.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "csp.context_processors.nonce",
            ],
        },
    },
]


def database_from_env(url: str | None = None) -> dict:
    """Return the default database: ``DATABASE_URL`` if set, else the embedded SQLite file.

    SQLite runs in WAL mode with a busy timeout and ``BEGIN IMMEDIATE`` transactions so a
    web process and a django-q2 worker can share one file: writers queue instead of failing
    with "database is locked" halfway through a transaction.
    """
    url = url if url is not None else os.environ.get("DATABASE_URL", "")
    if url:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        if config["ENGINE"] == "django.db.backends.postgresql":
            # Bind parameters on the server and prepare statements after their first use:
            # the engine repeats the same few statements for every step, and PostgreSQL
            # then plans them once per connection instead of on every call.
            options = config.setdefault("OPTIONS", {})
            options.setdefault("server_side_binding", True)
            options.setdefault("prepare_threshold", 1)
        return config
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("GOVFLOW_SQLITE_PATH", str(VAR_DIR / "govflow.sqlite3")),
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": (
                "PRAGMA journal_mode=WAL;"
                # FULL: a commit (the dispatch boundary above all) survives a power cut.
                "PRAGMA synchronous=FULL;"
                "PRAGMA busy_timeout=30000;"
                "PRAGMA foreign_keys=ON;"
            ),
        },
    }


DATABASES = {"default": database_from_env()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# -- Identity and access (docs/security.md) ------------------------------------------------
# Second factor: required for privileged users (govflow/identity/policy.py); "1" requires it
# of every staff user.
GOVFLOW_REQUIRE_2FA_FOR_ALL = os.environ.get("GOVFLOW_REQUIRE_2FA_FOR_ALL", "0") == "1"
OTP_TOTP_ISSUER = os.environ.get("GOVFLOW_OTP_ISSUER", "GovFlow")
# Nobody, administrators included, sees another person's TOTP secret or its QR code in the
# admin: whoever saw it could answer that person's second factor. Enrolment shows the
# secret only to its owner (govflow/identity/views.py).
OTP_ADMIN_HIDE_SENSITIVE_DATA = True
# A privileged session ends after this many seconds without a request (others: 2 weeks).
GOVFLOW_PRIVILEGED_IDLE_SECONDS = env_int("GOVFLOW_PRIVILEGED_IDLE_SECONDS", 15 * 60)

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failures a username is locked,
# and so is an address, each on its own, for GOVFLOW_LOCKOUT_HOURS (or until an
# administrator resets it). Every attempt is kept in axes' tables (admin: Axes).
AXES_FAILURE_LIMIT = env_int("GOVFLOW_LOGIN_FAILURE_LIMIT", 5)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_COOLOFF_TIME = env_float("GOVFLOW_LOCKOUT_HOURS", 1)
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_LOCKOUT_TEMPLATE = "identity/locked_out.html"
# Behind a proxy, GOVFLOW_PROXY_COUNT trusted proxies add X-Forwarded-For; without one the
# socket's address counts (a client cannot choose its address by sending a header).
AXES_IPWARE_PROXY_COUNT = env_int("GOVFLOW_PROXY_COUNT", 0) or None
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if AXES_IPWARE_PROXY_COUNT else ("REMOTE_ADDR",)
)

# Content security policy (django-csp): no inline script anywhere; a script that must be
# inline carries the request's nonce ({{ request.csp_nonce }}). Styles: the admin's own
# widgets set style attributes, so inline styles stay allowed; scripts never are.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'", csp.constants.NONCE],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"

LANGUAGE_CODE = "en"
# Each language named in itself, as the desk's language switch shows it.
LANGUAGES = [("en", "English"), ("de", "Deutsch")]
# The desk's German catalogue; the .mo is compiled at install (make), never committed.
LOCALE_PATHS = [BASE_DIR / "locale"]
# Dates and numbers follow the language; the desk's date-time keeps the seconds (formats/).
FORMAT_MODULE_PATH = ["govflow.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("GOVFLOW_STATIC_ROOT", VAR_DIR / "static"))

# Evidence files live outside the web root and are never served as static media; the
# recovery desk streams them to permitted operators only.
EVIDENCE_ROOT = Path(os.environ.get("GOVFLOW_EVIDENCE_ROOT", VAR_DIR / "evidence"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "recovery_evidence": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(EVIDENCE_ROOT), "base_url": None},
    },
}
RECOVERY_EVIDENCE_STORAGE = "recovery_evidence"
RECOVERY_EVIDENCE_MAX_BYTES = env_int("GOVFLOW_EVIDENCE_MAX_BYTES", 20 * 1024 * 1024)
RECOVERY_EVIDENCE_MAX_TOTAL_BYTES = env_int("GOVFLOW_EVIDENCE_MAX_TOTAL_BYTES", 50 * 1024 * 1024)

# Uploads: a file above 1 MiB is spooled by Django to a temporary file (in
# FILE_UPLOAD_TEMP_DIR, default the system's) instead of memory, and evidence is streamed
# from there in chunks. Form fields together (a start form's variables: 256 KiB of JSON at
# most) may take 1 MiB; a larger body of fields is refused with 400 before any view runs.
# See docs/deployment.md, "Input limits".
FILE_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
FILE_UPLOAD_TEMP_DIR = os.environ.get("GOVFLOW_UPLOAD_TEMP_DIR") or None

# Keys for the checkpoint chain (BLAKE3 keyed mode). "id:64-hex-chars" pairs, comma
# separated; the first is the active key, the others verify older checkpoints.
RECOVERY_CHAIN_KEYS = os.environ.get("GOVFLOW_CHAIN_KEYS", "")
# Keys the webhook subscriptions' signing secrets are derived from (govflow/events/signing.py),
# "id:64-hex-chars" pairs like the chain's; empty: derived from SECRET_KEY.
GOVFLOW_WEBHOOK_KEYS = os.environ.get("GOVFLOW_WEBHOOK_KEYS", "")

# Anchors outside the database (docs/recovery.md, "Anchors"): the sweeper appends chain
# heads and the ledger's watermark to an append-only, keyed, hash-chained file, so that a
# truncated chain or a database restored from an older backup is an integrity incident.
# RECOVERY_ANCHOR_STORE names another store (write-once storage); None turns anchors off.
RECOVERY_ANCHOR_STORE = "recovery.anchors.FileAnchorStore"
RECOVERY_ANCHOR_PATH = Path(
    os.environ.get("GOVFLOW_ANCHOR_PATH", VAR_DIR / "anchors" / "ledger.anchors")
)
RECOVERY_ANCHOR_INTERVAL = env_float("GOVFLOW_ANCHOR_INTERVAL", 10)

# Engine tuning (seconds unless said otherwise); see docs/deployment.md.
GOVFLOW_LEASE_TTL = env_float("GOVFLOW_LEASE_TTL", 30)
GOVFLOW_MAX_STEPS_PER_RUN = env_int("GOVFLOW_MAX_STEPS_PER_RUN", 500)
GOVFLOW_RUN_BUDGET = env_float("GOVFLOW_RUN_BUDGET", 25)
# Runs at once across a qcluster's worker processes, divided among them (ADR 0067), unless
# GOVFLOW_WORKER_RUNS names the runs per worker process (ADR 0041). Always 1 on SQLite.
GOVFLOW_CLUSTER_RUNS = env_int("GOVFLOW_CLUSTER_RUNS", 24)
if os.environ.get("GOVFLOW_WORKER_RUNS", ""):
    GOVFLOW_WORKER_RUNS = env_int("GOVFLOW_WORKER_RUNS", 1)
GOVFLOW_SHARED_COMMIT_WAIT = env_float("GOVFLOW_SHARED_COMMIT_WAIT", 0.005)
GOVFLOW_SWEEP_LEASE_TTL = env_float("GOVFLOW_SWEEP_LEASE_TTL", 10)
GOVFLOW_SWEEP_TICK = env_float("GOVFLOW_SWEEP_TICK", 0.25)
GOVFLOW_SWEEP_DURATION = env_float("GOVFLOW_SWEEP_DURATION", 40)

# The REST API (govflow/api, docs/integrations.md). DRF serves only the API's views.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First: its challenge makes a missing credential a 401 with WWW-Authenticate.
        "govflow.api.auth.ApiKeyAuthentication",
        # CSRF for unsafe methods; privileged sessions write only with a second factor.
        "govflow.identity.api.SecondFactorSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["govflow.api.permissions.HasScope"],
    "DEFAULT_THROTTLE_CLASSES": [
        "govflow.api.throttling.KeyRateThrottle",
        "govflow.api.throttling.AnonRateThrottle",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["govflow.api.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_METADATA_CLASS": None,
    "EXCEPTION_HANDLER": "govflow.api.problems.exception_handler",
    "URL_FORMAT_OVERRIDE": None,
    "NUM_PROXIES": env_int("GOVFLOW_API_NUM_PROXIES", 0),
}
GOVFLOW_API_RATE = os.environ.get("GOVFLOW_API_RATE", "1200/min")
GOVFLOW_API_ANON_RATE = os.environ.get("GOVFLOW_API_ANON_RATE", "120/min")
GOVFLOW_API_MAX_BODY_BYTES = env_int("GOVFLOW_API_MAX_BODY_BYTES", 1024 * 1024)
GOVFLOW_API_IDEMPOTENCY_TTL = env_float("GOVFLOW_API_IDEMPOTENCY_TTL", 24 * 3600)

SPECTACULAR_SETTINGS = {
    "TITLE": "GovFlow API",
    "DESCRIPTION": (
        "Start and follow workflow instances, deliver messages, read handoffs, the ledger "
        "and the audit trail. Authenticate with the header `Authorization: Api-Key <key>` "
        "(keys are made in the admin). Every error is an RFC 9457 problem "
        "(`application/problem+json`). The guide is docs/integrations.md."
    ),
    "TAGS": [
        {"name": "Instances", "description": "Start, follow and cancel workflow instances."},
        {"name": "Triggers", "description": "Deliver messages that waiting instances take."},
        {"name": "Handoffs", "description": "Steps waiting for an operator or a provider."},
        {"name": "Definitions", "description": "Published workflow definitions."},
        {"name": "Ledger and audit", "description": "Fingerprints, the chain, verification."},
        {"name": "About the API", "description": "Who you are; what errors mean."},
    ],
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "PATH_CONVERTER_OVERRIDES": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999_999_999_999_999_999}
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "govflow.api.schema.add_problem_responses",
        "govflow.api.schema.refuse_unknown_request_fields",
    ],
    # Served from the package (drf-spectacular-sidecar): no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# django-q2 with its ORM broker on the default database. ``retry`` stays well above
# ``timeout``: the broker hands a claimed task out again ``retry`` seconds after the
# claim, so a task that may still be running must never be redelivered by the broker
# itself (the engine's lease and fence make a redelivery harmless, not free).
_Q_WORKERS = env_int("GOVFLOW_Q_WORKERS", 2)
Q_CLUSTER = {
    "name": "govflow",
    "orm": "default",
    "workers": _Q_WORKERS,
    "timeout": 60,
    "retry": 180,
    "max_attempts": 0,
    "ack_failures": True,
    "catch_up": False,
    "poll": 0.2,
    # django-q2's own default: the last 250 successful tasks are kept, failures always.
    # Instance runs store no success at all (their task says save=False: the outcome is in
    # the instance, its tokens and the ledger; a row would cost a commit per run).
    "save_limit": env_int("GOVFLOW_Q_SAVE_LIMIT", 250),
    # Instance runs are claimed where they are recorded (ADR 0026); other tasks use the
    # ORM broker's queue as before.
    "broker_class": "govflow.engine.broker.ClaimBroker",
    "guard_cycle": 0.5,
    # Tasks waiting in django-q2's in-memory queue for a worker process (its default:
    # workers squared). A task carries up to a worker process's share of a dequeue's
    # claims, their leases taken (ADR 0069): one waiting task per worker process keeps
    # each fed, and a paused cluster holds fewer leases that others must wait out (ADR 0074).
    "queue_limit": env_int("GOVFLOW_Q_QUEUE_LIMIT", max(1, _Q_WORKERS), minimum=1),
    # A worker process is replaced after this many tasks (django-q2's default is 500), or
    # once its peak memory passes ``max_rss`` (KiB). Each task of ours carries one instance
    # run or a worker process's share of a dequeue's claims (ADR 0069), and a replacement
    # drains the process's runs, starts a new interpreter and opens new database sessions:
    # at 500 runs a task that was every few seconds under load.
    "recycle": env_int("GOVFLOW_Q_RECYCLE", 20_000, minimum=0),
    "max_rss": env_int("GOVFLOW_Q_MAX_RSS", 512 * 1024, minimum=0) or None,
    "label": "Task queue",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"axes": {"level": "WARNING"}},
    "root": {"handlers": ["console"], "level": os.environ.get("GOVFLOW_LOG_LEVEL", "INFO")},
}
