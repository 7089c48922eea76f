"""The README's hyperparameter tables must say what the code does."""

import re
from pathlib import Path

from container.hyperparameters import describe
from container.launch_config import LaunchConfig
from train.hyperparameters import TrainerConfig

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
TABLES = README.split("### Hyperparameters", 1)[1].split("\n## ", 1)[0]


def test_every_hyperparameter_is_documented_with_its_type_and_default():
    rows = {m[0]: (m[1], m[2]) for m in re.findall(
        r"^\| `(\w+)`(?: \(alias [^)]*\))? \| (\w+) \| ([^|]*) \|", TABLES, re.MULTILINE)}
    for cls in (TrainerConfig, LaunchConfig):
        for spec in describe(cls):
            default = spec["default"]
            shown = str(default).lower() if spec["type"] == "bool" else (
                str(default) if default != "" else '""')
            assert rows.get(spec["name"]) == (spec["type"], shown), spec["name"]
    assert len(rows) == len(describe(TrainerConfig)) + len(describe(LaunchConfig))
