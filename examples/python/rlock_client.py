"""A small client helper for the rlock Redis module, on redis-py.

    import redis
    from rlock_client import Lock

    r = redis.Redis()
    with Lock(r, "orders:42") as lock:          # waits on the server (BLOCK 0)
        write_somewhere(fence=lock.token)       # pass the fencing token along

What it does for you:

* ``acquire()`` sends ``RLOCK.ACQUIRE key owner PX lease [BLOCK ms]``: the wait
  happens on the server, which hands the lock over when it is freed.
* While the lock is held, a daemon thread renews the lease every ``lease/3``
  (``RLOCK.RENEW``), so a short lease keeps a live holder's lock and a crashed
  holder's lock frees itself quickly. The thread stops when the last hold is
  released, and sets ``lost`` if the server says the owner no longer holds it.
* ``token`` is the fencing token of the current tenure.
* ``acquire_via_pubsub()`` is for clients that must not park a connection on
  the server: it subscribes to the unlock channel ``__rlock@<db>__:<key>`` and
  retries the (non-blocking) acquire on every ``released``, ``expired`` or
  ``forced`` message. ``async_acquire()`` is the same for ``redis.asyncio``.

The same class drives FAIRLOCK (``kind="fairlock"``) and RWLOCK
(``kind="rwlock", mode="READ"`` or ``"WRITE"``).
"""

import asyncio
import threading
import time
import uuid

import redis

KINDS = ("rlock", "fairlock", "rwlock")
END_MESSAGES = (b"released", b"expired", b"forced")


def default_owner():
    """Redisson's convention: ``<client-uuid>:<thread-id>``."""
    return "%s:%d" % (uuid.uuid4(), threading.get_ident())


def unlock_channel(db, key):
    """The channel the module publishes on when a hold of ``key`` ends."""
    return "__rlock@%d__:%s" % (db, key)


def _db_of(client):
    return int(client.connection_pool.connection_kwargs.get("db", 0) or 0)


class LockLost(RuntimeError):
    """The server no longer knows this owner as a holder (lease ran out, forced)."""


