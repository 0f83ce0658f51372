"""Every Redis connection the project opens: the URL forms it reads, the client it builds, and
the replica acknowledgement (`WAIT`) that a durable write waits for.

Two kinds of URL (the settings' `REDIS_URL`, `CANARY_CONTROL_REDIS_URL`, a `--redis-url`):

    redis://[[user]:password@]host[:port][/db]   rediss://...   unix:///path?db=N
        one Redis, as redis-py's `Redis.from_url` reads it (unchanged)
    redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/<db>]
    rediss+sentinel://...?ssl_ca_certs=...       the same over TLS
        Redis Sentinel: the sentinels, asked in the order given, name the primary of
        `<service>`; the client follows it across a failover. The user and password are the
        primary's (and its replicas'): the same ACL users as with one Redis. The sentinels are
        asked without credentials. TLS (`rediss+`) applies to the sentinels and the primary
        alike, with the query options `ssl_cert_reqs`, `ssl_ca_certs`, `ssl_certfile`,
        `ssl_keyfile`, `ssl_check_hostname` of `rediss://`. A port defaults to 26379, the db to 0.

A malformed sentinel URL raises ValueError saying what is wrong (no service, a bad port, a bad
db), never echoing the password: `redact_url` is how any URL reaches a message or a log.

Standard library only at import: the settings and `rollout kill`'s client (rollout.resp_client)
parse URLs here without importing redis-py; `open_client` imports it when it builds a client.

Durable writes (`Acknowledgement`): after a share change, a kill, an audit entry or a ramp write,
`WAIT <replicas> <timeout_ms>` on the same connection returns how many replicas have it; fewer
than asked raises NotAcknowledged (the write is in effect on the primary, but a failover before a
replica copies it would lose it). `replicas` 0 skips the WAIT: one Redis works exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

from rollout.errors import NotAcknowledged

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)
DEFAULT_SENTINEL_PORT = 26379
TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile",
               "ssl_check_hostname")
_SERVICE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# redis-py's to_bool (rollout.resp_client reads it too)
FALSE_WORDS = ("0", "F", "FALSE", "N", "NO")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed `redis+sentinel://` (or `rediss+sentinel://`) URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_options: tuple[tuple[str, str], ...] = ()  # (name, value) from the query, in order

    @property
    def cert_reqs(self) -> str:
        return dict(self.tls_options).get("ssl_cert_reqs", "required")

    @property
    def check_hostname(self) -> bool:
        value = dict(self.tls_options).get("ssl_check_hostname")
        return True if value is None else value.upper() not in FALSE_WORDS


def scheme_of(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def is_sentinel(url: str) -> bool:
    return scheme_of(url) in SENTINEL_SCHEMES


def check_url(url: str) -> str:
    """`url` when it is a Redis URL this project reads; ValueError (password redacted) if not."""
    if scheme_of(url) not in SCHEMES:
        raise ValueError("REDIS_URL must start with redis://, rediss://, unix://, "
                         "redis+sentinel:// or rediss+sentinel://")
    if is_sentinel(url):
        parse_sentinel_url(url)
    return url


def parse_sentinel_url(url: str) -> SentinelURL:
    """The sentinels, service, db, credentials and TLS options of a sentinel URL."""
    scheme = scheme_of(url)
    if scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a sentinel URL: {redact_url(url)}")
    rest, _, query = url.partition("://")[2].partition("#")[0].partition("?")
    creds, at, rest = rest.rpartition("@")  # all before the last @: a password may hold / or @
    hosts, slash, path = rest.partition("/")
    username = password = None
    if at:
        user, colon, secret = creds.partition(":")
        if not colon or not secret:
            raise ValueError("sentinel URL: credentials are user:password@ or :password@ "
                             "(a user without a password is not accepted)")
        username, password = unquote(user) or None, unquote(secret)
    sentinels = tuple(_host_port(part) for part in hosts.split(","))
    parts = path.split("/") if slash else []
    if not parts or not parts[0]:
        raise ValueError("sentinel URL: no service name: write .../<service>/<db>, "
                         "e.g. redis+sentinel://host:26379/mymaster/0")
    if len(parts) > 2:
        raise ValueError("sentinel URL: the path is /<service>/<db>, nothing after the db")
    service = unquote(parts[0])
    if not _SERVICE.fullmatch(service):
        raise ValueError("sentinel URL: the service name is 1-128 letters, digits, "
                         "'_', '.', ':' or '-'")
    db = _db(parts[1]) if len(parts) == 2 and parts[1] else 0
    options = _query(query, tls=scheme == "rediss+sentinel")
    return SentinelURL(sentinels, service, db, username, password,
                       tls=scheme == "rediss+sentinel", tls_options=options)


def _host_port(part: str) -> tuple[str, int]:
    if not part:
        raise ValueError("sentinel URL: an empty sentinel address (write host:port,host:port)")
    if part.startswith("["):  # [IPv6]:port
        host, bracket, port = part[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise ValueError(f"sentinel URL: bad sentinel address {part!r}")
        port = port[1:]
    else:
        host, _, port = part.partition(":")
    if not host:
        raise ValueError(f"sentinel URL: no host in sentinel address {part!r}")
    if not port:
        return unquote(host), DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"sentinel URL: bad port {port!r} (1-65535) in {part!r}")
    return unquote(host), int(port)


def _db(text: str) -> int:
    if not text.isdigit() or int(text) > 10_000:
        raise ValueError(f"sentinel URL: bad db {text!r} (a number, e.g. /mymaster/0)")
    return int(text)


def _query(query: str, *, tls: bool) -> tuple[tuple[str, str], ...]:
    options = [(name, values[0]) for name, values in parse_qs(query).items() if values]
    for name, value in options:
        if name not in TLS_OPTIONS:
            raise ValueError(f"sentinel URL: unknown option {name!r} (allowed: "
                             f"{', '.join(TLS_OPTIONS)}, with rediss+sentinel://)")
        if not tls:
            raise ValueError(f"sentinel URL: {name} needs rediss+sentinel://")
        if name == "ssl_cert_reqs" and value not in ("none", "optional", "required"):
            raise ValueError("sentinel URL: ssl_cert_reqs is none, optional or required")
    return tuple(options)


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs (everything before the URL's last
    `@` counts as credentials: a password never shows, whatever it contains)."""
    url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if user else '***'}@{host}"


