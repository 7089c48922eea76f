"""The one way tests wait: poll a condition with a deadline, never sleep and then look."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    condition: Callable[[], T], failure: str, timeout: float = 10.0, every: float = 0.05
) -> T:
    """The first truthy value of `condition()`, polled every `every` seconds; after `timeout`
    seconds the test fails with `failure`."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, failure
        time.sleep(every)
    return found
