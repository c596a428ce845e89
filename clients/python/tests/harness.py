"""Real servers for the tests: ``RLOCK_SERVER`` (default ``redis-server``) with
the module ``RLOCK_MODULE`` (default ``<repo>/target/release/librlock.so``),
no persistence, each on a free loopback port in its own directory."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
sys.dont_write_bytecode = True

import redis  # noqa: E402

MODULE = os.environ.get("RLOCK_MODULE") or os.path.join(ROOT, "target", "release", "librlock.so")
SERVER = os.environ.get("RLOCK_SERVER") or "redis-server"


_RUNNING: "set[Server]" = set()


@atexit.register
def _stop_leftovers() -> None:
    """Servers a failed or interrupted run did not stop."""
    for s in list(_RUNNING):
        s.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server process with the module loaded."""

    def __init__(self, *extra: str) -> None:
        if not os.path.exists(MODULE):
            raise RuntimeError("%s is missing: run `cargo build --release`" % MODULE)
        self.dir = tempfile.mkdtemp(prefix="rlock-py-")
        self.frozen = False
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc: Optional[subprocess.Popen[Any]] = None
        _RUNNING.add(self)
        # Another test's server may take the port between free_port() and
        # the bind: then another port.
        for _ in range(5):
            if self._start_on(free_port(), extra):
                return
        self.stop()
        raise RuntimeError("%s did not start (ports taken); log in %s" % (SERVER, self.dir))

    def _start_on(self, port: int, extra: Any) -> bool:
        """False when the port was taken; raises when the server fails otherwise."""
        self.port = port
        self.log.seek(0)
        self.log.truncate()
        self.proc = subprocess.Popen(
            [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "no", "--loadmodule", MODULE, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                # Our child answering, not a server that had the port first.
                r = redis.Redis(port=port, socket_timeout=1)
                if r.ping() and r.info("server").get("process_id") == self.proc.pid:
                    return True
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None:
                with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
                    if "Address already in use" in f.read():
                        return False
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("%s did not start on port %d" % (SERVER, port))
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return "redis://127.0.0.1:%d/0" % self.port

    def client(self, **kw: Any) -> "redis.Redis":
        return redis.Redis(port=self.port, **kw)

    @property
    def alive(self) -> bool:
        """Running and answering (not killed, not frozen)."""
        return self.proc is not None and self.proc.poll() is None and not self.frozen

    def kill(self) -> None:
        """SIGKILL: the server is gone, its port refuses connections."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP: connections open, nothing answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self) -> None:
        if self.proc is not None:
            self.thaw()
            if self.proc.poll() is None:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        _RUNNING.discard(self)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def servers(n: int) -> List[Server]:
    return [Server() for _ in range(n)]


def server_name(client: "redis.Redis") -> str:
    info = client.info("server")
    if "valkey_version" in info:
        return "valkey %s" % info["valkey_version"]
    return "redis %s" % info["redis_version"]
