"""One attempt to deliver one event: a signed JSON POST, no redirects followed.

Outside any transaction. What the receiver answered is summed up in a few words
(``HTTP 503``, ``timed out after 10 s``): its body is never read into GovFlow's rows.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from .models import Event
from .signing import signature

__all__ = ["Attempt", "body_of", "headers_of", "post"]

USER_AGENT = "GovFlow-Webhooks/1"


@dataclass(frozen=True)
class Attempt:
    ok: bool
    outcome: str
    """In a few words: ``HTTP 204``, ``timed out after 10 s``, ``connection refused``."""


def body_of(event: Event) -> bytes:
    """The delivery's body: the same bytes on every attempt (compact JSON, sorted keys)."""
    created = event.created_at
    document = {
        "id": str(event.event_id),
        "type": event.type,
        "tenant": event.tenant,
        "instance": event.instance_id,
        "seq": event.seq,
        "occurred_at": created.isoformat().replace("+00:00", "Z"),
        "data": event.data,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def headers_of(event: Event, body: bytes, secret: str, attempt: int) -> dict[str, str]:
    timestamp = int(time.time())
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "GovFlow-Event-Id": str(event.event_id),
        "GovFlow-Event-Type": event.type,
        "GovFlow-Timestamp": str(timestamp),
        "GovFlow-Signature": f"v1={signature(secret, timestamp, body)}",
        "GovFlow-Delivery-Attempt": str(attempt),
    }


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float) -> Attempt:
    """POST ``body`` to ``url``; a 2xx answer is a delivery, anything else is not.

    ``timeout`` bounds the whole attempt, not each socket operation: a receiver that
    trickles its answer a byte at a time is cut off when it runs out (a timer shuts the
    socket down, which ends a blocked read at once).
    """
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = kind(parts.hostname, parts.port, timeout=timeout)
    cut = threading.Event()
    timer = threading.Timer(timeout, _cut_off, args=(connection, cut))
    timer.daemon = True
    timer.start()
    try:
        connection.request("POST", target, body=body, headers=headers)
        response = connection.getresponse()
        response.read(64 * 1024)  # drained, never kept
    except TimeoutError:
        return Attempt(False, f"timed out after {timeout:g} s")
    except ConnectionRefusedError:
        return Attempt(False, "connection refused")
    except (OSError, http.client.HTTPException) as exc:
        if cut.is_set():
            return Attempt(False, f"timed out after {timeout:g} s")
        return Attempt(False, f"connection failed ({type(exc).__name__})")
    finally:
        timer.cancel()
        connection.close()
    status = response.status
    return Attempt(200 <= status < 300, f"HTTP {status}")


def _cut_off(connection: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The attempt's time ran out: end whatever socket operation it is blocked in."""
    cut.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
