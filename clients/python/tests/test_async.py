"""The redis.asyncio half: AsyncLock, AsyncFairLock, AsyncReadWriteLock."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import unittest
from typing import Any, AsyncIterator, List, Optional

import harness
import redis
import redis.asyncio

from rlock import DeadlockError, LockLost, NotAcquired
from rlock._common import parse_info
from rlock.aio import (
    AsyncFairLock, AsyncLock, AsyncMultiLock, AsyncReadWriteLock, AsyncSemaphore, _close,
)

SERVER: Optional[harness.Server] = None


def setUpModule() -> None:
    global SERVER
    SERVER = harness.Server()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.stop()


async def wait_for(cond, limit: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %ss" % limit)
        await asyncio.sleep(0.005)


class UnclonablePool(redis.asyncio.ConnectionPool):
    """A pool the client cannot clone (a subclass, as Sentinel's): keepalive
    objects then take their pinned connection from it."""


@contextlib.asynccontextmanager
async def callers_pool_client() -> AsyncIterator[redis.asyncio.Redis]:
    assert SERVER is not None
    pool = UnclonablePool(port=SERVER.port)
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        yield client
    finally:
        await _close(client)
        await pool.disconnect()


class AsyncLockTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        assert SERVER is not None
        self.r = redis.asyncio.Redis(port=SERVER.port)
        await self.r.config_set("rlock.notify-channel", "yes")
        await self.r.flushall()

    async def asyncTearDown(self) -> None:
        await _close(self.r)

    async def waiters(self) -> int:
        return int((await self.r.info("rlock"))["rlock_waiters"])

    async def test_async_context_manager(self) -> None:
        async with AsyncLock(self.r, "cm", lease_ms=5000) as lock:
            self.assertIsInstance(lock.token, int)
            self.assertTrue(lock.renewing)
            info = await lock.info()
            assert info is not None
            self.assertEqual(info["owner"], lock.owner.encode())
            self.assertEqual(await lock.acquire(blocking=False), lock.token)
            self.assertEqual(await lock.release(), 1)
        self.assertEqual(await self.r.exists("cm"), 0)
        self.assertFalse(lock.renewing)

    async def test_block_timeout_none_and_not_acquired(self) -> None:
        async with AsyncLock(self.r, "busy"):
            start = time.monotonic()
            self.assertIsNone(await AsyncLock(self.r, "busy").acquire(timeout=0.2))
            self.assertGreaterEqual(time.monotonic() - start, 0.18)
            with self.assertRaises(NotAcquired):
                async with AsyncLock(self.r, "busy", timeout=0.1):
                    self.fail("must not enter")

    async def test_block_wait_is_handed_over_with_a_larger_token(self) -> None:
        holder = AsyncLock(self.r, "ho")
        first = await holder.acquire()
        waiter = AsyncLock(self.r, "ho")
        task = asyncio.ensure_future(waiter.acquire(timeout=5))

        async def parked() -> bool:
            return await self.waiters() == 1

        await wait_for(parked)
        await holder.release()
        token = await task
        self.assertGreater(token, first)  # type: ignore[operator]
        await waiter.release()

    async def test_renewal_keeps_a_300ms_lease_alive_for_2s(self) -> None:
        lock = AsyncLock(self.r, "renewed", lease_ms=300)
        token = await lock.acquire()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            info = await lock.info()
            self.assertIsNotNone(info, "the lease ran out despite renewal")
            assert info is not None
            self.assertEqual(info["token"], token)
            await asyncio.sleep(0.05)
        self.assertFalse(lock.lost.is_set())
        self.assertEqual(await lock.release(), 0)
        self.assertFalse(lock.renewing)

    async def test_lost_lock_is_reported(self) -> None:
        reported: List[AsyncLock] = []

        async def on_lost(lock: AsyncLock) -> None:
            reported.append(lock)

        lock = AsyncLock(self.r, "lost", lease_ms=300, on_lost=on_lost)  # type: ignore[arg-type]
        with self.assertRaises(LockLost):
            async with lock:
                await self.r.execute_command("RLOCK.FORCERELEASE", "lost")

                async def lost() -> bool:
                    return lock.lost.is_set()

                await wait_for(lost, 2)
                self.assertEqual(reported, [lock])
        self.assertEqual(reported, [lock])

    async def test_on_lost_callback_may_release_its_own_lock(self) -> None:
        # The callback runs outside the lock's mutex: awaiting the lock's own
        # release() there returns (LockLost: the server holds nothing for it).
        done = asyncio.Event()
        outcome: List[BaseException] = []

        async def on_lost(lock: AsyncLock) -> None:
            try:
                await lock.release()
            except LockLost as e:
                outcome.append(e)
            done.set()

        lock = AsyncLock(self.r, "cb", lease_ms=300, on_lost=on_lost)  # type: ignore[arg-type]
        await lock.acquire()
        await self.r.execute_command("RLOCK.FORCERELEASE", "cb")  # the next RENEW: NOTOWNER
        await asyncio.wait_for(done.wait(), 5)
        self.assertEqual(len(outcome), 1)
        self.assertEqual(lock.holds, 0)
        self.assertFalse(lock.renewing)

    async def test_a_dropped_held_lock_stops_renewing(self) -> None:
        async def renew_calls() -> int:
            stats = (await self.r.info("commandstats")).get("cmdstat_rlock.renew")
            return int(stats["calls"]) if stats else 0

        lock = AsyncLock(self.r, "drop", lease_ms=300)
        await lock.acquire()
        task = lock._renewer
        assert task is not None
        before = await renew_calls()
        await asyncio.sleep(0.25)
        self.assertGreater(await renew_calls(), before, "never renewed")
        del lock
        gc.collect()
        # The renewal task ends at its next tick and the lease runs out: the
        # key is gone within a few leases (it was renewed for good before).
        await asyncio.wait_for(asyncio.shield(task), 2)

        async def expired() -> bool:
            return await self.r.exists("drop") == 0

        await wait_for(expired, 2)

    async def test_a_release_does_not_wait_behind_a_parked_keepalive_acquisition(self) -> None:
        # As in the sync test: one keepalive semaphore object, a task holding
        # a permit and a task parked (on the pinned connection) for a second.
        await self.r.execute_command(
            "SEMAPHORE.ACQUIRE", "kr", "other", "LIMIT", 2, "PERMITS", 1, "PX", 30_000)
        sem = AsyncSemaphore(self.r, "kr", limit=2, keepalive=True)
        first = await sem.acquire(blocking=False)
        self.assertIsNotNone(first)
        parked = asyncio.ensure_future(sem.acquire(timeout=10))

        async def one_waiter() -> bool:
            return await self.waiters() == 1

        await wait_for(one_waiter)
        self.assertEqual(await asyncio.wait_for(sem.release(), 5), 0)
        token = await asyncio.wait_for(parked, 5)
        self.assertIsInstance(token, int)
        self.assertGreater(token, first)
        self.assertEqual(sem.holds, 1)
        info = parse_info(await self.r.execute_command("SEMAPHORE.INFO", "kr"))
        assert info is not None
        mine = [h for h in info["holders"] if h[b"owner"] == sem.owner.encode()]
        self.assertEqual(len(mine), 1)
        self.assertIsNotNone(mine[0][b"keepalive"])
        self.assertIsNotNone(sem._pin.conn)  # type: ignore[union-attr]
        self.assertEqual(await sem.release(), 0)
        self.assertIsNone(sem._pin.conn)  # type: ignore[union-attr]

    async def test_pubsub_path(self) -> None:
        holder = AsyncLock(self.r, "ps")
        first = await holder.acquire()
        waiter = AsyncLock(self.r, "ps")
        task = asyncio.ensure_future(waiter.acquire_via_pubsub(timeout=5, safety_poll=10))

        async def subscribed() -> bool:
            return (await self.r.pubsub_numsub("__rlock@0__:ps"))[0][1] == 1

        await wait_for(subscribed)
        await asyncio.sleep(0.05)
        self.assertEqual(await self.waiters(), 0)
        start = time.monotonic()
        await holder.release()
        token = await task
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertGreater(token, first)  # type: ignore[operator]
        await waiter.release()

    async def test_pubsub_path_retries_at_the_lease_end(self) -> None:
        await self.r.config_set("rlock.notify-channel", "no")
        await AsyncLock(self.r, "silent", lease_ms=400, auto_renew=False).acquire()
        start = time.monotonic()
        waiter = AsyncLock(self.r, "silent")
        self.assertIsNotNone(await waiter.acquire_via_pubsub(timeout=5, safety_poll=10))
        self.assertLess(time.monotonic() - start, 1.5)
        await waiter.release()

    async def test_fair_and_read_write(self) -> None:
        async with AsyncFairLock(self.r, "f") as f:
            info = await f.info()
            assert info is not None
            self.assertEqual(info["kind"], b"fairlock")
        a = AsyncReadWriteLock(self.r, "rw")
        b = AsyncReadWriteLock(self.r, "rw")
        async with a.read, b.read:
            self.assertIsNone(await AsyncReadWriteLock(self.r, "rw").write.acquire(blocking=False))
        async with a.write:
            self.assertIsNone(await b.read.acquire(blocking=False))
        self.assertEqual(await self.r.exists("rw"), 0)

    async def test_tasks_contend_and_never_overlap(self) -> None:
        inside = 0
        peak = 0
        tokens: List[int] = []

        async def work() -> None:
            nonlocal inside, peak
            for _ in range(5):
                async with AsyncLock(self.r, "contended", timeout=10) as lock:
                    inside += 1
                    peak = max(peak, inside)
                    tokens.append(lock.token)  # type: ignore[arg-type]
                    await asyncio.sleep(0.005)
                    inside -= 1

        await asyncio.gather(*(work() for _ in range(4)))
        self.assertEqual(peak, 1)
        self.assertEqual(tokens, sorted(tokens))
        self.assertEqual(len(set(tokens)), 20)


    async def keepalive_client(self, key: str) -> Optional[int]:
        info = parse_info(await self.r.execute_command("RLOCK.INFO", key))
        assert info is not None, "%s is not held" % key
        return info["keepalive"]

    async def test_multi_lock_all_or_nothing(self) -> None:
        other = AsyncLock(self.r, "m:b")
        await other.acquire()
        multi = AsyncMultiLock(self.r, ["m:a", "m:b"], lease_ms=300)
        self.assertIsNone(await multi.acquire(blocking=False))
        self.assertEqual(await self.r.exists("m:a"), 0)
        await other.release()
        async with multi:
            assert multi.tokens is not None
            self.assertEqual(len(multi.tokens), 2)
            self.assertTrue(multi.renewing)
            await asyncio.sleep(1.0)  # 3x the lease: RENEWALL keeps both
            infos = await multi.info()
            self.assertEqual([i["owner"] for i in infos if i], [multi.owner.encode()] * 2)
        self.assertEqual(await self.r.exists("m:a", "m:b"), 0)
        self.assertFalse(multi.renewing)

    async def test_blocking_multi_lock_is_granted_when_the_last_key_frees(self) -> None:
        a, b = AsyncLock(self.r, "w:a"), AsyncLock(self.r, "w:b")
        await a.acquire()
        await b.acquire()
        multi = AsyncMultiLock(self.r, ["w:a", "w:b"])
        task = asyncio.ensure_future(multi.acquire(timeout=5))

        async def parked() -> bool:
            return await self.waiters() == 1

        await wait_for(parked)
        await a.release()
        await asyncio.sleep(0.2)
        self.assertFalse(task.done(), "granted before every key was free")
        await b.release()
        tokens = await asyncio.wait_for(task, 5)
        self.assertEqual(len(tokens), 2)
        self.assertEqual(await multi.release(), [0, 0])

    async def test_keepalive_outlives_3x_its_lease_without_a_renewal_task(self) -> None:
        async def renew_calls() -> int:
            stats = (await self.r.info("commandstats")).get("cmdstat_rlock.renew")
            return int(stats["calls"]) if stats else 0

        before = await renew_calls()
        lock = AsyncLock(self.r, "ka", lease_ms=300, keepalive=True)
        token = await lock.acquire()
        self.assertFalse(lock.renewing)
        bound = await self.keepalive_client("ka")
        self.assertIsNotNone(bound)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            info = await lock.info()
            self.assertIsNotNone(info, "the lease ran out despite KEEPALIVE")
            assert info is not None
            self.assertEqual(info["token"], token)
            await asyncio.sleep(0.05)
        self.assertEqual(await self.keepalive_client("ka"), bound)
        self.assertEqual(await renew_calls(), before, "a client renewed")
        self.assertEqual(await lock.release(), 0)
        self.assertEqual(await self.r.exists("ka"), 0)
        self.assertIsNone(lock._pin.conn)  # type: ignore[union-attr]

    async def test_killed_keepalive_connection_is_a_lost_lock(self) -> None:
        lock = AsyncLock(self.r, "kill", lease_ms=10_000, keepalive=True)
        await lock.acquire()
        await self.r.client_kill_filter(_id=await self.keepalive_client("kill"))

        async def freed() -> bool:
            return await self.r.exists("kill") == 0

        await wait_for(freed, 1)
        with self.assertRaises(LockLost):
            await lock.release()
        self.assertTrue(lock.lost.is_set())

    async def test_dropped_keepalive_lock_is_released_without_the_cycle_collector(self) -> None:
        # Dropping the last reference releases at once, as in the sync half:
        # no reference cycle between the object and its pinned connection
        # waits for the cycle collector. Also with the caller's pool (one that
        # cannot be cloned, as Sentinel's).
        async with callers_pool_client() as custom:
            for client_name, client in (("own pool", self.r), ("caller's pool", custom)):
                for kind in ("AsyncLock", "AsyncReadWriteLock"):
                    with self.subTest(client=client_name, kind=kind):
                        key = "dropped-%s-%s" % (kind, client_name)

                        async def gone() -> bool:
                            return await self.r.exists(key) == 0

                        gc.collect()
                        gc.disable()
                        try:
                            if kind == "AsyncLock":
                                lock: Any = AsyncLock(client, key, lease_ms=10_000,
                                                      keepalive=True)
                                await lock.acquire()
                            else:
                                lock = AsyncReadWriteLock(client, key, lease_ms=10_000,
                                                          keepalive=True)
                                await lock.read.acquire()
                            self.assertEqual(await self.r.exists(key), 1)
                            del lock
                            await wait_for(gone, 5)  # not 10 s later
                        finally:
                            gc.enable()

    async def test_a_dropped_view_closes_the_shared_connection_with_the_callers_pool(self) -> None:
        # A ReadWriteLock on a pool that cannot be cloned: its read view is
        # dropped holding while the write view lives on. When the write view's
        # hold ends, the connection (still bound to the read hold) is closed,
        # not given back to the caller's pool for reuse.
        async with callers_pool_client() as custom:
            rw = AsyncReadWriteLock(custom, "dv", lease_ms=10_000, keepalive=True)
            write = rw.write
            await write.acquire()
            await rw.read.acquire()  # the writer's own read hold
            del rw
            self.assertEqual(await write.release(), 0)

            async def gone() -> bool:
                return await self.r.exists("dv") == 0

            await wait_for(gone, 5)  # the dropped read hold ended with the connection

    async def test_deadlock_error(self) -> None:
        await self.r.config_set("rlock.deadlock-check-ms", 100)
        try:
            await AsyncLock(self.r, "d:1", owner="A").acquire()
            b2 = AsyncLock(self.r, "d:2", owner="B")
            await b2.acquire()
            a2 = AsyncLock(self.r, "d:2", owner="A")
            task = asyncio.ensure_future(a2.acquire(timeout=10))

            async def parked() -> bool:
                return await self.waiters() == 1

            await wait_for(parked)
            with self.assertRaises(DeadlockError) as caught:
                await AsyncLock(self.r, "d:1", owner="B").acquire(timeout=10)
            self.assertEqual(caught.exception.cycle, ["B", "A", "B"])
            await b2.release()
            self.assertIsNotNone(await asyncio.wait_for(task, 5))
            await a2.release()
        finally:
            await self.r.config_set("rlock.deadlock-check-ms", 1000)


if __name__ == "__main__":
    unittest.main()
