"""Header routes: operator rules that send requests with a given header value to a named arm.

A route is part of the rollout state (`RolloutState.routes`), so it is written by the same
audited compare-and-set as the share, reaches every gateway through the same change channel,
is kept in the state history (a revert restores the routes of the revision) and is fenced like
any other change. Routes are kept in id order (`r1`, `r2`, ...); a new route takes the number
after the highest in use. The first route whose header carries one of its values decides
(rollout.policy); a request that no route matches is routed by the hashed share, unchanged.

Header names are stored lower-case (HTTP names are case-insensitive) and values are matched
exactly. Credentials, the override header itself and hop-by-hop headers cannot be routed on:
a route must never turn a secret into a routing signal, nor depend on what a proxy rewrites.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout.errors import InvalidChange

MAX_ROUTES = 32
MAX_VALUES = 32
MAX_VALUE_CHARS = 256
MAX_HEADER_CHARS = 64
OVERRIDE_HEADER = "x-canary-arm-override"
ARMS = ("baseline", "optimized")
# never a routing signal: credentials, the override header, and hop-by-hop headers (RFC 9110)
FORBIDDEN_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", OVERRIDE_HEADER, "connection",
    "keep-alive", "proxy-authenticate", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade",
})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]+$")  # an HTTP field name (RFC 9110 token)
_ID = re.compile(r"^r([1-9][0-9]{0,5})$")


def header_problem(name: str) -> str | None:
    """Why `name` cannot be routed on, or None (the name as given, any case)."""
    low = name.strip().lower()
    if not low or len(low) > MAX_HEADER_CHARS or not _TOKEN.fullmatch(low):
        return (f"header {name!r} is not a valid HTTP header name (letters, digits and "
                f"!#$%&'*+.^_`|~- only, at most {MAX_HEADER_CHARS} characters)")
    if low in FORBIDDEN_HEADERS:
        return f"header {low!r} cannot be routed on (credentials, the override, hop-by-hop)"
    return None


def value_problem(value: str) -> str | None:
    """Why `value` cannot be a route's header value, or None."""
    if not value or len(value) > MAX_VALUE_CHARS:
        return f"a header value has 1..{MAX_VALUE_CHARS} characters, got {len(value)}"
    if value != value.strip() or not value.isprintable() or not value.isascii():
        return (f"header value {value!r} must be printable ASCII without leading or trailing "
                "spaces (it is matched exactly)")
    return None


class Route(BaseModel):
    """One header route: requests whose `header` is one of `values` go to `arm`. Fields a newer
    version stores are kept (as RolloutState's)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str = Field(pattern=_ID.pattern, description="r1, r2, ...: stable, in creation order")
    header: str = Field(description="the HTTP header name, lower-case")
    values: tuple[str, ...] = Field(min_length=1, max_length=MAX_VALUES)
    arm: Literal["baseline", "optimized"]
    reason: str = ""
    created_by: str = ""
    created_at: float = 0.0

    @field_validator("header")
    @classmethod
    def _header(cls, name: str) -> str:
        problem = header_problem(name)
        if problem or name != name.strip().lower():
            raise ValueError(problem or "header names are stored lower-case")
        return name

    @field_validator("values")
    @classmethod
    def _values(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            problem = value_problem(value)
            if problem:
                raise ValueError(problem)
        if len(set(values)) != len(values):
            raise ValueError("a route lists each header value once")
        return values

    @property
    def number(self) -> int:
        return int(self.id[1:])

    def matches(self, headers: Mapping[str, str]) -> bool:
        """Whether a request with these headers (lower-case names) takes this route."""
        value = headers.get(self.header)
        return value is not None and value.strip() in self.values

    def describe(self) -> str:
        """'r1: x-user-group = internal|qa -> optimized'."""
        return f"{self.id}: {self.header} = {'|'.join(self.values)} -> {self.arm}"


def check_routes(routes: tuple[Route, ...]) -> tuple[Route, ...]:
    """The invariants of a state's routes: at most MAX_ROUTES, ids unique and ascending, no
    header value claimed by two routes (which would make the later one dead)."""
    if len(routes) > MAX_ROUTES:
        raise ValueError(f"at most {MAX_ROUTES} routes, got {len(routes)}")
    numbers = [r.number for r in routes]
    if numbers != sorted(set(numbers)):
        raise ValueError("route ids must be unique and in ascending order")
    seen: set[tuple[str, str]] = set()
    for route in routes:
        for value in route.values:
            if (route.header, value) in seen:
                raise ValueError(f"{route.header}: {value} is routed twice")
            seen.add((route.header, value))
    return routes


def parse_header(spec: str) -> tuple[str, tuple[str, ...]]:
    """'X-User-Group=internal,qa' -> ('x-user-group', ('internal', 'qa')); InvalidChange names
    what is wrong."""
    name, sep, values = spec.partition("=")
    if not sep:
        raise InvalidChange(f"--header must be NAME=VALUE[,VALUE...], got {spec!r}")
    return name.strip().lower(), tuple(v.strip() for v in values.split(","))


def with_route(routes: tuple[Route, ...], header: str, values: tuple[str, ...] | list[str],
               arm: str, *, actor: str, reason: str, now: float) -> tuple[Route, ...]:
    """`routes` plus a new one (the next id); InvalidChange for anything wrong with it."""
    problem = header_problem(header)
    if problem:
        raise InvalidChange(problem)
    header = header.strip().lower()
    values = tuple(values)
    if not 1 <= len(values) <= MAX_VALUES:
        raise InvalidChange(f"a route has 1..{MAX_VALUES} header values, got {len(values)}")
    for value in values:
        problem = value_problem(value)
        if problem:
            raise InvalidChange(problem)
    if len(set(values)) != len(values):
        raise InvalidChange("a route lists each header value once")
    if arm not in ARMS:
        raise InvalidChange(f"arm must be baseline or optimized, got {arm!r}")
    if len(routes) >= MAX_ROUTES:
        raise InvalidChange(f"there are already {MAX_ROUTES} routes (the most): remove one first")
    for route in routes:
        taken = sorted(set(values) & set(route.values)) if route.header == header else []
        if taken:
            raise InvalidChange(f"{header}: {', '.join(taken)} is already routed by {route.id} "
                                f"(to {route.arm}): remove it first")
    number = max((r.number for r in routes), default=0) + 1
    route = Route(id=f"r{number}", header=header, values=values, arm=arm, reason=reason,
                  created_by=actor, created_at=now)
    return (*routes, route)


def without_route(routes: tuple[Route, ...], route_id: str) -> tuple[tuple[Route, ...], Route]:
    """`routes` less the one with `route_id`, and that route; InvalidChange if there is none."""
    for route in routes:
        if route.id == route_id:
            return tuple(r for r in routes if r.id != route_id), route
    known = ", ".join(r.id for r in routes) or "none"
    raise InvalidChange(f"no route {route_id!r} (routes: {known})")


def first_match(routes: tuple[Route, ...], headers: Mapping[str, str]) -> Route | None:
    """The first route, in id order, that the request's headers match."""
    for route in routes:
        if route.matches(headers):
            return route
    return None