# --- clients ------------------------------------------------------------------------------------


def open_client(url: str, *, timeout_s: float, health_check_interval: int = 0,
                decode_responses: bool = True):
    """A redis-py client for `url`: `Redis.from_url` for one Redis, the primary of the sentinel
    service (`Sentinel(...).master_for`) for a sentinel URL; the same socket timeouts either way.
    `close()` closes the sentinels' connections too."""
    import redis

    options = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                   health_check_interval=health_check_interval,
                   decode_responses=decode_responses)
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    parsed = parse_sentinel_url(url)
    tls = _redis_py_tls(parsed)
    # One try per sentinel: the next sentinel is the retry (redis-py's default of 10 tries
    # with backoff costs seconds per dead sentinel, on every look-up of the primary).
    sentinel = Sentinel(
        list(parsed.sentinels),
        sentinel_kwargs=dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                             retry=Retry(NoBackoff(), 0), **tls),
    )
    return sentinel.master_for(
        parsed.service, redis_class=_sentinel_client_class(), db=parsed.db,
        username=parsed.username, password=parsed.password, **options, **tls)


def _redis_py_tls(parsed: SentinelURL) -> dict:
    if not parsed.tls:
        return {}
    options = dict(parsed.tls_options)
    tls: dict = {"ssl": True, "ssl_cert_reqs": parsed.cert_reqs,
                 "ssl_check_hostname": parsed.check_hostname}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if name in options:
            tls[name] = options[name]
    return tls


_CLIENT_CLASS = None


def _sentinel_client_class():
    """redis.Redis whose close() also closes the connections to the sentinels."""
    global _CLIENT_CLASS
    if _CLIENT_CLASS is None:
        import redis

        class SentinelRedis(redis.Redis):
            def close(self) -> None:
                manager = getattr(self.connection_pool, "sentinel_manager", None)
                super().close()
                if manager is not None:
                    for each in manager.sentinels:
                        each.close()

        _CLIENT_CLASS = SentinelRedis
    return _CLIENT_CLASS


# --- acknowledged writes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Acknowledgement:
    """How many replicas must have a durable write (`WAIT replicas timeout_ms`); 0: no WAIT."""

    replicas: int = 0
    timeout_ms: int = 1000

    def check(self, acknowledged: int, what: str) -> None:
        """NotAcknowledged when fewer than `replicas` replicas acknowledged `what`."""
        if acknowledged < self.replicas:
            raise NotAcknowledged(not_acknowledged_message(
                what, acknowledged, self.replicas, self.timeout_ms))


def not_acknowledged_message(what: str, acknowledged: int, replicas: int,
                             timeout_ms: int) -> str:
    return (f"{what} was written to the Redis primary, but {acknowledged} of the "
            f"{replicas} replica(s) required acknowledged it within {timeout_ms} ms: it is in "
            "effect now, and may or may not survive a failover of the primary (check the "
            "replicas, then `rollout status`)")


WAIT_MARGIN_MS = 250  # a WAIT ends this long before the socket timeout would cut it off


def acknowledgement_for(url: str, replicas: int | None, timeout_ms: int,
                        socket_timeout_s: float | None = None) -> Acknowledgement:
    """The settings' acknowledgement for `url`: `replicas` None means 1 behind Sentinel, 0 for
    one Redis. The WAIT is kept WAIT_MARGIN_MS inside `socket_timeout_s` (the connection's
    read timeout): a longer one would be cut off by it, and a write in effect reported as
    Redis unreachable instead of not acknowledged."""
    if replicas is None:
        replicas = 1 if is_sentinel(url) else 0
    if socket_timeout_s is not None:
        timeout_ms = max(1, min(timeout_ms, int(socket_timeout_s * 1000) - WAIT_MARGIN_MS))
    return Acknowledgement(replicas, timeout_ms)


def durable_script(client, call: Callable, ack: Acknowledgement, script, keys: list,
                   args: list, what: str, wrote: Callable[[object], bool] = lambda _: True):
    """Run a write script (redis-py's registered `script`), acknowledged by `ack`: with no
    replicas required, as before (EVALSHA); else EVAL and WAIT pipelined on one connection
    (WAIT counts the replicas that have this connection's writes). `call` runs a Redis call,
    mapping its errors (rollout.redis_store.call_redis bound to the URL). The script's reply;
    NotAcknowledged when the script wrote (`wrote(reply)`: a refused compare-and-set wrote
    nothing, and its conflict is the answer) and too few replicas have `what`."""
    if not ack.replicas:
        return call(script, keys=keys, args=args)
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    pipe.execute_command("WAIT", ack.replicas, ack.timeout_ms)
    reply, count = call(pipe.execute)
    if wrote(reply):
        ack.check(int(count), what)
    return reply


def wrote_first(reply) -> bool:
    """For scripts answering {1, ...} when they wrote, {0 or -1, ...} when they refused."""
    return bool(reply) and reply[0] == 1
