"""A model replica's start-up progress reaches the console of `serve run`
(serve.replica.model_server)."""

import logging
import os
import sys

from serve.replica.model_server import startup_log


class ToLogger:
    """What Serve's throughput mode makes of a replica's `sys.stderr`: a logger's stream."""

    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)

    def flush(self) -> None:
        pass


def test_progress_goes_to_the_processs_own_stderr_even_when_sys_stderr_is_redirected(
        monkeypatch, caplog):
    read, write = os.pipe()
    redirected = ToLogger()
    monkeypatch.setattr(sys, "stderr", redirected)
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        progress = startup_log("optimized", console_fd=write)
        progress("auto: measuring ov-int8", None)
        progress("auto: ov-int8 agreement 0.991", None)
    os.close(write)
    with os.fdopen(read) as pipe:
        shown = pipe.read().splitlines()
    assert shown == ["optimized model: auto: measuring ov-int8",
                     "optimized model: auto: ov-int8 agreement 0.991"]
    assert redirected.lines == []  # not through the redirected stream
    assert "optimized model: auto: ov-int8 agreement 0.991" in caplog.text  # the log too
