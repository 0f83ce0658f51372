"""A causal LM's arms through the gateway, end to end, beside its decode loop in process.

    python -m ops.bench --task generate --model-path DIR                  # both parts
    python -m ops.bench --task generate --model-path DIR --no-inprocess   # the gateway only

The application of the settings (`CANARY_*`, `--set`) starts on a local Ray Serve with a
throwaway Redis (ops.bench.target), each arm forced in turn through the audited path. For each
concurrency `c` the requests are the in-process cells' (ops.bench.generate_loop: the regression
set's texts cut to 8-40 prompt tokens, each answered with a length of its own, greedy, EOS
ignored), sent as `POST /v1/completions` with `stream: true` by `c` closed-loop clients (a
client sends its next request when its answer is done), each on a kept-alive connection of its
own. A client times every SSE event as it arrives; a token whose text is still empty (a
character not yet complete) sends no event, so the gaps are between the events a client sees.
Each answer's tokens are counted from its `usage` chunk.

Rows `gateway <arm>`: output tokens/s over the cell, time to the first event (from the
request's write) and between events, p50 and p99. The ratio beside them: the gateway's baseline
arm over the decode loop in process (the same fp32 model, the same requests, the same `c`):
what the gateway, its replica hop and the stream cost per token.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from ops.bench.generate_loop import Cell, lengths, prompts

TIMEOUT_S = 300.0  # a whole cell's bound


@dataclass
class Answer:
    """What one streamed answer came to."""

    status: int
    events: list[float]  # when each text event arrived (perf_counter)
    tokens: int  # usage.completion_tokens (0: no usage chunk)
    sent: float


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _chunks(reader: asyncio.StreamReader):
    """The body of a chunked response, chunk by chunk, as it arrives."""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


class StreamClient:
    """One kept-alive HTTP/1.1 connection that sends streamed completions (raw asyncio: the
    client shares the CPUs with the gateway it measures, as ops.load.sender explains)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = (parts.path.rstrip("/") + "/v1/completions").encode()  # under a prefix too
        self.reader = self.writer = None

    async def complete(self, body: dict) -> Answer:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode()
        self.writer.write(b"POST " + self.path + b" HTTP/1.1\r\nHost: bench\r\n"
                          b"Content-Type: application/json\r\nConnection: keep-alive\r\n"
                          b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
                          + payload)
        sent = time.perf_counter()
        status, headers = await _read_head(self.reader)
        events, tokens, pending = [], 0, b""
        if headers.get("transfer-encoding") != "chunked":
            await self.reader.readexactly(int(headers.get("content-length", 0)))
            return Answer(status, events, tokens, sent)
        async for data in _chunks(self.reader):
            now = time.perf_counter()
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif event.get("choices") and event["choices"][0].get("text"):
                    events.append(now)
        return Answer(status, events, tokens, sent)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def streamed_cell(url: str, model: str, way: str, requests: list[list[int]],
                        wanted: list[int], concurrency: int) -> Cell:
    """The requests through `url` to `model` by `concurrency` closed-loop streaming clients."""
    cell = Cell(way, concurrency)
    queue = list(zip(requests, wanted, strict=True))
    refused = 0

    async def client() -> None:
        nonlocal refused
        stream = StreamClient(url)
        try:
            while queue:
                prompt, length = queue.pop(0)
                answer = await stream.complete({
                    "model": model, "prompt": prompt, "max_tokens": length, "temperature": 0,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}})
                if answer.status != 200 or not answer.events:
                    refused += 1
                    continue
                cell.ttft.append(answer.events[0] - answer.sent)
                cell.itl += [b - a for a, b in zip(answer.events, answer.events[1:],
                                                   strict=False)]
                cell.tokens += answer.tokens
        finally:
            await stream.close()

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(concurrency))), TIMEOUT_S)
    cell.seconds = time.perf_counter() - started
    cell.note = f"{refused} not answered" if refused else ""
    return cell


def measure(url: str, tokenizer, arms: list[str], switch, concurrencies: list[int],
            max_tokens: int, say) -> list[dict]:
    """Rows `gateway <arm>` per concurrency, each arm forced by `switch` (ops.bench.target's
    ArmSwitch) before its cells; a warm-up of a few answers first."""
    import httpx

    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    cells = {c: prompts(tokenizer, max(16, 2 * c)) for c in concurrencies}  # the same per arm
    warm = prompts(tokenizer, 16)[:4]
    rows = []
    for arm in arms:
        switch.force(arm)
        asyncio.run(streamed_cell(url, model, "warm-up", warm, [4] * len(warm), 2))
        for c, requests in cells.items():
            wanted = lengths(len(requests), max_tokens)
            rows.append(asyncio.run(streamed_cell(url, model, f"gateway {arm}", requests, wanted,
                                                  c)).row())
            say(f"c={c} gateway {arm}: {rows[-1]['tokens_per_s']} tokens/s, ITL p99 "
                f"{rows[-1]['itl_p99_ms']} ms {rows[-1]['note']}")
    return rows


def ratios(rows: list[dict]) -> list[str]:
    """Per concurrency: the gateway's baseline arm over the decode loop in process."""
    lines = []
    for c in sorted({r["concurrency"] for r in rows}):
        way = {r["way"]: r for r in rows if r["concurrency"] == c}
        gateway, loop = way.get("gateway baseline"), way.get("decode loop")
        if gateway and loop and gateway["tokens_per_s"] and loop["tokens_per_s"]:
            lines.append(f"- c={c}: the gateway's baseline arm "
                         f"{gateway['tokens_per_s'] / loop['tokens_per_s']:.2f}x the decode loop "
                         "in process (tokens/s)")
    return lines
