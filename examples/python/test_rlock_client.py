#!/usr/bin/env python3
"""Runs the example (rlock_client.py) against real servers with the module and
checks what it reports. ``python3 examples/python/test_rlock_client.py``;
ends with ``N passed, M failed``. The library itself is tested by
clients/python/tests/run.py."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
sys.dont_write_bytecode = True

import harness  # noqa: E402
import rlock_client  # noqa: E402


class ExampleTest(unittest.TestCase):
    def test_demo_against_three_servers(self) -> None:
        servers = harness.servers(3)
        try:
            log = rlock_client.demo([s.port for s in servers])
            text = "\n".join(log)
            self.assertIn("still held after 700 ms with a 300 ms lease: True", text)
            self.assertIn("renewed by the server, no renewal thread: True", text)
            self.assertIn("released on exit: True", text)
            self.assertIn("two workers served in turn, tokens increasing: True", text)
            self.assertIn("pub/sub waiter acquired after release: True", text)
            self.assertIn("pub/sub holder kept by its renewal thread: True", text)
            self.assertIn("multi-lock holds 2 keys, one token each: True", text)
            self.assertIn("multi-lock released every key: True", text)
            self.assertIn("redlock granted by 3 of 3 servers", text)
            for s in servers:
                self.assertEqual(s.client().dbsize(), 0, "the demo left a lock behind")
        finally:
            for s in servers:
                s.stop()

    def test_demo_as_a_script(self) -> None:
        import subprocess

        server = harness.Server()
        try:
            out = subprocess.run(
                [sys.executable, os.path.join(HERE, "rlock_client.py"), str(server.port)],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("redlock granted by 1 of 1 servers", out.stdout)
        finally:
            server.stop()


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print("%d passed, %d failed" % (result.testsRun - failed, failed))
    sys.exit(1 if failed or not result.testsRun else 0)
