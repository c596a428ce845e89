#!/usr/bin/env python3
"""How an application uses the rlock Python library (clients/python, package
``rlock``): a guarded critical section with renewal, two workers served in
turn by the server, the pub/sub path, and RedLock.

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

from rlock import Lock, RedLock


def demo(ports: List[int]) -> List[str]:
    r = redis.Redis(port=ports[0])
    log: List[str] = []

    # 1. A guarded section: the lease (300 ms) is renewed while the block runs.
    with Lock(r, "demo:job", lease_ms=300) as lock:
        log.append("acquired demo:job, token %d" % lock.token)
        time.sleep(0.7)
        log.append("still held after 700 ms with a 300 ms lease: %s" % (lock.info() is not None))
    log.append("released on exit: %s" % (r.exists("demo:job") == 0))

    # 2. Two workers, one lock: the second waits on the server (BLOCK) and is
    #    handed the lock when the first releases; tokens only grow.
    tokens: List[int] = []

    def worker(name: str) -> None:
        with Lock(r, "demo:shared", owner=name, timeout=5) as held:
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
    holder = Lock(r, "demo:ps")
    holder.acquire()
    threading.Timer(0.1, holder.release).start()
    waiter = Lock(r, "demo:ps")
    got = waiter.acquire_via_pubsub(timeout=5)
    log.append("pub/sub waiter acquired after release: %s" % (got is not None))
    waiter.release()

    # 4. RedLock over every port given (one server is a quorum of one).
    with RedLock(["redis://127.0.0.1:%d/0" % p for p in ports], "demo:red", lease_ms=5000) as grant:
        log.append("redlock granted by %d of %d servers, valid for %d ms" % (
            grant.granted, len(ports), grant.validity_ms))
    r.close()
    return log


if __name__ == "__main__":
    ports = [int(p) for p in sys.argv[1:]] or [6379]
    for line in demo(ports):
        print(line)
