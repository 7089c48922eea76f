"""One row of the benchmark table, the table itself and its JSON form. No measuring here.

A row compares this project's number with a reference point (what the same work costs when
done the simplest or the published way) and checks a target, either on the ratio
(`ratio >= 0.9`) or on the value itself (`value <= 5 s`). Rows without a target are
informational (small allreduce sizes, memory).
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OPERATORS = (">=", "<=")
TARGET_SUBJECTS = ("ratio", "value")


@dataclass(frozen=True)
class Target:
    subject: str  # "ratio" or "value"
    operator: str  # ">=" or "<="
    threshold: float

    def __post_init__(self) -> None:
        if self.subject not in TARGET_SUBJECTS:
            raise ValueError(
                f"Unknown target subject: {self.subject}. Choose between "
                f"{', '.join(TARGET_SUBJECTS)}."
            )
        if self.operator not in OPERATORS:
            raise ValueError(
                f"Unknown operator: {self.operator}. Choose between {', '.join(OPERATORS)}."
            )

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        number = ratio if self.subject == "ratio" else value
        if number is None or not math.isfinite(number):
            return None
        return number >= self.threshold if self.operator == ">=" else number <= self.threshold

    def describe(self, unit: str) -> str:
        suffix = "" if self.subject == "ratio" else f" {unit}"
        return f"{self.subject} {self.operator} {self.threshold:g}{suffix}"


@dataclass(frozen=True)
class Measurement:
    """One metric: this project's value, the reference it is compared with, the target."""

    item: int  # the numbered benchmark (1 allreduce .. 7 data at scale, 8 serving), docs/performance.md
    metric: str
    unit: str
    value: float | None
    reference: float | None = None
    reference_name: str = ""
    target: Target | None = None
    note: str = ""
    samples: tuple[float | None, ...] = ()  # the repeats `value` is the median of (None: no value)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    @property
    def met(self) -> bool | None:
        return self.target.met(self.value, self.ratio) if self.target else None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            ratio=self.ratio,
            met=self.met,
            samples=list(self.samples),
            target=asdict(self.target) if self.target else None,
        )
        return data


def median(values: Iterable[float | None]) -> float | None:
    """The median of the finite values; None when there is none (a run that measured nothing
    counts as None)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".rstrip()


def table_rows(measurements: Sequence[Measurement]) -> list[list[str]]:
    header = ["#", "metric", "this project", "reference", "ratio", "target", "met"]
    rows = [header]
    for m in measurements:
        reference = _number(m.reference, m.unit) if m.reference is not None else "-"
        if m.reference_name:
            reference = (
                f"{reference} ({m.reference_name})" if m.reference is not None else m.reference_name
            )
        met = {True: "yes", False: "NO", None: "-"}[m.met]
        rows.append(
            [
                str(m.item),
                m.metric,
                _number(m.value, m.unit),
                reference,
                "-" if m.ratio is None else f"{m.ratio:.2f}",
                m.target.describe(m.unit) if m.target else "-",
                met,
            ]
        )
    return rows


def markdown_table(measurements: Sequence[Measurement]) -> str:
    rows = table_rows(measurements)
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def text_table(measurements: Sequence[Measurement]) -> str:
    rows = table_rows(measurements)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import os

    memory = None
    try:
        with open("/proc/meminfo") as meminfo:
            memory = int(meminfo.readline().split()[1]) * 1024
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "host": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": memory,
        "python": platform.python_version(),
        "system": platform.platform(),
        "load_average": load,
    }


def report(
    measurements: Sequence[Measurement], *, tiny: bool, started: float, notes: Sequence[str] = ()
) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "tiny": tiny,
        "seconds": round(time.time() - started, 1),
        "machine": machine(),
        "notes": list(notes),
        "measurements": [m.as_json() for m in measurements],
    }


def write_report(data: dict[str, Any], folder: Path, name: str = "bench") -> Path:
    """FOLDER/NAME[-tiny]-<stamp>.json, and the same as FOLDER/NAME[-tiny]-latest.json."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"{name}-{'tiny-' if data['tiny'] else ''}{stamp}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    latest = folder / f"{name}{'-tiny' if data['tiny'] else ''}-latest.json"
    latest.write_text(path.read_text())
    return path
