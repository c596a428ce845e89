"""The same locks for ``redis.asyncio``: ``AsyncLock``, ``AsyncFairLock``,
``AsyncReadWriteLock``, ``AsyncMultiLock``, ``AsyncSemaphore`` and ``AsyncRedLock``.

    from rlock.aio import AsyncLock

    async with AsyncLock(aclient, "orders:42", lease_ms=10_000) as lock:
        await write_somewhere(fence=lock.token)

Renewal runs as an asyncio task on the running loop. A BLOCK wait occupies
one pooled connection for its duration; ``use_pubsub=True`` (or
``acquire_via_pubsub``) waits on the unlock channel instead. With
``keepalive=True`` the server renews instead (no task) while the lock object
keeps the connection it was granted on, taken from a pool of its own, until
it holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
import weakref
from typing import (
    Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union,
)

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._common import (
    DEFAULT_LEASE_MS,
    DEFAULT_WAIT_MARGIN,
    DeadlockError,
    Family,
    KeyT,
    LockLost,
    NotAcquired,
    ServerTimeout,
    acquire_all,
    block_generation,
    block_ms,
    check_distinct_servers,
    check_lease,
    check_margin,
    check_permits,
    db_of,
    default_owner,
    drift_ms,
    enter_block,
    exit_block,
    is_deadlock,
    is_end_message,
    is_notowner,
    note_grant,
    parse_info,
    quorum,
    release_all,
    renew_all,
    retry_wait,
    semaphore_acquire,
    semaphore_release,
    stale_message,
    wait_deadline,
)
from ._common import unlock_channel
from ._sync import RedLockGrant, _renewed_grant

log = logging.getLogger("rlock")

ARedis = redis.asyncio.Redis


def _clone(client: ARedis, **overrides: Any) -> Optional[ARedis]:
    pool = client.connection_pool
    if type(pool) not in (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool):
        return None
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(overrides)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["retry_on_timeout"] = False
    new_pool = redis.asyncio.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    return redis.asyncio.Redis(connection_pool=new_pool)


def _blocking_client(client: ARedis, margin: float) -> Optional[ARedis]:
    """As in the sync half: no retries for a BLOCK wait, no socket timeout
    (its set-up and its reply are bounded with ``asyncio.wait_for``, see
    _connection_for_wait and _exchange). A new client per wait, closed after
    it (clients are tied to an event loop, so none is cached)."""
    kw = client.connection_pool.connection_kwargs
    connect = kw.get("socket_connect_timeout") or kw.get("socket_timeout")
    connect = margin if connect is None else min(connect, margin)
    return _clone(client, socket_timeout=None, socket_connect_timeout=connect)


async def _pool_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return await pool.get_connection("_")


async def _send_once(client: ARedis, args: List[Any]) -> Any:
    """As in the sync half: one command never resent (a RELEASE whose reply
    was lost may have been applied; a retry would drop one more hold)."""
    pool = client.connection_pool
    conn = await _pool_connection(pool)
    try:
        await conn.send_command(*args)
        return await conn.read_response()
    except redis.ResponseError:
        raise
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await _maybe_await(pool.release(conn))


async def _connection_for_wait(pool: Any, margin: float) -> Any:
    """A connected connection out of ``pool``, its set-up (connect, ``HELLO``,
    ``CLIENT SETINFO``) bounded by ``margin``; ServerTimeout past it."""
    try:
        return await asyncio.wait_for(_pool_connection(pool), margin)
    except (asyncio.TimeoutError, redis.TimeoutError) as e:
        raise ServerTimeout(
            "the server did not answer the connection set-up in time (%r)" % e) from e


async def _read_unbounded(conn: Any) -> Any:
    """``conn``'s next reply, read without the connection's own
    ``socket_timeout`` (the caller bounds the read): a connection of the
    caller's pool (Sentinel, custom) keeps the pool's timeout, which may be
    shorter than the wait."""
    saved = conn.socket_timeout
    conn.socket_timeout = None
    try:
        return await conn.read_response()
    finally:
        conn.socket_timeout = saved


async def _exchange(conn: Any, args: List[Any], deadline: Optional[float]) -> Any:
    """Sends one command on ``conn`` and reads its reply by ``deadline``
    (``loop.time()``; None: no limit), whatever the connection's
    ``socket_timeout``. Anything but a reply (a timeout, a broken
    connection, a cancellation) disconnects ``conn``: a late reply would be
    read as the answer to the next command. A timeout raises
    ServerTimeout."""
    try:
        await conn.send_command(*args)
        if deadline is None:
            return await _read_unbounded(conn)
        left = max(0.001, deadline - asyncio.get_running_loop().time())
        return await asyncio.wait_for(_read_unbounded(conn), left)
    except redis.ResponseError:
        raise
    except BaseException as e:
        try:
            await conn.disconnect()
        except Exception:
            pass
        if isinstance(e, (asyncio.TimeoutError, redis.TimeoutError)):
            raise ServerTimeout(
                "the server did not answer %s in time (%r); the connection was closed"
                % (args[0], e)) from e
        raise


def _renewal_client(client: ARedis, lease_ms: int) -> Optional[ARedis]:
    """As in the sync half: no retries, a timeout of at most lease/3. One per
    renewal task, closed when it ends."""
    timeout = max(0.01, lease_ms / 3000.0)
    mine = client.connection_pool.connection_kwargs.get("socket_timeout")
    if mine is not None:
        timeout = min(timeout, mine)
    return _clone(client, socket_timeout=timeout, socket_connect_timeout=timeout)


async def _close(obj: Any) -> None:
    closer = getattr(obj, "aclose", None) or obj.close
    result = closer()
    if asyncio.iscoroutine(result):
        await result


async def _close_own(client: ARedis) -> None:
    """Closes a client this module made, with its connection pool."""
    await _close(client)
    await client.connection_pool.disconnect()


async def _maybe_await(result: Any) -> Any:
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        return await result
    return result


_TIDYING: "set[asyncio.Task[None]]" = set()


def _abandon_pinned(loop: asyncio.AbstractEventLoop, pool: Any, own: Optional[ARedis],
                    conn: Any) -> None:
    """A pin went while its connection was out: its lock objects were dropped
    holding. Closes the connection's stream without awaiting (as redis-py's
    own ``Connection.__del__`` does), so the server ends every holding bound
    to it at once, then gives the connection back and closes the pin's own
    client on the loop. Nothing to do once the loop is closed (its sockets
    went with it)."""

    def close() -> None:
        writer = getattr(conn, "_writer", None)
        if writer is not None:
            writer.close()
            conn._reader = conn._writer = None  # redis-py reconnects on next use

        async def tidy() -> None:
            try:
                if own is not None:
                    await _maybe_await(own.connection_pool.release(conn))
                    await _close_own(own)
                else:
                    await _maybe_await(pool.release(conn))
            except Exception:
                log.debug("rlock: tidying a dropped keepalive connection failed",
                          exc_info=True)

        task = loop.create_task(tidy())
        _TIDYING.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(_TIDYING.discard)

    try:
        running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        close()
    elif not loop.is_closed():
        try:
            loop.call_soon_threadsafe(close)
        except RuntimeError:  # closed meanwhile
            pass


class _AsyncPin:
    """The connection an async lock object's KEEPALIVE holdings are bound to
    (see the sync _Pin). Taken when an acquisition starts from a client of its
    own (the caller's settings, no retries; the caller's pool when it cannot
    be cloned) and held while an acquisition is under way or any user holds
    anything; then closed with that client (clients are tied to an event
    loop, so none is kept). Only acquisitions go through it, one at a time;
    releases, renewals and INFO go through the caller's client.

    As the sync pin, it refers to its users weakly: a lock object dropped
    while holding is freed at once, and the pin with it, whose finalizer
    closes the connection (the server releases at once)."""

    def __init__(self, client: ARedis, margin: float) -> None:
        self.client = client
        self.margin = margin
        self.own: Optional[ARedis] = None
        self.conn: Any = None
        self.mutex = asyncio.Lock()
        self.busy = 0
        #: Goes up each time the connection is closed after a failure (which
        #: ended every holding bound to it): see the sync _Pin.
        self.generation = 0
        self._users: "weakref.WeakSet[_AsyncLockBase]" = weakref.WeakSet()
        self._registered = 0
        self._lost: List[Tuple["_AsyncLockBase", str]] = []
        self._finalizer: Optional[weakref.finalize] = None

    def add_user(self, user: "_AsyncLockBase") -> None:
        self._users.add(user)
        self._registered += 1

    @property
    def users(self) -> List["_AsyncLockBase"]:
        return list(self._users)

    def _idle(self) -> bool:
        return self.conn is not None and not self.busy and not any(
            u._holds > 0 for u in self.users)

    async def settle(self) -> None:
        """After a release: closes the connection if no acquisition is under
        way and no user holds anything (one under way does it when it ends)."""
        if self._idle():
            await self._give_back()

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[Callable[[List[Any], Optional[int]], Awaitable[Any]]]:
        try:
            async with self.mutex:
                self.busy += 1
                try:
                    yield self._call
                finally:
                    self.busy -= 1
                    if self._idle():
                        await self._give_back()
        finally:
            lost, self._lost = self._lost, []
            for user, why in lost:
                if user._set_lost(why):
                    await user._notify_lost()

    async def _give_back(self) -> None:
        conn, self.conn = self.conn, None
        own, self.own = self.own, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if own is not None:
            await _maybe_await(own.connection_pool.release(conn))
            await _close_own(own)
        else:
            # A user dropped while holding (one view of a ReadWriteLock) may
            # have left a holding bound to the connection: close it rather
            # than let the caller's pool reuse it.
            if len(self._users) < self._registered:
                await conn.disconnect()
            await _maybe_await(self.client.connection_pool.release(conn))

    async def _call(self, args: List[Any], block: Optional[int]) -> Any:
        deadline = wait_deadline(asyncio.get_running_loop().time(), block, self.margin)
        if self.conn is None:
            own = _blocking_client(self.client, self.margin)
            try:
                self.conn = await _connection_for_wait(
                    (own or self.client).connection_pool, self.margin)
            except BaseException:
                if own is not None:
                    await _close_own(own)
                raise
            self.own = own
            pool = self.client.connection_pool
            self._finalizer = weakref.finalize(
                self, _abandon_pinned, asyncio.get_running_loop(), pool, own, self.conn)
        conn = self.conn
        try:
            return await _exchange(conn, args, deadline)
        except redis.ResponseError:
            raise
        except BaseException as e:
            # Broken, timed out or cancelled mid-reply: _exchange closed the
            # connection, and closing it ends every holding bound to it.
            for user in self.users:
                if user._holds > 0:
                    user._holds = 0
                    user._token = None
                    self._lost.append((user, "its keepalive connection failed (%r)" % e))
            self.generation += 1
            await self._give_back()
            raise


class _AsyncLockBase:
    """Async twin of the sync lock objects (same arguments and meaning,
    including ``keepalive`` and ``wait_margin``: a BLOCK wait raises
    ServerTimeout when the server has not answered within its timeout plus
    ``wait_margin``, or the connection's set-up within ``wait_margin``).

    The renewal task refers to the object weakly: an object dropped while
    holding stops being renewed (its lease then runs out), as in the sync
    half. ``on_lost`` runs outside the object's mutex, so it may await
    ``release()``."""

    _family: Family

    def __init__(
        self,
        client: ARedis,
        key: KeyT,
        owner: Optional[str] = None,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        timeout: Optional[float] = None,
        auto_renew: bool = True,
        use_pubsub: bool = False,
        on_lost: Optional[Callable[["_AsyncLockBase"], Union[None, Awaitable[None]]]] = None,
        keepalive: bool = False,
        wait_margin: float = DEFAULT_WAIT_MARGIN,
        _pin: Optional[_AsyncPin] = None,
    ) -> None:
        self.client = client
        self.key = key
        self.owner = owner or default_owner()
        self.lease_ms = check_lease(lease_ms)
        self.timeout = timeout
        self.auto_renew = auto_renew
        self.use_pubsub = use_pubsub
        self.on_lost = on_lost
        self.lost = asyncio.Event()
        self._token: Optional[int] = None
        self._holds = 0
        self._mutex = asyncio.Lock()
        self._renewer: Optional["asyncio.Task[None]"] = None
        self.wait_margin = check_margin(wait_margin)
        self.keepalive = keepalive
        self._pin: Optional[_AsyncPin] = None
        if keepalive:
            self._pin = _pin or _AsyncPin(client, self.wait_margin)
            self._pin.add_user(self)

    @property
    def token(self) -> Optional[int]:
        return self._token

    @property
    def holds(self) -> int:
        return self._holds

    @property
    def locked(self) -> bool:
        return self._holds > 0 and not self.lost.is_set()

    @property
    def renewing(self) -> bool:
        return self._renewer is not None and not self._renewer.done()

    def check(self) -> None:
        if self.lost.is_set():
            raise LockLost("%s %r: lock lost" % (self._family.prefix, self.key))

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> Optional[int]:
        """Token, or None when not granted (see the sync ``acquire``, also
        for ServerTimeout)."""
        block = block_ms(blocking, timeout)
        args = self._acquire_args(block)
        try:
            if self._pin is not None:
                async with self._pin.use() as call:
                    reply = await call(args, block)
                    if reply is None:
                        return None
                    # Recorded inside the pin, so it is not given back.
                    note_grant(self._pin)
                    return self._granted(reply)
            if block is None:
                # Sent once (see the sync ``acquire``).
                reply = await _send_once(self.client, args)
            else:
                reply = await self._wait(args, block)
        except redis.ResponseError as e:
            if is_deadlock(e):
                raise DeadlockError(str(e)) from e
            raise
        return None if reply is None else self._granted(reply)

    async def _wait(self, args: List[Any], block: int) -> Any:
        """A BLOCK acquisition on a connection of its own, closed after it:
        its set-up bounded by ``wait_margin``, its reply awaited until BLOCK +
        ``wait_margin`` (forever for BLOCK 0)."""
        deadline = wait_deadline(asyncio.get_running_loop().time(), block, self.wait_margin)
        own = _blocking_client(self.client, self.wait_margin)
        if own is None:
            # A pool that cannot be cloned (Sentinel, custom): one of its
            # connections, the reply read with the wait's own bound (not the
            # pool's socket_timeout) and never resent.
            pool = self.client.connection_pool
            conn = await _connection_for_wait(pool, self.wait_margin)
            try:
                return await _exchange(conn, args, deadline)
            finally:
                await _maybe_await(pool.release(conn))
        try:
            conn = await _connection_for_wait(own.connection_pool, self.wait_margin)
            try:
                return await _exchange(conn, args, deadline)
            finally:
                await _maybe_await(own.connection_pool.release(conn))
        finally:
            await _close_own(own)

    def _grant_amount(self) -> int:
        return 1

    def _granted(self, reply: Any) -> Any:
        token = self._parse_grant(reply)
        if self._holds > 0 and token == self._token:
            self._holds += self._grant_amount()
        else:
            # A new tenure: whatever this object counted before ended on the
            # server (a release on another connection may have been served
            # just before this grant and answered after it).
            self._token = token
            self._holds = self._grant_amount()
        self.lost.clear()
        # With KEEPALIVE the server renews: no task.
        if self.auto_renew and not self.keepalive and not self.renewing:
            self._renewer = asyncio.ensure_future(
                _renew_loop(weakref.ref(self), self.client, self.lease_ms))
        return token

    def _keys(self) -> Sequence[KeyT]:
        return (self.key,)

    def _acquire_args(self, block: Optional[int]) -> List[Any]:
        return self._family.acquire(self.key, self.owner, self.lease_ms, block, self.keepalive)

    def _release_args(self) -> List[Any]:
        return self._family.release(self.key, self.owner)

    def _renew_args(self) -> List[Any]:
        return self._family.renew(self.key, self.owner, self.lease_ms)

    def _parse_grant(self, reply: Any) -> Any:
        return int(reply)

    def _parse_left(self, reply: Any) -> Any:
        return int(reply)

    def _holds_left(self, left: Any) -> int:
        return int(left)

    async def acquire_via_pubsub(
        self, timeout: Optional[float] = None, safety_poll: float = 5.0
    ) -> Optional[int]:
        """No parked connection: subscribe, try, retry on each end-of-hold
        message and at the holder's PTTL (see the sync version)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            db = db_of(self.client)
            await pubsub.subscribe(*(unlock_channel(db, k) for k in self._keys()))
            while True:
                token = await self.acquire(blocking=False)
                if token is not None:
                    return token
                wait = retry_wait([await self.client.pttl(k) for k in self._keys()], safety_poll)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                end = loop.time() + wait
                while True:
                    left = end - loop.time()
                    if left <= 0:
                        break
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
                    if is_end_message(msg):
                        break
        finally:
            await _close(pubsub)

    async def release(self) -> Any:
        """Drops one hold; returns the owner's remaining holds (0: free).
        Raises LockLost when the server says this owner holds nothing.

        Sent through the client, also for a keepalive object: the server
        keeps the binding whatever connection the owner's RELEASE comes on,
        and the pinned connection may be parked in another task's wait."""
        notowner: Optional[redis.ResponseError] = None
        notify = False
        try:
            async with self._mutex:
                token = self._token
                try:
                    left = self._parse_left(
                        await _send_once(self.client, self._release_args()))
                except redis.ResponseError as e:
                    if not is_notowner(e):
                        raise
                    notowner = e
                    if self._token == token:  # else a newer tenure was granted meanwhile
                        was_held = self._holds > 0
                        self._holds = 0
                        await self._stop_renewer()
                        notify = self._set_lost(str(e)) and was_held
                else:
                    if self._token == token:  # else it ended before a newer grant
                        self._holds = max(
                            0, min(self._holds - self._grant_amount(), self._holds_left(left)))
                        if self._holds == 0:
                            await self._stop_renewer()
        finally:
            if self._pin is not None:
                await self._pin.settle()
        if notowner is not None:
            # Outside the mutex: the callback may await release().
            if notify:
                await self._notify_lost()
            raise LockLost(str(notowner)) from notowner
        return left

    async def renew(self) -> None:
        """Resets the lease now (the renewal task does this every lease/3);
        raises LockLost when the server says this owner holds nothing, or
        (keepalive) inside an ``async with`` block whose hold ended with its
        pinned connection (nothing is sent; see ``__aexit__``)."""
        if self._pin is not None:
            gen = block_generation(self)
            if gen is not None and gen != self._pin.generation:
                raise LockLost(stale_message(self._family.prefix, self.key))
        try:
            await self.client.execute_command(*self._renew_args())
        except redis.ResponseError as e:
            if is_notowner(e):
                if self._set_lost(str(e)):
                    await self._notify_lost()
                raise LockLost(str(e)) from e
            raise

    async def info(self) -> Optional[Dict[str, Any]]:
        return parse_info(await self.client.execute_command(*self._family.info(self.key)))

    async def _stop_renewer(self) -> None:
        self._token = None
        task, self._renewer = self._renewer, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def _set_lost(self, why: str) -> bool:
        """Marks the lock lost; True the first time (then call _notify_lost,
        outside the mutex)."""
        if self.lost.is_set():
            return False
        self.lost.set()
        log.warning("%s %r owner %s: lock lost (%s)", self._family.prefix, self.key, self.owner, why)
        return True

    async def _notify_lost(self) -> None:
        if self.on_lost is not None:
            try:
                result = self.on_lost(self)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("rlock on_lost callback failed")

    async def __aenter__(self) -> "_AsyncLockBase":
        if self.use_pubsub:
            token = await self.acquire_via_pubsub(timeout=self.timeout)
        else:
            token = await self.acquire(timeout=self.timeout)
        if token is None:
            raise NotAcquired(
                "%s %r not acquired within %ss" % (self._family.prefix, self.key, self.timeout))
        if self._pin is not None:
            enter_block(self, self._pin)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Releases the hold; LockLost if it was lost meanwhile (unless the
        block raised). A keepalive object shared by tasks: a block whose hold
        was granted on a pinned connection that failed since sends nothing
        (another task may hold a new tenure) and raises LockLost."""
        if self._pin is not None:
            gen = exit_block(self)
            if gen is not None and gen != self._pin.generation:
                if exc_type is None:
                    raise LockLost(stale_message(self._family.prefix, self.key))
                return
        was_lost = self.lost.is_set()
        try:
            if self._holds > 0:
                await self.release()
        except LockLost:
            if exc_type is None:
                raise
            return
        if was_lost and exc_type is None:
            raise LockLost("%s %r: lock lost while held" % (self._family.prefix, self.key))


class AsyncLock(_AsyncLockBase):
    """Reentrant lock (``RLOCK.*``)."""

    _family = Family("RLOCK")


class AsyncFairLock(_AsyncLockBase):
    """Fair lock (``FAIRLOCK.*``)."""

    _family = Family("FAIRLOCK")


class AsyncReadLock(_AsyncLockBase):
    _family = Family("RWLOCK", "READ")


class AsyncWriteLock(_AsyncLockBase):
    _family = Family("RWLOCK", "WRITE")


class AsyncReadWriteLock:
    """``rw.read`` / ``rw.write`` views sharing one owner (``RWLOCK.*``)."""

    def __init__(self, client: ARedis, key: KeyT, owner: Optional[str] = None, **kwargs: Any) -> None:
        owner = owner or default_owner()
        self.key = key
        self.owner = owner
        if kwargs.get("keepalive"):
            kwargs["_pin"] = _AsyncPin(  # one binding for both views
                client, check_margin(kwargs.get("wait_margin", DEFAULT_WAIT_MARGIN)))
        self.read = AsyncReadLock(client, key, owner, **kwargs)
        self.write = AsyncWriteLock(client, key, owner, **kwargs)


class AsyncMultiLock(_AsyncLockBase):
    """Several RLOCK keys held together, all or nothing (see ``rlock.MultiLock``)."""

    _family = Family("RLOCK")

    def __init__(self, client: ARedis, keys: Iterable[KeyT], owner: Optional[str] = None, **kwargs: Any) -> None:
        keys = tuple(keys)
        if not keys:
            raise ValueError("AsyncMultiLock needs at least one key")
        super().__init__(client, keys, owner, **kwargs)  # type: ignore[arg-type]
        self.keys: Tuple[KeyT, ...] = keys

    @property
    def tokens(self) -> Optional[Tuple[int, ...]]:
        return self._token

    async def info(self) -> List[Optional[Dict[str, Any]]]:  # type: ignore[override]
        return [parse_info(await self.client.execute_command("RLOCK.INFO", k)) for k in self.keys]

    def _keys(self) -> Sequence[KeyT]:
        return self.keys

    def _acquire_args(self, block: Optional[int]) -> List[Any]:
        return acquire_all(self.keys, self.owner, self.lease_ms, block, self.keepalive)

    def _release_args(self) -> List[Any]:
        return release_all(self.keys, self.owner)

    def _renew_args(self) -> List[Any]:
        return renew_all(self.keys, self.owner, self.lease_ms)

    def _parse_grant(self, reply: Any) -> Tuple[int, ...]:
        return tuple(int(t) for t in reply)

    def _parse_left(self, reply: Any) -> List[int]:
        return [int(n) for n in reply]

    def _holds_left(self, left: Any) -> int:
        return min(left)


class AsyncSemaphore(_AsyncLockBase):
    """Semaphore with a lease per holding (see ``rlock.Semaphore``)."""

    _family = Family("SEMAPHORE")

    def __init__(
        self, client: ARedis, key: KeyT, limit: int, permits: int = 1,
        owner: Optional[str] = None, **kwargs: Any,
    ) -> None:
        self.limit, self.permits = check_permits(limit, permits)
        super().__init__(client, key, owner, **kwargs)

    def _acquire_args(self, block: Optional[int]) -> List[Any]:
        return semaphore_acquire(
            self.key, self.owner, self.limit, self.permits, self.lease_ms, block, self.keepalive)

    def _release_args(self) -> List[Any]:
        return semaphore_release(self.key, self.owner, self.permits)

    def _grant_amount(self) -> int:
        return self.permits


async def _renew_loop(ref: "weakref.ref[_AsyncLockBase]", client: ARedis, lease_ms: int) -> None:
    """The renewal task of one lock object: RENEW every lease/3 while it holds.
    It refers to the object weakly (between ticks nothing here keeps it
    alive), so a held object dropped without release stops being renewed and
    its lease runs out; the task ends at its next tick."""
    interval = lease_ms / 3000.0
    last_ok = time.monotonic()
    via = _renewal_client(client, lease_ms)
    try:
        while True:
            await asyncio.sleep(interval)
            lock = ref()
            if lock is None:
                return  # collected: let the lease run out
            lost: Optional[str] = None
            async with lock._mutex:  # no RENEW racing a RELEASE
                if lock._holds == 0:
                    return
                try:
                    await (via or client).execute_command(*lock._renew_args())
                    last_ok = time.monotonic()
                except redis.ResponseError as e:
                    if is_notowner(e):
                        lost = str(e)
                    elif time.monotonic() - last_ok >= lease_ms / 1000.0:
                        lost = "no renewal reached the server for a whole lease (%s)" % e
                except (redis.RedisError, OSError) as e:
                    if time.monotonic() - last_ok >= lease_ms / 1000.0:
                        lost = "no renewal reached the server for a whole lease (%s)" % e
            if lost is not None:
                # This task stops renewing; a release must not cancel it
                # while it runs the callback (outside the mutex: the callback
                # may await release()).
                if lock._renewer is asyncio.current_task():
                    lock._renewer = None
                if lock._set_lost(lost):
                    await lock._notify_lost()
                return
            del lock
    finally:
        if via is not None:
            await _close_own(via)


def _redlock_client(server: Union[ARedis, str], timeout: float) -> ARedis:
    if isinstance(server, str):
        return redis.asyncio.Redis.from_url(
            server, retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
            socket_timeout=timeout, socket_connect_timeout=timeout)
    clone = _clone(server, socket_timeout=timeout, socket_connect_timeout=timeout)
    if clone is None:
        raise ValueError("AsyncRedLock needs clients on plain connection pools (or URLs)")
    return clone


class AsyncRedLock:
    """RedLock for ``redis.asyncio`` (see ``rlock.RedLock``); it asks all
    servers at once instead of in turn, each bounded by ``server_timeout``."""

    def __init__(
        self,
        servers: Sequence[Union[ARedis, str]],
        key: KeyT,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        server_timeout: float = 0.1,
        retry_delay: float = 0.2,
        drift_factor: float = 0.01,
        timeout: Optional[float] = None,
    ) -> None:
        if not servers:
            raise ValueError("RedLock needs at least one server")
        self.clients: List[ARedis] = [_redlock_client(s, server_timeout) for s in servers]
        check_distinct_servers(self.clients)
        self.key = key
        self.lease_ms = check_lease(lease_ms)
        self.server_timeout = server_timeout
        self.retry_delay = retry_delay
        self.drift_factor = drift_factor
        self.timeout = timeout
        self.owner: Optional[str] = None
        self.grant: Optional[RedLockGrant] = None

    @property
    def quorum(self) -> int:
        return quorum(len(self.clients))

    async def _each(self, *args: Any) -> List[Tuple[bool, Any]]:
        async def one(c: ARedis) -> Tuple[bool, Any]:
            try:
                # The socket timeout bounds the read; wait_for also bounds the connect.
                return True, await asyncio.wait_for(
                    c.execute_command(*args), self.server_timeout * 2)
            except redis.ResponseError as e:
                return True, e
            except (redis.RedisError, OSError, asyncio.TimeoutError) as e:
                return False, e

        return list(await asyncio.gather(*(one(c) for c in self.clients)))

    async def try_acquire(self) -> Optional[RedLockGrant]:
        if self.grant is not None:
            raise RuntimeError("this RedLock is held: release it first")
        self.owner = "%s:redlock" % uuid.uuid4()
        start = time.monotonic()
        try:
            replies = await self._each("RLOCK.ACQUIRE", self.key, self.owner, "PX", self.lease_ms)
        except BaseException:
            # Cancelled mid-round: servers may have granted already.
            await self._release_round()
            raise
        elapsed_ms = (time.monotonic() - start) * 1000.0
        tokens = tuple(int(r) if ok and isinstance(r, int) else None for ok, r in replies)
        validity = self.lease_ms - elapsed_ms - drift_ms(self.lease_ms, self.drift_factor)
        if sum(t is not None for t in tokens) >= self.quorum and validity > 0:
            self.grant = RedLockGrant(tokens, validity, start)
            return self.grant
        await self._release_round()
        return None

    async def _release_round(self) -> None:
        """Releases a round that did not make the lock on every server; shielded,
        so a caller cancelled meanwhile does not stop it half-way."""
        owner, self.owner = self.owner, None
        await asyncio.shield(self._each("RLOCK.RELEASE", self.key, owner))

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> Optional[RedLockGrant]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            grant = await self.try_acquire()
            if grant is not None or not blocking:
                return grant
            delay = random.uniform(self.retry_delay / 2, self.retry_delay)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                delay = min(delay, left)
            await asyncio.sleep(delay)

    async def extend(self) -> Optional[RedLockGrant]:
        """Renews the lease on every server (see ``RedLock.extend``): the new
        grant when a quorum renewed within the new validity, else None (the
        lock must be taken as lost; ``release`` still cleans up)."""
        if self.owner is None or self.grant is None:
            raise RuntimeError("this RedLock is not held")
        start = time.monotonic()
        replies = await self._each("RLOCK.RENEW", self.key, self.owner, "PX", self.lease_ms)
        grant = _renewed_grant(self, replies, start)
        if grant is not None:
            self.grant = grant
        return grant

    async def release(self) -> int:
        if self.owner is None:
            return 0
        try:
            replies = await self._each("RLOCK.RELEASE", self.key, self.owner)
            return sum(ok for ok, _ in replies)
        finally:
            self.owner = None
            self.grant = None

    async def __aenter__(self) -> RedLockGrant:
        grant = await self.acquire(timeout=self.timeout)
        if grant is None:
            raise NotAcquired("RedLock %r not acquired within %ss" % (self.key, self.timeout))
        return grant

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    async def close(self) -> None:
        for c in self.clients:
            await _close_own(c)
