"""A receiving webhook server for tests: a real local HTTP server in a thread.

It answers each request with the next status of its script (the last one repeats), may
hold a request until the test releases it, and keeps every request it received.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event_id(self) -> str:
        return self.headers["GovFlow-Event-Id"]

    @property
    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    def __init__(self, script=(200,), *, delay: float = 0.0) -> None:
        self.script = list(script)
        self.delay = delay
        self.received: list[Received] = []
        self.held = threading.Event()
        self.release = threading.Event()
        self.hold = False
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.received.append(Received(dict(self.headers.items()), body))
                    status = (
                        receiver.script.pop(0) if len(receiver.script) > 1 else receiver.script[0]
                    )
                if receiver.hold:
                    receiver.held.set()
                    receiver.release.wait(60)
                if receiver.delay:
                    time.sleep(receiver.delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/govflow?x=1"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Wait (polling a condition, never a fixed sleep) until ``count`` requests came."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.received)} of {count} requests came")
            time.sleep(0.02)
        return list(self.received)
