"""Locks on one server and RedLock over several, for the synchronous redis-py client."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

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
    unlock_channel,
    wait_deadline,
)

log = logging.getLogger("rlock")

_PLAIN_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool)
_DERIVED: "weakref.WeakKeyDictionary[Any, Dict[Any, redis.Redis]]" = (
    weakref.WeakKeyDictionary()
)
_CLONE_LOCK = threading.Lock()


def _clone(client: "redis.Redis", **overrides: Any) -> Optional["redis.Redis"]:
    """A client on a new pool with the same connection settings as ``client``'s,
    except ``overrides``, and no command retries. None when the pool is not a
    plain one (Sentinel, custom): then the caller uses ``client`` itself."""
    pool = client.connection_pool
    if type(pool) not in _PLAIN_POOLS:
        return None
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(overrides)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["retry_on_timeout"] = False
    new_pool = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    return redis.Redis(connection_pool=new_pool)


def _derived(client: "redis.Redis", tag: Any, **overrides: Any) -> "redis.Redis":
    """``client``'s settings with ``overrides`` and no retries, one per pool and
    ``tag`` (``client`` itself when its pool cannot be cloned)."""
    pool = client.connection_pool
    with _CLONE_LOCK:
        per_pool = _DERIVED.setdefault(pool, {})
        found = per_pool.get(tag)
        if found is None:
            found = _clone(client, **overrides) or client
            per_pool[tag] = found
        return found


def _blocking_client(client: "redis.Redis", margin: float) -> "redis.Redis":
    """The client ``BLOCK`` waits go through: ``client``'s settings without
    retries (a retried ACQUIRE would queue again at the back) and with
    ``margin`` as its socket timeout, which bounds the connection's set-up
    (connect, ``HELLO``/``CLIENT SETINFO``); each wait then reads its reply
    with a timeout of its own (see _exchange), since redis-py's default 5 s
    socket timeout would cut longer waits short."""
    kw = client.connection_pool.connection_kwargs
    connect = kw.get("socket_connect_timeout") or kw.get("socket_timeout")
    connect = margin if connect is None else min(connect, margin)
    return _derived(
        client, ("block", margin), socket_timeout=margin, socket_connect_timeout=connect)


def _renewal_client(client: "redis.Redis", lease_ms: int) -> "redis.Redis":
    """The client renewals go through: no retries (the next tick is the retry)
    and a timeout of at most a third of the lease, so a dead server is noticed
    while the lease may still run."""
    timeout = max(0.01, lease_ms / 3000.0)
    mine = client.connection_pool.connection_kwargs.get("socket_timeout")
    if mine is not None:
        timeout = min(timeout, mine)
    return _derived(client, ("renew", timeout), socket_timeout=timeout, socket_connect_timeout=timeout)


def _pool_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("_")


def _send_once(client: "redis.Redis", args: List[Any]) -> Any:
    """One command on a connection of ``client``'s pool, never resent: a
    RELEASE (or an ACQUIRE) whose reply was lost may have been applied, and
    the client's own retries would send it again and drop (or take) one more
    hold. A failure closes the connection (a late reply would be read as the
    next command's)."""
    pool = client.connection_pool
    conn = _pool_connection(pool)
    try:
        conn.send_command(*args)
        return conn.read_response()
    except redis.ResponseError:
        raise
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _connection_for_wait(pool: Any) -> Any:
    """A connected connection out of ``pool`` (a _blocking_client pool: its
    set-up is bounded by the margin); ServerTimeout when set-up timed out."""
    try:
        return _pool_connection(pool)
    except redis.TimeoutError as e:
        raise ServerTimeout(
            "the server did not answer the connection set-up in time (%s)" % e) from e


def _set_read_timeout(conn: Any, timeout: Optional[float]) -> None:
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(timeout)


def _exchange(conn: Any, args: List[Any], deadline: Optional[float]) -> Any:
    """Sends one command on ``conn`` and reads its reply by ``deadline``
    (``time.monotonic()``; None: no limit). Anything but a reply (a timeout,
    a broken connection, an interruption) disconnects ``conn``: a late reply
    would be read as the answer to the next command. A timeout raises
    ServerTimeout."""
    try:
        conn.send_command(*args)
        if deadline is None:
            _set_read_timeout(conn, None)
        else:
            _set_read_timeout(conn, max(0.001, deadline - time.monotonic()))
        try:
            return conn.read_response()
        finally:
            _set_read_timeout(conn, conn.socket_timeout)
    except redis.ResponseError:
        raise
    except redis.TimeoutError as e:
        conn.disconnect()
        raise ServerTimeout(
            "the server did not answer %s in time (%s); the connection was closed"
            % (args[0], e)) from e
    except BaseException:
        conn.disconnect()
        raise


def _wait_call(client: "redis.Redis", args: List[Any], block: int, margin: float) -> Any:
    """One BLOCK acquisition on a connection of ``_blocking_client(client)``:
    its reply is awaited until BLOCK + ``margin`` (forever for BLOCK 0)."""
    deadline = wait_deadline(time.monotonic(), block, margin)
    pool = _blocking_client(client, margin).connection_pool
    conn = _connection_for_wait(pool)
    try:
        return _exchange(conn, args, deadline)
    finally:
        # Disconnected by _exchange unless a reply came: the pool gets back
        # an unconnected slot, never a connection a late reply could reach.
        pool.release(conn)


def _drop_pinned(pool: Any, conn: Any, close: bool) -> None:
    """Gives a pinned connection back to its pool, closed first when ``close``
    (which ends every holding bound to it)."""
    try:
        if close:
            conn.disconnect()
    finally:
        pool.release(conn)


class _Pin:
    """The one connection a lock object's ``KEEPALIVE`` holdings are bound to.

    The server renews a keepalive holding while the connection that was granted
    it stays open and releases it when that connection closes, so the
    connection must not go back to a pool (where another command could close
    it, or it could idle out) while anything is held on it. A pin takes one
    connection out of the pool of ``_blocking_client(client)`` (set-up bounded
    by the margin; no retries, so an ACQUIRE is never sent twice) when an
    acquisition starts, sends the acquisitions of its users (a lock object, or
    both views of a ReadWriteLock) through it one at a time (a ``KEEPALIVE``
    acquisition binds the connection it comes on), and gives it back to the
    pool only once no acquisition is under way and none of its users holds
    anything. Releases, renewals and INFO do not need it (the server keeps a
    binding whatever connection its owner's RELEASE or RENEW comes on), so
    they go through the client and never wait behind a parked acquisition.
    If the connection fails (or a wait on it is abandoned), every holding
    bound to it is reported lost: once the server sees the connection close it
    releases them. The pin's ``generation`` then goes up: a ``with`` block
    granted in an earlier generation is stale (its hold ended, and a later
    acquisition by another thread is a new tenure it must not release).

    The pin refers to its users weakly, so a lock object dropped while
    holding is freed at once (no reference cycle waits for the cycle
    collector): the pin goes with it and its connection is closed (the server
    releases at once), as a renewal-thread lock's lease would run out.
    """

    def __init__(self, client: "redis.Redis", margin: float) -> None:
        self.margin = margin
        self.client = _blocking_client(client, margin)
        self.conn: Any = None
        #: One acquisition at a time on the connection.
        self.mutex = threading.RLock()
        #: Guards ``conn`` and ``busy`` between acquisitions and releases.
        self.state = threading.Lock()
        self.busy = 0
        #: Goes up each time the connection is closed after a failure (which
        #: ended every holding bound to it).
        self.generation = 0
        self._users: "weakref.WeakSet[_LockBase]" = weakref.WeakSet()
        self._registered = 0
        self._lost: List[Tuple["_LockBase", str]] = []
        self._finalizer: Optional[weakref.finalize] = None

    def add_user(self, user: "_LockBase") -> None:
        self._users.add(user)
        self._registered += 1

    @property
    def users(self) -> List["_LockBase"]:
        return list(self._users)

    def _give_back(self, close: bool = False) -> None:
        conn, self.conn = self.conn, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        # A user dropped while holding may have left a holding bound to the
        # connection: close it rather than let the pool reuse it.
        close = close or len(self._users) < self._registered
        _drop_pinned(self.client.connection_pool, conn, close)

    def _idle(self) -> bool:
        return self.conn is not None and not self.busy and not any(
            u._holds > 0 for u in self.users)

    def settle(self, close: bool = False) -> None:
        """After a release: gives the connection back (closed first when
        ``close``) if no acquisition is under way and no user holds anything.
        An acquisition under way does it when it ends."""
        with self.state:
            if self._idle():
                self._give_back(close)

    @contextlib.contextmanager
    def use(self) -> Iterator[Callable[[List[Any], Optional[int]], Any]]:
        """Holds the pin for one acquisition and what the caller records about
        its reply; gives the connection back when no user holds anything after."""
        try:
            with self.mutex:
                with self.state:
                    self.busy += 1
                try:
                    yield self._call
                finally:
                    with self.state:
                        self.busy -= 1
                        if self._idle():
                            self._give_back()
        finally:
            # on_lost callbacks run outside the pin (they may release).
            lost, self._lost = self._lost, []
            for user, why in lost:
                user._mark_lost(why)

    def _call(self, args: List[Any], block: Optional[int]) -> Any:
        deadline = wait_deadline(time.monotonic(), block, self.margin)
        if self.conn is None:
            pool = self.client.connection_pool
            self.conn = _connection_for_wait(pool)
            self._finalizer = weakref.finalize(self, _drop_pinned, pool, self.conn, True)
        try:
            return _exchange(self.conn, args, deadline)
        except redis.ResponseError:
            raise
        except BaseException as e:
            # Broken, timed out or interrupted mid-reply: _exchange closed the
            # connection, and closing it ends every holding bound to it.
            with self.state:
                self.generation += 1
                self._give_back(close=True)
            for user in self.users:
                if user._holds > 0:
                    user._holds = 0
                    user._token = None
                    self._lost.append((user, "its keepalive connection failed (%r)" % e))
            raise


class _Renewer:
    """Renews one lock object's lease every lease/3 on its own daemon thread."""

    def __init__(self, lock: "_LockBase") -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run,
            args=(weakref.ref(lock), lock.lease_ms),
            name="rlock-renew:%r" % (lock.key,),
            daemon=True,
        )
        self.thread.start()

    def _run(self, ref: "weakref.ref[_LockBase]", lease_ms: int) -> None:
        interval = lease_ms / 3000.0
        last_ok = time.monotonic()
        while not self.stop.wait(interval):
            lock = ref()
            if lock is None:
                return  # the lock object is gone: let the lease run out
            lost: Optional[str] = None
            # Under the object's mutex, so a RELEASE cannot slip in between
            # the stop check and the RENEW (a late RENEW would say NOTOWNER).
            with lock._mutex:
                if self.stop.is_set():
                    return
                try:
                    lock._send_renew()
                    last_ok = time.monotonic()
                except redis.RedisError as e:
                    if isinstance(e, redis.ResponseError) and is_notowner(e):
                        lost = str(e)
                    else:
                        # Connection trouble, or a server that refuses the
                        # renewal (READONLY after a demotion, NOREPLICAS):
                        # keep trying while the lease may still run; once a
                        # whole lease passed without a renewal it ended.
                        log.warning("rlock renewal of %r: %s", lock.key, e)
                        if time.monotonic() - last_ok >= lease_ms / 1000.0:
                            lost = "no renewal reached the server for a whole lease (%s)" % e
            if lost is not None:
                lock._mark_lost(lost)
                return
            del lock


