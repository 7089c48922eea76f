"""The order `make test` hands test files to its two pytest-xdist workers: longest first.

`--dist loadfile --no-loadscope-reorder` gives whole files to the workers as they come free,
in collection order. With the long files first, the short ones fill in at the end and neither
worker is left alone on a long file (xdist's own order, most tests first, left the long few-test
files for last). The seconds per file come from the last run on this machine, recorded at the
end of every session in build/test-durations.json (ignored by git; a run of some files
updates only theirs, and a file run in part by -k is not recorded). The files that
record lacks (all of them in a fresh clone) take theirs from tests/durations.json, committed
from such a record (after a whole `make test`: `cp build/test-durations.json
tests/durations.json`). A file in neither (a new one) goes after the others, in collection
order, until its first run."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "build" / "test-durations.json"
DEFAULT = ROOT / "tests" / "durations.json"


def file_of(nodeid: str, keywords=()) -> str:
    """The record's key of a test: its file, `FILE [slow]` for its tests marked slow."""
    return nodeid.split("::")[0] + (" [slow]" if "slow" in keywords else "")


def known_durations(sources: tuple[Path, ...] = (DEFAULT, RECORD)) -> dict[str, float]:
    """Seconds per test file: this machine's last record of it, else the committed default's
    (a record that holds only the files run so far still orders the rest)."""
    known: dict[str, float] = {}
    for path in sources:  # the later ones win
        if path.exists():
            known.update(json.loads(path.read_text()))
    return known


def longest_first(items: list, sources: tuple[Path, ...] = (DEFAULT, RECORD)) -> None:
    """Sort `items` (pytest's, in place) by their file's known seconds, longest first; each
    file's tests stay together and in their order, files with no record keep theirs, last."""
    seconds = known_durations(sources)
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(file_of(item.nodeid, item.keywords), index)
    items.sort(
        key=lambda item: (
            -seconds.get(file_of(item.nodeid, item.keywords), 0.0),
            first_seen[file_of(item.nodeid, item.keywords)],
        )
    )


class Timer:
    """Each file's seconds (set-up, test and tear-down of its tests) from the session's test
    reports; under xdist the controller sees every worker's."""

    def __init__(self, record: Path = RECORD) -> None:
        self.record = record
        self.seconds: Counter = Counter()
        self.partial: set[str] = set()

    def add(self, report) -> None:
        self.seconds[file_of(report.nodeid, report.keywords)] += report.duration

    def save(self) -> None:
        """Merge this session's files into the record: the files it did not run keep theirs."""
        whole = {
            name: round(value, 1)
            for name, value in self.seconds.items()
            if name not in self.partial
        }
        if not whole:
            return
        record = json.loads(self.record.read_text()) if self.record.exists() else {}
        record.update(whole)
        self.record.parent.mkdir(parents=True, exist_ok=True)
        # sessions run side by side: each writes a file of its own, then renames it
        temporary = self.record.with_name(f"{self.record.name}.{os.getpid()}")
        temporary.write_text(
            json.dumps(dict(sorted(record.items(), key=lambda kv: -kv[1])), indent=1) + "\n"
        )
        temporary.replace(self.record)
