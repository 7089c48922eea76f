"""The documentation says what the code does: the hyperparameter tables of docs/training.md and
the README's exit codes."""

import re
from pathlib import Path

from job.hyperparameters import describe
from job.launch_config import LaunchConfig
from job.protocol import FailureKind, exit_code
from job.trainer_config import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TRAINING = (ROOT / "docs" / "training.md").read_text()
TABLES = TRAINING.split("## Hyperparameters", 1)[1].split("\n# ", 1)[0]


def test_every_hyperparameter_is_documented_with_its_type_and_default():
    rows = {
        m[0]: (m[1], m[2])
        for m in re.findall(
            r"^\| `(\w+)`(?: \(alias [^)]*\))? \| (\w+) \| ([^|]*) \|", TABLES, re.MULTILINE
        )
    }
    for cls in (TrainerConfig, LaunchConfig):
        for spec in describe(cls):
            default = spec["default"]
            shown = (
                str(default).lower()
                if spec["type"] == "bool"
                else (str(default) if default != "" else '""')
            )
            assert rows.get(spec["name"]) == (spec["type"], shown), spec["name"]
    assert len(rows) == len(describe(TrainerConfig)) + len(describe(LaunchConfig))


def test_the_readme_exit_codes_are_the_codes_the_job_exits_with():
    table = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| +(\d+(?: \+ N)?) \| (.+) \|$", table, re.MULTILINE))
    assert rows["0"] == "completed"
    assert "configuration or data error" in rows[str(exit_code(FailureKind.CONFIG))]
    assert "cluster error" in rows[str(exit_code(FailureKind.CLUSTER))]
    assert "stopped by SIGTERM" in rows[str(exit_code(FailureKind.STOPPED))]
    assert "rank raised" in rows[str(exit_code(FailureKind.RANK, rank_code=1))]
    assert "bug in the launcher" in rows[str(exit_code(FailureKind.INTERNAL))]
    assert "hung" in rows[str(exit_code(FailureKind.HUNG))]
    assert "killed by signal N" in rows["128 + N"]
    assert set(rows) == {"0", "1", "2", "3", "4", "143", "128 + N"}


def test_every_link_of_the_readme_and_the_docs_leads_to_a_file():
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_the_readme_stays_short():
    assert len(README.splitlines()) <= 200