class _LockBase:
    """A lease-based lock on one key for one owner string (see the subclasses).

    Reentrant: acquiring again while held adds a hold (same token); each
    ``release()`` drops one. One object is one owner: use one object per thread
    (or task) when they must exclude each other. Thread-safe.

    ``keepalive=True`` sends ``KEEPALIVE``: the server renews the lease while
    the connection that was granted the lock stays open, and releases the lock
    when it closes, so no renewal thread runs. The object pins one connection
    (taken from the client's pool, or from a pool with the same settings)
    for as long as it holds anything and sends its acquisitions through it
    (see _Pin); releases go through the client. Loss is then seen by
    ``release()`` (NOTOWNER) or when that connection fails; there is no
    background check. Use it when a connection may be dedicated to the
    holder; otherwise keep the renewal thread.

    A ``BLOCK`` wait gives the server its timeout plus ``wait_margin``
    seconds (default 2) to answer, and opening the connection for it at most
    ``wait_margin``; then it raises ServerTimeout (a ``redis.TimeoutError``)
    and closes that connection. ``timeout=None`` (BLOCK 0) waits for the
    answer without a limit once the connection is set up.
    """

    _family: Family

    def __init__(
        self,
        client: "redis.Redis",
        key: KeyT,
        owner: Optional[str] = None,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        timeout: Optional[float] = None,
        auto_renew: bool = True,
        use_pubsub: bool = False,
        on_lost: Optional[Callable[["_LockBase"], None]] = None,
        keepalive: bool = False,
        wait_margin: float = DEFAULT_WAIT_MARGIN,
        _pin: Optional[_Pin] = None,
    ) -> None:
        self.client = client
        self.key = key
        self.owner = owner or default_owner()
        self.lease_ms = check_lease(lease_ms)
        #: Seconds ``with`` waits for the lock (None: until granted).
        self.timeout = timeout
        self.auto_renew = auto_renew
        #: ``with`` uses the pub/sub path instead of parking a connection.
        self.use_pubsub = use_pubsub
        self.on_lost = on_lost
        #: Set when the server said this owner no longer holds the lock.
        self.lost = threading.Event()
        self._token: Optional[int] = None
        self._holds = 0
        self._mutex = threading.RLock()
        self._lost_mutex = threading.Lock()
        self._renewer: Optional[_Renewer] = None
        #: Seconds a waiting call gives the server beyond its own timeout (and
        #: a connection's set-up) before it raises ServerTimeout.
        self.wait_margin = check_margin(wait_margin)
        #: The server renews the lease while the pinned connection is open.
        self.keepalive = keepalive
        self._pin: Optional[_Pin] = None
        if keepalive:
            self._pin = _pin or _Pin(client, self.wait_margin)
            self._pin.add_user(self)

    # -- state -------------------------------------------------------------

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the current tenure (None when not held)."""
        return self._token

    @property
    def holds(self) -> int:
        """Holds this object took and has not released."""
        return self._holds

    @property
    def locked(self) -> bool:
        """Held by this object, as far as it knows (not lost)."""
        return self._holds > 0 and not self.lost.is_set()

    @property
    def renewing(self) -> bool:
        r = self._renewer
        return r is not None and r.thread.is_alive()

    def check(self) -> None:
        """Raises LockLost if the lock was lost while held."""
        if self.lost.is_set():
            raise LockLost("%s %r: lock lost" % (self._family.prefix, self.key))

    # -- commands ----------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> Optional[int]:
        """Takes the lock (or one more hold). Returns the fencing token, or None
        when not granted.

        ``blocking=False`` (or ``timeout <= 0``): one try, no wait. Otherwise the
        server parks the call (``BLOCK``) until the lock is handed over or
        ``timeout`` seconds pass (None: no limit) and None comes back.

        Raises ServerTimeout when the server has not answered a wait within
        ``timeout`` + ``wait_margin`` seconds (or the connection's set-up
        within ``wait_margin``); the connection is closed. A lock the server
        granted just before it saw that connection close stays held until its
        lease ends (with ``keepalive``: until the server sees the close); no
        release is sent for it, since this owner may hold the lock already.
        """
        block = block_ms(blocking, timeout)
        args = self._acquire_args(block)
        try:
            if self._pin is not None:
                with self._pin.use() as call:
                    reply = call(args, block)
                    if reply is None:
                        return None
                    # Recorded inside the pin, so it is not given back.
                    note_grant(self._pin)
                    return self._granted(reply)
            if block is None:
                # Sent once: a retried ACQUIRE whose first reply was lost
                # would take a second hold of a reentrant lock.
                reply = _send_once(self.client, args)
            else:
                reply = _wait_call(self.client, args, block, self.wait_margin)
        except redis.ResponseError as e:
            if is_deadlock(e):
                raise DeadlockError(str(e)) from e
            raise
        return None if reply is None else self._granted(reply)

    def acquire_via_pubsub(
        self, timeout: Optional[float] = None, safety_poll: float = 5.0
    ) -> Optional[int]:
        """Takes the lock without parking a connection on the server.

        Subscribes to the unlock channel first (so no release is missed), tries
        without BLOCK, and tries again on each ``released``/``expired``/``forced``
        message and when the holder's lease (``PTTL``) runs out: a lease that
        ends with nobody parked may be announced only when Redis expires the
        key. ``safety_poll`` bounds every wait (a flush publishes nothing).
        No queue position: FAIRLOCK order only binds parked waiters.
        Returns the token, or None after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            db = db_of(self.client)
            pubsub.subscribe(*(unlock_channel(db, k) for k in self._keys()))
            while True:
                token = self.acquire(blocking=False)
                if token is not None:
                    return token
                wait = retry_wait([self.client.pttl(k) for k in self._keys()], safety_poll)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                end = time.monotonic() + wait
                while True:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    if is_end_message(pubsub.get_message(timeout=left)):
                        break
        finally:
            pubsub.close()

    def release(self) -> int:
        """Drops one hold; returns the holds this owner has left (0: free).
        Raises LockLost if the server says this owner holds nothing."""
        args = self._release_args()
        notowner: Optional[redis.ResponseError] = None
        left: Any = 0
        try:
            # Through the client, also for a keepalive object: the server keeps
            # the binding whatever connection the owner's RELEASE comes on, and
            # the pinned connection may be parked in another thread's wait.
            with self._mutex:
                token = self._token
                was_held = self._holds > 0
                try:
                    left = self._parse_left(_send_once(self.client, args))
                    if self._token == token:
                        self._holds = self._holds_after_release(left)
                    # else the pinned connection failed meanwhile (holds: 0)
                except redis.ResponseError as e:
                    if not is_notowner(e):
                        raise
                    notowner = e
                    if self._token == token:
                        self._holds = 0
                    else:
                        was_held = False
                renewer = self._stop_if_free()
        finally:
            if self._pin is not None:
                # The last hold gone: the pinned connection goes back (closed
                # after NOTOWNER: it may be the one whose failure ended it).
                self._pin.settle(close=notowner is not None)
        if renewer is not None and renewer.thread is not threading.current_thread():
            renewer.thread.join()
        if notowner is not None:
            self._mark_lost(str(notowner), notify=was_held)
            raise LockLost(str(notowner)) from notowner
        return left

    def renew(self) -> None:
        """Resets the lease now (the renewal thread does this every lease/3).
        Raises LockLost when the server says this owner holds nothing, or
        (keepalive) when called inside a ``with`` block whose hold ended with
        its pinned connection (then nothing is sent: the owner may hold a
        newer tenure that is not this block's)."""
        self._check_block()
        try:
            self._send_renew()
        except redis.ResponseError as e:
            if is_notowner(e):
                self._mark_lost(str(e))
                raise LockLost(str(e)) from e
            raise

    def _stale_block(self) -> bool:
        """Whether this thread's innermost ``with`` block of this keepalive
        object was granted on a pinned connection that failed since."""
        if self._pin is None:
            return False
        gen = block_generation(self)
        return gen is not None and gen != self._pin.generation

    def _check_block(self) -> None:
        if self._stale_block():
            raise LockLost(stale_message(self._family.prefix, self.key))

    def _send_renew(self) -> None:
        _renewal_client(self.client, self.lease_ms).execute_command(*self._renew_args())

    def info(self) -> Optional[Dict[str, Any]]:
        """``*.INFO`` as a dict with str keys (None when the key holds no lock)."""
        return parse_info(self.client.execute_command(*self._family.info(self.key)))

    # -- internals ---------------------------------------------------------

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

    def _holds_after_release(self, left: Any) -> int:
        """This object's holds after one release: one grant fewer, and never
        more than its owner has left on the server (other objects of the same
        owner share the tenure, and release from it too)."""
        return max(0, min(self._holds - self._grant_amount(), self._holds_left(left)))

    def _grant_amount(self) -> int:
        """Holds one grant adds (a semaphore: its permits)."""
        return 1

    def _granted(self, reply: Any) -> Any:
        token = self._parse_grant(reply)
        with self._mutex:
            self._token = token
            self._holds += self._grant_amount()
            self.lost.clear()
            # With KEEPALIVE the server renews: no thread.
            if self.auto_renew and not self.keepalive and not self.renewing:
                self._renewer = _Renewer(self)
        return token

    def _mark_lost(self, why: str, notify: bool = True) -> None:
        with self._lost_mutex:
            if self.lost.is_set():
                return
            self.lost.set()
        log.warning("%s %r owner %s: lock lost (%s)", self._family.prefix, self.key, self.owner, why)
        if notify and self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:  # a callback's failure must not kill the renewer
                log.exception("rlock on_lost callback failed")

    def _stop_if_free(self) -> Optional[_Renewer]:
        """With the mutex held: when no hold is left, forgets the token and
        tells the renewal thread to stop; returns it for joining."""
        if self._holds > 0:
            return None
        self._token = None
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop.set()
        return renewer

    # -- context manager ---------------------------------------------------

    def __enter__(self) -> "_LockBase":
        if self.use_pubsub:
            token = self.acquire_via_pubsub(timeout=self.timeout)
        else:
            token = self.acquire(timeout=self.timeout)
        if token is None:
            raise NotAcquired(
                "%s %r not acquired within %ss" % (self._family.prefix, self.key, self.timeout)
            )
        if self._pin is not None:
            enter_block(self, self._pin)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Releases the hold. If the lock was lost meanwhile, raises LockLost
        (unless the block already raised): the work done under it was not
        protected.

        A keepalive object shared by threads: when the pinned connection this
        block's hold was granted on failed (an abandoned wait, a broken
        connection), that hold ended on the server, and another thread may
        hold a new tenure since; the block then sends nothing and raises
        LockLost."""
        if self._pin is not None:
            gen = exit_block(self)
            if gen is not None and gen != self._pin.generation:
                if exc_type is None:
                    raise LockLost(stale_message(self._family.prefix, self.key))
                return
        was_lost = self.lost.is_set()
        try:
            if self._holds > 0:
                self.release()
        except LockLost:
            if exc_type is None:
                raise
            return
        if was_lost and exc_type is None:
            raise LockLost("%s %r: lock lost while held" % (self._family.prefix, self.key))

    def __repr__(self) -> str:
        return "<%s key=%r owner=%r holds=%d token=%r>" % (
            type(self).__name__, self.key, self.owner, self._holds, self._token)


class Lock(_LockBase):
    """Reentrant lock (``RLOCK.*``).

    >>> with Lock(r, "orders:42", lease_ms=10_000) as lock:
    ...     write(fence=lock.token)
    """

    _family = Family("RLOCK")


class FairLock(_LockBase):
    """Fair lock (``FAIRLOCK.*``): parked waiters are granted in arrival order."""

    _family = Family("FAIRLOCK")


class ReadLock(_LockBase):
    """The READ view of a ReadWriteLock (``RWLOCK.* READ``)."""

    _family = Family("RWLOCK", "READ")


class WriteLock(_LockBase):
    """The WRITE view of a ReadWriteLock (``RWLOCK.* WRITE``)."""

    _family = Family("RWLOCK", "WRITE")


class ReadWriteLock:
    """Read-write lock (``RWLOCK.*``) with two views sharing one owner:
    ``rw.read`` and ``rw.write``, each a lock object with the same API as Lock.
    Releasing WRITE while holding READ downgrades; asking WRITE while holding
    only READ is refused by the server (``redis.ResponseError``)."""

    def __init__(self, client: "redis.Redis", key: KeyT, owner: Optional[str] = None, **kwargs: Any) -> None:
        owner = owner or default_owner()
        self.key = key
        self.owner = owner
        if kwargs.get("keepalive"):
            # One pinned connection for both views: the owner's tenure has one
            # binding, and giving the connection back while the other view
            # still holds would end that view's holding.
            kwargs["_pin"] = _Pin(
                client, check_margin(kwargs.get("wait_margin", DEFAULT_WAIT_MARGIN)))
        self.read = ReadLock(client, key, owner, **kwargs)
        self.write = WriteLock(client, key, owner, **kwargs)

    def info(self) -> Optional[Dict[str, Any]]:
        return self.read.info()


class MultiLock(_LockBase):
    """Several RLOCK keys held together, all or nothing (Redisson's MultiLock,
    atomic on the server): ``RLOCK.ACQUIREALL`` / ``RELEASEALL`` / ``RENEWALL``.

    >>> with MultiLock(r, ["{acct}:1", "{acct}:2"], lease_ms=10_000) as m:
    ...     transfer(fence=m.tokens)

    ``acquire`` returns the tuple of fencing tokens (one per key, in order) or
    None; nothing is held unless everything is. A BLOCK wait holds nothing
    while it waits and takes its place in each key's queue, so it is never
    starved and cannot deadlock with another multi-key waiter. ``release()``
    returns the owner's remaining holds per key. The keys are plain RLOCK keys
    (a ``Lock`` with the same owner shares their tenures); in a cluster they
    must hash to one slot (hash tags). Same options as Lock (lease, timeout,
    renewal thread or ``keepalive``, ``use_pubsub``, ``on_lost``).
    """

    _family = Family("RLOCK")

    def __init__(self, client: "redis.Redis", keys: Iterable[KeyT], owner: Optional[str] = None, **kwargs: Any) -> None:
        keys = tuple(keys)
        if not keys:
            raise ValueError("MultiLock needs at least one key")
        super().__init__(client, keys, owner, **kwargs)  # type: ignore[arg-type]
        self.keys: Tuple[KeyT, ...] = keys

    @property
    def tokens(self) -> Optional[Tuple[int, ...]]:
        """The fencing token of each key's tenure, in key order (None when not held)."""
        return self._token

    def info(self) -> List[Optional[Dict[str, Any]]]:  # type: ignore[override]
        """``RLOCK.INFO`` of each key."""
        return [parse_info(self.client.execute_command("RLOCK.INFO", k)) for k in self.keys]

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
        # Held together while the owner holds every key (RENEWALL needs that).
        return min(left)


