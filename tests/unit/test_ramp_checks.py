"""A ramp's HTTP checks: judging an answer (rollout.ramp.checks, pure), running several at once
within their timeouts, and the HTTP checker (serve.control_plane.checks) against a real local HTTP
server."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout.ramp.checks import Check, CheckResult, judge, run_checks, unanswered
from serve.control_plane.checks import HttpChecker


class Receiver:
    """A local HTTP server whose answer the test sets: `status`, `body`, `headers`; `hang`
    (an Event) makes it wait before answering until the event is set."""

    def __init__(self):
        self.status, self.body, self.headers = 200, b'{"data": {"error_rate": 0.002}}', {}
        self.hang: threading.Event | None = None
        self.requests: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                receiver.requests.append(self.path)
                if receiver.hang is not None:
                    receiver.hang.wait(10)
                self.send_response(receiver.status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(receiver.body)))
                self.end_headers()
                self.wfile.write(receiver.body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/health") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        if self.hang is not None:
            self.hang.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def a_check(**fields) -> Check:
    return Check(**{"url": "http://mon/x", **fields})


# --- judging an answer ---------------------------------------------------------------------------


def test_the_expected_status_passes_and_another_fails():
    assert judge(a_check(), 200, b"") == CheckResult("mon/x", "pass", 200.0, "status 200")
    failed = judge(a_check(expect=204), 503, b"oops")
    assert (failed.status, failed.value, failed.note) == ("fail", 503.0, "HTTP 503, expected 204")


@pytest.mark.parametrize(("value", "status", "note"), [
    (0.004, "pass", ""), (0.01, "pass", ""), (0.02, "fail", "above max 0.01"),
    (0.0005, "fail", "below min 0.001"), ("0.005", "pass", ""),  # a Prometheus string
])
def test_a_field_is_judged_against_its_thresholds(value, status, note):
    check = a_check(field="data.result.0.value", max=0.01, min=0.001)
    result = judge(check, 200, json.dumps({"data": {"result": [{"value": value}]}}).encode())
    assert (result.status, result.note, result.threshold) == (status, note, ">= 0.001, <= 0.01")


@pytest.mark.parametrize(("body", "note"), [
    (b"<html>ok</html>", "the answer is not JSON"),
    (b"\xff\xfe", "the answer is not JSON"),
    (b'{"data": {}}', "no field data.error_rate in the answer (at 'error_rate')"),
    (b'{"data": []}', "no field data.error_rate in the answer"),
    (b'{"data": {"error_rate": "high"}}', "data.error_rate is not a number"),
    (b'{"data": {"error_rate": true}}', "data.error_rate is not a number"),
    (b'{"data": {"error_rate": null}}', "data.error_rate is not a number"),
])
def test_an_answer_without_a_usable_field_waits(body, note):
    result = judge(a_check(field="data.error_rate", max=0.01), 200, body)
    assert result.status == "wait" and note in result.note and result.value is None


def test_a_status_mismatch_fails_before_the_field_is_read():
    assert judge(a_check(field="a", max=1), 500, b"not json").status == "fail"


# --- running checks at once ---------------------------------------------------------------------


class SlowChecker:
    def __init__(self):
        self.release = threading.Event()

    def check(self, check):
        if check.label == "slow":
            self.release.wait(10)
        if check.label == "broken":
            raise RuntimeError("bug")
        return CheckResult(check.label, "pass", 200.0, check.threshold_text())


def test_checks_run_at_once_and_one_past_its_timeout_waits():
    checker = SlowChecker()
    checks = [a_check(name="slow", timeout_s=0.2), a_check(name="fast"), a_check(name="broken")]
    try:
        results = run_checks(checker, checks)
    finally:
        checker.release.set()
    assert [(r.name, r.status) for r in results] == [
        ("slow", "wait"), ("fast", "pass"), ("broken", "wait")]
    assert results[0].note == "no answer within 0.2s"
    assert results[2].note == "checker error: bug"


def test_without_a_checker_every_check_waits():
    assert run_checks(None, [a_check()]) == (unanswered(a_check(), "no checker configured"),)
    assert run_checks(None, []) == ()


# --- the HTTP checker against a real server -----------------------------------------------------


def test_the_http_checker_passes_on_the_expected_status_and_field(receiver):
    check = Check(url=receiver.url("/metrics?q=1"), field="data.error_rate", max=0.01)
    result = HttpChecker().check(check)
    assert (result.status, result.value) == ("pass", 0.002)
    assert receiver.requests == ["/metrics?q=1"]


def test_the_http_checker_fails_on_another_status_or_a_broken_threshold(receiver):
    receiver.status = 500
    result = HttpChecker().check(Check(url=receiver.url()))
    assert (result.status, result.value, result.note) == ("fail", 500.0,
                                                           "HTTP 500, expected 200")
    receiver.status, receiver.body = 200, b'{"data": {"error_rate": 0.3}}'
    result = HttpChecker().check(Check(url=receiver.url(), field="data.error_rate", max=0.01))
    assert (result.status, result.value, result.note) == ("fail", 0.3, "above max 0.01")


def test_a_receiver_that_hangs_is_a_wait_after_the_timeout(receiver):
    receiver.hang = threading.Event()
    result = HttpChecker().check(Check(url=receiver.url(), timeout_s=0.3))
    assert (result.status, result.note) == ("wait", "no answer within 0.3s")


def test_a_refused_connection_is_a_wait():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    result = HttpChecker().check(Check(url=f"http://127.0.0.1:{port}/health", timeout_s=2))
    assert result.status == "wait" and result.note.startswith("unreachable: ")
    assert "refused" in result.note.lower()


def test_an_answer_that_is_not_json_is_a_wait(receiver):
    receiver.body = b"<html>all good</html>"
    result = HttpChecker().check(Check(url=receiver.url(), field="data.error_rate", max=0.01))
    assert result.status == "wait" and result.note.startswith("the answer is not JSON")


def test_an_answer_over_the_bound_is_a_wait(receiver):
    receiver.body = json.dumps({"data": {"error_rate": 0.0}, "pad": "x" * 5000}).encode()
    result = HttpChecker(max_body=1000).check(
        Check(url=receiver.url(), field="data.error_rate", max=0.01))
    assert (result.status, result.note) == ("wait", "the answer is over 1000 bytes")


def test_redirects_are_followed_to_http_only(receiver):
    receiver.status, receiver.headers = 302, {"Location": "ftp://files.internal/x"}
    result = HttpChecker().check(Check(url=receiver.url()))
    assert result.status == "wait" and "redirect to 'ftp://files.internal/x' refused" in \
        result.note
    receiver.headers = {"Location": "file:///etc/passwd"}  # not followed: the 302 is judged
    assert HttpChecker().check(Check(url=receiver.url())).value == 302.0
    second = Receiver()
    try:
        receiver.headers = {"Location": second.url("/moved")}
        assert HttpChecker().check(Check(url=receiver.url())).status == "pass"
        assert second.requests == ["/moved"]
    finally:
        second.close()


def test_a_hanging_receiver_does_not_hold_the_other_checks(receiver):
    fast = Receiver()
    receiver.hang = threading.Event()
    try:
        results = run_checks(HttpChecker(), [
            Check(url=receiver.url(), name="hangs", timeout_s=0.5),
            Check(url=fast.url(), name="fast", timeout_s=5)])
    finally:
        fast.close()
    assert [(r.name, r.status) for r in results] == [("hangs", "wait"), ("fast", "pass")]
    assert results[0].note == "no answer within 0.5s"


# --- shown with the gates: `rollout ramp status` and the dashboard's panel ------------------------


def test_status_and_the_dashboard_show_each_check_and_the_deadline(tmp_path, monkeypatch):
    import io

    from ops import cli
    from rollout.ramp import RampController
    from serve.dashboard.ramp import ramp_status
    from tests.ramp_harness import Harness

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    h = Harness()
    h.verdict()
    h.controller = RampController(h.states, h.ramps, h.metrics, clock=h.clock, owner="c1",
                                  checker=HttpChecker())
    plan = tmp_path / "plan.yaml"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there: the check waits
    plan.write_text("gates: {p99_ms: 500}\nprogress_deadline_s: 7200\non_deadline: pause\n"
                    f"checks: [{{url: 'http://127.0.0.1:{port}/ok', name: budget, "
                    "field: data.burn, max: 1}]\nsteps: [{percent: 10}, {percent: 100}]\n")

    def rollout(*argv):
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--actor", "alice", *argv], store=h.states, clock=h.clock, stdout=out,
                        stderr=err, ramps=h.ramps)
        assert code == 0, err.getvalue()
        return out.getvalue()

    rollout("ramp", "start", str(plan), "--reason", "go")
    h.healthy()
    h.tick()  # advance to 10 %
    assert h.tick().kind == "hold"
    out = rollout("ramp", "status")
    assert "a step held 2h past its soak is paused" in out
    lines = out.splitlines()
    rows = [line.split() for line in lines[lines.index("checks:") + 1:]]
    assert rows[0] == ["CHECK", "VALUE", "EXPECTED", "STATUS"]
    assert rows[1][:6] == ["budget", "-", "<=", "1", "wait", "(unreachable:"]
    last = ramp_status(h.control)["last_evaluation"]
    assert [(c["name"], c["status"], c["threshold"]) for c in last["checks"]] == [
        ("budget", "wait", "<= 1")]
