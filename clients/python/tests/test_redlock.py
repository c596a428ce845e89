"""RedLock over 5 independent servers: quorum, validity, dead and frozen servers."""

from __future__ import annotations

import asyncio
import time
import unittest
from typing import List

import harness

from rlock import NotAcquired, RedLock
from rlock._common import parse_info
from rlock.aio import AsyncRedLock

N = 5
LEASE = 10000
DRIFT = LEASE * 0.01 + 2


class RedLockTest(unittest.TestCase):
    def setUp(self) -> None:
        self.servers: List[harness.Server] = harness.servers(N)
        self.clients = [s.client(socket_timeout=2) for s in self.servers]

    def tearDown(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.stop()

    def holders(self, key: str) -> List[bool]:
        """Per server: whether it holds `key` (dead or frozen ones: False)."""
        return [bool(s.alive and c.exists(key)) for s, c in zip(self.servers, self.clients)]

    def redlock(self, **kw) -> RedLock:  # type: ignore[no-untyped-def]
        kw.setdefault("lease_ms", LEASE)
        return RedLock([s.url for s in self.servers], "res", **kw)

    def test_all_servers_grant(self) -> None:
        lock = self.redlock()
        start = time.monotonic()
        grant = lock.acquire(blocking=False)
        elapsed = (time.monotonic() - start) * 1000
        assert grant is not None
        self.assertEqual(grant.granted, N)
        self.assertTrue(all(isinstance(t, int) for t in grant.tokens))
        self.assertLessEqual(grant.validity_ms, LEASE - DRIFT)
        self.assertGreaterEqual(grant.validity_ms, LEASE - DRIFT - elapsed - 1)
        self.assertEqual(self.holders("res"), [True] * N)
        # Held: a second RedLock cannot get a quorum, and leaves nothing behind.
        other = self.redlock()
        self.assertIsNone(other.acquire(blocking=False))
        for c in self.clients:
            info = parse_info(c.execute_command("RLOCK.INFO", "res"))
            assert info is not None
            self.assertEqual(info["owner"], lock.owner.encode())
        self.assertEqual(lock.release(), N)
        self.assertEqual(self.holders("res"), [False] * N)
        self.assertIsNotNone(other.acquire(blocking=False))
        other.release()

    def test_acquires_with_two_servers_killed(self) -> None:
        self.servers[1].kill()
        self.servers[3].kill()
        lock = self.redlock()
        grant = lock.acquire(blocking=False)
        assert grant is not None
        self.assertEqual(grant.granted, 3)
        self.assertIsNone(grant.tokens[1])
        self.assertIsNone(grant.tokens[3])
        self.assertEqual(self.holders("res"), [True, False, True, False, True])
        # Release reaches every reachable server.
        self.assertEqual(lock.release(), 3)
        self.assertEqual(self.holders("res"), [False] * N)

    def test_fails_with_three_killed_and_leaves_no_holds(self) -> None:
        for i in (0, 2, 4):
            self.servers[i].kill()
        lock = self.redlock()
        self.assertIsNone(lock.acquire(blocking=False))
        self.assertEqual(self.holders("res"), [False] * N)
        self.assertIsNone(lock.owner)
        # Blocking with a timeout retries, then gives up; still no holds.
        start = time.monotonic()
        self.assertIsNone(lock.acquire(timeout=0.5))
        self.assertGreaterEqual(time.monotonic() - start, 0.45)
        self.assertEqual(self.holders("res"), [False] * N)
        with self.assertRaises(NotAcquired):
            with self.redlock(timeout=0.2):
                self.fail("must not enter")

    def test_minority_held_elsewhere_is_released_after_failure(self) -> None:
        # Three servers are held by somebody else: this RedLock gets two grants,
        # no quorum, and must give those two back.
        for c in self.clients[:3]:
            c.execute_command("RLOCK.ACQUIRE", "res", "someone-else", "PX", LEASE)
        lock = self.redlock()
        self.assertIsNone(lock.acquire(blocking=False))
        self.assertEqual(self.holders("res"), [True, True, True, False, False])

    def test_frozen_server_is_skipped_within_the_server_timeout(self) -> None:
        self.servers[2].freeze()
        lock = self.redlock(server_timeout=0.2)
        start = time.monotonic()
        grant = lock.acquire(blocking=False)
        elapsed = time.monotonic() - start
        assert grant is not None
        self.assertEqual(grant.granted, 4)
        self.assertIsNone(grant.tokens[2])
        self.assertGreaterEqual(elapsed, 0.19)
        self.assertLess(elapsed, 0.6)
        # Validity shrinks with the time spent: at least the 200 ms wait.
        self.assertLessEqual(grant.validity_ms, LEASE - DRIFT - 190)
        self.assertGreater(grant.validity_ms, LEASE - DRIFT - 1000)
        start = time.monotonic()
        self.assertEqual(lock.release(), 4)
        self.assertLess(time.monotonic() - start, 0.6)

    def test_validity_shrinks_with_elapsed_time(self) -> None:
        fast = self.redlock()
        g1 = fast.acquire(blocking=False)
        assert g1 is not None
        fast.release()
        self.servers[0].freeze()
        slow = self.redlock(server_timeout=0.3)
        g2 = slow.acquire(blocking=False)
        assert g2 is not None
        self.assertLess(g2.validity_ms, g1.validity_ms - 250)
        slow.release()
        # When the time spent eats the whole lease, 4 grants are not enough:
        # no lock, and every grant is given back.
        # (The frozen server is left out: a command it received before freezing
        # runs when it thaws, after its sender gave up; the lease bounds that.)
        short = self.redlock(server_timeout=0.3, lease_ms=250)
        self.assertIsNone(short.acquire(blocking=False))
        self.assertEqual(self.holders("res"), [False] * N)

    def test_extend_renews_on_every_server(self) -> None:
        lock = self.redlock(lease_ms=500)
        assert lock.acquire(blocking=False) is not None
        time.sleep(0.3)
        grant = lock.extend()
        assert grant is not None
        self.assertEqual(grant.granted, N)
        time.sleep(0.3)  # past the first lease, within the renewed one
        self.assertEqual(self.holders("res"), [True] * N)
        for i in (0, 1, 2):
            self.servers[i].kill()
        self.assertIsNone(lock.extend())
        lock.release()

    def test_context_manager(self) -> None:
        with self.redlock() as grant:
            self.assertEqual(grant.granted, N)
            self.assertEqual(self.holders("res"), [True] * N)
        self.assertEqual(self.holders("res"), [False] * N)

    def test_async_redlock(self) -> None:
        self.servers[4].kill()
        self.servers[1].freeze()

        async def run() -> None:
            lock = AsyncRedLock([s.url for s in self.servers], "res",
                                lease_ms=LEASE, server_timeout=0.2)
            start = time.monotonic()
            grant = await lock.acquire(blocking=False)
            elapsed = time.monotonic() - start
            assert grant is not None
            self.assertEqual(grant.granted, 3)
            self.assertEqual([t is None for t in grant.tokens], [False, True, False, False, True])
            self.assertLess(elapsed, 0.6)  # asked at once: one timeout, not one per server
            self.assertEqual(self.holders("res"), [True, False, True, True, False])
            renewed = await lock.extend()
            assert renewed is not None
            self.assertEqual(renewed.granted, 3)
            self.assertEqual(renewed.tokens, grant.tokens)
            self.assertEqual(await lock.release(), 3)
            self.assertEqual(self.holders("res"), [False] * N)
            self.servers[3].kill()  # two dead, one frozen: no quorum
            self.assertIsNone(await lock.acquire(blocking=False))
            self.assertEqual(self.holders("res"), [False] * N)
            await lock.close()

        asyncio.run(run())

    def test_a_server_listed_twice_is_refused(self) -> None:
        # It would count twice towards the quorum: one server as a majority.
        urls = [self.servers[0].url, self.servers[0].url, self.servers[1].url]
        with self.assertRaises(ValueError):
            RedLock(urls, "res")
        with self.assertRaises(ValueError):
            AsyncRedLock(urls, "res")
        other_db = self.servers[0].url[:-1] + "1"
        with self.assertRaises(ValueError):
            RedLock([self.servers[0].url, other_db], "res")

    def test_a_cancelled_async_round_releases_what_it_got(self) -> None:
        self.servers[2].freeze()

        async def run() -> None:
            lock = AsyncRedLock([s.url for s in self.servers], "res",
                                lease_ms=LEASE, server_timeout=1.0)
            # Cancelled while the frozen server keeps the round open: the
            # others have granted by then.
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(lock.acquire(blocking=False), 0.3)
            self.assertIsNone(lock.owner)
            await lock.close()

        asyncio.run(run())
        self.assertEqual(self.holders("res"), [False] * N)


if __name__ == "__main__":
    unittest.main()
