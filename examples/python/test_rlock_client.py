#!/usr/bin/env python3
"""Tests of rlock_client.py against a real redis-server loading the module.

Run from anywhere: ``python3 examples/python/test_rlock_client.py``. Needs
redis-server, redis-py (``make deps``) and target/release/librlock.so
(``cargo build --release``). Starts its own server on a free port and prints
``N passed, M failed`` last; exits non-zero on any failure.
"""

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODULE = os.path.join(ROOT, "target", "release", "librlock.so")
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from rlock_client import Lock, LockLost, async_acquire  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """redis-server with the module, no persistence, on a free loopback port."""

    def __init__(self):
        if not os.path.exists(MODULE):
            raise RuntimeError("%s is missing: run `cargo build --release`" % MODULE)
        self.dir = tempfile.mkdtemp(prefix="rlock-py-")
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "redis.log"), "w")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", self.dir, "--save", "", "--appendonly", "no",
             "--loadmodule", MODULE],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port).ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not start, see its log")
            time.sleep(0.02)

    def client(self, **kw):
        return redis.Redis(port=self.port, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server()


def tearDownModule():
    if SERVER is not None:
        SERVER.stop()


def renew_calls(r):
    stats = r.info("commandstats").get("cmdstat_rlock.renew")
    return stats["calls"] if stats else 0


class LockTest(unittest.TestCase):
    def setUp(self):
        self.r = SERVER.client()
        self.r.flushall()

    def tearDown(self):
        self.r.close()

    def test_context_manager_acquires_and_releases(self):
        with Lock(self.r, "cm", lease_ms=5000) as lock:
            self.assertIsInstance(lock.token, int)
            self.assertGreater(lock.token, 0)
            info = lock.info()
            self.assertEqual(info[b"owner"], lock.owner.encode())
            self.assertEqual(info[b"token"], lock.token)
            self.assertTrue(lock.renewing)
            # Reentrant: a second hold, same token.
            token = lock.token
            self.assertTrue(lock.acquire(blocking=False))
            self.assertEqual(lock.token, token)
            self.assertEqual(lock.release(), 1)
        self.assertIsNone(self.r.execute_command("RLOCK.INFO", "cm"))
        self.assertEqual(self.r.exists("cm"), 0)
        self.assertFalse(lock.renewing)
        self.assertIsNone(lock.token)

    def test_busy_lock_without_block_is_not_granted(self):
        with Lock(self.r, "busy"):
            other = Lock(self.r, "busy")
            self.assertFalse(other.acquire(blocking=False))
            start = time.monotonic()
            self.assertFalse(other.acquire(timeout=0.2))
            self.assertGreaterEqual(time.monotonic() - start, 0.15)
            self.assertFalse(other.renewing)

    def test_renewal_keeps_a_short_lease_alive(self):
        lock = Lock(self.r, "renewed", lease_ms=300)
        self.assertTrue(lock.acquire())
        token = lock.token
        time.sleep(1.3)  # more than four leases
        info = lock.info()
        self.assertIsNotNone(info, "the lock expired despite renewal")
        self.assertEqual(info[b"owner"], lock.owner.encode())
        self.assertEqual(info[b"token"], token)
        self.assertGreater(self.r.pttl("renewed"), 0)
        self.assertFalse(lock.lost.is_set())
        self.assertFalse(Lock(self.r, "renewed").acquire(blocking=False))
        self.assertEqual(lock.release(), 0)

    def test_renewal_thread_stops_after_release(self):
        lock = Lock(self.r, "stops", lease_ms=150)
        self.assertTrue(lock.acquire())
        thread = lock._renewer
        time.sleep(0.3)
        self.assertGreater(renew_calls(self.r), 0)
        lock.release()
        self.assertFalse(thread.is_alive())
        self.assertFalse(lock.renewing)
        before = renew_calls(self.r)
        time.sleep(0.4)  # several renewal intervals
        self.assertEqual(renew_calls(self.r), before)
        self.assertEqual(self.r.exists("stops"), 0)

    def test_lost_lock_is_reported(self):
        lock = Lock(self.r, "lost", lease_ms=300)
        self.assertTrue(lock.acquire())
        self.r.execute_command("RLOCK.FORCERELEASE", "lost")
        self.assertTrue(lock.lost.wait(2), "the renewal thread did not notice")
        with self.assertRaises(LockLost):
            lock.release()
        self.assertFalse(lock.renewing)

    def test_two_threads_contend_and_both_succeed_in_turn(self):
        spans = []
        errors = []
        started = threading.Barrier(2)

        def worker(name):
            try:
                client = SERVER.client()
                started.wait()
                with Lock(client, "contended", lease_ms=2000) as lock:
                    begin = time.monotonic()
                    time.sleep(0.2)
                    spans.append((begin, time.monotonic(), name, lock.token))
                client.close()
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(s[2] for s in spans), ["a", "b"])
        first, second = sorted(spans)
        self.assertLessEqual(first[1], second[0], "the holds overlapped")
        self.assertGreater(second[3], first[3], "fencing tokens must increase")
        self.assertEqual(self.r.exists("contended"), 0)

    def test_rwlock_readers_share_and_writer_waits(self):
        a = Lock(self.r, "rw", kind="rwlock", mode="READ")
        b = Lock(self.r, "rw", kind="rwlock", mode="read")
        w = Lock(self.r, "rw", kind="rwlock", mode="WRITE")
        self.assertTrue(a.acquire(blocking=False))
        self.assertTrue(b.acquire(blocking=False))
        self.assertFalse(w.acquire(blocking=False))
        a.release()
        b.release()
        self.assertTrue(w.acquire(blocking=False))
        w.release()

    def test_pubsub_path_acquires_after_the_holder_releases(self):
        holder = Lock(self.r, "ps", lease_ms=5000)
        self.assertTrue(holder.acquire())
        waiter = Lock(SERVER.client(), "ps", lease_ms=5000)
        result = {}

        def wait():
            start = time.monotonic()
            result["granted"] = waiter.acquire_via_pubsub(timeout=5, safety_poll=10)
            result["waited"] = time.monotonic() - start

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        self.assertTrue(t.is_alive(), "acquired while held")
        # No connection is parked on the server: the waiter only subscribed.
        self.assertEqual(self.r.info("rlock")["rlock_waiters"], 0)
        holder.release()
        t.join(5)
        self.assertTrue(result.get("granted"))
        # Woken by the message, not by the (10 s) safety poll.
        self.assertLess(result["waited"], 2)
        self.assertEqual(waiter.info()[b"owner"], waiter.owner.encode())
        waiter.release()

    def test_pubsub_path_acquires_after_the_lease_expires(self):
        self.r.execute_command("RLOCK.ACQUIRE", "psx", "crashed", "PX", 200)
        waiter = Lock(self.r, "psx")
        start = time.monotonic()
        self.assertTrue(waiter.acquire_via_pubsub(timeout=5, safety_poll=10))
        self.assertLess(time.monotonic() - start, 2)
        waiter.release()

    def test_async_pubsub_path(self):
        holder = Lock(self.r, "async", lease_ms=5000)
        self.assertTrue(holder.acquire())

        async def scenario():
            aclient = redis.asyncio.Redis(port=SERVER.port)
            try:
                task = asyncio.ensure_future(
                    async_acquire(aclient, "async", "async-owner", lease_ms=5000,
                                  timeout=5, safety_poll=10))
                await asyncio.sleep(0.3)
                self.assertFalse(task.done())
                # The same connection pool keeps serving other commands.
                self.assertTrue(await aclient.ping())
                await asyncio.get_running_loop().run_in_executor(None, holder.release)
                token = await asyncio.wait_for(task, 5)
                left = await aclient.execute_command("RLOCK.RELEASE", "async", "async-owner")
                return token, left
            finally:
                if hasattr(aclient, "aclose"):
                    await aclient.aclose()
                else:
                    await aclient.close()

        token, left = asyncio.run(scenario())
        self.assertIsInstance(token, int)
        self.assertEqual(left, 0)

    def test_async_pubsub_path_times_out(self):
        self.r.execute_command("RLOCK.ACQUIRE", "async-busy", "x", "PX", 5000)

        async def scenario():
            aclient = redis.asyncio.Redis(port=SERVER.port)
            try:
                return await async_acquire(aclient, "async-busy", "y", timeout=0.3)
            finally:
                if hasattr(aclient, "aclose"):
                    await aclient.aclose()
                else:
                    await aclient.close()

        self.assertIsNone(asyncio.run(scenario()))


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped - len(result.expectedFailures)
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
