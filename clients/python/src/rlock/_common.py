"""What the sync and asyncio halves share: command building, replies, errors."""

from __future__ import annotations

import threading
import uuid
from contextvars import ContextVar
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import redis

KeyT = Union[str, bytes]

#: Messages the module publishes on ``__rlock@<db>__:<key>`` when a hold ends.
END_MESSAGES = frozenset(
    {b"released", b"expired", b"forced", "released", "expired", "forced"}
)

#: Default lease of every lock object, in milliseconds (the module's own default).
DEFAULT_LEASE_MS = 30000

#: Default ``wait_margin`` of every lock object, in seconds: how much longer
#: than its own timeout a waiting call gives the server to answer.
DEFAULT_WAIT_MARGIN = 2.0


class LockError(Exception):
    """Base class of this library's errors."""


class NotAcquired(LockError):
    """A ``with`` block (or ``acquire(..., raise_on_timeout=True)``) could not get
    the lock within its timeout."""


class LockLost(LockError):
    """The server no longer knows this owner as a holder: the lease ran out
    (renewals failed) or somebody forced the lock free. Stop touching the
    protected resource; a fencing-token check there rejects late writes."""


class ServerTimeout(LockError, redis.TimeoutError):
    """The server did not answer an acquisition in time: a ``BLOCK`` wait got no
    reply within its timeout plus ``wait_margin`` (a frozen, overloaded or
    cut-off server), or opening the connection for it took longer than
    ``wait_margin``. The connection was closed, never reused. Whether the
    server granted the lock is unknown: a grant it made before it saw the
    connection close stays until its lease ends (with ``keepalive``, until the
    server sees the connection closed). Also a ``redis.TimeoutError``."""


class DeadlockError(LockError, redis.ResponseError):
    """The server answered a parked wait with ``DEADLOCK``: this waiter lies on a
    cycle of the wait-for graph (it waits, directly or not, for an owner that
    waits for it) and was the latest on it to start waiting, so it left the
    queue. Nothing was acquired. Give up what this owner holds (that breaks the
    cycle) and retry. ``cycle`` lists the owners, starting and ending with this
    one. Also a ``redis.ResponseError``, for code that catches those."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        _, _, tail = message.partition("cycle:")
        #: The owners on the cycle: ``[me, ..., me]``.
        self.cycle: List[str] = [o.strip() for o in tail.split(" -> ")] if tail else []


#: The pin generation of the last keepalive grant in this thread or task:
#: (id of the pin, generation), read by the ``with`` block that asked for it.
_GRANT: "ContextVar[Optional[Tuple[int, int]]]" = ContextVar("rlock_grant", default=None)
#: The ``with`` blocks of keepalive lock objects open in this thread or task,
#: innermost last: (id of the lock object, pin generation at acquisition).
_BLOCKS: "ContextVar[Tuple[Tuple[int, Optional[int]], ...]]" = ContextVar(
    "rlock_blocks", default=())


def note_grant(pin: Any) -> None:
    """Records that this thread or task was just granted a hold on ``pin``'s
    current connection (its generation)."""
    _GRANT.set((id(pin), pin.generation))


def enter_block(lock: Any, pin: Any) -> None:
    """A ``with`` block of ``lock`` starts after its acquisition in this
    thread or task: it remembers the pin generation that acquisition was
    granted in."""
    grant = _GRANT.get()
    _GRANT.set(None)
    gen = grant[1] if grant is not None and grant[0] == id(pin) else None
    _BLOCKS.set(_BLOCKS.get() + ((id(lock), gen),))


def exit_block(lock: Any) -> Optional[int]:
    """The innermost ``with`` block of ``lock`` in this thread or task ends:
    the pin generation it was granted in (None when unknown)."""
    blocks = _BLOCKS.get()
    for i in range(len(blocks) - 1, -1, -1):
        if blocks[i][0] == id(lock):
            _BLOCKS.set(blocks[:i] + blocks[i + 1:])
            return blocks[i][1]
    return None


def block_generation(lock: Any) -> Optional[int]:
    """The pin generation of ``lock``'s innermost ``with`` block open in this
    thread or task (None: none open, or unknown)."""
    for lock_id, gen in reversed(_BLOCKS.get()):
        if lock_id == id(lock):
            return gen
    return None


def stale_message(prefix: str, key: Any) -> str:
    return (
        "%s %r: lock lost: the keepalive connection this hold was granted on failed "
        "(and the server ended its holdings); nothing was sent" % (prefix, key))


def is_deadlock(error: BaseException) -> bool:
    return str(error).startswith("DEADLOCK")


def default_owner() -> str:
    """Redisson's convention: ``<random uuid>:<thread id>``."""
    return "%s:%d" % (uuid.uuid4(), threading.get_ident())


def unlock_channel(db: int, key: KeyT) -> str:
    """The channel the module publishes on when a hold of ``key`` ends."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogateescape")
    return "__rlock@%d__:%s" % (db, key)


def db_of(client: Any) -> int:
    """The database number a redis-py client (sync or asyncio) talks to."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    return int(kwargs.get("db", 0) or 0)


def is_notowner(error: BaseException) -> bool:
    return str(error).startswith("NOTOWNER")


def is_end_message(message: Optional[Dict[str, Any]]) -> bool:
    return (
        message is not None
        and message.get("type") in ("message", b"message")
        and message.get("data") in END_MESSAGES
    )


def block_ms(blocking: bool, timeout: Optional[float]) -> Optional[int]:
    """The BLOCK argument: None (no BLOCK), 0 (forever) or at least 1 ms."""
    if not blocking:
        return None
    if timeout is None:
        return 0
    if timeout <= 0:
        return None  # a zero or negative timeout is one immediate try
    return max(1, int(round(timeout * 1000)))


