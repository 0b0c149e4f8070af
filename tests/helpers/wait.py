"""Polling helper for concurrency tests: never assert after a bare sleep."""

from setl.testing.servers import wait_until

__all__ = ["wait_until"]
