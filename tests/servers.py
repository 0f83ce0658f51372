"""Real servers for integration tests: a Redis server on a free loopback port in a temp dir."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from serve.ray_env import free_port

ACL_FILE = Path(__file__).resolve().parents[1] / "ops" / "redis-users.acl"
ACL_PASSWORDS = {"operator": "change-me-operator", "gateway": "change-me-gateway",
                 "controller": "change-me-controller", "admin": "admin-for-fault-tests"}
# the tests' own user beside ops/redis-users.acl's: every command, for injecting faults
# (CONFIG SET, REPLICAOF, CLIENT PAUSE, SCRIPT KILL) that no production user may send
ADMIN_ACL = f"user admin on >{ACL_PASSWORDS['admin']} ~* &* +@all\n"


class RedisServer:
    """A throwaway `redis-server` on 127.0.0.1: start, stop, restart (same port), pause.

    `password`: requirepass for the default user. `acl`: load ops/redis-users.acl (users
    `operator`, `gateway` and `controller`; the default user is off). `tls`: serve TLS only,
    with a self-signed CA made with openssl in the server's temp dir.
    """

    def __init__(self, password: str | None = None, *, acl: bool = False, tls: bool = False):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: install Debian's redis-server package")
        self.binary = binary
        self.port = free_port()
        self.password = password
        self.acl = acl
        self.tls = tls
        self.dir = Path(tempfile.mkdtemp(prefix="canary-redis-"))
        self.proc: subprocess.Popen | None = None
        if tls:
            make_certs(self.dir)

    @property
    def url(self) -> str:
        """The URL of the all-powerful user: the default one, or `operator` under ACLs."""
        if self.acl:
            return self.url_for("operator")
        auth = f":{self.password}@" if self.password else ""
        return self._url(auth)

    def url_for(self, user: str) -> str:
        return self._url(f"{user}:{ACL_PASSWORDS[user]}@")

    def _url(self, auth: str) -> str:
        if self.tls:
            ca = self.dir / "ca.crt"
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary, "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--appendonly", "no",
            # the fault tests move `dir` to fail a snapshot (MISCONF)
            "--enable-protected-configs", "yes",
        ]
        if self.tls:
            args += [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.dir / "server.crt"),
                "--tls-key-file", str(self.dir / "server.key"),
                "--tls-ca-cert-file", str(self.dir / "ca.crt"), "--tls-auth-clients", "no",
            ]
        else:
            args += ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        if self.acl:
            acl = self.dir / "users.acl"
            acl.write_text(ACL_FILE.read_text().rstrip("\n") + "\n" + ADMIN_ACL)
            args += ["--aclfile", str(acl)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server on port {self.port} did not start"
                    ) from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def admin(self) -> redis.Redis:
        """A client allowed every command (the default user, or `admin` under ACLs)."""
        url = self.url_for("admin") if self.acl else self.url
        return redis.Redis.from_url(url, decode_responses=True)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_certs(where: Path) -> None:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "server.key", "-out", "server.csr")
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.ext")
