"""One way for tests to wait: for a condition, with a deadline, naming it.

A test never sleeps a fixed time and then asserts that something happened
(that is a race with the scheduler), and never counts messages to decide
when something happened. It waits for the condition itself; the deadline is
generous because waiting costs nothing when the condition comes true early,
and a loaded CI box can be many times slower than a laptop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Default deadline: far above any healthy wait, still well under the tests' own timeouts.
DEADLINE_S = 30.0


def wait_until(condition: Callable[[], T], what: str, timeout: float = DEADLINE_S, poll: float = 0.02) -> T:
    """Return the first truthy value of ``condition()``; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