class Semaphore(_LockBase):
    """Semaphore with a lease per holding (``SEMAPHORE.*``): at most ``limit``
    permits are held at once on the key, and each ``acquire()`` of this object
    takes ``permits`` of them for its owner (one holding, one token, one
    lease; acquiring again adds ``permits`` and keeps the token).

    >>> with Semaphore(r, "pool:db", limit=10, permits=2, lease_ms=10_000) as s:
    ...     query(fence=s.token)

    The latest ACQUIRE's ``limit`` is in force on the key. Waiters are served
    in arrival order on the server, and a large request is not overtaken by
    smaller ones. ``release()`` returns ``permits`` and answers the owner's
    remaining permits (``holds`` counts this object's permits). A holder that
    dies without releasing gets its permits back to the pool when its lease
    ends. Same options as Lock (lease, timeout, renewal thread or
    ``keepalive``, ``use_pubsub``, ``on_lost``).
    """

    _family = Family("SEMAPHORE")

    def __init__(
        self, client: "redis.Redis", key: KeyT, limit: int, permits: int = 1,
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


# -- RedLock ----------------------------------------------------------------


@dataclass(frozen=True)
class RedLockGrant:
    """A RedLock acquisition.

    ``tokens[i]`` is server i's fencing token, or None where it did not grant.
    They are NOT one fencing token: each server counts on its own, so they
    cannot be compared across servers or across acquisitions. ``validity_ms``
    is how long the lock is known to be held from ``acquired_at``
    (``time.monotonic()``) on: lease - time spent acquiring - clock drift.
    """

    tokens: Tuple[Optional[int], ...]
    validity_ms: float
    acquired_at: float

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` value past which the lock may have ended."""
        return self.acquired_at + self.validity_ms / 1000.0

    @property
    def granted(self) -> int:
        return sum(t is not None for t in self.tokens)


def _renewed_grant(lock: Any, replies: List[Tuple[bool, Any]], start: float) -> Optional[RedLockGrant]:
    """The grant after ``RLOCK.RENEW`` on every server (``replies``, sent at
    ``start``), or None unless a quorum renewed within the new validity."""
    elapsed_ms = (time.monotonic() - start) * 1000.0
    renewed = [ok and r == 1 for ok, r in replies]
    validity = lock.lease_ms - elapsed_ms - drift_ms(lock.lease_ms, lock.drift_factor)
    if sum(renewed) < lock.quorum or validity <= 0:
        return None
    tokens = tuple(t if ok else None for t, ok in zip(lock.grant.tokens, renewed))
    return RedLockGrant(tokens, validity, start)


def _redlock_client(server: Union["redis.Redis", str], timeout: float) -> "redis.Redis":
    if isinstance(server, str):
        return redis.Redis.from_url(
            server, retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
            socket_timeout=timeout, socket_connect_timeout=timeout)
    clone = _clone(server, socket_timeout=timeout, socket_connect_timeout=timeout)
    if clone is None:
        raise ValueError(
            "RedLock needs clients on plain connection pools (or URLs) to set its "
            "per-server timeout")
    return clone


class RedLock:
    """Quorum lock over N independent servers (masters with no replication
    between them), each with the rlock module.

    ``acquire`` sends ``RLOCK.ACQUIRE key owner PX lease`` (never BLOCK) to each
    server in turn, each with a socket timeout of ``server_timeout`` seconds so
    a dead or frozen server costs at most that. It holds the lock when at least
    N/2+1 servers granted and the validity, lease - elapsed - drift (lease x
    ``drift_factor`` + 2 ms), is still positive; otherwise it releases on every
    server and (when blocking) retries after a random delay.

    Each acquisition uses a fresh owner string, so a RedLock is not reentrant.
    The per-server tokens are not one fencing token (see RedLockGrant).
    """

    def __init__(
        self,
        servers: Sequence[Union["redis.Redis", str]],
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
        self.clients: List[redis.Redis] = [_redlock_client(s, server_timeout) for s in servers]
        check_distinct_servers(self.clients)
        self.key = key
        self.lease_ms = check_lease(lease_ms)
        self.server_timeout = server_timeout
        self.retry_delay = retry_delay
        self.drift_factor = drift_factor
        #: Seconds ``with`` keeps retrying (None: until acquired).
        self.timeout = timeout
        self.owner: Optional[str] = None
        self.grant: Optional[RedLockGrant] = None

    @property
    def quorum(self) -> int:
        return quorum(len(self.clients))

    def _each(self, args_for: Callable[[str], List[Any]]) -> List[Tuple[bool, Any]]:
        """Sends one command to every server in turn: (answered, reply or error)."""
        out: List[Tuple[bool, Any]] = []
        assert self.owner is not None
        for c in self.clients:
            try:
                out.append((True, c.execute_command(*args_for(self.owner))))
            except redis.ResponseError as e:
                out.append((True, e))
            except redis.RedisError as e:  # timeout, refused, reset
                out.append((False, e))
        return out

    def try_acquire(self) -> Optional[RedLockGrant]:
        """One round over all servers. Returns the grant, or None (after
        releasing on every server)."""
        if self.grant is not None:
            raise RuntimeError("this RedLock is held: release it first")
        self.owner = "%s:redlock" % uuid.uuid4()
        start = time.monotonic()
        try:
            replies = self._each(lambda owner: ["RLOCK.ACQUIRE", self.key, owner, "PX", self.lease_ms])
        except BaseException:
            # Interrupted mid-round (KeyboardInterrupt): servers may have granted.
            self._release_everywhere()
            self.owner = None
            raise
        elapsed_ms = (time.monotonic() - start) * 1000.0
        tokens = tuple(
            int(r) if ok and isinstance(r, int) else None for ok, r in replies)
        validity = self.lease_ms - elapsed_ms - drift_ms(self.lease_ms, self.drift_factor)
        granted = sum(t is not None for t in tokens)
        if granted >= self.quorum and validity > 0:
            self.grant = RedLockGrant(tokens, validity, start)
            return self.grant
        self._release_everywhere()
        self.owner = None
        return None

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> Optional[RedLockGrant]:
        """``try_acquire`` until it succeeds, retrying after a random delay in
        [retry_delay/2, retry_delay]; ``blocking=False`` is one round. None when
        ``timeout`` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            grant = self.try_acquire()
            if grant is not None or not blocking:
                return grant
            delay = random.uniform(self.retry_delay / 2, self.retry_delay)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                delay = min(delay, left)
            time.sleep(delay)

    def _release_everywhere(self) -> int:
        replies = self._each(lambda owner: ["RLOCK.RELEASE", self.key, owner])
        return sum(ok for ok, _ in replies)

    def release(self) -> int:
        """Releases on every server (also those that did not grant: their
        answer may have been lost). Returns how many servers answered."""
        if self.owner is None:
            return 0
        try:
            return self._release_everywhere()
        finally:
            self.owner = None
            self.grant = None

    def extend(self) -> Optional[RedLockGrant]:
        """Renews the lease on every server (``RLOCK.RENEW ... PX lease``).
        Returns the new grant when a quorum renewed within the new validity,
        else None: the lock must be taken as lost (it stays recorded so that
        ``release`` still cleans up)."""
        if self.owner is None or self.grant is None:
            raise RuntimeError("this RedLock is not held")
        start = time.monotonic()
        replies = self._each(lambda owner: ["RLOCK.RENEW", self.key, owner, "PX", self.lease_ms])
        grant = _renewed_grant(self, replies, start)
        if grant is not None:
            self.grant = grant
        return grant

    def __enter__(self) -> RedLockGrant:
        grant = self.acquire(timeout=self.timeout)
        if grant is None:
            raise NotAcquired("RedLock %r not acquired within %ss" % (self.key, self.timeout))
        return grant

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def close(self) -> None:
        for c in self.clients:
            c.close()
