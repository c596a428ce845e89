"""MultiLock (RLOCK.ACQUIREALL), keepalive holdings and DeadlockError (sync)
against a real server."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import unittest
from typing import Any, List, Optional

import harness
import redis

from rlock import DeadlockError, Lock, LockLost, MultiLock, NotAcquired, ReadWriteLock, Semaphore

from rlock._common import parse_info
from test_lock import renew_calls, wait_for, waiters

SERVER: Optional[harness.Server] = None


def setUpModule() -> None:
    global SERVER
    SERVER = harness.Server()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.stop()


def calls(r: "redis.Redis", command: str) -> int:
    stats = r.info("commandstats").get("cmdstat_%s" % command)
    return int(stats["calls"]) if stats else 0


def owner_of(r: "redis.Redis", key: str) -> Optional[bytes]:
    info = parse_info(r.execute_command("RLOCK.INFO", key))
    return None if info is None else info["owner"]


def keepalive_client(r: "redis.Redis", key: str) -> Optional[int]:
    """The client id a KEEPALIVE holding of ``key`` is bound to."""
    info = parse_info(r.execute_command("RLOCK.INFO", key))
    assert info is not None, "%s is not held" % key
    return info["keepalive"]


class MultiLockTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.r = SERVER.client()
        self.r.flushall()

    def tearDown(self) -> None:
        self.r.close()

    def test_all_or_nothing(self) -> None:
        other = Lock(self.r, "m:b", owner="other")
        other.acquire()
        multi = MultiLock(self.r, ["m:a", "m:b", "m:c"], lease_ms=5000)
        self.assertIsNone(multi.acquire(blocking=False))
        # Nothing was taken: the free keys stay free.
        self.assertEqual(self.r.exists("m:a", "m:c"), 0)
        self.assertFalse(multi.locked)
        self.assertFalse(multi.renewing)
        other.release()
        tokens = multi.acquire(blocking=False)
        assert tokens is not None
        self.assertEqual(len(tokens), 3)
        self.assertEqual(tokens, multi.tokens)
        for key, info in zip(multi.keys, multi.info()):
            assert info is not None, key
            self.assertEqual(info["owner"], multi.owner.encode())
        self.assertEqual(
            [i["token"] for i in multi.info() if i is not None], list(tokens))
        self.assertTrue(multi.renewing)
        # The keys are plain RLOCK keys: a single-key lock of another owner is refused.
        self.assertIsNone(Lock(self.r, "m:c").acquire(blocking=False))
        self.assertEqual(multi.release(), [0, 0, 0])
        self.assertEqual(self.r.exists("m:a", "m:b", "m:c"), 0)
        self.assertFalse(multi.renewing)
        self.assertIsNone(multi.tokens)

    def test_context_manager_reentrant_and_renewed(self) -> None:
        before = calls(self.r, "rlock.renewall")
        with MultiLock(self.r, ["r:1", "r:2"], lease_ms=300) as multi:
            first = multi.tokens
            # Reentrant: the same owner again, same tokens, two holds of each key.
            self.assertEqual(multi.acquire(blocking=False), first)
            self.assertEqual(multi.release(), [1, 1])
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # 3x the lease, held throughout
                self.assertEqual(owner_of(self.r, "r:1"), multi.owner.encode())
                self.assertEqual(owner_of(self.r, "r:2"), multi.owner.encode())
                time.sleep(0.05)
        self.assertGreaterEqual(calls(self.r, "rlock.renewall") - before, 5)
        self.assertEqual(self.r.exists("r:1", "r:2"), 0)

    def test_blocking_multi_lock_is_granted_when_the_last_key_frees(self) -> None:
        a = Lock(self.r, "w:a", owner="holder-a")
        b = Lock(self.r, "w:b", owner="holder-b")
        token_a, token_b = a.acquire(), b.acquire()
        multi = MultiLock(self.r, ["w:a", "w:b"], owner="multi")
        got: List[Any] = []
        t = threading.Thread(target=lambda: got.append(multi.acquire(timeout=5)))
        t.start()
        wait_for(lambda: waiters(self.r) == 1)
        a.release()
        time.sleep(0.2)
        self.assertTrue(t.is_alive(), "granted before every key was free")
        self.assertEqual(self.r.exists("w:b"), 1)
        # The freed key is reserved for the queued multi-key waiter.
        self.assertIsNone(Lock(self.r, "w:a").acquire(blocking=False))
        start = time.monotonic()
        b.release()
        t.join(5)
        self.assertLess(time.monotonic() - start, 1.0)
        tokens = got[0]
        self.assertIsNotNone(tokens)
        self.assertGreater(tokens[0], token_a)
        self.assertGreater(tokens[1], token_b)
        self.assertEqual(owner_of(self.r, "w:a"), b"multi")
        self.assertEqual(owner_of(self.r, "w:b"), b"multi")
        multi.release()

    def test_blocking_multi_lock_times_out_holding_nothing(self) -> None:
        with Lock(self.r, "t:b"):
            start = time.monotonic()
            with self.assertRaises(NotAcquired):
                with MultiLock(self.r, ["t:a", "t:b"], timeout=0.2):
                    self.fail("must not enter")
            self.assertGreaterEqual(time.monotonic() - start, 0.18)
            self.assertEqual(self.r.exists("t:a"), 0)
            self.assertEqual(waiters(self.r), 0)

    def test_release_of_keys_not_all_held_is_lost(self) -> None:
        multi = MultiLock(self.r, ["l:1", "l:2"], lease_ms=300)
        reported: List[Any] = []
        multi.on_lost = reported.append
        multi.acquire()
        self.r.execute_command("RLOCK.FORCERELEASE", "l:2")
        wait_for(multi.lost.is_set, 2)  # RENEWALL says NOTOWNER
        self.assertEqual(reported, [multi])
        with self.assertRaises(LockLost):
            multi.release()
        # NOTOWNER changes nothing: l:1 stays held until its lease ends.
        self.assertEqual(owner_of(self.r, "l:1"), multi.owner.encode())

    def test_pubsub_path(self) -> None:
        holder = Lock(self.r, "p:b")
        holder.acquire()
        multi = MultiLock(self.r, ["p:a", "p:b"])
        got: List[Any] = []
        t = threading.Thread(
            target=lambda: got.append(multi.acquire_via_pubsub(timeout=5, safety_poll=10)))
        t.start()
        wait_for(lambda: self.r.pubsub_numsub("__rlock@0__:p:b")[0][1] == 1)
        self.assertEqual(waiters(self.r), 0)
        start = time.monotonic()
        holder.release()
        t.join(5)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertEqual(len(got[0]), 2)
        multi.release()

    def test_keepalive_multi_lock(self) -> None:
        multi = MultiLock(self.r, ["k:1", "k:2"], lease_ms=300, keepalive=True)
        before = calls(self.r, "rlock.renewall")
        multi.acquire()
        self.assertFalse(multi.renewing)
        bound = {keepalive_client(self.r, "k:1"), keepalive_client(self.r, "k:2")}
        self.assertEqual(len(bound), 1)
        self.assertIsNotNone(bound.pop())
        time.sleep(1.0)
        self.assertEqual(owner_of(self.r, "k:1"), multi.owner.encode())
        self.assertEqual(owner_of(self.r, "k:2"), multi.owner.encode())
        self.assertEqual(calls(self.r, "rlock.renewall"), before)
        self.assertEqual(multi.release(), [0, 0])
        self.assertEqual(self.r.exists("k:1", "k:2"), 0)


HOLDER = """
import sys, time
sys.path.insert(0, %(src)r)
import redis
from rlock import Lock
lock = Lock(redis.Redis(port=%(port)d), "crash", lease_ms=10000, keepalive=True)
print(lock.acquire(), flush=True)
time.sleep(60)
"""


class KeepaliveTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.r = SERVER.client()
        self.r.flushall()

    def tearDown(self) -> None:
        self.r.close()

    def test_keepalive_outlives_3x_its_lease_without_a_renewal_thread(self) -> None:
        lock = Lock(self.r, "ka", lease_ms=300, keepalive=True)
        before = renew_calls(self.r)
        token = lock.acquire()
        self.assertFalse(lock.renewing)
        bound = keepalive_client(self.r, "ka")
        self.assertIsNotNone(bound)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # held throughout, not just at the end
            info = lock.info()
            self.assertIsNotNone(info, "the lease ran out despite KEEPALIVE")
            assert info is not None
            self.assertEqual(info["token"], token)
            # Other traffic on the same client does not take the pinned connection.
            self.r.ping()
            time.sleep(0.05)
        self.assertEqual(renew_calls(self.r), before, "a client renewed")
        self.assertEqual(keepalive_client(self.r, "ka"), bound)
        # Reentrant through the same connection: the binding stays.
        self.assertEqual(lock.acquire(blocking=False), token)
        self.assertEqual(lock.release(), 1)
        self.assertEqual(keepalive_client(self.r, "ka"), bound)
        self.assertEqual(lock.release(), 0)
        self.assertEqual(self.r.exists("ka"), 0)
        self.assertIsNone(lock._pin.conn)  # type: ignore[union-attr]  # back in the pool

    def test_keepalive_holding_ends_when_the_connection_closes(self) -> None:
        # A holder process that dies without releasing: its lock is free at
        # once, not 10 s (its lease) later, and a parked waiter is served.
        assert SERVER is not None
        src = os.path.join(harness.ROOT, "clients", "python", "src")
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER % {"src": src, "port": SERVER.port}],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            self.assertTrue(holder.stdout.readline().strip().isdigit())
            self.assertIsNotNone(keepalive_client(self.r, "crash"))
            got: List[Optional[int]] = []
            waiter = Lock(self.r, "crash")
            t = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
            t.start()
            wait_for(lambda: waiters(self.r) == 1)
            start = time.monotonic()
            holder.kill()
            t.join(5)
            self.assertLess(time.monotonic() - start, 1.0)
            self.assertIsNotNone(got[0])
            waiter.release()
        finally:
            holder.kill()
            holder.wait()

    def test_killed_keepalive_connection_is_a_lost_lock(self) -> None:
        reported: List[Any] = []
        lock = Lock(self.r, "kill", lease_ms=10_000, keepalive=True, on_lost=reported.append)
        lock.acquire()
        self.r.client_kill_filter(_id=keepalive_client(self.r, "kill"))
        wait_for(lambda: self.r.exists("kill") == 0, 1)  # released at once
        with self.assertRaises(LockLost):
            lock.release()
        self.assertEqual(reported, [lock])
        # The object is usable again, on a new pinned connection.
        self.assertIsNotNone(lock.acquire(blocking=False))
        self.assertEqual(lock.release(), 0)

    def test_dropped_keepalive_lock_object_closes_its_connection(self) -> None:
        lock = Lock(self.r, "dropped", lease_ms=10_000, keepalive=True)
        lock.acquire()
        self.assertIsNotNone(keepalive_client(self.r, "dropped"))
        del lock
        gc.collect()
        wait_for(lambda: self.r.exists("dropped") == 0, 1)  # not 10 s later

    def test_dropped_keepalive_lock_is_released_without_the_cycle_collector(self) -> None:
        # Dropping the last reference releases at once, as for a lock with a
        # renewal thread: no reference cycle waits for the cycle collector.
        for kind in ("Lock", "ReadWriteLock"):
            with self.subTest(kind):
                key = "dropped-rc-%s" % kind
                gc.collect()
                gc.disable()
                try:
                    if kind == "Lock":
                        lock: Any = Lock(self.r, key, lease_ms=10_000, keepalive=True)
                        lock.acquire()
                    else:
                        lock = ReadWriteLock(self.r, key, lease_ms=10_000,
                                             keepalive=True)
                        lock.read.acquire()
                    self.assertEqual(self.r.exists(key), 1)
                    del lock
                    wait_for(lambda: self.r.exists(key) == 0, 5)  # not 10 s later
                finally:
                    gc.enable()

    def test_keepalive_block_wait_binds_the_parked_connection(self) -> None:
        holder = Lock(self.r, "kb")
        holder.acquire()
        waiter = Lock(self.r, "kb", lease_ms=300, keepalive=True)
        got: List[Optional[int]] = []
        t = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
        t.start()
        wait_for(lambda: waiters(self.r) == 1)
        holder.release()
        t.join(5)
        self.assertIsNotNone(got[0])
        self.assertIsNotNone(keepalive_client(self.r, "kb"))
        self.assertFalse(waiter.renewing)
        time.sleep(1.0)
        self.assertEqual(owner_of(self.r, "kb"), waiter.owner.encode())
        with self.assertRaises(NotAcquired):
            with Lock(self.r, "kb", timeout=0.1):
                pass
        waiter.release()
        self.assertEqual(self.r.exists("kb"), 0)

    def test_a_release_does_not_wait_behind_a_parked_acquisition(self) -> None:
        # One keepalive semaphore object, two threads: one holds a permit,
        # the other waits (on the pinned connection) for a second one while
        # another owner holds the last. The holder's release goes through at
        # once (not when the wait times out), and it serves the parked wait,
        # which the server binds to the pinned connection.
        other = Semaphore(self.r, "kr", limit=2, owner="other")
        other.acquire()
        sem = Semaphore(self.r, "kr", limit=2, keepalive=True)
        first = sem.acquire(blocking=False)
        self.assertIsNotNone(first)
        got: List[Optional[int]] = []
        t = threading.Thread(target=lambda: got.append(sem.acquire(timeout=10)))
        t.start()
        try:
            wait_for(lambda: waiters(self.r) == 1)
            released = threading.Event()
            left: List[int] = []

            def release() -> None:
                left.append(sem.release())
                released.set()

            threading.Thread(target=release, daemon=True).start()
            self.assertTrue(released.wait(5), "the release waited behind the parked acquisition")
            self.assertEqual(left, [0])
            t.join(5)
            self.assertIsInstance(got[0], int)
            self.assertGreater(got[0], first)  # a new tenure
            self.assertEqual(sem.holds, 1)
            info = parse_info(self.r.execute_command("SEMAPHORE.INFO", "kr"))
            assert info is not None
            mine = [h for h in info["holders"] if h[b"owner"] == sem.owner.encode()]
            self.assertEqual(len(mine), 1)
            pinned = sem._pin.conn  # type: ignore[union-attr]
            self.assertIsNotNone(pinned, "the pinned connection was given back while bound")
            pinned.send_command("CLIENT", "ID")  # idle now: the test may use it
            self.assertEqual(mine[0][b"keepalive"], pinned.read_response())
            self.assertEqual(sem.release(), 0)
            self.assertIsNone(sem._pin.conn)  # type: ignore[union-attr]
        finally:
            t.join(15)
            other.release()

    def test_keepalive_read_write_views_share_one_connection(self) -> None:
        rw = ReadWriteLock(self.r, "krw", lease_ms=300, keepalive=True)
        rw.write.acquire()
        rw.read.acquire()
        self.assertIs(rw.read._pin, rw.write._pin)
        rw.write.release()  # downgrade: READ stays, bound to the same connection
        time.sleep(1.0)
        info = self.r.execute_command("RWLOCK.INFO", "krw")
        self.assertIsNotNone(info, "the read hold ended with the write view")
        self.assertEqual(rw.read.release(), 0)
        self.assertEqual(self.r.exists("krw"), 0)
        self.assertIsNone(rw.read._pin.conn)  # type: ignore[union-attr]


class DeadlockTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.r = SERVER.client()
        self.r.flushall()
        self.r.config_set("rlock.deadlock-check-ms", 100)

    def tearDown(self) -> None:
        self.r.config_set("rlock.deadlock-check-ms", 1000)
        self.r.close()

    def test_deadlock_error_is_raised_to_the_latest_waiter(self) -> None:
        a1 = Lock(self.r, "d:1", owner="A")
        b2 = Lock(self.r, "d:2", owner="B")
        a1.acquire()
        b2.acquire()
        a2 = Lock(self.r, "d:2", owner="A")  # A waits for B ...
        got: List[Any] = []
        t = threading.Thread(target=lambda: got.append(a2.acquire(timeout=10)))
        t.start()
        wait_for(lambda: waiters(self.r) == 1)
        b1 = Lock(self.r, "d:1", owner="B")  # ... and B for A: B came last
        start = time.monotonic()
        with self.assertRaises(DeadlockError) as caught:
            b1.acquire(timeout=10)
        self.assertLess(time.monotonic() - start, 2.0)
        self.assertEqual(caught.exception.cycle, ["B", "A", "B"])
        self.assertIsInstance(caught.exception, redis.ResponseError)
        self.assertFalse(b1.locked)
        self.assertEqual(int(self.r.info("rlock")["rlock_deadlocks"]), 1)
        # B gives up what it holds: A's wait is served.
        b2.release()
        t.join(5)
        self.assertIsNotNone(got[0])
        a2.release()
        a1.release()

    def test_with_block_raises_deadlock_error(self) -> None:
        with Lock(self.r, "e:1", owner="A"), Lock(self.r, "e:2", owner="B"):
            a2 = Lock(self.r, "e:2", owner="A")
            t = threading.Thread(target=lambda: a2.acquire(timeout=1) and a2.release())
            t.start()
            wait_for(lambda: waiters(self.r) == 1)
            with self.assertRaises(DeadlockError):
                with Lock(self.r, "e:1", owner="B", timeout=10):
                    self.fail("must not enter")
            t.join(5)


if __name__ == "__main__":
    unittest.main()
