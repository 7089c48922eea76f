"""Metric definitions that match the one line per epoch the trainer's rank 0 prints.

The trainer prints, for example (mpirun may prefix the line with its tag `[1,0]<stdout>:`):

    METRICS epoch=3 loss=0.123456 accuracy=0.9512 val_loss=0.2012 val_accuracy=0.93 lr=0.0016 samples_per_sec=12345.6

Keys appear only when computed; `val_*` only with a validation channel. SageMaker runs each
definition's regex over every log line and records its first group as the metric's value, so
each regex finds `METRICS` anywhere in the line and then its key preceded by whitespace, which
keeps `loss=` from matching inside `val_loss=`. NaN or infinite values are not numbers to
SageMaker and are not captured. Tuning objectives come from the same table. The line's format has one home,
job.protocol (its writer and the parser the benchmarks use).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from job.protocol import METRICS_PREFIX as MARKER

NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"


@dataclass(frozen=True)
class Metric:
    key: str  # as the trainer prints it (the Keras history key)
    name: str  # as SageMaker shows it
    objective: str  # "Minimize", "Maximize", or "" when not a tuning objective

    @property
    def regex(self) -> str:
        return rf"{MARKER}\b.*\s{self.key}=({NUMBER})"


METRICS = (
    Metric("epoch", "epoch", ""),
    Metric("loss", "train:loss", "Minimize"),
    Metric("accuracy", "train:accuracy", "Maximize"),
    Metric("val_loss", "validation:loss", "Minimize"),
    Metric("val_accuracy", "validation:accuracy", "Maximize"),
    Metric("lr", "train:learning_rate", ""),
    Metric("samples_per_sec", "train:samples_per_sec", ""),
)


def definitions() -> list[dict[str, str]]:
    """MetricDefinitions for CreateTrainingJob and CreateAlgorithm."""
    return [{"Name": m.name, "Regex": m.regex} for m in METRICS]


def tuning_objectives() -> list[dict[str, str]]:
    """SupportedTuningJobObjectiveMetrics: the metrics worth optimising, with their direction."""
    return [{"Type": m.objective, "MetricName": m.name} for m in METRICS if m.objective]


def extract(log_text: str, metric_definitions: list[dict[str, str]]) -> dict[str, list[float]]:
    """What SageMaker would record from a log: metric name -> values, in line order."""
    compiled = [(d["Name"], re.compile(d["Regex"])) for d in metric_definitions]
    found: dict[str, list[float]] = {}
    for line in log_text.splitlines():
        for name, regex in compiled:
            match = regex.search(line)
            if match:
                found.setdefault(name, []).append(float(match.group(1)))
    return found
