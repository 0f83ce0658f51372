"""The unit tier's fence: a unit test needs neither Ray nor the network.

While a unit test runs, `ray.init`, `serve.start` and `serve.run` raise `UnitTierError`, and so
does a socket connection to anything but this machine's loopback (127.0.0.0/8, ::1, `localhost`)
or a unix socket. Ray is never imported for it: its entry points are replaced when the test starts
if `ray` is already imported, or the moment the test imports it. A refusal that the code under
test catches still fails the test, at teardown. A Ray that an earlier tier left running in the
process (a fixture scoped wider than its tier) fails each unit test before it starts: its threads
would run under the unit tier. Tests outside tests/unit are not fenced.
"""

from __future__ import annotations

import importlib.abc
import ipaddress
import socket
import sys
from collections.abc import Callable

import pytest

WHERE = ("a test that needs it belongs in tests/integration (a real Redis, a real small Ray); "
         "a unit test fakes the call")
# what starts Ray, by module: Serve's entry points call ray.init too, but refuse by their own name
RAY_ENTRIES = {"ray": ("init",), "ray.serve": ("start", "run")}
INET = (socket.AF_INET, socket.AF_INET6)


class UnitTierError(RuntimeError):
    """A unit test reached for Ray or beyond the loopback (not an OSError: code that retries
    network errors does not swallow it)."""


class Fence:
    """The refusals of one unit test; `refused` is read (and cleared) by tests of the fence."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def refuse(self, what: str) -> UnitTierError:
        message = f"{what} in a unit test: {WHERE}"
        self.refused.append(message)
        return UnitTierError(message)


def is_loopback(host) -> bool:
    """Whether a connect address's host is this machine's loopback; a name other than
    `localhost` is not (it would need a DNS lookup)."""
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str):
        return False
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 scope id is no part
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def _fence_sockets(mp: pytest.MonkeyPatch, fence: Fence) -> None:
    def checked(original: Callable) -> Callable:
        def connect(sock, address, *args):
            if sock.family in INET and not is_loopback(address[0]):
                raise fence.refuse(f"a socket connection to {address!r}")
            return original(sock, address, *args)
        return connect

    create_connection = socket.create_connection

    def create_loopback_connection(address, *args, **kwargs):
        if not is_loopback(address[0]):  # refused before the name is looked up
            raise fence.refuse(f"a socket connection to {address!r}")
        return create_connection(address, *args, **kwargs)

    mp.setattr(socket.socket, "connect", checked(socket.socket.connect))
    mp.setattr(socket.socket, "connect_ex", checked(socket.socket.connect_ex))
    mp.setattr(socket, "create_connection", create_loopback_connection)


def _fence_ray(mp: pytest.MonkeyPatch, fence: Fence, module) -> None:
    for name in RAY_ENTRIES[module.__name__]:
        what = f"{module.__name__}.{name}()"

        def refused(*args, _what=what, **kwargs):
            raise fence.refuse(_what)

        mp.setattr(module, name, refused)


class _ThenFence(importlib.abc.Loader):
    """A module's own loader, then `fence(module)`; the module keeps its own loader."""

    def __init__(self, loader, fence: Callable) -> None:
        self._loader, self._fence = loader, fence

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader
        self._fence(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _FenceOnImport(importlib.abc.MetaPathFinder):
    """Finds Ray's modules with the finders after it and fences each one once it has run."""

    def __init__(self, fence: Callable) -> None:
        self._fence = fence

    def find_spec(self, name, path, target=None):
        if name not in RAY_ENTRIES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenFence(spec.loader, self._fence)
                return spec
        return None


@pytest.fixture(autouse=True)
def unit_fence():
    """Refuses Ray and outside connections for the test (see the module docstring)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.fail("Ray is still running in this process, left by an earlier tier's fixture: "
                    "scope it to its tier (package), so that no Ray thread runs under a unit "
                    "test", pytrace=False)
    fence = Fence()
    with pytest.MonkeyPatch.context() as mp:
        _fence_sockets(mp, fence)

        def fence_ray(module) -> None:
            _fence_ray(mp, fence, module)

        for name in RAY_ENTRIES:
            if name in sys.modules:
                fence_ray(sys.modules[name])
        finder = _FenceOnImport(fence_ray)
        sys.meta_path.insert(0, finder)
        try:
            yield fence
        finally:
            sys.meta_path.remove(finder)
    if fence.refused:
        pytest.fail("the unit tier's fence refused: " + "; ".join(fence.refused), pytrace=False)
