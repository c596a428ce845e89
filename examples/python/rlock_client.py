#!/usr/bin/env python3
"""How an application uses the rlock Python library (clients/python, package
``rlock``): a guarded critical section kept alive by the server (KEEPALIVE),
two workers served in turn by the server, the pub/sub path with its renewal
thread, a multi-key lock, and RedLock.

Which renewal to use: where the holder has a connection of its own for as
long as it holds (a BLOCK wait, a worker), ``keepalive=True`` lets the server
renew the lease while that connection is open and free the lock the moment it
closes (a crashed holder costs nothing). Where no connection can be dedicated
(multiplexed clients, the pub/sub path), the library's renewal thread sends
RENEW every lease/3.

    pip install ./clients/python          # or: PYTHONPATH=clients/python/src
    python3 examples/python/rlock_client.py 6379 [6380 6381 ...]

The lock logic lives in the library; this file only calls it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import List

try:
    import rlock  # installed with pip
except ImportError:  # running from the repository
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python", "src"))
    import rlock

import redis

from rlock import Lock, MultiLock, RedLock


def demo(ports: List[int]) -> List[str]:
    r = redis.Redis(port=ports[0])
    log: List[str] = []

    # 1. A guarded section on a connection dedicated to the holder (the lock
    #    object pins one while it holds): KEEPALIVE, the server renews the
    #    300 ms lease while the block runs; no renewal thread.
    with Lock(r, "demo:job", lease_ms=300, keepalive=True) as lock:
        log.append("acquired demo:job, token %d" % lock.token)
        time.sleep(0.7)
        log.append("still held after 700 ms with a 300 ms lease: %s" % (lock.info() is not None))
        log.append("renewed by the server, no renewal thread: %s" % (not lock.renewing))
    log.append("released on exit: %s" % (r.exists("demo:job") == 0))

    # 2. Two workers, one lock: the second waits on the server (BLOCK) and is
    #    handed the lock when the first releases; tokens only grow. Each wait
    #    parks a connection of its own, so it holds with KEEPALIVE.
    tokens: List[int] = []

    def worker(name: str) -> None:
        with Lock(r, "demo:shared", owner=name, timeout=5, keepalive=True) as held:
            tokens.append(held.token)  # type: ignore[arg-type]
            time.sleep(0.1)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("worker-a", "worker-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.append("two workers served in turn, tokens increasing: %s" % (
        len(tokens) == 2 and tokens[0] < tokens[1]))

    # 3. The pub/sub path: wait for a release without parking a connection.
    #    No connection is dedicated to the holder here, so its lease is kept by
    #    the renewal thread (RENEW every lease/3), not KEEPALIVE.
    holder = Lock(r, "demo:ps")
    holder.acquire()
    threading.Timer(0.1, holder.release).start()
    waiter = Lock(r, "demo:ps", lease_ms=300)
    got = waiter.acquire_via_pubsub(timeout=5)
    log.append("pub/sub waiter acquired after release: %s" % (got is not None))
    time.sleep(0.5)
    log.append("pub/sub holder kept by its renewal thread: %s" % (
        waiter.renewing and waiter.info() is not None))
    waiter.release()

    # 4. Several keys at once, all or nothing (RLOCK.ACQUIREALL): a transfer
    #    between two accounts (one hash tag, so one cluster slot).
    with MultiLock(r, ["demo:{acct}:1", "demo:{acct}:2"], timeout=5, keepalive=True) as multi:
        log.append("multi-lock holds %d keys, one token each: %s" % (
            len(multi.keys), len(multi.tokens or ()) == len(multi.keys)))
    log.append("multi-lock released every key: %s" % (
        r.exists("demo:{acct}:1", "demo:{acct}:2") == 0))

    # 5. RedLock over every port given (one server is a quorum of one).
    with RedLock(["redis://127.0.0.1:%d/0" % p for p in ports], "demo:red", lease_ms=5000) as grant:
        log.append("redlock granted by %d of %d servers, valid for %d ms" % (
            grant.granted, len(ports), grant.validity_ms))
    r.close()
    return log


if __name__ == "__main__":
    ports = [int(p) for p in sys.argv[1:]] or [6379]
    for line in demo(ports):
        print(line)
