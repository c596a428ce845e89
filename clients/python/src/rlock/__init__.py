"""Client library for the rlock Redis module (``RLOCK.*``, ``FAIRLOCK.*``,
``RWLOCK.*``, ``SEMAPHORE.*``), on redis-py, plus RedLock over independent servers.

    import redis
    from rlock import Lock

    r = redis.Redis()
    with Lock(r, "orders:42", lease_ms=10_000) as lock:  # waits on the server (BLOCK)
        write_somewhere(fence=lock.token)                # this tenure's fencing token

* ``acquire(blocking=True, timeout=None)`` returns the fencing token, or None
  when the lock was busy (``blocking=False``) or ``timeout`` seconds passed;
  ``with`` raises ``NotAcquired`` instead (``Lock(..., timeout=s)``).
* While held, a daemon thread renews the lease every lease/3. When the server
  says the owner no longer holds the lock (or no renewal got through for a
  whole lease), ``lock.lost`` is set, ``on_lost(lock)`` is called, and leaving
  the ``with`` block raises ``LockLost``.
* ``acquire_via_pubsub()`` (or ``use_pubsub=True``) waits without parking a
  connection: it subscribes to ``__rlock@<db>__:<key>`` and retries on each
  message and when the holder's lease runs out.
* ``keepalive=True``: the server renews the lease while the connection that
  was granted the lock stays open and releases it when that connection
  closes; no renewal thread. The lock object pins that connection (out of the
  pool) while it holds anything.
* ``MultiLock(r, [k1, k2, ...])``: every key or none (``RLOCK.ACQUIREALL``);
  ``tokens`` has one fencing token per key.
* ``Semaphore(r, key, limit=n, permits=k)``: ``SEMAPHORE.*``, at most ``n``
  permits held at once, a lease and a token per holding.
* A parked wait that closes a wait-for cycle raises ``DeadlockError``.
* A ``BLOCK`` wait the server does not answer within its timeout plus
  ``wait_margin`` (default 2 s; also the bound on opening its connection)
  raises ``ServerTimeout`` (a ``redis.TimeoutError``) and closes that
  connection; ``timeout=None`` waits without a limit once connected.
* ``FairLock``, ``ReadWriteLock`` (``rw.read`` / ``rw.write``), and in
  ``rlock.aio`` the same for ``redis.asyncio``.
* ``RedLock``: quorum over independent servers; its per-server tokens are not
  one fencing token.
"""

from ._common import (
    DEFAULT_LEASE_MS,
    DEFAULT_WAIT_MARGIN,
    END_MESSAGES,
    DeadlockError,
    LockError,
    LockLost,
    NotAcquired,
    ServerTimeout,
    default_owner,
    unlock_channel,
)
from ._sync import (
    FairLock,
    Lock,
    MultiLock,
    ReadLock,
    ReadWriteLock,
    RedLock,
    RedLockGrant,
    Semaphore,
    WriteLock,
)

__all__ = [
    "DEFAULT_LEASE_MS",
    "DEFAULT_WAIT_MARGIN",
    "DeadlockError",
    "END_MESSAGES",
    "FairLock",
    "Lock",
    "LockError",
    "LockLost",
    "MultiLock",
    "NotAcquired",
    "ReadLock",
    "ReadWriteLock",
    "RedLock",
    "RedLockGrant",
    "Semaphore",
    "ServerTimeout",
    "WriteLock",
    "default_owner",
    "unlock_channel",
]
__version__ = "0.1.0"
