"""A minimal Redis client: RESP2 over TCP, TLS or a Unix socket, standard library only.

For the one command that cannot wait for redis-py's import (about 0.3 s on a 2-core machine,
most of it redis.asyncio): `rollout kill` / `unkill` (rollout.killswitch). Everything else uses
redis-py.

It reads the URLs redis-py's `Redis.from_url` reads, for the options below, and connects as
redis-py does (AUTH [username] password, CLIENT SETNAME, then SELECT db; the same TLS context).

    redis://[[username]:password@]host[:port][/db]    rediss://...    unix:///path?db=N
    query options: db, username, password, client_name, socket_timeout (each reply),
                   socket_connect_timeout; ssl_cert_reqs (none | optional | required),
                   ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_check_hostname
    accepted and ignored: max_connections, health_check_interval, timeout (a pool's: one
                   connection, used once, has none to size, check or wait for) and
                   socket_read_size (a buffer size)

redis-py 8.1 reads 16 query options by name (`URL_QUERY_ARGUMENT_PARSERS`) and passes any other
to its connection class as a string (about 25 more: ssl_ca_path, ssl_password, ssl_ciphers,
ssl_min_version, the OCSP options, protocol, retry_on_timeout, lib_name...), and each release
adds some. A URL with any option not listed above (or a value this client would read otherwise,
such as a bad port) raises `Unsupported`, and the kill runs over redis-py instead
(rollout.killswitch.RedisPyConnection, imported then): a URL is never connected differently
from the gateway's, and never refused when redis-py takes it.

and the Sentinel form as rollout.redis_conn reads it (`connect` takes either):

    redis+sentinel://[[username]:password@]host:port[,host:port...]/<service>[/<db>]
    rediss+sentinel://...   (TLS to the sentinels and the primary, the query options above)

With a sentinel URL, `connect` asks the sentinels in order (`SENTINEL get-master-addr-by-name`),
connects to the primary the first one that answers names, and checks that it says `master`
(`ROLE`; an ACL user refused ROLE relies on the write's READONLY error instead). A sentinel or
primary that cannot be reached, or an address that is not (yet) the primary, is an OSError: the
caller may find the primary again and retry (`retryable`).

Errors: `ReplyError` for an error reply (WRONGPASS, NOPERM, NOSCRIPT, ...; `AuthError` when
the credentials are refused); OSError (timeouts and TLS errors included) for the transport;
`ProtocolError` for a reply it cannot read. `rollout_error` turns them into the rollout's errors
as the Redis store reports redis-py's (StoreUnavailable, PermissionDenied).
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlparse

from rollout.errors import PermissionDenied, StoreRefused, StoreUnavailable
from rollout.redis_conn import FALSE_WORDS, SentinelURL, is_sentinel, parse_sentinel_url, redact_url

OPTIONS = {"db", "username", "password", "client_name", "socket_timeout",
            "socket_connect_timeout", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile",
            "ssl_keyfile", "ssl_check_hostname"}
# accepted and ignored, each with redis-py's parser: a value it refuses is still its to report
IGNORED_OPTIONS = {"max_connections": int, "health_check_interval": int, "timeout": float,
            "socket_read_size": int}


class Unsupported(ValueError):
    """The URL needs an option this client does not implement: use redis-py."""


class ReplyError(Exception):
    """Redis answered with an error."""


class AuthError(ReplyError):
    """Redis refused the credentials (WRONGPASS, NOAUTH, or an AUTH it could not take)."""


class ProtocolError(Exception):
    """A reply this client cannot read."""


class NoPrimary(OSError):
    """No sentinel named a primary that answers as one (a failover may be in progress)."""


# Error replies a failover causes: the address is no longer (or not yet) a writable primary.
_FAILOVER_REPLIES = ("READONLY", "LOADING", "MASTERDOWN", "TRYAGAIN")


def retryable(exc: BaseException) -> bool:
    """Whether finding the primary again and retrying may help: the transport failed, or the
    server answered as a replica (or one still loading) would."""
    if isinstance(exc, ReplyError):
        return str(exc).startswith(_FAILOVER_REPLIES)
    return isinstance(exc, (OSError, ProtocolError))


@dataclass(frozen=True)
class Address:
    """Where and how to connect, as redis-py's `parse_url` reads a URL."""

    tls: bool = False
    host: str = "localhost"
    port: int = 6379
    path: str | None = None  # a Unix socket
    db: int = 0
    username: str | None = None
    password: str | None = None
    cert_reqs: str = "required"
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True
    client_name: str | None = None
    read_timeout_s: float | None = None  # None: the caller's timeout
    connect_timeout_s: float | None = None


