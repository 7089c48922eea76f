"""The one way tests wait: poll a condition with a deadline, never sleep and then look."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def eventually(condition: Callable[[], T], failure: str, timeout: float = 10.0) -> T:
    """The first truthy value of `condition()`, polled every 50 ms; after `timeout` seconds
    the test fails with `failure`."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)
    return found
