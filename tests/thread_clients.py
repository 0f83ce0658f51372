"""`ThreadClients`: one `httpx.Client` per thread, as real clients each hold their own.

A test that sends from a thread pool must not share one `httpx.Client` across its threads:
httpx does not document its client as safe for that. Its connection pool (httpcore's, 1.0.x)
decides under a lock which connections to close (expired, or surplus idle ones once it holds
more than `max_keepalive_connections`, 20 by default) and closes them after releasing it. A
connection it has just handed to another thread, which that thread has not started on yet,
counts as idle; when that thread starts its request between the decision and the close, the
socket is closed under it and the request fails with `ReadError: [Errno 9] Bad file
descriptor` (or, with the descriptor already reused, reads another request's bytes). Sharing
a client among more threads than its keep-alive slots makes the pool close and reopen about one
connection per request, so a burst of thousands of requests hits that window now and then.
A client per thread has one connection per thread, kept alive, and nothing closes it from
outside.
"""

from __future__ import annotations

import threading

import httpx


class ThreadClients:
    """Hands each thread its own client to `base_url`, made on first use in that thread.

    Clients of threads that have ended are closed when another client is made (a thread pool's
    workers end with the pool), the rest by `close`."""

    def __init__(self, base_url: str, **options) -> None:
        self.base_url = base_url
        self.options = options
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: dict[threading.Thread, httpx.Client] = {}

    def get(self) -> httpx.Client:
        """This thread's client."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(base_url=self.base_url, **self.options)
            with self._lock:
                self._close_ended()
                self._clients[threading.current_thread()] = client
        return client

    def _close_ended(self) -> None:
        """Closes the clients of threads that have ended (called under the lock)."""
        for thread in [thread for thread in self._clients if not thread.is_alive()]:
            self._clients.pop(thread).close()

    def close(self) -> None:
        """Closes every thread's client."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
