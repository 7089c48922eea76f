"""Metric definitions against the trainer's METRICS lines: synthetic ones, then a real run's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sagemaker_testing import REPO

from sagemaker_ops import metrics

DEFINITIONS = metrics.definitions()
FULL = (
    "METRICS epoch=3 loss=0.123456 accuracy=0.9512 val_loss=0.2012 val_accuracy=0.93 "
    "lr=0.0016 samples_per_sec=12345.6"
)


@pytest.mark.parametrize("prefix", ["", "[1,0]<stdout>:", "2024-01-01 12:00:00 [1,0]<stdout>: "])
def test_every_metric_of_a_full_line(prefix):
    assert metrics.extract(prefix + FULL, DEFINITIONS) == {
        "epoch": [3.0],
        "train:loss": [0.123456],
        "train:accuracy": [0.9512],
        "validation:loss": [0.2012],
        "validation:accuracy": [0.93],
        "train:learning_rate": [0.0016],
        "train:samples_per_sec": [12345.6],
    }


def test_train_keys_never_match_inside_validation_keys():
    line = "[1,0]<stdout>:METRICS epoch=1 val_loss=0.5 val_accuracy=0.75"
    assert metrics.extract(line, DEFINITIONS) == {
        "epoch": [1.0],
        "validation:loss": [0.5],
        "validation:accuracy": [0.75],
    }


def test_number_forms_of_percent_g_and_lines_without_the_marker():
    log = "\n".join(
        [
            "Epoch 1/2 - loss=0.9 accuracy=0.1",  # Keras' own progress: not ours
            "METRICS epoch=1 loss=1.23457e+06 lr=1e-05 accuracy=-0",
            "METRICS epoch=2 loss=nan accuracy=1 lr=2.5E-4",  # NaN is no number to SageMaker
        ]
    )
    assert metrics.extract(log, DEFINITIONS) == {
        "epoch": [1.0, 2.0],
        "train:loss": [1234570.0],
        "train:learning_rate": [1e-05, 2.5e-4],
        "train:accuracy": [-0.0, 1.0],
    }


def test_definitions_are_unique_and_within_sagemakers_limits():
    names = [d["Name"] for d in DEFINITIONS]
    assert len(set(names)) == len(names) <= 40
    assert all(len(d["Regex"]) <= 500 and re.compile(d["Regex"]).groups == 1 for d in DEFINITIONS)
    objectives = metrics.tuning_objectives()
    assert {o["MetricName"] for o in objectives} <= set(names)
    assert {o["Type"] for o in objectives} == {"Minimize", "Maximize"}


DEFAULT_JOB = REPO / "scripts" / "default_job.py"
CAPTURED = Path(__file__).with_name("data") / "default_job_2_epochs"
KEY_VALUE = re.compile(r"\s([A-Za-z_]+)=(\S+)")


def assert_every_metric_extracted(log: str, history: dict[str, list[float]]) -> None:
    """The definitions find each epoch's line once and every value in it, equal to history.json."""
    lines = [line for line in log.splitlines() if "METRICS " in line]
    assert len(lines) == 2, log[-3000:]
    printed = {key for line in lines for key, _ in KEY_VALUE.findall(line[line.index("METRICS") :])}
    known = {m.key for m in metrics.METRICS}
    assert printed <= known, (
        f"the trainer prints keys no metric definition reads: {printed - known}"
    )
    assert {"epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr"} <= printed

    found = metrics.extract(log, DEFINITIONS)
    assert found["epoch"] == [1.0, 2.0]
    by_key = {m.key: m.name for m in metrics.METRICS}
    compared = [key for key in history if key in by_key]
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "lr"} <= set(compared)
    for key in compared:
        assert found[by_key[key]] == pytest.approx(history[key], rel=1e-5), key


def test_log_captured_from_the_embedded_run():
    """A log of `default_job.py --epochs 2` as the trainer printed it, with its history.json:
    mpirun's tags, the launcher's lines and the final RESULT line (which must not count)."""
    log = CAPTURED.with_suffix(".log").read_text()
    assert "RESULT loss=" in log and "[1,0]<stdout>:METRICS" in log
    assert_every_metric_extracted(
        log, json.loads(CAPTURED.with_suffix(".history.json").read_text())
    )


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """The embedded 2-process training run, 2 epochs, now: its whole log and its history."""
    if not DEFAULT_JOB.exists():
        pytest.skip("scripts/default_job.py (the embedded training run) does not exist yet")
    root = tmp_path_factory.mktemp("ml")
    run = subprocess.run(
        [sys.executable, str(DEFAULT_JOB), "--ml-root", str(root), "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    return log, json.loads((root / "output" / "data" / "history.json").read_text())


def test_log_of_a_live_embedded_run(live_run):
    """The same against the trainer as it is now, so a change to its line format fails here."""
    assert_every_metric_extracted(*live_run)
