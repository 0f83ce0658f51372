"""The end-to-end part of `python -m ops.bench`: every cell in order (ops.bench.target.order)
on the gateway's arms, forced through the audited path and restored, on plain Serve and on
the peer servers, each with the CPU per request of the processes on its path (ops.bench.cpu).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ops.bench import cpu, endtoend, front_doors, peers, target


@dataclass
class Measured:
    """The end-to-end part: levels per arm, of the plain deployment and of each peer, and the
    peak RSS (MiB) of the serve processes."""

    arms: dict[str, list[dict]]
    plain: list[dict] = field(default_factory=list)
    peers: dict[str, list[dict]] = field(default_factory=dict)  # --peer: by peer name
    protocols: list[dict] = field(default_factory=list)  # --protocol: ops.bench.front_doors
    memory: dict[str, float] = field(default_factory=dict)


def measure(args, settings, url, texts, say) -> Measured:
    """The end-to-end part of a run: on the gateway at `url`, or on a local app with what
    `args` adds beside it (plain Serve, the peers); `settings` are the run's."""
    from serve.recipes import source

    if url:
        return _levels(args, settings, url, texts, say)
    with local_gateway(args, settings, say) as (local, local_url), \
            contextlib.ExitStack() as stack:
        plain_url = None
        if args.plain:
            from ops.bench import plain

            say("deploying plain Ray Serve beside it")
            plain_url = stack.enter_context(plain.deployed(local, local_url))
        running = stack.enter_context(peers.started(
            args.peer, source.model_dir(local), args.infinity_venv,
            Path(args.out) / "peers", say)) if args.peer else {}
        return _levels(args, local, local_url, texts, say, app=target.APP,
                       plain_url=plain_url, running=running)


@contextlib.contextmanager
def local_gateway(args, settings, say):
    """The application of `settings` on a local Ray Serve, on `REDIS_URL` or `--redis-url` when
    given, else on a throwaway Redis: (the settings it runs with, its URL)."""
    with target.redis_for(settings.redis_url if (args.redis_url or os.environ.get("REDIS_URL"))
                          else None) as redis_url:
        local = settings.model_copy(update={"redis_url": redis_url})
        say("starting the local app (Ray Serve)")
        with target.local_app(local) as url:
            yield local, url


def _levels(args, settings, url, texts, say, app=None, plain_url=None,
            running=None) -> Measured:
    """Every cell in `target.order`, arms forced through the audited path and restored;
    `running`: the peer servers (ops.bench.peers), by name."""
    running = running or {}
    switch = target.ArmSwitch(settings, url)
    measured = Measured({arm: [] for arm in args.arms}, peers={name: [] for name in running})
    launchers = {peer.pid: name for name, peer in running.items()}
    steps = target.order(args.arms, args.inputs_per_request, args.concurrency,
                         plain=plain_url is not None, peers=list(running))
    try:
        for who, size, c in steps:
            if who == target.PLAIN:
                level = _cell(args, plain_url, texts, c, size, app, target.PLAIN)
                measured.plain.append(level)
            elif who in running:
                level = _cell(args, running[who].url, texts, c, size, app, cpu.PEER + who,
                              running[who].peer.door, launchers)
                measured.peers[who].append(level)
            else:
                switch.force(who)
                level = _cell(args, url, texts, c, size, app, who)
                measured.arms[who].append(level)
            say(f"{who if who == target.PLAIN or who in running else f'gateway {who}'} "
                f"c={c}, {size} text(s) "
                f"per request: {level['rps']:.1f} req/s, p50 {level['p50_ms']} ms, p99 "
                f"{level['p99_ms']} ms, answered by {level['arms']}, failed {level['failed']} "
                f"of {level['sent']}")
            for name in (app, target.PLAIN) if plain_url else (app,):
                for process, mib in target.process_memory(name).items():
                    measured.memory[process] = max(mib, measured.memory.get(process, 0.0))
        if args.protocol:
            measured.protocols = _front_doors(args, switch, url, texts, say, app)
    finally:
        switch.restore()
    return measured


def _front_doors(args, switch, url: str, texts: list[str], say, app: str | None) -> list[dict]:
    """`--protocol`: every door asked for, on baseline, in each cell (ops.bench.front_doors)."""
    switch.force("baseline")
    named = front_doors.doors(args.protocol, front_doors.served_model(url))
    cells = [(size, c) for size in args.inputs_per_request for c in args.concurrency]
    return front_doors.measure(
        cells, named,
        lambda c, size, door: _cell(args, url, texts, c, size, app, "baseline", door), say)


def _cell(args, url: str, texts: list[str], concurrency: int, size: int, app: str | None,
          who: str, door: endtoend.Door | None = None,
          launchers: dict[int, str] | None = None) -> dict:
    """One level of `who` (an arm, `plain` or `peer:<name>`) on `url`, with the CPU per
    answered request of each process on its path (ops.bench.cpu; the load client alone for a
    gateway given by URL). `launchers`: each peer server's pid and name."""
    probe = cpu.probe(who, app, plain_app=target.PLAIN, peers=launchers) if app else \
        cpu.Probe({os.getpid(): (cpu.CLIENT, "the load client (this process)")})
    level = endtoend.load(url, texts, concurrency, seconds=args.seconds, warmup=args.warmup,
                          per_request=size, task=args.task, timeout=args.timeout, door=door,
                          probe=probe)
    level["cpu"] = cpu.per_request(probe, level["ok"])
    return level
