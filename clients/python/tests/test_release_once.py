"""A RELEASE is sent once: when its reply is lost (a TCP proxy swallows it),
the library does not resend it (redis-py's default retries would, and on a
reentrant hold the second RELEASE drops the outer hold too). So is an
ACQUIRE without BLOCK (a second one would take a second hold)."""

from __future__ import annotations

import asyncio
import socket
import threading
import unittest
from typing import Optional

import harness
import redis
import redis.asyncio

from rlock import Lock
from rlock._common import parse_info
from rlock.aio import AsyncLock, _close

SERVER: Optional[harness.Server] = None


def setUpModule() -> None:
    global SERVER
    SERVER = harness.Server()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.stop()


class LossyProxy:
    """Forwards to the server; once armed, drops the server's replies on the
    connection that sent a command containing the marker."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.marker: Optional[bytes] = None
        self.mutex = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            lossy = threading.Event()
            threading.Thread(target=self._up, args=(client, server, lossy), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, lossy), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, lossy: threading.Event) -> None:
        self._pump(src, dst, lambda data: self._check(data, lossy) or True)

    def _down(self, src: socket.socket, dst: socket.socket, lossy: threading.Event) -> None:
        self._pump(src, dst, lambda data: not lossy.is_set())

    def _check(self, data: bytes, lossy: threading.Event) -> None:
        with self.mutex:
            if self.marker is not None and self.marker in data:
                self.marker = None
                lossy.set()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, forward) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if forward(data):
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def calls(r: "redis.Redis", command: str) -> int:
    return int(r.info("commandstats").get("cmdstat_" + command, {}).get("calls", 0))


def release_calls(r: "redis.Redis") -> int:
    return calls(r, "rlock.release")


class ReleaseOnceTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.direct = SERVER.client()
        self.direct.flushall()
        self.proxy = LossyProxy(SERVER.port)

    def tearDown(self) -> None:
        self.proxy.close()
        self.direct.close()

    def check_outer_hold_kept(self, key: str, before: int) -> None:
        self.assertEqual(release_calls(self.direct), before + 1, "RELEASE was resent")
        info = self.direct.execute_command("RLOCK.INFO", key)
        self.assertIsNotNone(info, "the outer hold was dropped too")
        self.assertIsNone(Lock(self.direct, key, owner="other").acquire(blocking=False))

    def test_a_lost_release_reply_is_not_resent(self) -> None:
        for keepalive in (False, True):
            with self.subTest(keepalive=keepalive):
                key = "once-%s" % keepalive
                # redis-py's default: retries on timeouts.
                r = redis.Redis(port=self.proxy.port, socket_timeout=0.5)
                lock = Lock(r, key, keepalive=keepalive)
                self.assertIsNotNone(lock.acquire())
                self.assertIsNotNone(lock.acquire())
                before = release_calls(self.direct)
                self.proxy.marker = b"RLOCK.RELEASE"
                with self.assertRaises(redis.RedisError):
                    lock.release()
                self.check_outer_hold_kept(key, before)
                self.direct.execute_command("RLOCK.FORCERELEASE", key)
                r.close()

    def test_async_a_lost_release_reply_is_not_resent(self) -> None:
        async def scenario() -> None:
            r = redis.asyncio.Redis(port=self.proxy.port, socket_timeout=0.5)
            try:
                lock = AsyncLock(r, "once-async")
                self.assertIsNotNone(await lock.acquire())
                self.assertIsNotNone(await lock.acquire())
                before = release_calls(self.direct)
                self.proxy.marker = b"RLOCK.RELEASE"
                with self.assertRaises(redis.RedisError):
                    await lock.release()
                self.check_outer_hold_kept("once-async", before)
                await lock.release()
            finally:
                await _close(r)

        asyncio.run(scenario())

    def check_one_hold(self, key: str, before: int) -> None:
        self.assertEqual(calls(self.direct, "rlock.acquire"), before + 1, "ACQUIRE was resent")
        info = parse_info(self.direct.execute_command("RLOCK.INFO", key))
        assert info is not None
        self.assertEqual(info["holds"], 1)

    def test_a_lost_acquire_reply_is_not_resent(self) -> None:
        r = redis.Redis(port=self.proxy.port, socket_timeout=0.5)
        lock = Lock(r, "acquire-once")
        before = calls(self.direct, "rlock.acquire")
        self.proxy.marker = b"RLOCK.ACQUIRE"
        with self.assertRaises(redis.RedisError):
            lock.acquire(blocking=False)
        self.check_one_hold("acquire-once", before)
        r.close()

    def test_async_a_lost_acquire_reply_is_not_resent(self) -> None:
        async def scenario() -> None:
            r = redis.asyncio.Redis(port=self.proxy.port, socket_timeout=0.5)
            try:
                before = calls(self.direct, "rlock.acquire")
                self.proxy.marker = b"RLOCK.ACQUIRE"
                with self.assertRaises(redis.RedisError):
                    await AsyncLock(r, "acquire-once-async").acquire(blocking=False)
                self.check_one_hold("acquire-once-async", before)
            finally:
                await _close(r)

        asyncio.run(scenario())


if __name__ == "__main__":
    unittest.main()