def parse_url(url: str) -> Address:
    """The address of a redis://, rediss:// or unix:// URL; Unsupported for anything else."""
    try:
        parts = urlparse(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise Unsupported(f"scheme {parts.scheme!r}")
        query = {name: values[0] for name, values in parse_qs(parts.query).items() if values}
        unknown = set(query) - OPTIONS - set(IGNORED_OPTIONS)
        if unknown:
            raise Unsupported(f"URL options {sorted(unknown)}")
        for option, parse in IGNORED_OPTIONS.items():
            if option in query:
                parse(query[option])
        fields: dict = _numbers(query)
        if "client_name" in query:
            fields["client_name"] = query["client_name"]
        username = unquote(parts.username) if parts.username else query.get("username")
        password = unquote(parts.password) if parts.password else query.get("password")
        if username and not password:
            raise Unsupported("a username without a password")
        fields.update(username=username or None, password=password or None)
        if parts.scheme == "unix":
            fields["path"] = unquote(parts.path) if parts.path else None
            if not fields["path"]:
                raise Unsupported("a unix:// URL without a path")
        else:
            if parts.hostname:
                fields["host"] = unquote(parts.hostname)
            if parts.port:
                fields["port"] = int(parts.port)
            if parts.path and "db" not in query:
                try:
                    fields["db"] = int(unquote(parts.path).replace("/", ""))
                except ValueError:
                    pass  # redis-py ignores a path that is not a number too
        if parts.scheme == "rediss":
            fields.update(_tls(query))
        return Address(**fields)
    except ValueError as exc:  # a bad port or db number: redis-py's to report
        raise Unsupported(str(exc)) from None


def _numbers(query: dict[str, str]) -> dict:
    """db and the socket timeouts (ValueError for a value redis-py would read otherwise)."""
    fields: dict = {}
    if "db" in query:
        fields["db"] = int(query["db"])
    for option, name in (("socket_timeout", "read_timeout_s"),
                         ("socket_connect_timeout", "connect_timeout_s")):
        if option in query:
            seconds = float(query[option])
            if not 0 < seconds < float("inf"):
                raise ValueError(f"{option}={query[option]!r}")
            fields[name] = seconds
    return fields


def _tls(query: dict[str, str]) -> dict:
    reqs = query.get("ssl_cert_reqs", "required")
    if reqs not in ("none", "optional", "required"):
        raise Unsupported(f"ssl_cert_reqs={reqs!r}")
    check = query.get("ssl_check_hostname")
    return {"tls": True, "cert_reqs": reqs, "ca_certs": query.get("ssl_ca_certs"),
            "certfile": query.get("ssl_certfile"), "keyfile": query.get("ssl_keyfile"),
            "check_hostname": True if check is None else check.upper() not in FALSE_WORDS}


class Connection:
    """One connection, authenticated and on its database; a context manager."""

    def __init__(self, address: Address, timeout_s: float):
        self._sock = _open(address, address.connect_timeout_s or timeout_s)
        self._sock.settimeout(address.read_timeout_s or timeout_s)
        self._file = self._sock.makefile("rb")
        try:
            if address.password:
                self._auth(address)
            if address.client_name and self.call("CLIENT", "SETNAME",
                                                 address.client_name) != "OK":
                raise ReplyError("CLIENT SETNAME was not accepted")
            if address.db and self.call("SELECT", address.db) != "OK":
                raise ReplyError(f"SELECT {address.db} was not accepted")
        except BaseException:
            self.close()
            raise

    def _auth(self, address: Address) -> None:
        creds = [address.username] if address.username else []
        try:
            if self.call("AUTH", *creds, address.password) != "OK":
                raise AuthError("AUTH was not accepted")
        except ReplyError as exc:
            raise AuthError(str(exc)) from None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()

    def call(self, *args):
        """Send one command, return its reply (strings decoded as UTF-8, as redis-py's
        `decode_responses=True` does); an error reply raises ReplyError."""
        self._sock.sendall(_command(args))
        return self._reply()

    def script(self, source: str, keys: list[str], args: list) -> object:
        """Run a Lua script as redis-py's `register_script` does: EVALSHA, and EVAL (which
        caches it) the first time the server does not know it."""
        sha = hashlib.sha1(source.encode()).hexdigest()
        try:
            return self.call("EVALSHA", sha, len(keys), *keys, *args)
        except ReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return self.call("EVAL", source, len(keys), *keys, *args)

    def _reply(self):
        line = self._file.readline()
        if not line.endswith(b"\r\n"):
            raise ProtocolError("the connection closed mid-reply")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body.decode()
        if kind == b"-":
            text = body.decode(errors="replace")
            raise (AuthError if text.startswith(("NOAUTH", "WRONGPASS")) else ReplyError)(text)
        if kind == b":":
            return int(body)
        if kind == b"$":
            size = int(body)
            if size < 0:
                return None
            data = self._file.read(size + 2)
            if len(data) != size + 2:
                raise ProtocolError("the connection closed mid-reply")
            return data[:-2].decode()
        if kind == b"*":
            count = int(body)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise ProtocolError(f"unexpected reply type {kind!r}")


def connect(url: str, timeout_s: float) -> Connection:
    """A connection to the Redis at `url` (`timeout_s` for connecting and for each reply); for
    a sentinel URL, to the primary its sentinels name."""
    if is_sentinel(url):
        try:
            parsed = parse_sentinel_url(url)
        except ValueError as exc:  # malformed: the settings' validation reports it
            raise Unsupported(str(exc)) from None
        return connect_primary(parsed, timeout_s)
    return Connection(parse_url(url), timeout_s)


def connect_primary(url: SentinelURL, timeout_s: float) -> Connection:
    """The primary of `url.service`, as the first sentinel that answers names it; NoPrimary
    when none does, or when the address it names does not answer as the primary."""
    problems = []
    for host, port in url.sentinels:
        try:
            with Connection(_address(url, host, port, sentinel=True), timeout_s) as sentinel:
                named = sentinel.call("SENTINEL", "get-master-addr-by-name", url.service)
        except (OSError, ReplyError, ProtocolError) as exc:
            problems.append(f"sentinel {host}:{port}: {type(exc).__name__}: {exc}")
            continue
        if not named:
            problems.append(f"sentinel {host}:{port} knows no service {url.service!r}")
            continue
        primary = Connection(_address(url, named[0], int(named[1])), timeout_s)
        try:
            _check_primary(primary, f"{named[0]}:{named[1]}")
        except BaseException:
            primary.close()
            raise
        return primary
    raise NoPrimary("no primary for " + url.service + ": " + "; ".join(problems))


def _address(url: SentinelURL, host: str, port: int, *, sentinel: bool = False) -> Address:
    """A sentinel's address (no credentials, no db) or the primary's, TLS as the URL says."""
    tls = _tls(dict(url.tls_options)) if url.tls else {}  # the options of rediss://
    if sentinel:
        return Address(host=host, port=port, **tls)
    return Address(host=host, port=port, db=url.db, username=url.username,
                   password=url.password, **tls)


def _check_primary(conn: Connection, where: str) -> None:
    try:
        role = conn.call("ROLE")
    except ReplyError as exc:
        if str(exc).startswith("NOPERM"):
            return  # an ACL user without ROLE: a write to a replica answers READONLY
        raise
    if not role or role[0] != "master":
        raise NoPrimary(f"{where} answers as {role[0] if role else 'nothing'}, not the primary")


def _open(address: Address, timeout_s: float) -> socket.socket:
    if address.path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(address.path)
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not address.tls:
        return sock
    try:
        return _context(address).wrap_socket(sock, server_hostname=address.host)
    except BaseException:
        sock.close()
        raise


def _context(address: Address):
    """The TLS context redis-py's SSLConnection builds for the same options."""
    import ssl

    context = ssl.create_default_context()
    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED}[address.cert_reqs]
    context.check_hostname = address.check_hostname if reqs != ssl.CERT_NONE else False
    context.verify_mode = reqs
    if address.certfile or address.keyfile:
        context.load_cert_chain(certfile=address.certfile, keyfile=address.keyfile)
    if address.ca_certs is not None:
        context.load_verify_locations(cafile=address.ca_certs)
    return context


def _command(args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def rollout_error(exc: BaseException, url: str) -> BaseException:
    """`exc` as the rollout's error, as rollout.redis_store reports redis-py's (the URL's
    password redacted): refused credentials, the transport or a failover reply is
    StoreUnavailable (transient unless the credentials were refused), NOPERM PermissionDenied,
    any other error reply (OOM, MISCONF, a script error) StoreRefused; anything else is
    returned as it is."""
    safe = redact_url(url)
    if isinstance(exc, ReplyError) and str(exc).startswith("NOPERM"):
        return PermissionDenied(f"Redis at {safe} refused: {str(exc).partition(' ')[2]}")
    if isinstance(exc, AuthError):
        error = StoreUnavailable(f"cannot reach Redis at {safe}: AuthenticationError: {exc}")
        error.transient = False
        return error
    if retryable(exc):
        return StoreUnavailable(f"cannot reach Redis at {safe}: {type(exc).__name__}: {exc}")
    if isinstance(exc, ReplyError):
        return StoreRefused.from_reply(str(exc), safe)
    return exc
