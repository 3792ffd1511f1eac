"""Which webhook URLs GovFlow will call: a scheme allow-list and public addresses only.

A webhook makes GovFlow's servers send requests where a tenant says: without checks, a
subscription could reach the database, the metadata service of a cloud host or an admin
interface on the local network (server-side request forgery). So a URL is refused unless
its scheme is ``https`` (``http`` only where ``GOVFLOW_WEBHOOK_ALLOW_HTTP`` is set) and
every address its host resolves to is public (``GOVFLOW_WEBHOOK_ALLOW_PRIVATE`` allows
the others, for development). The check runs when a subscription is made and again
before every attempt, since a name may resolve elsewhere later; redirects are never
followed.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from recovery.api import RecoveryValidationError

from .conf import ALLOW_HTTP, ALLOW_PRIVATE

__all__ = ["UrlRefused", "url_check"]


class UrlRefused(RecoveryValidationError):
    """A webhook URL GovFlow will not call; the message says why and what to do."""


def url_check(url: str) -> None:
    """Raise :class:`UrlRefused` unless GovFlow may deliver to ``url`` (resolves its host)."""
    if not isinstance(url, str) or not url.strip():
        raise UrlRefused("Give the URL events are delivered to, e.g. https://example.org/hook.")
    if len(url) > 2000 or any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise UrlRefused(
            "The URL is longer than 2000 characters or holds spaces or control characters."
        )
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise UrlRefused(f"The URL cannot be read ({exc}).") from None
    _check_scheme(parts.scheme)
    if not host:
        raise UrlRefused("The URL names no host: write it as https://host/path.")
    if parts.username or parts.password:
        raise UrlRefused(
            "The URL holds a user name or password: remove it. Deliveries are signed "
            "instead (check the GovFlow-Signature header)."
        )
    if ALLOW_PRIVATE.value():
        return
    for address in _addresses(host, port or (443 if parts.scheme == "https" else 80)):
        if not address.is_global or address.is_multicast:
            raise UrlRefused(
                f"The host {host!r} is or resolves to {address}, a loopback, private, "
                "link-local or otherwise non-public address: GovFlow delivers only to "
                "public addresses. Use the public name of the receiving system (for "
                "development, GOVFLOW_WEBHOOK_ALLOW_PRIVATE allows it)."
            )


def _check_scheme(scheme: str) -> None:
    allowed = ("https", "http") if ALLOW_HTTP.value() else ("https",)
    if scheme.lower() not in allowed:
        hint = (
            " (http:// only where GOVFLOW_WEBHOOK_ALLOW_HTTP is set, for development)"
            if scheme.lower() == "http"
            else ""
        )
        raise UrlRefused(
            f"The URL's scheme is {scheme or 'missing'!r}: webhooks are delivered over "
            f"https:// only{hint}. Write it as https://host/path."
        )


def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        return [_unmapped(literal)]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise UrlRefused(
            f"The host {host!r} could not be resolved: check its spelling, or that it is "
            "known to this server's DNS."
        ) from None
    return [_unmapped(ipaddress.ip_address(info[4][0].split("%")[0])) for info in infos]


def _unmapped(address):
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address
