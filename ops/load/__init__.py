"""The load-generation library every load tool here uses: the bench (ops.bench), the drills
(ops.drill), the load test (`python -m ops.load`) and the overhead measurement
(ops.bench.overhead).

- `Sender` (ops.load.sender): the one HTTP client that generates load, raw HTTP/1.1 on
  kept-alive connections; a request ends as a `Shot` (status or no answer, latency, the response
  headers asked for, when it was sent).
- `closed_loop` / `open_loop` / `drain` (ops.load.loops): N clients that wait for their answer
  (and honour Retry-After), or a fixed rate whatever the answers; `LoopLag`, the client's own
  delay; `recovery_time`, how soon the server answers again.
- `summarize` (ops.load.tally): the status histogram, goodput and latency percentiles.
- ops.load.processes: the server's processes (RSS, CPU time, niceness), by process title.
"""

from ops.load.loops import (
    LoopLag,
    Offered,
    closed_loop,
    drain,
    honour_retry_after,
    measure_closed,
    no_backoff,
    open_loop,
    recovery_time,
)
from ops.load.sender import BadResponse, Sender, SenderStats, Shot, parse_head
from ops.load.tally import bucket, parse_server_timing, pct, statuses, summarize

__all__ = [
    "BadResponse", "LoopLag", "Offered", "Sender", "SenderStats", "Shot", "bucket",
    "closed_loop", "drain", "honour_retry_after", "measure_closed", "no_backoff", "open_loop",
    "parse_head", "parse_server_timing", "pct", "recovery_time", "statuses", "summarize",
]
