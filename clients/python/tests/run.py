#!/usr/bin/env python3
"""Runs every test of the rlock Python client against real servers and ends
with ``N passed, M failed`` (exit status 1 on any failure or error).

    python3 clients/python/tests/run.py [-v] [test_module ...]
"""

import logging
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

import harness  # noqa: E402


def main() -> int:
    verbose = "-v" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if not a.startswith("-")]
    # The library logs each lost lock; the tests check them through on_lost.
    logging.getLogger("rlock").setLevel(logging.CRITICAL)
    loader = unittest.TestLoader()
    if names:
        suite = loader.loadTestsFromNames(names)
    else:
        suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    probe = harness.Server()
    try:
        print("rlock Python client tests on %s (%s)" % (
            harness.server_name(probe.client()), harness.SERVER), flush=True)
    finally:
        probe.stop()
    result = unittest.TextTestRunner(verbosity=2 if verbose else 1).run(suite)
    # A test with several failed subtests is one failed test.
    failed = len({getattr(t, "test_case", t).id() for t, _ in result.failures + result.errors}
                 | {t.id() for t in result.unexpectedSuccesses})
    passed = result.testsRun - failed - len(result.skipped)
    print("%d passed, %d failed" % (passed, failed)
          + (", %d skipped" % len(result.skipped) if result.skipped else ""))
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
