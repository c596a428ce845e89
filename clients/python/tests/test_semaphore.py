"""Semaphore and AsyncSemaphore (SEMAPHORE.*) against a real server."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import List, Optional

import harness
import redis
import redis.asyncio

from rlock import LockLost, NotAcquired, Semaphore
from rlock._common import parse_info
from rlock.aio import AsyncSemaphore, _close
from test_async import wait_for as async_wait_for
from test_lock import renew_calls, wait_for, waiters

SERVER: Optional[harness.Server] = None


def setUpModule() -> None:
    global SERVER
    SERVER = harness.Server()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.stop()


def used(r: "redis.Redis", key: str) -> int:
    info = parse_info(r.execute_command("SEMAPHORE.INFO", key))
    return 0 if info is None else int(info["used"])


class SemaphoreTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.r = SERVER.client()
        self.r.config_set("rlock.notify-channel", "yes")
        self.r.flushall()

    def tearDown(self) -> None:
        self.r.close()

    def test_permits_up_to_the_limit_and_release_counts(self) -> None:
        a = Semaphore(self.r, "s", limit=5, permits=2)
        b = Semaphore(self.r, "s", limit=5, permits=2)
        c = Semaphore(self.r, "s", limit=5, permits=2)
        ta, tb = a.acquire(blocking=False), b.acquire(blocking=False)
        self.assertIsNotNone(ta)
        self.assertIsNotNone(tb)
        self.assertIsNone(c.acquire(blocking=False), "4 of 5 in use")
        self.assertEqual(used(self.r, "s"), 4)
        # Again: two more permits under the same token, if they fit (they do not).
        self.assertIsNone(a.acquire(blocking=False))
        self.assertEqual(a.holds, 2)
        self.assertEqual(a.release(), 0)
        self.assertEqual(a.holds, 0)
        self.assertIsNone(a.token)
        self.assertEqual(a.acquire(blocking=False), a.token)
        self.assertGreater(a.token or 0, tb or 0, "a new holding, a new token")
        info = a.info()
        assert info is not None
        self.assertEqual(info["kind"], b"semaphore")
        self.assertEqual((info["limit"], info["used"], info["available"]), (5, 4, 1))
        b.release()
        a.release()
        self.assertEqual(self.r.exists("s"), 0)

    def test_context_manager_and_timeout(self) -> None:
        with Semaphore(self.r, "cm", limit=1, lease_ms=5000) as s:
            self.assertIsInstance(s.token, int)
            self.assertTrue(s.renewing)
            self.assertIsNone(Semaphore(self.r, "cm", limit=1).acquire(timeout=0.2))
            with self.assertRaises(NotAcquired):
                with Semaphore(self.r, "cm", limit=1, timeout=0.1):
                    pass
        self.assertFalse(s.renewing)
        self.assertEqual(self.r.exists("cm"), 0)
        self.assertEqual(waiters(self.r), 0)

    def test_a_release_wakes_a_parked_waiter(self) -> None:
        holder = Semaphore(self.r, "w", limit=2, permits=2)
        first = holder.acquire()
        got: List[Optional[int]] = []
        waiter = Semaphore(self.r, "w", limit=2)
        t = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
        t.start()
        wait_for(lambda: waiters(self.r) == 1)
        started = time.monotonic()
        holder.release()
        t.join(5)
        self.assertLess(time.monotonic() - started, 2)
        self.assertEqual(len(got), 1)
        self.assertGreater(got[0] or 0, first or 0)
        waiter.release()

    def test_renewal_keeps_a_300ms_lease_alive_for_2s(self) -> None:
        s = Semaphore(self.r, "renewed", limit=3, permits=2, lease_ms=300)
        token = s.acquire()
        before = renew_calls(self.r, "semaphore")
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            self.assertEqual(used(self.r, "renewed"), 2, "the lease ran out despite renewal")
            time.sleep(0.05)
        self.assertGreaterEqual(renew_calls(self.r, "semaphore") - before, 5)
        self.assertEqual(s.token, token)
        self.assertEqual(s.release(), 0)

    def test_lost_holding_is_reported(self) -> None:
        reported: List[Semaphore] = []
        s = Semaphore(self.r, "lost", limit=2, lease_ms=300, on_lost=reported.append)
        with self.assertRaises(LockLost):
            with s:
                self.assertEqual(self.r.execute_command("SEMAPHORE.FORCERELEASE", "lost"), 1)
                wait_for(s.lost.is_set, 2)
        self.assertEqual(reported, [s])

    def test_keepalive_holds_while_the_connection_is_open(self) -> None:
        s = Semaphore(self.r, "ka", limit=2, lease_ms=300, keepalive=True)
        s.acquire()
        self.assertFalse(s.renewing)
        time.sleep(0.8)
        self.assertEqual(used(self.r, "ka"), 1, "the server renews a keepalive holding")
        self.assertEqual(s.release(), 0)
        self.assertEqual(self.r.exists("ka"), 0)

    def test_pubsub_path_waits_without_a_parked_connection(self) -> None:
        holder = Semaphore(self.r, "ps", limit=1)
        holder.acquire()
        got: List[Optional[int]] = []
        waiter = Semaphore(self.r, "ps", limit=1)
        t = threading.Thread(
            target=lambda: got.append(waiter.acquire_via_pubsub(timeout=5, safety_poll=10)))
        t.start()
        wait_for(lambda: self.r.pubsub_numsub("__rlock@0__:ps")[0][1] == 1)
        self.assertEqual(waiters(self.r), 0)
        holder.release()
        t.join(5)
        self.assertIsNotNone(got[0])
        waiter.release()

    def test_the_same_object_adds_permits_under_its_token(self) -> None:
        s = Semaphore(self.r, "again", limit=5, permits=2)
        token = s.acquire(blocking=False)
        self.assertIsNotNone(token)
        self.assertEqual(s.acquire(blocking=False), token, "one holding, one token")
        self.assertEqual((s.holds, used(self.r, "again")), (4, 4))
        # 2 more do not fit in 5: a BLOCK wait of the holder itself times out with None.
        self.assertIsNone(s.acquire(timeout=0.2))
        self.assertEqual((s.holds, waiters(self.r)), (4, 0))
        self.assertEqual(s.release(), 2)
        self.assertEqual((s.holds, s.token, used(self.r, "again")), (2, token, 2))
        self.assertEqual(s.release(), 0)
        self.assertIsNone(s.token)
        self.assertGreater(s.acquire(blocking=False) or 0, token or 0, "a new holding")
        s.release()

    def test_a_partial_return_wakes_the_pubsub_path(self) -> None:
        holder = Semaphore(self.r, "part", limit=2)
        holder.acquire()
        holder.acquire()  # both permits, one holding
        entered: List[Optional[int]] = []

        def wait() -> None:
            # use_pubsub: `with` waits on the channel (safety poll 5 s, PTTL 30 s).
            with Semaphore(self.r, "part", limit=2, use_pubsub=True, timeout=10) as w:
                entered.append(w.token)

        t = threading.Thread(target=wait)
        t.start()
        wait_for(lambda: self.r.pubsub_numsub("__rlock@0__:part")[0][1] == 1)
        self.assertEqual(waiters(self.r), 0)
        started = time.monotonic()
        self.assertEqual(holder.release(), 1, "one permit returned, one kept")
        t.join(10)
        self.assertLess(time.monotonic() - started, 2.5, "woken by `released`, not by a poll")
        self.assertEqual(len(entered), 1)
        self.assertGreater(entered[0] or 0, holder.token or 0)
        self.assertEqual(holder.release(), 0)
        self.assertEqual(self.r.exists("part"), 0)

    def test_threads_contend_and_never_exceed_the_limit(self) -> None:
        inside = [0]
        peak = [0]
        tokens: List[int] = []
        guard = threading.Lock()

        def work(permits: int) -> None:
            for _ in range(4):
                with Semaphore(self.r, "pool", limit=4, permits=permits, timeout=20) as s:
                    with guard:
                        inside[0] += permits
                        peak[0] = max(peak[0], inside[0])
                        tokens.append(s.token)  # type: ignore[arg-type]
                    time.sleep(0.005)
                    with guard:
                        inside[0] -= permits

        threads = [threading.Thread(target=work, args=(p,)) for p in (1, 1, 2, 2, 3, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertLessEqual(peak[0], 4)
        self.assertEqual(len(set(tokens)), 24, "a token per holding")
        self.assertEqual(self.r.exists("pool"), 0)

    def test_arguments_are_checked_before_sending(self) -> None:
        for limit, permits in [(0, 1), (2, 3), (2, 0), (2**32, 1)]:
            with self.assertRaises(ValueError):
                Semaphore(self.r, "x", limit=limit, permits=permits)


class AsyncSemaphoreTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        assert SERVER is not None
        self.r = redis.asyncio.Redis(port=SERVER.port)
        await self.r.config_set("rlock.notify-channel", "yes")
        await self.r.flushall()

    async def asyncTearDown(self) -> None:
        await _close(self.r)

    async def test_async_semaphore(self) -> None:
        async with AsyncSemaphore(self.r, "as", limit=3, permits=2, lease_ms=300) as s:
            self.assertIsInstance(s.token, int)
            self.assertTrue(s.renewing)
            other = AsyncSemaphore(self.r, "as", limit=3, permits=2)
            self.assertIsNone(await other.acquire(blocking=False))
            task = asyncio.ensure_future(other.acquire(timeout=5))
            await asyncio.sleep(0.8)  # renewed past its 300 ms lease meanwhile
            self.assertFalse(task.done())
        self.assertIsNotNone(await task)
        self.assertEqual(await other.release(), 0)
        self.assertEqual(await self.r.exists("as"), 0)

    async def test_async_lost_holding_is_reported(self) -> None:
        reported: List[AsyncSemaphore] = []

        async def on_lost(s: AsyncSemaphore) -> None:
            reported.append(s)

        s = AsyncSemaphore(self.r, "alost", limit=2, lease_ms=300, on_lost=on_lost)  # type: ignore[arg-type]
        with self.assertRaises(LockLost):
            async with s:
                self.assertEqual(await self.r.execute_command("SEMAPHORE.FORCERELEASE", "alost"), 1)

                async def lost() -> bool:
                    return s.lost.is_set()

                await async_wait_for(lost, 2)
        self.assertEqual(reported, [s])

    async def test_async_keepalive_and_pubsub_path(self) -> None:
        holder = AsyncSemaphore(self.r, "aps", limit=2, permits=2, lease_ms=300, keepalive=True)
        first = await holder.acquire()
        self.assertFalse(holder.renewing)
        waiter = AsyncSemaphore(self.r, "aps", limit=2)
        task = asyncio.ensure_future(waiter.acquire_via_pubsub(timeout=10, safety_poll=10))

        async def subscribed() -> bool:
            return (await self.r.pubsub_numsub("__rlock@0__:aps"))[0][1] == 1

        await async_wait_for(subscribed)
        await asyncio.sleep(0.8)  # past the 300 ms lease: the server renews it
        self.assertFalse(task.done())
        info = await holder.info()
        assert info is not None
        self.assertEqual((info["used"], info["waiters"]), (2, 0))
        started = time.monotonic()
        self.assertEqual(await holder.release(), 0)
        token = await task
        self.assertLess(time.monotonic() - started, 2.5)
        self.assertGreater(token or 0, first or 0)
        self.assertEqual(await waiter.release(), 0)


if __name__ == "__main__":
    unittest.main()
