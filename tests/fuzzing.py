"""What every fuzz test shares: one reproducible Hypothesis profile and a count of the inputs
tried per parser, printed at the end of the session.

    from tests.fuzzing import fuzz

    @fuzz("resourceconfig.json", max_examples=300, document=documents)
    def test_a_document_is_read_or_refused(document): ...

`fuzz(parser, max_examples, **strategies)` is `@given(**strategies)` under the profile below
with `max_examples`, and counts each input the test body receives under `parser`; put
`@example(...)` above it for the inputs that once found a defect. The profile is derandomized
and keeps no example database, so CI and a laptop try the same inputs on every run: a failure
reproduces, and the time the fuzzing takes is the same each run (Hypothesis then picks its
inputs from a seed taken from the test's name).

tests/conftest.py moves the counts into each test's report (`user_properties`, which
pytest-xdist carries from its workers), adds them up and prints, at the end of the session,

    fuzz: resourceconfig.json: 300 inputs tried, 0 failures

where a failure is a fuzz test of that parser that failed.

FUZZ_SCALE=10 in the environment tries ten times the inputs, new ones on every run (not
derandomized): a soak for a laptop, not for CI.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings

PROFILE = "fuzz"
settings.register_profile(
    PROFILE,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
if SCALE != 1:
    settings.register_profile(PROFILE, settings.get_profile(PROFILE), derandomize=False)

PROPERTY = "fuzz"  # the name of the (parser, inputs) pairs in a report's user_properties
tried: Counter = Counter()  # parser -> inputs the test bodies received in this process


def fuzz(parser: str, max_examples: int, **strategies: Any) -> Callable:
    """`@given(**strategies)` with the shared profile and `max_examples`, each input counted
    under `parser`."""

    def decorate(test: Callable) -> Callable:
        @functools.wraps(test)
        def counted(*args: Any, **kwargs: Any) -> Any:
            tried[parser] += 1
            return test(*args, **kwargs)

        return settings(settings.get_profile(PROFILE), max_examples=round(max_examples * SCALE))(
            given(**strategies)(counted)
        )

    return decorate


def take_counts() -> list[tuple[str, tuple[str, int]]]:
    """The counts since the last call, as user_properties entries, and start again at 0."""
    counts = [(PROPERTY, (parser, number)) for parser, number in sorted(tried.items())]
    tried.clear()
    return counts


class Tally:
    """The session's counts, from every test report (the controller's, under xdist)."""

    def __init__(self) -> None:
        self.tried: Counter = Counter()
        self.failed: Counter = Counter()

    def add(self, report: Any) -> None:
        for name, value in getattr(report, "user_properties", ()):
            if name == PROPERTY:
                parser, number = value
                self.tried[parser] += number
                if report.failed:
                    self.failed[parser] += 1

    def lines(self) -> list[str]:
        return [
            f"fuzz: {parser}: {self.tried[parser]} inputs tried, {self.failed[parser]} failures"
            for parser in sorted(self.tried)
        ]