class Lock:
    """A lease-based lock on one key, held by one owner string.

    Reentrant: acquiring again while held adds a hold (same token); each
    ``release()`` drops one, and the lock is free when the count reaches 0.
    Thread-safe; one ``Lock`` object is one owner (use one per thread when
    threads should exclude each other).
    """

    def __init__(self, client, key, owner=None, lease_ms=30000, kind="rlock",
                 mode=None, auto_renew=True):
        if kind not in KINDS:
            raise ValueError("kind must be one of %s" % (KINDS,))
        if (kind == "rwlock") != (mode is not None):
            raise ValueError("mode (READ or WRITE) is for rwlock only, and required there")
        if mode is not None and mode.upper() not in ("READ", "WRITE"):
            raise ValueError("mode must be READ or WRITE")
        if lease_ms <= 0:
            raise ValueError("lease_ms must be positive")
        self.client = client
        self.key = key
        self.owner = owner or default_owner()
        self.lease_ms = int(lease_ms)
        self.kind = kind
        self.mode = mode.upper() if mode else None
        self.auto_renew = auto_renew
        self.token = None
        self.holds = 0
        self.lost = threading.Event()
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._renewer = None

    # -- commands ---------------------------------------------------------

    def _command(self, verb):
        return "%s.%s" % (self.kind.upper(), verb)

    def _acquire_args(self, block_ms):
        args = [self._command("ACQUIRE"), self.key]
        if self.mode:
            args.append(self.mode)
        args += [self.owner, "PX", self.lease_ms]
        if block_ms is not None:
            args += ["BLOCK", int(block_ms)]
        return args

    def _granted(self, token):
        with self._mutex:
            self.token = token
            self.holds += 1
            self.lost.clear()
            if self.holds == 1 and self.auto_renew:
                self._start_renewer()
        return True

    def acquire(self, blocking=True, timeout=None):
        """Takes the lock (or one more hold of it). Returns True when granted.

        ``blocking=False``: one try. Otherwise the server parks the call until
        the lock is granted or ``timeout`` seconds pass (None: forever).
        """
        if not blocking:
            block_ms = None
        elif timeout is None:
            block_ms = 0
        else:
            block_ms = max(1, int(timeout * 1000))
        token = self.client.execute_command(*self._acquire_args(block_ms))
        if token is None:
            return False
        return self._granted(int(token))

    def release(self):
        """Drops one hold; returns the holds left (0: the lock is free)."""
        args = [self._command("RELEASE"), self.key]
        if self.mode:
            args.append(self.mode)
        args.append(self.owner)
        try:
            left = int(self.client.execute_command(*args))
        except redis.ResponseError as e:
            if str(e).startswith("NOTOWNER"):
                self._reset()
                raise LockLost(str(e)) from e
            raise
        with self._mutex:
            self.holds = left
        if left == 0:
            self._reset()
        return left

    def renew(self):
        """Resets the lease of every hold of this owner (the watchdog call)."""
        try:
            self.client.execute_command(
                self._command("RENEW"), self.key, self.owner, "PX", self.lease_ms)
        except redis.ResponseError as e:
            if str(e).startswith("NOTOWNER"):
                self.lost.set()
                raise LockLost(str(e)) from e
            raise

    def info(self):
        """``*.INFO`` as a dict (None when nobody holds the lock)."""
        reply = self.client.execute_command(self._command("INFO"), self.key)
        if reply is None or isinstance(reply, dict):
            return reply
        return dict(zip(reply[::2], reply[1::2]))

    # -- pub/sub path -----------------------------------------------------

    def acquire_via_pubsub(self, timeout=None, safety_poll=5.0):
        """Acquires without parking a connection on the server.

        Subscribes to the key's unlock channel *before* trying, so a release
        between the try and the wait is not missed, then retries the
        non-blocking acquire on each end-of-hold message. ``safety_poll``
        bounds the wait for a message (a lock key deleted by DEL publishes
        nothing). Returns True when granted, False at ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(unlock_channel(_db_of(self.client), self.key))
            while True:
                if self.acquire(blocking=False):
                    return True
                wait = safety_poll
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return False
                end = time.monotonic() + wait
                while time.monotonic() < end:
                    msg = pubsub.get_message(timeout=max(0.0, end - time.monotonic()))
                    if msg and msg["type"] == "message" and msg["data"] in END_MESSAGES:
                        break
        finally:
            pubsub.close()

    # -- renewal ----------------------------------------------------------

    @property
    def renewing(self):
        """Whether the renewal thread is running."""
        r = self._renewer
        return r is not None and r.is_alive()

    def _start_renewer(self):
        self._stop = threading.Event()
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(self._stop,),
            name="rlock-renew:%s" % self.key, daemon=True)
        self._renewer.start()

    def _renew_loop(self, stop):
        interval = self.lease_ms / 3000.0
        while not stop.wait(interval):
            try:
                self.renew()
            except LockLost:
                return
            except redis.RedisError:
                # A dropped connection: keep trying while the lease may still run.
                continue

    def _reset(self):
        with self._mutex:
            self.holds = 0
            self.token = None
            self._stop.set()
            renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()

    # -- context manager --------------------------------------------------

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        if self.holds > 0:
            try:
                self.release()
            except LockLost:
                pass  # the lock already ended on the server
        return False


async def async_acquire(aclient, key, owner, lease_ms=30000, timeout=None,
                        kind="rlock", mode=None, safety_poll=5.0):
    """The pub/sub path for ``redis.asyncio`` clients (multiplexed, never park a
    connection): subscribe to the unlock channel, try, and retry on each
    ``released``/``expired``/``forced`` message. Returns the fencing token, or
    None at ``timeout`` seconds. Renew with ``RENEW`` and release with
    ``RELEASE`` on the same owner as usual."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    args = ["%s.ACQUIRE" % kind.upper(), key]
    if mode:
        args.append(mode.upper())
    args += [owner, "PX", int(lease_ms)]
    pubsub = aclient.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(unlock_channel(_db_of(aclient), key))
        while True:
            token = await aclient.execute_command(*args)
            if token is not None:
                return int(token)
            wait = safety_poll
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    return None
            end = loop.time() + wait
            while loop.time() < end:
                msg = await pubsub.get_message(timeout=max(0.0, end - loop.time()))
                if msg and msg["type"] == "message" and msg["data"] in END_MESSAGES:
                    break
    finally:
        await pubsub.aclose() if hasattr(pubsub, "aclose") else await pubsub.close()
