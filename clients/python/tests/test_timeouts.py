"""A waiting call against a server that stops answering (SIGSTOP): it raises
ServerTimeout within its timeout plus ``wait_margin`` (sync and asyncio,
every lock class, keepalive or not, frozen before or during the wait)."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import Any, Callable, Dict, List, Optional, Tuple

import harness
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from rlock import FairLock, Lock, LockLost, MultiLock, ReadWriteLock, Semaphore, ServerTimeout
from rlock._common import parse_info
from rlock.aio import AsyncLock, AsyncMultiLock, AsyncSemaphore, _close

SERVER: Optional[harness.Server] = None

#: Short enough to keep the suite quick; the bounds checked are generous.
MARGIN = 0.5
WAIT = 1.0
#: How long past timeout + margin a call may take before the test calls it
#: hung (scheduling on a busy machine, not the library's precision).
SLACK = 5.0


def setUpModule() -> None:
    global SERVER
    SERVER = harness.Server()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.stop()


def release_calls(r: "redis.Redis") -> int:
    """RELEASE and RENEW commands of any family the server has run."""
    stats = r.info("commandstats")
    return sum(int(v.get("calls", 0)) for k, v in stats.items()
               if k.endswith(".release") or k.endswith(".renew"))


def waiters(r: "redis.Redis") -> int:
    return int(r.info("rlock")["rlock_waiters"])


def wait_for(cond: Callable[[], Any], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %ss" % limit)
        time.sleep(0.01)


def in_thread(fn: Callable[[], Any]) -> Tuple[threading.Thread, Dict[str, Any]]:
    """Runs ``fn`` on a daemon thread; the box gets its value or error and
    how long it took."""
    box: Dict[str, Any] = {}

    def target() -> None:
        start = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            box["error"] = e
        box["elapsed"] = time.monotonic() - start

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


class FrozenServerTest(unittest.TestCase):
    """Sync lock objects."""

    def setUp(self) -> None:
        assert SERVER is not None
        self.server = SERVER
        self.r = SERVER.client()
        self.r.flushall()

    def tearDown(self) -> None:
        self.server.thaw()  # whatever happened
        self.r.close()

    def kinds(self, r: "redis.Redis") -> List[Tuple[str, Callable[[], Any], Callable[[], Any]]]:
        """(name, holder, waiter) per lock class: the holder takes what the
        waiter then waits for."""
        kw = dict(wait_margin=MARGIN)
        return [
            ("Lock", lambda: Lock(r, "f:l", owner="h"), lambda: Lock(r, "f:l", **kw)),
            ("FairLock", lambda: FairLock(r, "f:f", owner="h"), lambda: FairLock(r, "f:f", **kw)),
            ("ReadWriteLock.write", lambda: ReadWriteLock(r, "f:rw", owner="h").read,
             lambda: ReadWriteLock(r, "f:rw", **kw).write),
            ("MultiLock", lambda: Lock(r, "{f}:2", owner="h"),
             lambda: MultiLock(r, ["{f}:1", "{f}:2"], **kw)),
            ("Semaphore", lambda: Semaphore(r, "f:s", limit=1, owner="h"),
             lambda: Semaphore(r, "f:s", limit=1, **kw)),
            ("Lock keepalive", lambda: Lock(r, "f:k", owner="h"),
             lambda: Lock(r, "f:k", keepalive=True, **kw)),
        ]

    def test_a_wait_parked_before_the_freeze_raises_server_timeout(self) -> None:
        for name, make_holder, make_waiter in self.kinds(self.r):
            with self.subTest(name):
                self.r.flushall()
                holder = make_holder()
                self.assertIsNotNone(holder.acquire(blocking=False))
                waiter = make_waiter()
                t, box = in_thread(lambda: waiter.acquire(timeout=WAIT))
                wait_for(lambda: waiters(self.r) == 1)
                self.server.freeze()
                try:
                    t.join(WAIT + MARGIN + SLACK)
                    self.assertFalse(t.is_alive(), "the wait did not return while frozen")
                finally:
                    self.server.thaw()
                t.join(10)
                self.assertIsInstance(box.get("error"), ServerTimeout, box)
                self.assertIsInstance(box["error"], redis.TimeoutError)
                self.assertLess(box["elapsed"], WAIT + MARGIN + SLACK)
                self.assertFalse(waiter.locked)
                # Thawed: the abandoned waiter was not granted (its BLOCK time
                # ran out while frozen), the holder still holds.
                wait_for(lambda: waiters(self.r) == 0)
                self.assertEqual(holder.release(), 0)
                # The object works again, on a fresh connection: the late
                # answer to the abandoned wait is read by nobody.
                token = waiter.acquire(timeout=WAIT)
                self.assertIsInstance(token, (int, tuple), name)
                waiter.release()

    def test_a_freeze_before_the_connection_is_set_up(self) -> None:
        # A client whose pools are new: the wait's connection is opened (and
        # its CLIENT SETINFO answered) only after the freeze.
        for keepalive in (False, True):
            with self.subTest(keepalive=keepalive):
                fresh = self.server.client()
                lock = Lock(fresh, "f:setup", wait_margin=MARGIN, keepalive=keepalive)
                self.server.freeze()
                try:
                    t, box = in_thread(lambda: lock.acquire(timeout=WAIT))
                    t.join(WAIT + MARGIN + SLACK)
                    self.assertFalse(t.is_alive(), "the set-up did not return while frozen")
                finally:
                    self.server.thaw()
                t.join(10)
                self.assertIsInstance(box.get("error"), ServerTimeout, box)
                self.assertLess(box["elapsed"], WAIT + MARGIN + SLACK)
                fresh.close()

    def test_keepalive_holdings_on_an_abandoned_connection_end(self) -> None:
        # A keepalive semaphore holds a permit and waits for a second one on
        # its pinned connection; the server freezes. The wait is abandoned,
        # the connection closed: the holding bound to it is reported lost, and
        # once thawed the server ends it (it sees the connection closed).
        other = Semaphore(self.r, "f:ks", limit=2, owner="other")
        other.acquire()
        lost: List[Any] = []
        sem = Semaphore(self.r, "f:ks", limit=2, keepalive=True, wait_margin=MARGIN,
                        lease_ms=60_000, on_lost=lost.append)
        self.assertIsNotNone(sem.acquire(blocking=False))
        t, box = in_thread(lambda: sem.acquire(timeout=WAIT))
        wait_for(lambda: waiters(self.r) == 1)
        self.server.freeze()
        try:
            t.join(WAIT + MARGIN + SLACK)
            self.assertFalse(t.is_alive(), "the keepalive wait did not return while frozen")
        finally:
            self.server.thaw()
        t.join(10)
        self.assertIsInstance(box.get("error"), ServerTimeout, box)
        self.assertEqual(lost, [sem])
        self.assertEqual(sem.holds, 0)
        self.assertIsNone(sem._pin.conn)  # type: ignore[union-attr]

        def owners() -> List[bytes]:
            info = parse_info(self.r.execute_command("SEMAPHORE.INFO", "f:ks"))
            assert info is not None
            return [h[b"owner"] for h in info["holders"]]

        wait_for(lambda: owners() == [b"other"], 5)  # not 60 s (its lease) later
        other.release()

    def test_a_with_block_from_before_the_pin_failed_is_lost(self) -> None:
        # A keepalive semaphore shared by threads: the main thread is in a
        # with block; another thread's wait on the pinned connection is
        # abandoned (the server froze), which ends the holding; a third
        # thread acquires again (a new tenure). The with block from before
        # the failure raises LockLost and sends nothing: it must not drop
        # the new tenure's permit.
        other = Semaphore(self.r, "f:kw", limit=2, owner="other")
        other.acquire()
        sem = Semaphore(self.r, "f:kw", limit=2, keepalive=True, wait_margin=MARGIN,
                        lease_ms=60_000)

        def owners() -> List[bytes]:
            info = parse_info(self.r.execute_command("SEMAPHORE.INFO", "f:kw"))
            assert info is not None
            return sorted(h[b"owner"] for h in info["holders"])

        mine = sorted([b"other", sem.owner.encode()])
        with self.assertRaises(LockLost):
            with sem:
                t, box = in_thread(lambda: sem.acquire(timeout=WAIT))
                wait_for(lambda: waiters(self.r) == 1)
                self.server.freeze()
                try:
                    t.join(WAIT + MARGIN + SLACK)
                    self.assertFalse(t.is_alive(), "the keepalive wait did not return")
                finally:
                    self.server.thaw()
                t.join(10)
                self.assertIsInstance(box.get("error"), ServerTimeout, box)
                wait_for(lambda: owners() == [b"other"], 5)
                t, box = in_thread(lambda: sem.acquire(blocking=False))
                t.join(10)
                self.assertIsInstance(box.get("value"), int, box)
                self.assertEqual(owners(), mine)
                before = release_calls(self.r)
                with self.assertRaises(LockLost):
                    sem.renew()  # inside the stale block: sends nothing
        self.assertEqual(release_calls(self.r), before, "the stale block sent a command")
        self.assertEqual(owners(), mine, "the stale block released the new tenure")
        self.assertEqual(sem.holds, 1)
        self.assertEqual(sem.release(), 0)
        self.assertEqual(owners(), [b"other"])
        other.release()

    def test_waits_longer_than_the_margin_still_work(self) -> None:
        # The margin bounds how late the answer may be, not the wait:
        # BLOCK 0 and a BLOCK longer than the margin are served.
        for keepalive in (False, True):
            for timeout in (None, 3.0):
                with self.subTest(keepalive=keepalive, timeout=timeout):
                    holder = Lock(self.r, "f:long", owner="h")
                    holder.acquire()
                    waiter = Lock(self.r, "f:long", wait_margin=0.2, keepalive=keepalive)
                    t, box = in_thread(lambda: waiter.acquire(timeout=timeout))
                    wait_for(lambda: waiters(self.r) == 1)
                    time.sleep(0.6)  # three margins
                    holder.release()
                    t.join(10)
                    self.assertIsInstance(box.get("value"), int, box)
                    self.assertEqual(waiter.release(), 0)


class AsyncFrozenServerTest(unittest.IsolatedAsyncioTestCase):
    """rlock.aio."""

    async def asyncSetUp(self) -> None:
        assert SERVER is not None
        self.server = SERVER
        self.r = redis.asyncio.Redis(port=SERVER.port)
        await self.r.flushall()

    async def asyncTearDown(self) -> None:
        self.server.thaw()
        await _close(self.r)

    async def wait_waiters(self, n: int) -> None:
        deadline = time.monotonic() + 5
        while int((await self.r.info("rlock"))["rlock_waiters"]) != n:
            if time.monotonic() > deadline:
                raise AssertionError("waiters never reached %d" % n)
            await asyncio.sleep(0.01)

    async def frozen_call(self, call: Any, freeze_after: Optional[Callable[[], Any]]) -> Tuple[Any, float]:
        """Starts ``call``; freezes the server (once ``freeze_after`` says so,
        or at once); returns (outcome, seconds), the server thawed."""
        start = time.monotonic()
        if freeze_after is None:
            self.server.freeze()
        task = asyncio.ensure_future(call)
        try:
            if freeze_after is not None:
                await freeze_after()
                self.server.freeze()
            done, _ = await asyncio.wait({task}, timeout=WAIT + MARGIN + SLACK)
            self.assertIn(task, done, "the async wait did not return while frozen")
        finally:
            self.server.thaw()
        elapsed = time.monotonic() - start
        try:
            return await task, elapsed
        except BaseException as e:  # noqa: BLE001 - the outcome under test
            return e, elapsed

    async def test_async_wait_parked_before_the_freeze(self) -> None:
        kinds = [
            ("AsyncLock", lambda: AsyncLock(self.r, "a:l", wait_margin=MARGIN)),
            ("AsyncMultiLock", lambda: AsyncMultiLock(self.r, ["{a}:1", "{a}:2"], wait_margin=MARGIN)),
            ("AsyncSemaphore", lambda: AsyncSemaphore(self.r, "a:s", limit=1, wait_margin=MARGIN)),
            ("AsyncLock keepalive",
             lambda: AsyncLock(self.r, "a:l", keepalive=True, wait_margin=MARGIN)),
        ]
        for name, make in kinds:
            with self.subTest(name):
                await self.r.flushall()
                for key in ("a:l", "{a}:2"):
                    await self.r.execute_command("RLOCK.ACQUIRE", key, "h", "PX", 60_000)
                await self.r.execute_command(
                    "SEMAPHORE.ACQUIRE", "a:s", "h", "LIMIT", 1, "PERMITS", 1, "PX", 60_000)
                waiter = make()
                outcome, elapsed = await self.frozen_call(
                    waiter.acquire(timeout=WAIT), lambda: self.wait_waiters(1))
                self.assertIsInstance(outcome, ServerTimeout, name)
                self.assertLess(elapsed, WAIT + MARGIN + SLACK)
                self.assertFalse(waiter.locked)
                await self.wait_waiters(0)  # thawed: not granted after its time

    async def test_async_freeze_before_the_connection_is_set_up(self) -> None:
        for keepalive in (False, True):
            with self.subTest(keepalive=keepalive):
                lock = AsyncLock(self.r, "a:setup", wait_margin=MARGIN, keepalive=keepalive)
                outcome, elapsed = await self.frozen_call(lock.acquire(timeout=WAIT), None)
                self.assertIsInstance(outcome, ServerTimeout)
                self.assertLess(elapsed, WAIT + MARGIN + SLACK)

    async def test_async_block_from_before_the_pin_failed_is_lost(self) -> None:
        # As the sync test: a keepalive semaphore shared by tasks; an async
        # with block from before the pinned connection failed raises
        # LockLost and sends nothing once another task took a new tenure.
        await self.r.execute_command(
            "SEMAPHORE.ACQUIRE", "a:kw", "other", "LIMIT", 2, "PERMITS", 1, "PX", 60_000)
        sem = AsyncSemaphore(self.r, "a:kw", limit=2, keepalive=True, wait_margin=MARGIN,
                             lease_ms=60_000)
        sync = SERVER.client()  # type: ignore[union-attr]

        async def owners() -> List[bytes]:
            info = parse_info(await self.r.execute_command("SEMAPHORE.INFO", "a:kw"))
            assert info is not None
            return sorted(h[b"owner"] for h in info["holders"])

        mine = sorted([b"other", sem.owner.encode()])
        try:
            with self.assertRaises(LockLost):
                async with sem:
                    outcome, _ = await self.frozen_call(
                        sem.acquire(timeout=WAIT), lambda: self.wait_waiters(1))
                    self.assertIsInstance(outcome, ServerTimeout)
                    deadline = time.monotonic() + 5
                    while await owners() != [b"other"]:
                        self.assertLess(time.monotonic(), deadline)
                        await asyncio.sleep(0.01)
                    self.assertIsInstance(
                        await asyncio.ensure_future(sem.acquire(blocking=False)), int)
                    self.assertEqual(await owners(), mine)
                    before = release_calls(sync)
                    with self.assertRaises(LockLost):
                        await sem.renew()
            self.assertEqual(release_calls(sync), before, "the stale block sent a command")
            self.assertEqual(await owners(), mine, "the stale block released the new tenure")
            self.assertEqual(sem.holds, 1)
            self.assertEqual(await sem.release(), 0)
            self.assertEqual(await owners(), [b"other"])
        finally:
            sync.close()

    async def test_async_custom_pool_wait_outlasts_its_socket_timeout(self) -> None:
        # A pool that cannot be cloned (a subclass, as Sentinel's) with a
        # socket_timeout shorter than the wait: the wait's reply is still
        # awaited for its timeout + margin, not cut at the socket timeout.
        class CustomPool(redis.asyncio.ConnectionPool):
            pass

        assert SERVER is not None
        for keepalive in (False, True):
            with self.subTest(keepalive=keepalive):
                pool = CustomPool(port=SERVER.port, socket_timeout=0.3)
                custom = redis.asyncio.Redis(
                    connection_pool=pool, retry=AsyncRetry(NoBackoff(), 0))
                try:
                    await self.r.execute_command("RLOCK.ACQUIRE", "a:cp", "h", "PX", 60_000)
                    waiter = AsyncLock(custom, "a:cp", keepalive=keepalive, wait_margin=MARGIN)
                    task = asyncio.ensure_future(waiter.acquire(timeout=5))
                    await self.wait_waiters(1)
                    await asyncio.sleep(1.0)  # three socket timeouts
                    self.assertFalse(task.done(), task.done() and task.exception())
                    await self.r.execute_command("RLOCK.RELEASE", "a:cp", "h")
                    self.assertIsInstance(await asyncio.wait_for(task, 10), int)
                    self.assertEqual(await waiter.release(), 0)
                    # BLOCK 0 waits without a limit, whatever the socket timeout.
                    await self.r.execute_command("RLOCK.ACQUIRE", "a:cp", "h", "PX", 60_000)
                    task = asyncio.ensure_future(waiter.acquire())
                    await self.wait_waiters(1)
                    await asyncio.sleep(1.0)
                    self.assertFalse(task.done(), task.done() and task.exception())
                    await self.r.execute_command("RLOCK.RELEASE", "a:cp", "h")
                    self.assertIsInstance(await asyncio.wait_for(task, 10), int)
                    self.assertEqual(await waiter.release(), 0)
                finally:
                    await _close(custom)
                    await pool.disconnect()

    async def test_async_block_0_waits_past_the_margin(self) -> None:
        for keepalive in (False, True):
            with self.subTest(keepalive=keepalive):
                await self.r.execute_command("RLOCK.ACQUIRE", "a:long", "h", "PX", 60_000)
                waiter = AsyncLock(self.r, "a:long", wait_margin=0.2, keepalive=keepalive)
                task = asyncio.ensure_future(waiter.acquire())
                await self.wait_waiters(1)
                await asyncio.sleep(0.6)  # three margins
                await self.r.execute_command("RLOCK.RELEASE", "a:long", "h")
                self.assertIsInstance(await asyncio.wait_for(task, 10), int)
                self.assertEqual(await waiter.release(), 0)


if __name__ == "__main__":
    unittest.main()