def wait_deadline(now: float, block: Optional[int], margin: float) -> Optional[float]:
    """When a call sent at ``now`` with this BLOCK argument gives up waiting
    for the reply: BLOCK + ``margin`` (no BLOCK: ``margin``), never for
    ``BLOCK 0`` (None: the server answers only when it grants)."""
    if block == 0:
        return None
    return now + (block or 0) / 1000.0 + margin


def check_margin(margin: float) -> float:
    margin = float(margin)
    if not margin > 0:
        raise ValueError("wait_margin must be a positive number of seconds")
    return margin


def check_lease(lease_ms: int) -> int:
    lease_ms = int(lease_ms)
    if lease_ms <= 0:
        raise ValueError("lease_ms must be a positive number of milliseconds")
    return lease_ms


class Family:
    """The command prefix of a lock family and, for RWLOCK, the mode word."""

    def __init__(self, prefix: str, mode: Optional[str] = None) -> None:
        self.prefix = prefix
        self.mode = mode

    def acquire(
        self, key: KeyT, owner: str, lease_ms: int, block: Optional[int],
        keepalive: bool = False,
    ) -> List[Any]:
        args: List[Any] = [self.prefix + ".ACQUIRE", key]
        if self.mode:
            args.append(self.mode)
        args += [owner, "PX", lease_ms]
        if block is not None:
            args += ["BLOCK", block]
        if keepalive:
            args.append("KEEPALIVE")
        return args

    def release(self, key: KeyT, owner: str) -> List[Any]:
        args: List[Any] = [self.prefix + ".RELEASE", key]
        if self.mode:
            args.append(self.mode)
        args.append(owner)
        return args

    def renew(self, key: KeyT, owner: str, lease_ms: int) -> List[Any]:
        return [self.prefix + ".RENEW", key, owner, "PX", lease_ms]

    def info(self, key: KeyT) -> List[Any]:
        return [self.prefix + ".INFO", key]


def acquire_all(
    keys: Sequence[KeyT], owner: str, lease_ms: int, block: Optional[int], keepalive: bool
) -> List[Any]:
    """``RLOCK.ACQUIREALL numkeys key [key ...] owner PX ms [BLOCK ms] [KEEPALIVE]``."""
    args: List[Any] = ["RLOCK.ACQUIREALL", len(keys), *keys, owner, "PX", lease_ms]
    if block is not None:
        args += ["BLOCK", block]
    if keepalive:
        args.append("KEEPALIVE")
    return args


def check_permits(limit: int, permits: int) -> Tuple[int, int]:
    """A semaphore's ``LIMIT`` and ``PERMITS``: positive, at most 2**32 - 1,
    ``permits <= limit`` (the server refuses anything else)."""
    limit, permits = int(limit), int(permits)
    if not 1 <= limit <= 0xFFFFFFFF:
        raise ValueError("limit must be a positive integer below 2**32")
    if not 1 <= permits <= limit:
        raise ValueError("permits must be a positive integer no greater than limit")
    return limit, permits


def semaphore_acquire(
    key: KeyT, owner: str, limit: int, permits: int, lease_ms: int, block: Optional[int],
    keepalive: bool,
) -> List[Any]:
    """``SEMAPHORE.ACQUIRE key owner LIMIT n PERMITS k PX ms [BLOCK ms] [KEEPALIVE]``."""
    args: List[Any] = [
        "SEMAPHORE.ACQUIRE", key, owner, "LIMIT", limit, "PERMITS", permits, "PX", lease_ms,
    ]
    if block is not None:
        args += ["BLOCK", block]
    if keepalive:
        args.append("KEEPALIVE")
    return args


def semaphore_release(key: KeyT, owner: str, permits: int) -> List[Any]:
    return ["SEMAPHORE.RELEASE", key, owner, "PERMITS", permits]


def release_all(keys: Sequence[KeyT], owner: str) -> List[Any]:
    return ["RLOCK.RELEASEALL", len(keys), *keys, owner]


def renew_all(keys: Sequence[KeyT], owner: str, lease_ms: int) -> List[Any]:
    return ["RLOCK.RENEWALL", len(keys), *keys, owner, "PX", lease_ms]


def retry_wait(pttls: Sequence[int], safety_poll: float) -> float:
    """How long the pub/sub path waits before trying again, from the ``PTTL``
    of each key it needs: until the first holder's lease runs out (each bounded
    by ``safety_poll``), at once when every key was freed meanwhile."""
    waits = []
    for pttl in pttls:
        if pttl == -2:
            continue  # no lock there (free, or freed since the try)
        waits.append(safety_poll if pttl < 0 else min(safety_poll, pttl / 1000.0 + 0.002))
    return min(waits) if waits else 0.001


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def parse_info(reply: Any) -> Optional[Dict[str, Any]]:
    """A ``*.INFO`` reply (RESP2 flat list or RESP3 map) as a dict with str keys;
    None when the key holds no lock."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2]))
    return {_text(k): v for k, v in items}


def drift_ms(lease_ms: int, drift_factor: float) -> float:
    """RedLock's clock-drift allowance: lease x factor + 2 ms."""
    return lease_ms * drift_factor + 2.0


def quorum(n: int) -> int:
    return n // 2 + 1


def check_distinct_servers(clients: Sequence[Any]) -> None:
    """RedLock's quorum counts servers, so one listed twice (also with another
    db: the same process) would count twice: ValueError."""
    seen = set()
    for c in clients:
        kw = c.connection_pool.connection_kwargs
        where = kw.get("path") or (kw.get("host", "localhost"), kw.get("port", 6379))
        if where in seen:
            raise ValueError("RedLock needs distinct servers: %r is listed twice" % (where,))
        seen.add(where)
