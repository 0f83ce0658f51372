#!/usr/bin/env python3
"""HAProxy as Ray Serve starts it for the gateway: its listeners on the gateway's address, and
gone when the Ray process that started it is gone.

Serve runs `RAY_SERVE_HAPROXY_BINARY_PATH` with HAProxy's own arguments (`-db -f CONFIG ...`);
`serve.ray_env.apply` points it here, and this program execs the real binary
(`GATEWAY_HAPROXY_BINARY`) after two things Serve has no setting for:

- Binds. Serve's template binds HAProxy's stats page (`bind *:8404`) and metrics page
  (`bind :9101`), and its HTTP door under direct ingress, on every interface. Each `bind` line
  of CONFIG that names no address gets `GATEWAY_HAPROXY_BIND` (the gateway's `listen_host`);
  unset or empty, CONFIG is left as Serve wrote it.
- Parent death. HAProxy outlives a Ray process that is killed (SIGKILL, `ray stop --force`,
  a crash), still holding the HTTP port and answering 500. Here the kernel sends HAProxy
  SIGTERM when the thread that started it exits (Linux `prctl(PR_SET_PDEATHSIG)`; kept across
  exec): Serve starts HAProxy from its proxy's event loop, which lives as long as the proxy.

Standard library only, and nothing newer than Python 3.6 (f-strings): it runs on whatever
`python3` the Ray node's PATH finds, before any virtual environment.
"""

import ctypes
import os
import re
import signal
import sys

BINARY = "GATEWAY_HAPROXY_BINARY"
BIND = "GATEWAY_HAPROXY_BIND"
PR_SET_PDEATHSIG = 1
# `bind :9101`, `bind *:8404`, `bind 0.0.0.0:8000`, `bind [::]:8000`: a bind on every interface
_ANY = re.compile(r"^(?P<lead>\s*bind\s+)(?:\*|0\.0\.0\.0|\[?::\]?)?:(?P<port>\d+)\b", re.M)


def rebind(config, host):
    """`config` with each bind on every interface moved to `host` (HAProxy reads the port after
    the last colon, so an IPv6 address needs no brackets)."""
    return _ANY.sub(lambda m: "{}{}:{}".format(m.group("lead"), host, m.group("port")), config)


def config_path(argv):
    """The file after `-f` in HAProxy's arguments, or None."""
    for i in range(len(argv) - 1):
        if argv[i] == "-f":
            return argv[i + 1]
    return None


def die_with_parent():
    """SIGTERM to this process (and what it execs) when its parent thread exits; False where
    the kernel has no such call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv):
    binary = os.environ.get(BINARY, "")
    if not binary or os.path.realpath(binary) == os.path.realpath(__file__):
        sys.stderr.write(f"haproxy_launcher: {BINARY} names no HAProxy binary ({binary!r})\n")
        return 2
    host = os.environ.get(BIND, "")
    path = config_path(argv)
    if host and path and os.path.isfile(path):
        with open(path) as f:
            config = f.read()
        moved = rebind(config, host)
        if moved != config:
            with open(path + ".rebind", "w") as f:
                f.write(moved)
            os.replace(path + ".rebind", path)
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the call: nobody to serve
        return 0
    os.execv(binary, [binary] + argv)
    return 1  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
