"""What the load client itself costs per request: ops.load's `Sender` against httpx's
`AsyncClient`, side by side in one run, against a loopback server in another process that
answers every request at once (so that the client's CPU time is all that is measured).

    python -m ops.bench.client_cost                       # 3 rounds of 4,000 requests each
    python -m ops.bench.client_cost --requests 2000 --concurrency 8,64 --rounds 5

For each concurrency, the rounds alternate the two clients (Sender, httpx, httpx, Sender, ...)
and report the best round of each: the client process's CPU time per request (user + system,
`time.process_time`) and the requests per second it reached. On a machine whose CPUs the load
generator shares with the server it measures, the CPU a client spends per request is taken from
the server: that is why the load is generated with `Sender` (ops.load.sender's docstring holds
the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time

import httpx

from ops.cli.types import client_counts, positive_int
from ops.load import Sender

BODY = json.dumps({"inputs": ["a short text to classify"]}).encode()
OUTPUTS = b'{"outputs": [{"label": 1, "score": 0.9}]}'
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
          + str(len(OUTPUTS)).encode() + b"\r\nServer-Timing: total;dur=1.0\r\n\r\n" + OUTPUTS)


async def fixed_answer_server(reply: bytes) -> asyncio.Server:
    """A loopback HTTP/1.1 server on a free port answering every request (its head and its
    Content-Length body read) with `reply`, at once; a connection ends when the client closes
    it or sends what it cannot frame."""
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError, IndexError, ValueError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)


def _serve(port_out) -> None:
    """The loopback server (its own process): answers every request with ANSWER."""
    async def main():
        server = await fixed_answer_server(ANSWER)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


async def _workers(send, requests: int, concurrency: int) -> None:
    todo = iter(range(requests))

    async def worker():
        for i in todo:
            await send(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _round(client: str, url: str, requests: int, concurrency: int) -> tuple[float, float]:
    """(CPU ms per request, requests per second) of one client for `requests` requests."""
    if client == "sender":
        sender = Sender(url, connections=concurrency, capture=("server-timing",))

        async def send(i):
            shot = await sender(BODY, f"k{i}")
            if shot.status != 200:
                raise RuntimeError(f"the loopback server answered {shot.status}")

        close = sender.aclose
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        http = httpx.AsyncClient(base_url=url, limits=limits, timeout=30)

        async def send(i):
            response = await http.post("/v1/predict", content=BODY, headers={
                "X-Routing-Key": f"k{i}", "Content-Type": "application/json"})
            if response.status_code != 200:
                raise RuntimeError(f"the loopback server answered {response.status_code}")

        close = http.aclose
    await _workers(send, min(requests, 200), concurrency)  # connections opened, not measured
    cpu, wall = time.process_time(), time.perf_counter()
    await _workers(send, requests, concurrency)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await close()
    return cpu * 1000 / requests, requests / wall


def measure(url: str, requests: int, concurrencies: list[int], rounds: int) -> list[dict]:
    """Per concurrency: the best round of each client (see the module docstring)."""
    rows = []
    for concurrency in concurrencies:
        best: dict[str, tuple[float, float]] = {}
        for r in range(rounds):
            for client in ("sender", "httpx") if r % 2 == 0 else ("httpx", "sender"):
                cpu_ms, rps = asyncio.run(_round(client, url, requests, concurrency))
                if client not in best or cpu_ms < best[client][0]:
                    best[client] = (cpu_ms, rps)
                print(f"c={concurrency} round {r + 1}/{rounds} {client:<6} {cpu_ms:.3f} ms CPU "
                      f"per request, {rps:.0f} req/s", file=sys.stderr)
        rows.append({"concurrency": concurrency, **{
            f"{client}_{what}": round(value, 3)
            for client, (cpu_ms, rps) in best.items()
            for what, value in (("cpu_ms", cpu_ms), ("rps", rps))}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.client_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=positive_int, default=4_000,
                        help="requests per round (default 4000)")
    parser.add_argument("--concurrency", type=client_counts, default=[8, 64],
                        help="comma-separated concurrency levels (default 8,64)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds per client and level, best reported (default 3)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    ports = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=30)}"
        rows = measure(url, args.requests, args.concurrency, args.rounds)
    finally:
        server.terminate()
        server.join(5)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'clients':>7} {'Sender CPU ms/req':>18} {'httpx CPU ms/req':>17} {'ratio':>6} "
          f"{'Sender req/s':>13} {'httpx req/s':>12}")
    for row in rows:
        print(f"{row['concurrency']:>7} {row['sender_cpu_ms']:>18.3f} {row['httpx_cpu_ms']:>17.3f} "
              f"{row['httpx_cpu_ms'] / row['sender_cpu_ms']:>5.1f}x {row['sender_rps']:>13.0f} "
              f"{row['httpx_rps']:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
