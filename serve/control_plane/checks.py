"""The ramp's HTTP checker: fetches a plan's check URL and judges the answer
(rollout.ramp.checks.judge); injected into the ramp controller (serve.control_plane.controller).

One GET per check, with the check's `timeout_s` for the whole answer (connect, headers, body),
at most `MAX_BODY` bytes read, no proxy from the environment, and redirects followed only to
http(s) URLs, at most `MAX_REDIRECTS` times. Any answer is judged, whatever its status (a 500
is an answer: the check fails); no usable answer (refused, timed out, a redirect elsewhere,
a body over the bound) is `wait`, never an exception.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from rollout.ramp.checks import Check, CheckResult, judge, unanswered

MAX_BODY = 1 << 20  # bytes read from an answer
MAX_REDIRECTS = 3
_CHUNK = 64 << 10


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) only, and only a few."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise urllib.error.URLError(f"redirect to {newurl[:80]!r} refused (http(s) only)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _TooSlow(Exception):
    pass


class HttpChecker:
    """`rollout.ramp.checks.Checker` over HTTP."""

    def __init__(self, *, max_body: int = MAX_BODY):
        self.max_body = max_body
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _Redirects)

    def check(self, check: Check) -> CheckResult:
        deadline = time.monotonic() + check.timeout_s
        request = urllib.request.Request(check.url, headers={
            "Accept": "application/json", "User-Agent": "canary-ramp-check"})
        try:
            with self._opener.open(request, timeout=check.timeout_s) as answer:
                return judge(check, answer.status, self._read(answer, deadline))
        except urllib.error.HTTPError as exc:  # an answer with a status other than 2xx
            with exc:
                try:
                    body = self._read(exc, deadline)
                except (OSError, _TooSlow, ValueError):
                    body = b""
                return judge(check, exc.code, body)
        except _TooSlow:
            return unanswered(check, f"no whole answer within {check.timeout_s:g}s")
        except TimeoutError:
            return unanswered(check, f"no answer within {check.timeout_s:g}s")
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                return unanswered(check, f"no answer within {check.timeout_s:g}s")
            return unanswered(check, f"unreachable: {_why(exc.reason)}")
        except ValueError as exc:  # a body over the bound, a malformed answer
            return unanswered(check, str(exc))
        except (OSError, http.client.HTTPException) as exc:  # reset mid-way, not HTTP
            return unanswered(check, f"unreachable: {_why(exc)}")

    def _read(self, answer, deadline: float) -> bytes:
        """The body, at most `max_body` bytes, before the deadline."""
        chunks, size = [], 0
        while True:
            if time.monotonic() > deadline:
                raise _TooSlow()
            chunk = answer.read(_CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_body:
                raise ValueError(f"the answer is over {self.max_body} bytes")
            chunks.append(chunk)


def _why(reason: object) -> str:
    text = str(reason) or type(reason).__name__
    return text if len(text) <= 120 else text[:117] + "..."
