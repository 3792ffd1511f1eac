"""The outbox's settings: defaults in one table, read lazily (never at import time).

``docs/deployment.md`` shows the table generated from :data:`SETTINGS`
(:func:`settings_table`; a test keeps the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class Setting:
    name: str
    default: int | float | bool | str
    type: type
    unit: str
    description: str

    def value(self):
        value = getattr(settings, self.name, self.default)
        if self.type is bool:
            return bool(value)
        return self.type(value)


MAX_ATTEMPTS = Setting(
    "GOVFLOW_WEBHOOK_MAX_ATTEMPTS",
    8,
    int,
    "",
    "attempts to deliver one event to one subscription; after the last failed one the "
    "delivery is a dead letter (shown on the desk, delivered again by an operator) and the "
    "instance's later events wait behind it for that subscription",
)
RETRY_BASE = Setting(
    "GOVFLOW_WEBHOOK_RETRY_BASE",
    10,
    float,
    "seconds",
    "the wait after the first failed attempt; it doubles after each further one",
)
RETRY_MAX = Setting(
    "GOVFLOW_WEBHOOK_RETRY_MAX",
    3600,
    float,
    "seconds",
    "the longest wait between two attempts",
)
TIMEOUT = Setting(
    "GOVFLOW_WEBHOOK_TIMEOUT",
    10,
    float,
    "seconds",
    "how long one attempt may take in all (connecting, sending, the answer); longer counts "
    "as a failed attempt and the connection is cut. Must be under two thirds of "
    "`GOVFLOW_PUBLISHER_LEASE_TTL`",
)
CONCURRENCY = Setting(
    "GOVFLOW_WEBHOOK_CONCURRENCY",
    4,
    int,
    "",
    "how many subscriptions the publisher delivers to at once (one attempt at a time per "
    "subscription, so a slow receiver holds up only its own events)",
)
LEASE_TTL = Setting(
    "GOVFLOW_PUBLISHER_LEASE_TTL",
    30,
    float,
    "seconds",
    "the `govflow:publisher` lease; a killed publisher is replaced by a standby after this "
    "long at most (at once when its process is known to be gone)",
)
TICK = Setting(
    "GOVFLOW_PUBLISHER_TICK",
    1.0,
    float,
    "seconds",
    "the publisher's pause between passes when it found nothing to deliver",
)
ALLOW_HTTP = Setting(
    "GOVFLOW_WEBHOOK_ALLOW_HTTP",
    False,
    bool,
    "",
    "accept `http://` webhook URLs (development only; `https://` is always accepted)",
)
ALLOW_PRIVATE = Setting(
    "GOVFLOW_WEBHOOK_ALLOW_PRIVATE",
    False,
    bool,
    "",
    "accept webhook URLs whose host is or resolves to a loopback, private, link-local or "
    "otherwise non-public address (development only)",
)
KEYS = Setting(
    "GOVFLOW_WEBHOOK_KEYS",
    "",
    str,
    "",
    "keys the subscriptions' signing secrets are derived from: `id:64-hex-chars` pairs, "
    "comma separated, the first for new secrets. Empty: one key derived from "
    "`SECRET_KEY` (id `secret-key`), so rotating `SECRET_KEY` would change every secret: "
    "set this in production",
)

SETTINGS: tuple[Setting, ...] = (
    MAX_ATTEMPTS,
    RETRY_BASE,
    RETRY_MAX,
    TIMEOUT,
    CONCURRENCY,
    LEASE_TTL,
    TICK,
    ALLOW_HTTP,
    ALLOW_PRIVATE,
    KEYS,
)


def settings_table() -> str:
    """The Markdown table of :data:`SETTINGS`, as ``docs/deployment.md`` shows it."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default!r}`" if s.type is str else f"`{s.default}`"
        unit = f" ({s.unit})" if s.unit else ""
        rows.append(f"| `{s.name}` | {default}{unit} | {s.description} |")
    return "\n".join(rows) + "\n"
