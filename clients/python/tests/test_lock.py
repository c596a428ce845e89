"""Lock, FairLock and ReadWriteLock (sync) against a real server."""

from __future__ import annotations

import threading
import time
import unittest
from typing import Any, List, Optional, Tuple

import harness
import redis

from rlock import FairLock, Lock, LockLost, NotAcquired, ReadWriteLock

SERVER: Optional[harness.Server] = None


def setUpModule() -> None:
    global SERVER
    SERVER = harness.Server()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.stop()


def renew_calls(r: "redis.Redis", family: str = "rlock") -> int:
    stats = r.info("commandstats").get("cmdstat_%s.renew" % family)
    return int(stats["calls"]) if stats else 0


def waiters(r: "redis.Redis") -> int:
    return int(r.info("rlock")["rlock_waiters"])


def wait_for(cond: Any, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %ss" % limit)
        time.sleep(0.005)


class LockTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.r = SERVER.client()
        self.r.config_set("rlock.notify-channel", "yes")
        self.r.flushall()

    def tearDown(self) -> None:
        self.r.close()

    def test_context_manager_acquires_renews_and_releases(self) -> None:
        with Lock(self.r, "cm", lease_ms=5000) as lock:
            self.assertIsInstance(lock.token, int)
            info = lock.info()
            assert info is not None
            self.assertEqual(info["kind"], b"rlock")
            self.assertEqual(info["owner"], lock.owner.encode())
            self.assertEqual(info["token"], lock.token)
            self.assertTrue(lock.renewing)
            self.assertTrue(lock.locked)
            # Reentrant: a second hold, same token.
            token = lock.token
            self.assertEqual(lock.acquire(blocking=False), token)
            self.assertEqual(lock.holds, 2)
            self.assertEqual(lock.release(), 1)
            self.assertTrue(lock.renewing)
        self.assertEqual(self.r.exists("cm"), 0)
        self.assertFalse(lock.renewing)
        self.assertIsNone(lock.token)
        self.assertFalse(lock.locked)

    def test_with_block_exception_still_releases(self) -> None:
        with self.assertRaises(KeyError):
            with Lock(self.r, "boom"):
                raise KeyError("inside")
        self.assertEqual(self.r.exists("boom"), 0)

    def test_block_timeout_returns_none_and_with_raises(self) -> None:
        with Lock(self.r, "busy"):
            other = Lock(self.r, "busy")
            self.assertIsNone(other.acquire(blocking=False))
            start = time.monotonic()
            self.assertIsNone(other.acquire(timeout=0.2))
            self.assertGreaterEqual(time.monotonic() - start, 0.18)
            self.assertFalse(other.renewing)
            start = time.monotonic()
            with self.assertRaises(NotAcquired):
                with Lock(self.r, "busy", timeout=0.1):
                    self.fail("must not enter")
            self.assertGreaterEqual(time.monotonic() - start, 0.09)
            self.assertEqual(waiters(self.r), 0)

    def test_wait_outlasts_the_clients_socket_timeout(self) -> None:
        # redis-py's socket_timeout (5 s by default in redis-py 8) must not cut a
        # BLOCK wait short: the wait goes through a connection without one.
        r = SERVER.client(socket_timeout=0.3)  # type: ignore[union-attr]
        holder = Lock(r, "long")
        holder.acquire()
        threading.Timer(0.8, holder.release).start()
        start = time.monotonic()
        waiter = Lock(r, "long")
        token = waiter.acquire(timeout=3)
        self.assertIsNotNone(token)
        self.assertGreaterEqual(time.monotonic() - start, 0.7)
        self.assertEqual(waiter.release(), 0)
        r.close()

    def test_waiter_is_handed_the_lock_with_a_larger_token(self) -> None:
        holder = Lock(self.r, "handover")
        first = holder.acquire()
        assert first is not None
        got: List[Optional[int]] = []
        waiter = Lock(self.r, "handover")
        t = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
        t.start()
        wait_for(lambda: waiters(self.r) == 1)
        self.assertEqual(holder.release(), 0)
        t.join()
        self.assertIsNotNone(got[0])
        self.assertGreater(got[0], first)  # type: ignore[operator]
        self.assertEqual(waiter.token, got[0])
        waiter.release()

    def test_tokens_increase_across_tenures_and_families(self) -> None:
        tokens = []
        for lock in (Lock(self.r, "t1"), FairLock(self.r, "t2"), Lock(self.r, "t1"),
                     ReadWriteLock(self.r, "t3").write):
            with lock:
                tokens.append(lock.token)
        self.assertEqual(tokens, sorted(tokens))
        self.assertEqual(len(set(tokens)), len(tokens))

    def test_renewal_keeps_a_300ms_lease_alive_for_2s(self) -> None:
        lock = Lock(self.r, "renewed", lease_ms=300)
        token = lock.acquire()
        before = renew_calls(self.r)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # held the whole time, not just at the end
            info = lock.info()
            self.assertIsNotNone(info, "the lease ran out despite renewal")
            assert info is not None
            self.assertEqual(info["owner"], lock.owner.encode())
            self.assertEqual(info["token"], token)
            time.sleep(0.05)
        self.assertGreaterEqual(renew_calls(self.r) - before, 5)
        self.assertFalse(lock.lost.is_set())
        self.assertIsNone(Lock(self.r, "renewed").acquire(blocking=False))
        self.assertEqual(lock.release(), 0)
        calls = renew_calls(self.r)
        time.sleep(0.3)
        self.assertEqual(renew_calls(self.r), calls, "renewal went on after release")

    def test_without_renewal_the_lease_ends(self) -> None:
        lock = Lock(self.r, "unrenewed", lease_ms=200, auto_renew=False)
        lock.acquire()
        self.assertFalse(lock.renewing)
        wait_for(lambda: self.r.exists("unrenewed") == 0, 2)
        with self.assertRaises(LockLost):
            lock.release()
        self.assertTrue(lock.lost.is_set())

    def test_lost_lock_is_reported(self) -> None:
        reported: List[Lock] = []
        lock = Lock(self.r, "lost", lease_ms=300, on_lost=reported.append)
        with self.assertRaises(LockLost):
            with lock:
                self.assertEqual(self.r.execute_command("RLOCK.FORCERELEASE", "lost"), 1)
                wait_for(lock.lost.is_set, 2)  # the next renewal (every 100 ms) sees it
                self.assertEqual(reported, [lock])
                self.assertFalse(lock.locked)
                with self.assertRaises(LockLost):
                    lock.check()
        self.assertFalse(lock.renewing)
        self.assertEqual(reported, [lock])  # once

    def test_lost_when_no_renewal_gets_through_for_a_lease(self) -> None:
        own = harness.Server()
        try:
            r = own.client(socket_timeout=0.2)
            reported: List[Lock] = []
            lock = Lock(r, "gone", lease_ms=300, on_lost=reported.append)
            lock.acquire()
            own.kill()
            wait_for(lock.lost.is_set, 3)
            self.assertEqual(reported, [lock])
        finally:
            own.stop()

    def test_objects_sharing_an_owner_count_their_own_holds(self) -> None:
        # Two objects of one owner share its tenure: the one that released
        # holds nothing, stops renewing, and is not told "lost" when the
        # other releases the last hold.
        reported: List[Lock] = []
        a = Lock(self.r, "shared", owner="o", lease_ms=600, on_lost=reported.append)
        b = Lock(self.r, "shared", owner="o", lease_ms=600)
        self.assertEqual(a.acquire(), b.acquire())
        self.assertEqual(a.release(), 1)
        self.assertEqual(a.holds, 0)
        self.assertFalse(a.renewing)
        self.assertEqual(b.holds, 1)
        self.assertEqual(b.release(), 0)
        time.sleep(0.5)  # past a renewal tick of the old lease
        self.assertFalse(a.lost.is_set())
        self.assertEqual(reported, [])

    def test_lost_when_the_server_refuses_every_renewal_for_a_lease(self) -> None:
        # Demoted (REPLICAOF another master), the server answers READONLY to
        # every RENEW: that is no renewal either, and the lease runs out.
        own, other = harness.Server(), harness.Server()
        try:
            r = own.client()
            reported: List[Lock] = []
            lock = Lock(r, "demoted", lease_ms=300, on_lost=reported.append)
            lock.acquire()
            r.execute_command("REPLICAOF", "127.0.0.1", str(other.port))
            wait_for(lock.lost.is_set, 3)
            self.assertEqual(reported, [lock])
            self.assertFalse(lock.locked)
        finally:
            own.stop()
            other.stop()

    def _waiting_via_pubsub(
        self, key: str, timeout: float
    ) -> Tuple[Lock, threading.Thread, List[Optional[int]]]:
        """A waiter on the pub/sub path in a thread, once it is subscribed;
        its lock, its thread, and the list its token will be put in."""
        got: List[Optional[int]] = []
        waiter = Lock(self.r, key)
        t = threading.Thread(
            target=lambda: got.append(waiter.acquire_via_pubsub(timeout=timeout, safety_poll=10)))
        t.start()
        wait_for(lambda: self.r.pubsub_numsub("__rlock@0__:" + key)[0][1] == 1)
        time.sleep(0.1)
        return waiter, t, got

    def test_pubsub_path_waits_without_a_parked_connection(self) -> None:
        holder = Lock(self.r, "ps")
        first = holder.acquire()
        waiter, t, got = self._waiting_via_pubsub("ps", 5)
        self.assertEqual(waiters(self.r), 0, "the pub/sub path must not park")
        start = time.monotonic()
        holder.release()
        t.join()
        self.assertLess(time.monotonic() - start, 1.0)  # the message, not the poll
        self.assertGreater(got[0], first)  # type: ignore[operator]
        waiter.release()

    def test_pubsub_path_wakes_when_the_lock_is_deleted(self) -> None:
        # A DEL (or an eviction) ends the holds under their holder; the server
        # publishes it as "forced", so the waiter need not wait out the lease.
        Lock(self.r, "psdel", lease_ms=60000, auto_renew=False).acquire()
        waiter, t, got = self._waiting_via_pubsub("psdel", 8)
        start = time.monotonic()
        self.r.delete("psdel")
        t.join()
        self.assertLess(time.monotonic() - start, 1.0)  # the message, not the poll
        self.assertIsNotNone(got[0])
        waiter.release()

    def test_pubsub_path_retries_at_the_lease_end(self) -> None:
        # No message at all (channel off): the retry at the holder's PTTL grants.
        self.r.config_set("rlock.notify-channel", "no")
        Lock(self.r, "silent", lease_ms=400, auto_renew=False).acquire()
        start = time.monotonic()
        waiter = Lock(self.r, "silent")
        token = waiter.acquire_via_pubsub(timeout=5, safety_poll=10)
        elapsed = time.monotonic() - start
        self.assertIsNotNone(token)
        self.assertGreater(elapsed, 0.3)
        self.assertLess(elapsed, 1.5)
        waiter.release()

    def test_pubsub_path_times_out_with_none(self) -> None:
        with Lock(self.r, "pst"):
            start = time.monotonic()
            self.assertIsNone(Lock(self.r, "pst").acquire_via_pubsub(timeout=0.3))
            self.assertGreaterEqual(time.monotonic() - start, 0.28)
            with self.assertRaises(NotAcquired):
                with Lock(self.r, "pst", timeout=0.1, use_pubsub=True):
                    pass

    def test_decoded_responses_client(self) -> None:
        r = SERVER.client(decode_responses=True)  # type: ignore[union-attr]
        holder = Lock(r, "dec")
        holder.acquire()
        waiter = Lock(r, "dec")
        threading.Timer(0.2, holder.release).start()
        self.assertIsNotNone(waiter.acquire_via_pubsub(timeout=3, safety_poll=10))
        info = waiter.info()
        assert info is not None
        self.assertEqual(info["owner"], waiter.owner)
        waiter.release()
        r.close()

    def test_fair_lock_serves_parked_waiters_in_arrival_order(self) -> None:
        holder = FairLock(self.r, "fair")
        holder.acquire()
        order: List[str] = []
        threads = []
        for i in range(3):
            lock = FairLock(self.r, "fair", owner="w%d" % i)

            def run(lock: FairLock = lock) -> None:
                lock.acquire(timeout=5)
                order.append(lock.owner)
                lock.release()

            threads.append(threading.Thread(target=run))
            threads[-1].start()
            wait_for(lambda n=i + 1: waiters(self.r) == n)
        info = holder.info()
        assert info is not None
        self.assertEqual(info["kind"], b"fairlock")
        self.assertEqual(info["queue"], [b"w0", b"w1", b"w2"])
        self.assertIsNone(FairLock(self.r, "fair").acquire(blocking=False))
        holder.release()
        for t in threads:
            t.join()
        self.assertEqual(order, ["w0", "w1", "w2"])

    def test_read_write_lock_views(self) -> None:
        a = ReadWriteLock(self.r, "rw", lease_ms=2000)
        b = ReadWriteLock(self.r, "rw", lease_ms=2000)
        with a.read, b.read:
            info = a.info()
            assert info is not None
            self.assertEqual(info["mode"], b"read")
            self.assertIsNone(ReadWriteLock(self.r, "rw").write.acquire(blocking=False))
            # Upgrading would deadlock: the server refuses at once.
            with self.assertRaises(redis.ResponseError):
                a.write.acquire(timeout=1)
        with a.write as w:
            self.assertIsNone(b.read.acquire(blocking=False))
            # The writer may also read; releasing WRITE then downgrades.
            self.assertEqual(a.read.acquire(blocking=False), w.token)
        info = a.info()
        assert info is not None
        self.assertEqual(info["mode"], b"read")
        self.assertIsNotNone(b.read.acquire(blocking=False))
        a.read.release()
        b.read.release()
        self.assertEqual(self.r.exists("rw"), 0)

    def test_threads_contend_and_never_overlap(self) -> None:
        inside = [0]
        peak = [0]
        tokens: List[int] = []
        guard = threading.Lock()

        def work() -> None:
            for _ in range(5):
                with Lock(self.r, "contended", timeout=10) as lock:
                    with guard:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                        tokens.append(lock.token)  # type: ignore[arg-type]
                    time.sleep(0.005)
                    with guard:
                        inside[0] -= 1

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(peak[0], 1)
        self.assertEqual(len(tokens), 20)
        self.assertEqual(tokens, sorted(tokens))


if __name__ == "__main__":
    unittest.main()
