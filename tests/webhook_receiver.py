"""A real local webhook receiver for tests: ThreadingHTTPServer on 127.0.0.1, in a thread.

It records every POST (headers and raw body) and answers with the next status of `script`
(then 200), or hangs while `hang` is set (until the test releases it).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, port: int = 0):
        self.received: list[tuple[dict, bytes]] = []
        self.script: list[int] = []  # statuses to answer, in order; then 200
        self.hang = threading.Event()  # while set, requests wait for `release`
        self.release = threading.Event()
        self.attempts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.attempts += 1
                    status = receiver.script.pop(0) if receiver.script else 200
                if receiver.hang.is_set():
                    receiver.release.wait(30)
                    return
                if 200 <= status < 300:
                    with receiver._lock:
                        receiver.received.append(({k.lower(): v for k, v in self.headers.items()},
                                                  body))
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/T0/B0/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self) -> list[dict]:
        with self._lock:
            return [json.loads(body) for _, body in self.received]

    def wait_for(self, n: int, timeout_s: float = 10.0) -> list[dict]:
        """Until `n` events were received (bounded); the events."""
        deadline = time.monotonic() + timeout_s
        while len(self.events()) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"received {len(self.events())} of {n} events")
            time.sleep(0.01)
        return self.events()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
